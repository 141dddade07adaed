"""What the stores mean alike (core.py and its readers use it; so does the notifier).

- Failure: a job has ``failed`` once a ``rank.traceback`` record, or a ``proc.exit`` whose
  fields hold a non-zero int under one of EXIT_CODE_KEYS or a non-empty ``signal``, was stored.
- Running: a job with a record within RUNNING_NS of now is ``running``; else ``failed`` or
  ``ended``. Record times are the nodes' own clocks (not clock-corrected).
- Belonging: a job selects its records plus the jobless records (kernel, cgroup, GPU) of its
  nodes within JOB_MARGIN_NS of its window.
- Reading: index scans come back in (time, ...) order and are merged lazily (``merge``);
  a Selection's grep is a literal substring of the message : linear in the
  message, so no pattern a user sends can run for long (a regular expression could).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter

from firstfault.wire import KIND_PROC_EXIT, KIND_RANK_TRACEBACK

RUNNING_NS = 60 * 10**9  # a job with a record this recent is running
JOB_MARGIN_NS = 10 * 60 * 10**9  # jobless records this close to a job belong to it
EXIT_CODE_KEYS = ("exitcode", "exit_code", "code", "returncode")
FAIL_KINDS = frozenset((KIND_RANK_TRACEBACK, KIND_PROC_EXIT))


def is_failure(kind: str, fields: dict) -> bool:
    """Does one record make its job failed?"""
    if kind == KIND_RANK_TRACEBACK:
        return True
    if kind != KIND_PROC_EXIT:
        return False
    if any(type(fields.get(k)) is int and fields[k] != 0 for k in EXIT_CODE_KEYS):
        return True
    return bool(fields.get("signal"))


def failed_jobs(kind: Sequence[str], fields: Sequence[dict], job: Sequence[str | None]) -> set[str | None]:
    """The jobs that a batch's columns show failing."""
    if FAIL_KINDS.isdisjoint(kind):
        return set()
    return {job[i] for i, k in enumerate(kind) if k in FAIL_KINDS and is_failure(k, fields[i])}


def job_status(now_ns: int, last_ns: int, failed: bool) -> str:
    """``running`` | ``failed`` | ``ended``, by the rules above."""
    return "running" if now_ns - last_ns <= RUNNING_NS else "failed" if failed else "ended"


def merge(sources: list[tuple[int, Callable[[], Iterator[tuple]]]]) -> Iterator[tuple]:
    """The items of ascending iterators in ascending order; ``(lo, open)`` pairs, each
    opened only once the merge reaches ``lo`` (every item's [0] is >= its ``lo``)."""
    pending = deque(sorted(sources, key=itemgetter(0)))
    heap: list[list] = []
    n = 0
    while heap or pending:
        if pending and (not heap or pending[0][0] <= heap[0][0][0]):
            it = pending.popleft()[1]()  # it may hold items before the head: look again
            for item in it:
                heapq.heappush(heap, [item, n, it])
                n += 1
                break
            continue
        # Yield from the head's source while it stays below every other source's
        # head and below the next source to open: no heap operation for most items.
        entry = heap[0]
        it = entry[2]
        if len(heap) == 1:
            bound = None
        else:  # the smaller child of the root is the next smallest head
            bound = heap[1][0] if len(heap) == 2 else min(heap[1][0], heap[2][0])
        stop = pending[0][0] if pending else None
        yield entry[0]
        for item in it:
            if (bound is None or item < bound) and (stop is None or item[0] < stop):
                yield item
                continue
            heapq.heapreplace(heap, [item, entry[1], it])
            break
        else:
            heapq.heappop(heap)
