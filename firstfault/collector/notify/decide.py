"""When a job has failed and when its first failure is settled: pure rules over what the
ingest saw. firstfault/collector/notify/notifier.py feeds them and acts on the answers.

Failed. A job has failed once a failure record of it was stored (store/shared.py's
``is_failure``: a ``rank.traceback``, or a ``proc.exit`` with a non-zero code or a signal)
and then one of (``decided_by``):

- ``ranks-exited``: every rank seen in its records has a ``proc.exit`` record;
- ``launcher-end``: its report shows an exit for every rank it knows (the launcher's own
  lines: torchrun's summary, DeepSpeed's exit lines; the notifier asks the report);
- ``epilog``: a ``job.mark`` with event ``end`` (a scheduler's epilog) was stored; this
  one also counts without a failure record when the report names a first failure;
- ``quiet``: no record of the job for ``quiet_s``.

Settled. No earlier candidate can still arrive when every node of the job has shipped
up to ``T + U + settle_s``: T the first failure's time on the collector's clock (the
report's ``occurred_at``, else when the failure record was stored), U the largest clock
uncertainty of the job's nodes. A node has shipped up to X (``drained``) when the
collector stored a record of it observed at X or later (a stream's records come in seq
order, so the earlier ones are in), or its agent answered a ping sent at X + the agent's
flush margin with nothing of it in flight (an idle agent has nothing unsent), or its
agent closed its connection cleanly (it flushes its spool first: it has shipped all it
saw until it connects again). A node that says
nothing (agent dead, network down) holds the notice up to ``max_wait_s`` after the job
failed; it is then sent unsettled, naming the nodes behind, and an update follows if
their records change the answer.

Known limits: an agent whose send window is full (records streaming faster than the
collector stores them) may answer a ping with records observed before it still unsent;
its batches' own observed times still bound what came in. A line a rank flushed long after
it happened (buffered stdout) can arrive after the settle margin: it makes an update.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from firstfault.collector.store.shared import FAIL_KINDS, is_failure
from firstfault.wire import KIND_JOB_MARK, KIND_PROC_EXIT

WATCH_KINDS = FAIL_KINDS | {KIND_JOB_MARK}


@dataclass
class JobWatch:
    """What the notifier knows of one job (collector clock, ns)."""

    job: str
    last_ns: int  # when its latest record was stored
    nodes: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    exited: set[int] = field(default_factory=set)
    failure_ns: int | None = None  # when its first failure record was stored
    end_ns: int | None = None  # when an end mark was stored
    failed_ns: int | None = None  # when it was decided failed
    decided_by: str | None = None
    checked_ns: int = 0  # last_ns its latest report was built at (0: never)
    told: dict | None = None  # the answer last told
    revision: int = 0
    not_failed: bool = False  # an end mark came and its report named no failure


def observe(w: JobWatch, node: str, now_ns: int, ranks: Iterable[int | None],
            rows: Sequence[tuple[str, int | None, dict]]) -> None:
    """A batch of this job's records stored: the ranks they name, and (kind, rank, fields)
    of those of them whose kind is one of WATCH_KINDS (the others do not matter)."""
    w.last_ns = now_ns
    w.nodes.add(node)
    w.ranks.update(r for r in ranks if r is not None)
    for kind, rank, fields in rows:
        if kind == KIND_JOB_MARK:
            if fields.get("event") == "end" and w.end_ns is None:
                w.end_ns = now_ns
        elif kind in FAIL_KINDS:
            if kind == KIND_PROC_EXIT and rank is not None:
                w.exited.add(rank)
            if w.failure_ns is None and is_failure(kind, fields):
                w.failure_ns = now_ns


def failed_because(w: JobWatch, now_ns: int, quiet_ns: int) -> str | None:
    """Why the job counts as failed now from the records alone (None: not yet; the
    report-based ``launcher-end`` and end-mark-only cases are the notifier's)."""
    if w.failure_ns is None:
        return None
    if w.end_ns is not None:
        return "epilog"
    if w.ranks and w.ranks <= w.exited:
        return "ranks-exited"
    if now_ns - w.last_ns >= quiet_ns:
        return "quiet"
    return None


def every_rank_exited(report: dict) -> bool:
    """Does the report show an exit (agents' or the launcher's lines) for every rank it knows?"""
    ranks = report.get("ranks") or {}
    return bool(ranks) and all(r.get("exit") for r in ranks.values())


def behind(nodes: set[str], drained: dict[str, int], first_ns: int, uncertainty_ns: dict[str, int],
           settle_ns: int) -> list[str]:
    """The nodes that have not shipped up to the settle bound (see the module docstring)."""
    if not nodes:
        return []
    bound = first_ns + max(uncertainty_ns.get(n, 0) for n in nodes) + settle_ns
    return sorted(n for n in nodes if drained.get(n, -1) < bound)
