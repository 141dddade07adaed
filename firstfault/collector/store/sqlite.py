"""SqliteStore: the collector's embedded default store, one SQLite file (stdlib sqlite3).

The file (with its ``-wal`` and ``-shm``) holds every record the agents shipped, the
jobs derived from them and the nodes' clock estimates. It implements the Store
protocol of base.py, plus ``insert_columns`` (the ingest server's fast path: a
wire batch's columns, no Record objects; with wire.PackedColumns, their bytes kept as
they came), ``insert_columns_many`` (several in one transaction: the server's group
commit), ``needed`` (a report's records) and ``mark_pending`` (marks for blocks
stored unmarked, when the server is idle: sqlite_marks.py).

Schema (version ``len(MIGRATIONS)`` = 3, kept in ``PRAGMA user_version``; ``PRAGMA
application_id`` is 0x66666c74, "fflt"; sqlite_schema.py has the DDL and migrations)
    streams(sid, node, stream, high_seq, free_first_ns, free_last_ns)
        one row per agent stream. high_seq: the highest seq ever stored; prune never
        lowers it, so pruned records are not resent. free_*: bounds of the t_ns of
        the stream's records without a job (stale-low after prune, never too high).
    blocks(bid, sid, jid, seq_lo, seq_hi, t_lo, t_hi, n, ranks, seqs, data, idx)
        records of one stream and one job (jid NULL: no job: kernel, cgroup, GPU
        records) from one insert, in (t_ns, seq) order (blocks.py is the layout):
        a batch's main job keeps the frame's column bytes as its data, untouched.
        t_ns = occurred_ns if known, else observed_ns. One row and three small index
        entries per block, not per record: what takes the store past a row's cost
        (bench/RESULTS.md).
          blocks_seq  (sid, seq_hi)                   resends' idempotency look-ups
          blocks_job  (jid, t_lo)                     a job's blocks in time order
          blocks_free (sid, t_lo) WHERE jid IS NULL   a stream's jobless blocks
    marks(bid, mid, seqs, data): the records of block bid that the marker ``mid``
        chose for reports, packed alike (sqlite_marks.py). A block is marked as it
        is inserted (by every insert method) when the store has a marker; else, or
        when it came from a version 1 or unmarked version 2 file, its bid waits in
        ``pending(bid)`` for mark_pending. A block marked by another marker (an
        older catalog) is not marked again: reports read it whole.
    markers(mid, name): the markers that marked blocks, by name.
    jobs(jid, job, first_ns, last_ns, records, failed), job_nodes(jid, node),
    job_ranks(jid, rank): derived on insert, one update per job per batch.
    node_clocks(node, measured_ns, offset_ns, uncertainty_ns): every estimate.

Invariants
    * (node, stream, seq) is stored at most once (the first content wins); a resend
      inserts nothing and ``insert`` counts only new records. Records above a
      stream's high_seq are new by construction; those at or below it (resends,
      late fills, seq lists with holes) are looked up in the stream's blocks whose
      [seq_lo, seq_hi] reaches them (blocks_seq) before anything is written.
    * jobs.records = the job's records, first_ns <= its earliest t_ns, last_ns = its
      latest (prune may leave last_ns, nodes and ranks of deleted records: enough
      for listing). failed: a ``rank.traceback`` record, or a ``proc.exit`` whose
      fields say it failed (store/shared.py has the rule, the same for both backends).
    * A job selects its records plus the jobless records of the nodes that sent its
      records, within [first_ns - 10 min, last_ns + 10 min]. Selections' since/until
      are inclusive; a rank filter drops records without a rank; grep is Python's
      re.search. Order: (t_ns, node, stream, seq), merged in Python from the blocks,
      each read when the merge reaches its t_lo (sqlite_read.py): no sort, nothing
      loaded whole. Building the Record objects is most of a read's cost.

Durability (``power_safe``)
    journal_mode=WAL. With synchronous=NORMAL, the default, COMMIT write(2)s the
    transaction's pages to the WAL and returns without fsync. The kernel's page
    cache outlives the process, so a kill -9, OOM kill or crash of the collector
    loses nothing ``insert`` returned for (the next open replays the WAL): the
    Store's contract, tested by SIGKILLing a writer (tests, slow). A power loss or
    kernel crash can lose the transactions since the last checkpoint's fsync (never
    corrupt: WAL frames are checksummed and a torn tail is dropped); agents have
    then dropped those acked records. ``power_safe=True`` sets synchronous=FULL:
    every commit fsyncs the WAL (slower inserts: bench/RESULTS.md).

Space
    Pages of 16 KiB (new files). ``prune(max_bytes=)`` bounds the live pages,
    page_count - freelist_count. There is no auto_vacuum (it costs every insert):
    freed pages go on the freelist and new blocks reuse them, so the file stays
    near its high-water mark and stops growing; ``VACUUM`` offline to shrink it.
    The WAL is checkpointed every WAL_AUTOCHECKPOINT pages and cut back to
    JOURNAL_SIZE_LIMIT after.

Threads
    One connection per store object (check_same_thread=False): any thread may call
    it, one call at a time, as base.py says (the server runs it on one worker
    thread). For concurrent reading open a second SqliteStore on the same file: WAL
    readers do not block the writer; each store reloads its stream and job names
    when another connection has committed (PRAGMA data_version). An iterator from
    ``records`` reads one block at a time; blocks committed meanwhile may or may
    not appear, blocks pruned meanwhile are skipped.

Known issues
    A job's window and its "running" status use record times as the nodes' clocks
    give them (not clock-corrected). Opening does not run integrity_check (it reads
    the whole file). Small batches make small blocks (a row each): at a trickle of
    records the store costs what a row per record did.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from itertools import groupby, islice, repeat
from operator import attrgetter, lt
from pathlib import Path
from typing import Any

from firstfault.collector.store.base import JobInfo, Marker, NodeClock, StoreError
from firstfault.collector.store.blocks import COLUMNS, block_seqs, make_blocks, times
from firstfault.collector.store.shared import failed_jobs, job_status
from firstfault.collector.store.sqlite_marks import Marking
from firstfault.collector.store.sqlite_prune import Pruning
from firstfault.collector.store.sqlite_read import Reading
from firstfault.collector.store.sqlite_schema import INSERT_BLOCK, INSERT_MARKS, MIGRATIONS, block_row
from firstfault.wire import Record

__all__ = ["COLUMNS", "MIGRATIONS", "SqliteStore"]

log = logging.getLogger(__name__)

APPLICATION_ID = 0x66666C74  # "fflt"
PAGE_SIZE = 16384  # new files: ~10% cheaper inserts than 4 KiB pages (bench/RESULTS.md)
WAL_AUTOCHECKPOINT = 1024  # pages (16 MiB)
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024
MIN_SQLITE = (3, 8, 3)  # partial indexes, WITHOUT ROWID

_column_getters = tuple(map(attrgetter, COLUMNS))
_node_stream = attrgetter("node", "stream")
_seq_of = attrgetter("seq")


class SqliteStore(Reading, Pruning, Marking):
    """The Store protocol (base.py) on one SQLite file; see the module docstring."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0,
                 power_safe: bool = False, cache_mib: int = 64,
                 now_ns: Callable[[], int] = time.time_ns, marker: Marker | None = None) -> None:
        """Open (creating or migrating) the store at ``path``; StoreError if it can not be.

        busy_timeout_s: how long to wait for another connection's write lock.
        power_safe: synchronous=FULL, so commits survive a power loss, not only a
        kill of the process. cache_mib: SQLite page cache. now_ns: the clock for
        job status and prune ages (tests). marker: marks at insert what a report
        will read (base.Marker; firstfault/analysis/reads.py), None for no marks."""
        self.path = str(path)
        self._marker = marker
        self._mid: int | None = None  # the marker's id in this file, once it marked a block
        self._now_ns = now_ns
        self._streams: dict[int, tuple[str, str]] = {}  # sid -> (node, stream)
        self._sids: dict[tuple[str, str], int] = {}
        self._node_sids: dict[str, list[int]] = defaultdict(list)
        self._high: dict[int, int | None] = {}  # sid -> high_seq
        self._jobs: dict[int, str] = {}  # jid -> job
        self._jids: dict[str, int] = {}
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise StoreError(f"SQLite {sqlite3.sqlite_version} is too old for the store "
                             f"(needs {'.'.join(map(str, MIN_SQLITE))} or newer)")
        try:
            self._db: sqlite3.Connection | None = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None,
                check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: can not open the store: {e}") from e
        try:
            self._open(power_safe, cache_mib)
        except BaseException as e:
            self._db.close()
            self._db = None
            if isinstance(e, sqlite3.DatabaseError):
                raise StoreError(f"{self.path}: not a usable SQLite database ({e}); move "
                                 "it aside and start with a new file") from e
            if isinstance(e, sqlite3.Error):
                raise StoreError(f"{self.path}: can not open the store: {e}") from e
            raise

    # --- open and migrate ----------------------------------------------------------

    def _open(self, power_safe: bool, cache_mib: int) -> None:
        db = self._db
        assert db is not None
        self._check_version(db)  # before anything writes: refuse a foreign file
        db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # takes effect on a new file only
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StoreError(f"{self.path}: SQLite can not use WAL here (journal mode "
                             f"{mode}); put the store on a local filesystem")
        db.execute(f"PRAGMA synchronous={'FULL' if power_safe else 'NORMAL'}")
        db.execute(f"PRAGMA cache_size={-1024 * int(cache_mib)}")
        db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT}")
        db.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
        self._migrate(db)
        self._data_version = db.execute("PRAGMA data_version").fetchone()[0]
        self._load_names()

    def _check_version(self, db: sqlite3.Connection) -> int:
        app = db.execute("PRAGMA application_id").fetchone()[0]
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if app not in (0, APPLICATION_ID) or (app == 0 and version):
            raise StoreError(f"{self.path}: not a firstfault store (SQLite application_id "
                             f"{app:#x}, user_version {version}); choose another path")
        if version > len(MIGRATIONS):
            raise StoreError(f"{self.path}: the store has schema version {version}, written "
                             f"by a newer firstfault; this one knows versions up to "
                             f"{len(MIGRATIONS)}: upgrade firstfault")
        if version == 0 and db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise StoreError(f"{self.path}: holds tables of another program, not a firstfault "
                             "store; choose another path")
        return version

    def _migrate(self, db: sqlite3.Connection) -> None:
        if db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS):
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            version = self._check_version(db)  # another process may have migrated
            for i in range(version, len(MIGRATIONS)):
                log.info("store migrate path=%s from=%d to=%d", self.path, i, i + 1)
                MIGRATIONS[i](db)
            db.execute(f"PRAGMA user_version={len(MIGRATIONS)}")
            db.execute(f"PRAGMA application_id={APPLICATION_ID}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _load_names(self) -> None:
        """Streams and jobs by id (they change only by inserts and prunes)."""
        db = self._conn()
        for names in (self._streams, self._sids, self._node_sids, self._high, self._jobs,
                      self._jids):
            names.clear()  # in place: running iterators hold these dicts
        self._mid = None
        for sid, node, stream, high in db.execute(
                "SELECT sid, node, stream, high_seq FROM streams ORDER BY sid"):
            self._add_stream(sid, node, stream, high)
        self._jobs.update(db.execute("SELECT jid, job FROM jobs"))
        self._jids.update((job, jid) for jid, job in self._jobs.items())

    def _add_stream(self, sid: int, node: str, stream: str, high: int | None) -> None:
        self._streams[sid] = (node, stream)
        self._sids[(node, stream)] = sid
        self._node_sids[node].append(sid)
        self._high[sid] = high

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"{self.path}: the store is closed")
        return self._db

    def _refresh(self) -> None:
        """Reload the names when another connection has committed since we looked."""
        v = self._conn().execute("PRAGMA data_version").fetchone()[0]
        if v != self._data_version:
            self._data_version = v
            self._load_names()

    @contextmanager
    def _sql(self, what: str) -> Iterator[None]:
        """SQLite's errors as StoreError naming the file and what failed."""
        try:
            yield
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: {what} failed: {e}") from e

    def _write(self, work: Callable[[], Any], what: str) -> Any:
        """``work()`` in one write transaction, committed before returning."""
        db = self._conn()
        with self._sql(what):
            db.execute("BEGIN IMMEDIATE")
            try:
                self._refresh()
                result = work()
                db.execute("COMMIT")
                return result
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                self._load_names()  # undo names added by the rolled-back work
                raise

    # --- ingest --------------------------------------------------------------------

    def high_seq(self, node: str, stream: str) -> int | None:
        with self._sql("high_seq"):
            self._refresh()
        sid = self._sids.get((node, stream))
        return None if sid is None else self._high[sid]

    def insert(self, records: Sequence[Record]) -> int:
        """Store records durably (committed on return); return how many were new."""
        if not records:
            return 0

        def work() -> int:
            new = 0
            for (node, stream), group in groupby(records, _node_stream):
                group = list(group)
                cols = {c: list(map(get, group)) for c, get in zip(COLUMNS, _column_getters)}
                new += self._insert_columns(node, stream, list(map(_seq_of, group)), cols)
            return new
        return self._write(work, f"insert of {len(records)} records")

    def insert_columns(self, node: str, stream: str, seqs: Sequence[int],
                       cols: dict[str, Sequence[Any]]) -> int:
        """insert() for one wire batch as columns (firstfault/wire.py BatchColumns): record
        i is seqs[i] and cols[c][i] for every c in COLUMNS; no Record objects built."""
        if not len(seqs):
            return 0
        return self._write(lambda: self._insert_columns(node, stream, seqs, cols),
                           f"insert of {len(seqs)} records of node={node} stream={stream}")

    def insert_columns_many(self, batches: Sequence[tuple]) -> list[int]:
        """insert_columns of several (node, stream, seqs, cols) in one transaction (the
        ingest server's group commit): all committed on return, or none; new counts."""
        return self._write(lambda: [self._insert_columns(*b) if len(b[2]) else 0
                                    for b in batches], f"insert of {len(batches)} batches")

    def _insert_columns(self, node: str, stream: str, seqs: Sequence[int],
                        cols: dict[str, Sequence[Any]]) -> int:
        db = self._conn()
        sid = self._sids.get((node, stream))
        if sid is None:
            sid = db.execute("INSERT INTO streams (node, stream) VALUES (?, ?)",
                             (node, stream)).lastrowid
            self._add_stream(sid, node, stream, None)
        high = self._high[sid]
        floor = -1 if high is None else high
        packed = getattr(cols, "packed", None)  # wire.PackedColumns: the frame's bytes
        if not (seqs[0] > floor and (isinstance(seqs, range)
                                     or all(map(lt, seqs, islice(seqs, 1, None))))):
            seqs, cols = self._only_new(sid, floor, seqs, cols)
            if not seqs:
                return 0
            packed = None
        kind, fields, job = cols["kind"], cols["fields"], cols["job"]
        failed = failed_jobs(kind, fields, job)
        blocks = make_blocks(seqs, cols, times(cols), packed)
        mid = self._marker_id() if self._marker is not None else None
        per_job: dict[str, list] = {}  # job -> [first, last, count, ranks]
        free = []
        for b in blocks:
            if mid is not None:
                self._mark(b)
            if b.job is None:
                free.append(b.bounds()[2:])
                continue
            _, _, t_lo, t_hi = b.bounds()
            agg = per_job.get(b.job)
            if agg is None:
                per_job[b.job] = [t_lo, t_hi, b.n, b.ranks()]
            else:
                agg[0], agg[1], agg[2] = min(agg[0], t_lo), max(agg[1], t_hi), agg[2] + b.n
                agg[3] |= b.ranks()
        jid_of = {j: self._job_add(j, node, first, last, count, ranks, j in failed)
                  for j, (first, last, count, ranks) in per_job.items()}
        jid_of[None] = None
        for b in blocks:
            bid = db.execute(INSERT_BLOCK, block_row(sid, jid_of[b.job], b)).lastrowid
            if mid is not None:
                db.execute(INSERT_MARKS, (bid, mid, *b.marked_rows()))
            else:
                db.execute("INSERT INTO pending (bid) VALUES (?)", (bid,))
        top = max(floor, seqs[-1])
        db.execute("UPDATE streams SET high_seq = ? WHERE sid = ?", (top, sid))
        self._high[sid] = top
        if free:
            lo, hi = min(f[0] for f in free), max(f[1] for f in free)
            db.execute("UPDATE streams SET free_first_ns = min(coalesce(free_first_ns, ?), ?), "
                       "free_last_ns = max(coalesce(free_last_ns, ?), ?) WHERE sid = ?",
                       (lo, lo, hi, hi, sid))
        return len(seqs)

    def _only_new(self, sid: int, floor: int, seqs: Sequence[int],
                  cols: dict[str, Sequence[Any]]) -> tuple[list[int], dict[str, list[Any]]]:
        """The records of a batch not stored yet, first of duplicates kept, by seq."""
        first: dict[int, tuple] = {}
        for row in zip(seqs, *(cols[c] for c in COLUMNS)):
            first.setdefault(row[0], row)
        old = sorted(s for s in first if s <= floor)
        have: set[int] = set()
        if old:
            for seqs_data, idx, n in self._conn().execute(
                    "SELECT seqs, idx, n FROM blocks INDEXED BY blocks_seq WHERE sid = ? AND "
                    "seq_hi >= ? AND seq_lo <= ?", (sid, old[0], old[-1])):
                have.update(block_seqs(seqs_data, idx, n))
        keep = [first[s] for s in sorted(first) if s not in have]
        if not keep:
            return [], {}
        columns = list(map(list, zip(*keep)))
        return columns[0], dict(zip(COLUMNS, columns[1:]))

    def _job_add(self, job: str, node: str, first_ns: int, last_ns: int, count: int,
                 ranks: set[int], failed: bool) -> int:
        """Add a batch's aggregate to a job (created if new); its jid."""
        db = self._conn()
        jid = self._jids.get(job)
        if jid is None:
            jid = db.execute("INSERT INTO jobs (job, first_ns, last_ns, records, failed) "
                             "VALUES (?, ?, ?, ?, ?)",
                             (job, first_ns, last_ns, count, int(failed))).lastrowid
            self._jids[job], self._jobs[jid] = jid, job
        else:
            db.execute("UPDATE jobs SET first_ns = min(first_ns, ?), last_ns = max(last_ns, ?), "
                       "records = records + ?, failed = max(failed, ?) WHERE jid = ?",
                       (first_ns, last_ns, count, int(failed), jid))
        db.execute("INSERT OR IGNORE INTO job_nodes (jid, node) VALUES (?, ?)", (jid, node))
        if ranks:
            db.executemany("INSERT OR IGNORE INTO job_ranks (jid, rank) VALUES (?, ?)",
                           zip(repeat(jid), ranks))
        return jid

    # --- jobs and clocks -----------------------------------------------------------

    def jobs(self) -> list[JobInfo]:
        """Every job the records name, newest (latest first record) first."""
        db = self._conn()
        nodes, ranks = defaultdict(list), defaultdict(list)
        with self._sql("jobs"):
            for jid, node in db.execute("SELECT jid, node FROM job_nodes ORDER BY jid, node"):
                nodes[jid].append(node)
            for jid, rank in db.execute("SELECT jid, rank FROM job_ranks ORDER BY jid, rank"):
                ranks[jid].append(rank)
            rows = db.execute("SELECT jid, job, first_ns, last_ns, records, failed FROM jobs "
                              "ORDER BY first_ns DESC, job").fetchall()
        return [self._job_info(row, nodes[row[0]], ranks[row[0]]) for row in rows]

    def job(self, job: str) -> JobInfo | None:
        db = self._conn()
        with self._sql(f"job {job!r}"):
            row = db.execute("SELECT jid, job, first_ns, last_ns, records, failed FROM jobs "
                             "WHERE job = ?", (job,)).fetchone()
            if row is None:
                return None
            nodes = [n for (n,) in db.execute(
                "SELECT node FROM job_nodes WHERE jid = ? ORDER BY node", (row[0],))]
            ranks = [r for (r,) in db.execute(
                "SELECT rank FROM job_ranks WHERE jid = ? ORDER BY rank", (row[0],))]
        return self._job_info(row, nodes, ranks)

    def _job_info(self, row: tuple, nodes: list[str], ranks: list[int]) -> JobInfo:
        _, job, first_ns, last_ns, count, failed = row
        status = job_status(self._now_ns(), last_ns, bool(failed))
        return JobInfo(job=job, first_ns=first_ns, last_ns=last_ns, nodes=tuple(nodes),
                       ranks=tuple(ranks), records=count, status=status)

    def save_clock(self, clock: NodeClock) -> None:
        self._write(lambda: self._conn().execute(
            "INSERT INTO node_clocks (node, measured_ns, offset_ns, uncertainty_ns) "
            "VALUES (?, ?, ?, ?)",
            (clock.node, clock.measured_ns, clock.offset_ns, clock.uncertainty_ns)),
            f"save_clock of node={clock.node}")

    def clocks(self) -> dict[str, NodeClock]:
        """The latest clock estimate of every node."""
        # SQLite: with max(), the bare columns come from the row holding the max.
        with self._sql("clocks"):
            rows = self._conn().execute(
                "SELECT node, offset_ns, uncertainty_ns, max(measured_ns) FROM node_clocks "
                "GROUP BY node").fetchall()
        return {node: NodeClock(node, offset, unc, measured)
                for node, offset, unc, measured in rows}

    # --- life cycle ----------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent); later calls raise StoreError."""
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
