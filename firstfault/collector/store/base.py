"""The Store protocol: what the collector's ingest and query sides need from storage.

One core for every backend (core.py) over a dialect each (sqlite.py, the default;
postgres.py, shared by several collectors). Every method is synchronous and called
from one thread at a time per Store object; the asyncio server runs them in a worker
thread so a slow disk slows reading from sockets (backpressure) instead of growing
memory.

Durability contract: when ``insert`` returns, the rows are committed so that a
kill -9 of the collector loses none of them; only then may the server ack.
Idempotency: (node, stream, seq) is unique; inserting a key again changes
nothing and is not an error (agents resend after reconnecting).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from firstfault.wire import Record


class StoreError(Exception):
    """Base error of the stores: the database can not be opened, migrated or written."""


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A job as the records show it."""

    job: str
    first_ns: int  # earliest occurred (else observed) time of its records
    last_ns: int
    nodes: tuple[str, ...]
    ranks: tuple[int, ...]
    records: int
    status: str  # "running" (records within the last minute), "failed" (an exit != 0 seen), "ended"


@dataclass(frozen=True, slots=True)
class NodeClock:
    """A node's clock: add offset_ns to its times to get the collector's; error bound uncertainty_ns."""

    node: str
    offset_ns: int
    uncertainty_ns: int
    measured_ns: int  # collector time of the estimate


@dataclass(frozen=True, slots=True)
class Selection:
    """Which records a query wants. A job selects its own records plus the kernel,
    cgroup and GPU records of its nodes within its time window (they carry no job)."""

    job: str | None = None
    nodes: tuple[str, ...] | None = None
    ranks: tuple[int, ...] | None = None
    since_ns: int | None = None
    until_ns: int | None = None
    grep: str | None = None  # a literal part of message (no pattern: linear time, whatever is sent)
    limit: int | None = None  # None: every matching record, never cut silently


INT64 = (-(2**63), 2**63 - 1)  # what a time, rank or limit may be (SQLite's and PostgreSQL's bigint)


def check_selection(sel: Selection) -> bool:
    """ValueError for a value out of range (a negative ``limit``, a time, rank or limit
    beyond 64 bits); False when an empty rank or node filter makes the selection match
    nothing (every store checks alike)."""
    lo, hi = INT64
    for name, v in (("since", sel.since_ns), ("until", sel.until_ns), ("limit", sel.limit),
                    *(("rank", r) for r in sel.ranks or ())):
        if v is not None and not lo <= v <= hi:
            raise ValueError(f"{name}: out of range: {v}")
    if sel.limit is not None and sel.limit < 0:
        raise ValueError(f"limit: must be >= 0, got {sel.limit}")
    return not (sel.ranks is not None and not sel.ranks or sel.nodes is not None and not sel.nodes)


def check_prune(max_age_s: float | None, max_bytes: int | None) -> None:
    """ValueError for a negative bound of ``Store.prune``."""
    if max_age_s is not None and max_age_s < 0:
        raise ValueError(f"max_age_s: must be >= 0, got {max_age_s}")
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes: must be >= 0, got {max_bytes}")


def prune_to_size(max_bytes: int, used_bytes: Callable[[], int], records: Callable[[], int],
                  kth_oldest: Callable[[int], int], delete_before: Callable[[int], int]) -> int:
    """Delete the oldest records until ``used_bytes()`` is at most ``max_bytes``; how many
    went. Each round deletes up to the time of the k-th oldest record, k the excess over
    the bytes a record takes on average (plus 5 %), so a few rounds reach the bound."""
    deleted = 0
    while (used := used_bytes()) > max_bytes:
        total = records()
        if not total:
            break
        n = delete_before(kth_oldest(math.ceil((used - max_bytes) / (used / total) * 1.05)) + 1)
        if not n:
            break
        deleted += n
    return deleted


class Store(Protocol):
    def high_seq(self, node: str, stream: str) -> int | None:
        """The highest seq stored for (node, stream), None when none is."""

    def insert(self, records: Sequence[Record]) -> int:
        """Store records durably (committed on return); return how many were new."""

    def jobs(self) -> list[JobInfo]:
        """Every job the records name, newest first."""

    def job(self, job: str) -> JobInfo | None: ...

    def records(self, sel: Selection) -> Iterator[Record]:
        """Matching records ordered by (occurred or observed time, node, stream, seq)."""

    def save_clock(self, clock: NodeClock) -> None: ...

    def clocks(self) -> dict[str, NodeClock]:
        """The latest clock estimate of every node."""

    def prune(self, *, max_age_s: float | None, max_bytes: int | None) -> int:
        """Delete the oldest records beyond the age or size bound; return how many."""

    def close(self) -> None: ...

    # Optional (use needed_records, which falls back to records):
    #
    # def needed(self, sel: Selection, marker: str) -> Iterator[Record]:
    #     """The records of sel a report needs, in records() order: every record a
    #     Marker named ``marker`` marked when it was inserted, and every record not
    #     marked by it (inserted without that marker): always a superset of what
    #     the marker would mark, so the report is the one records(sel) gives."""


class Marker(Protocol):
    """Chooses, at insert, the records of a block that a report will read (the
    collector's is firstfault/analysis/reads.py); a backend that keeps marks stores
    the chosen ones aside with ``name`` and serves them from ``needed``."""

    name: str  # changes whenever what mark() chooses would change

    def mark(self, *, source: Sequence[str], kind: Sequence[str], message: Sequence[str],
             occurred_ns: Sequence[int | None], rank: Sequence[int | None],
             fields: Sequence[dict], order: Sequence[int] | None = None,
             pid: Sequence[int | None] | None = None) -> list[int]:
        """Indices (ascending) of the records a report needs, of one block: records
        of one (node, stream) and one job, in (occurred else observed time, seq)
        order: the columns' values at the indices ``order``, or all of them (None)."""


def needed_records(store: Store, sel: Selection, marker: str) -> Iterator[Record]:
    """``store.needed(sel, marker)`` where the backend has it, else every record."""
    needed = getattr(store, "needed", None)
    return store.records(sel) if needed is None else needed(sel, marker)
