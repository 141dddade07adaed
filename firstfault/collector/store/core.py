"""BlockStore: the Store protocol (base.py) over one database, the same for every
backend; a dialect (dialect.py: sqlite.py, postgres.py) holds only what differs.

Records are kept as blocks (blocks.py is the layout): the records of one stream and one
job (or of none) from one insert, one row of ``blocks`` each, their report marks in
``marks`` (marking.py). The tables, in both dialects:

    streams(sid, node, stream, high_seq, free_first_ns, free_last_ns)
        one row per agent stream. high_seq: the highest seq ever stored; prune never
        lowers it, so pruned records are not resent. free_*: bounds of the t_ns of the
        stream's records without a job (stale-low after prune, never too high). An
        empty row means what no row means.
    blocks(bid, sid, jid, seq_lo, seq_hi, t_lo, t_hi, n, ranks, seqs, data, idx)
        t_ns = occurred_ns if known, else observed_ns; indexes
          blocks_seq  (sid, seq_hi)                   resends' idempotency look-ups
          blocks_job  (jid, t_lo)                     a job's blocks in time order
          blocks_free (sid, t_lo) WHERE jid IS NULL   a stream's jobless blocks
    marks(bid, mid, seqs, data), pending(bid), markers(mid, name): marking.py.
    jobs(jid, job, first_ns, last_ns, records, failed), job_nodes(jid, node),
    job_ranks(jid, rank): derived on insert, one update per job per transaction.
    node_clocks(node, measured_ns, offset_ns, uncertainty_ns): every estimate.

Ingest: ingest.py (one write transaction per call, committed on return).

Invariants
    * (node, stream, seq) is stored at most once (the first content wins); a resend
      inserts nothing and ``insert`` counts only new records.
    * jobs.records = the job's records, first_ns <= its earliest t_ns, last_ns = its
      latest (prune may leave last_ns, nodes and ranks of deleted records: enough for
      listing). failed: shared.py's rule.
    * A job selects its records plus the jobless records of the nodes that sent its
      records, within [first_ns - 10 min, last_ns + 10 min] (read.py).

Known issues: a job's window and its "running" status use record times as the nodes'
clocks give them (not clock-corrected). Small batches make small blocks (a row each):
at a trickle of records the store costs what a row per record did.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from itertools import groupby
from operator import attrgetter
from typing import Any, TypeVar

from firstfault.collector.store import marking
from firstfault.collector.store.base import JobInfo, Marker, NodeClock, Selection, StoreError
from firstfault.collector.store.blocks import COLUMNS
from firstfault.collector.store.dialect import Dialect, Retry
from firstfault.collector.store.ingest import Ingest
from firstfault.collector.store.names import Names
from firstfault.collector.store.prune import Pruner
from firstfault.collector.store.read import Reader
from firstfault.collector.store.shared import job_status
from firstfault.wire import Record

log = logging.getLogger(__name__)

T = TypeVar("T")
RETRIES = 5  # a write rolled back by a conflict is tried this often

_column_getters = tuple(map(attrgetter, COLUMNS))
_node_stream = attrgetter("node", "stream")
_seq_of = attrgetter("seq")


class BlockStore:
    """The Store protocol (base.py) on a dialect's database; see the module docstring.
    Besides the protocol: insert_columns (a wire batch's columns, no Record objects;
    with wire.PackedColumns their bytes kept as they came), insert_columns_many
    (several in one transaction), needed (a report's records), mark_pending and
    used_bytes."""

    def __init__(self, dialect: Dialect, *, marker: Marker | None = None,
                 now_ns: Callable[[], int] = time.time_ns) -> None:
        self.d = dialect
        self.name = dialect.name
        self.marker = marker
        self.mid: int | None = None  # the marker's id in markers, once it marked a block
        self.now_ns = now_ns
        self.names = Names()
        self._stale = True  # names to be loaded before use
        self._ingest = Ingest(self)
        self._reader = Reader(self)
        self._pruner = Pruner(self)
        with dialect.errors("opening the store"):
            self.refresh()

    # --- names and transactions -----------------------------------------------------

    def refresh(self) -> None:
        """Reload the cached names when they may be stale."""
        if self.d.changed() or self._stale:
            self.load_names()

    def load_names(self) -> None:
        d, names = self.d, self.names
        names.clear()
        self.mid = None  # looked up again: the transaction that added it may be undone
        for sid, node, stream in d.execute("SELECT sid, node, stream FROM streams ORDER BY sid"):
            names.add_stream(sid, d.unescape(node), d.unescape(stream))
        for jid, job in d.execute("SELECT jid, job FROM jobs"):
            names.add_job(jid, d.unescape(job))
        self._stale = False

    def write(self, work: Callable[[], T], what: str) -> T:
        """``work()`` in one write transaction, committed before returning; run again
        (names reloaded) after a conflict, up to RETRIES times."""
        last: Exception | None = None
        for attempt in range(RETRIES):
            try:
                return self.d.transaction(lambda: (self.refresh(), work())[1], what)
            except Retry as e:
                log.warning("store retry db=%s what=%r attempt=%d reason=%s", self.name, what,
                            attempt + 1, e)
                self._stale, last = True, e
            except BaseException:
                self._stale = True  # undo names added by the rolled-back work
                raise
        raise StoreError(f"{self.name}: {what} failed {RETRIES} times: {last}")

    # --- ingest ---------------------------------------------------------------------

    def high_seq(self, node: str, stream: str) -> int | None:
        """The highest seq stored for (node, stream), None when none is."""
        d = self.d
        with d.errors("high_seq"):
            row = d.execute("SELECT high_seq FROM streams WHERE node = ? AND stream = ?",
                            (d.escape(node), d.escape(stream))).fetchone()
        return None if row is None else row[0]

    def insert(self, records: Sequence[Record]) -> int:
        """Store records durably (committed on return); return how many were new."""
        batches = []
        for (node, stream), group in groupby(records, _node_stream):
            group = list(group)
            batches.append((node, stream, list(map(_seq_of, group)),
                            {c: list(map(get, group)) for c, get in zip(COLUMNS, _column_getters)}))
        return sum(self._insert_many(batches)) if batches else 0

    def insert_columns(self, node: str, stream: str, seqs: Sequence[int],
                       cols: dict[str, Sequence[Any]]) -> int:
        """insert() for one wire batch as columns (firstfault/wire.py BatchColumns): record
        i is seqs[i] and cols[c][i] for every c in COLUMNS; no Record objects built."""
        return self._insert_many([(node, stream, seqs, cols)])[0]

    def insert_columns_many(self, batches: Sequence[tuple]) -> list[int]:
        """insert_columns of several (node, stream, seqs, cols) in one transaction: all
        committed on return, or none; per batch the number of new records."""
        return self._insert_many(batches)

    def _insert_many(self, batches: Sequence[tuple]) -> list[int]:
        full = [b for b in batches if len(b[2])]
        if not full:
            return [0] * len(batches)
        for node, stream, _, _ in full:
            if (node, stream) not in self.names.sids:
                self._ingest.new_stream(node, stream)
        n = sum(len(b[2]) for b in full)
        news = iter(self.write(lambda: self._ingest.insert(full), f"insert of {n} records"))
        return [next(news) if len(b[2]) else 0 for b in batches]

    # --- reads, marks, retention (read.py, marking.py, prune.py) ----------------------

    def records(self, sel: Selection) -> Iterator[Record]:
        """Matching records ordered by (t_ns, node, stream, seq), streamed.

        ValueError for a value out of range or a negative ``limit`` (raised here, not
        on the first next())."""
        return self._reader.records(sel)

    def needed(self, sel: Selection, marker: str) -> Iterator[Record]:
        """base.Store.needed: of blocks marked by ``marker`` and wholly inside the
        selection's window, only their marked records; every other block in full."""
        return self._reader.needed(sel, marker)

    def mark_pending(self, max_records: int = marking.MARK_STEP_RECORDS) -> int:
        """Mark blocks stored unmarked (marking.py); how many were."""
        return marking.mark_pending(self, max_records)

    def prune(self, *, max_age_s: float | None, max_bytes: int | None) -> int:
        """Delete records older than max_age_s (by t_ns), then the oldest until
        used_bytes() is at most max_bytes; return how many records went. Clock
        estimates older than max_age_s go too, but each node's latest stays."""
        return self._pruner.prune(max_age_s=max_age_s, max_bytes=max_bytes)

    def used_bytes(self) -> int:
        """What the records take, as the dialect counts it (what max_bytes bounds)."""
        with self.d.errors("used_bytes"):
            return self.d.used_bytes()

    # --- jobs and clocks ----------------------------------------------------------------

    def jobs(self) -> list[JobInfo]:
        """Every job the records name, newest (latest first record) first."""
        d = self.d
        nodes, ranks = defaultdict(list), defaultdict(list)
        with d.errors("jobs"):
            for jid, node in d.execute("SELECT jid, node FROM job_nodes"):
                nodes[jid].append(d.unescape(node))
            for jid, rank in d.execute("SELECT jid, rank FROM job_ranks"):
                ranks[jid].append(rank)
            rows = d.execute("SELECT jid, job, first_ns, last_ns, records, failed FROM jobs "
                             "WHERE records > 0").fetchall()
        infos = [self._job_info(row, nodes[row[0]], ranks[row[0]]) for row in rows]
        return sorted(infos, key=lambda j: (-j.first_ns, j.job))

    def job(self, job: str) -> JobInfo | None:
        d = self.d
        with d.errors(f"job {job!r}"):
            row = d.execute("SELECT jid, job, first_ns, last_ns, records, failed FROM jobs "
                            "WHERE job = ? AND records > 0", (d.escape(job),)).fetchone()
            if row is None:
                return None
            nodes = [d.unescape(n) for (n,) in d.execute(
                "SELECT node FROM job_nodes WHERE jid = ?", (row[0],))]
            ranks = [r for (r,) in d.execute("SELECT rank FROM job_ranks WHERE jid = ?", (row[0],))]
        return self._job_info(row, nodes, ranks)

    def _job_info(self, row: tuple, nodes: list[str], ranks: list[int]) -> JobInfo:
        _, job, first_ns, last_ns, count, failed = row
        return JobInfo(job=self.d.unescape(job), first_ns=first_ns, last_ns=last_ns,
                       nodes=tuple(sorted(nodes)), ranks=tuple(sorted(ranks)), records=count,
                       status=job_status(self.now_ns(), last_ns, bool(failed)))

    def save_clock(self, clock: NodeClock) -> None:
        self.write(lambda: self.d.execute(
            "INSERT INTO node_clocks (node, measured_ns, offset_ns, uncertainty_ns) "
            "VALUES (?, ?, ?, ?)", (self.d.escape(clock.node), clock.measured_ns,
                                    clock.offset_ns, clock.uncertainty_ns)),
            f"save_clock of node={clock.node}")

    def clocks(self) -> dict[str, NodeClock]:
        """The latest clock estimate of every node."""
        d = self.d
        with d.errors("clocks"):
            rows = d.execute("SELECT node, offset_ns, uncertainty_ns, measured_ns FROM node_clocks c "
                             "WHERE measured_ns = (SELECT max(measured_ns) FROM node_clocks l "
                             "WHERE l.node = c.node)").fetchall()
        return {d.unescape(node): NodeClock(d.unescape(node), offset, unc, measured)
                for node, offset, unc, measured in rows}

    # --- life cycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent); later calls raise StoreError."""
        self.d.close()

    def __enter__(self) -> BlockStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
