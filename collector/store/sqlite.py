"""SqliteStore: the collector's embedded default store, one SQLite file (stdlib sqlite3).

The file (with its ``-wal`` and ``-shm``) holds every record the agents shipped, the
jobs derived from them and the nodes' clock estimates. It implements the Store
protocol of base.py, plus ``insert_columns`` (the ingest server's fast path: a
wire batch's columns, no Record objects).

Schema (version 1 = ``len(MIGRATIONS)``, kept in ``PRAGMA user_version``;
``PRAGMA application_id`` is 0x66666c74, "fflt")
    streams(sid, node, stream, high_seq, free_first_ns, free_last_ns)
        one row per agent stream. high_seq: the highest seq ever stored; prune never
        lowers it, so pruned records are not resent. free_*: bounds of the t_ns of
        the stream's records without a job (stale-low after prune, never too high).
    records(id, sid, seq, t_ns, jid, rank, source, kind, message, occurred_ns,
            observed_ns, boot_id, mono_ns, local_rank, pid, severity, fields)
        one row per Record, id = insertion order. t_ns = occurred_ns if known, else
        observed_ns. jid NULL: no job (kernel, cgroup, GPU records). fields: a
        msgpack map, NULL when empty. Indexes, nothing more (each one costs inserts,
        see bench/RESULTS.md):
          records_key  UNIQUE (sid, seq)   the idempotency key (node, stream, seq)
          records_job  (jid, t_ns, rank)   a job's records in time order; a rank
                                           filter is answered from the index entries
          records_free (sid, t_ns, seq) WHERE jid IS NULL   a node's jobless records
                                           in time order (partial: rank lines cost
                                           nothing here)
    jobs(jid, job, first_ns, last_ns, records, failed), job_nodes(jid, node),
    job_ranks(jid, rank): derived on insert, one update per job per batch.
    node_clocks(node, measured_ns, offset_ns, uncertainty_ns): every estimate.
    Example: agent/wire.py's batch record (gpu-07, stream 3f2a9c, seq 812) is the row
        (sid of gpu-07/3f2a9c, 812, 1796206319782000000, jid of "12345", 0, 'ranklog',
         'rank.line', '[2026-12-02 10:11:59,782] [INFO] ... is about to be saved!',
         1796206319782000000, 1796206319790113000, NULL, NULL, 0, 24211, 6, NULL)

Invariants
    * (node, stream, seq) is stored at most once (the first content wins); a resend
      inserts nothing and ``insert`` counts only new rows. Records above a stream's high_seq are new by
      construction; those at or below it (resends, late fills) are looked up first.
    * jobs.records = the job's rows, first_ns <= its earliest t_ns, last_ns = its
      latest (prune may leave last_ns, nodes and ranks of deleted rows: enough for
      listing). failed: a ``rank.traceback`` record, or a ``proc.exit`` whose fields
      hold a non-zero int under one of EXIT_CODE_KEYS or a non-empty ``signal``.
    * A job selects its records plus the jobless records of the nodes that sent its
      records, within [first_ns - 10 min, last_ns + 10 min]. Selections' since/until
      are inclusive; a rank filter drops records without a rank; grep is Python's
      re.search, run inside SQLite (a REGEXP function) so that rows that do not
      match are never built. Order: (t_ns, node, stream, seq), merged in Python from
      index scans that SQLite returns in t_ns order (one per job, one per stream for
      jobless records, each opened when the merge reaches its first time): no sort,
      nothing loaded whole. Building the Record objects is most of a read's cost.

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
    Pages of 16 KiB (new files): inserts cost ~10% less than with 4 KiB pages.
    ``prune(max_bytes=)`` bounds the live pages, page_count - freelist_count. There
    is no auto_vacuum (it costs every insert): freed pages go on the freelist and
    new records reuse them, so the file stays near its high-water mark and stops
    growing; ``VACUUM`` offline to shrink it. The WAL is checkpointed every
    WAL_AUTOCHECKPOINT pages and cut back to JOURNAL_SIZE_LIMIT after.

Threads
    One connection per store object (check_same_thread=False): any thread may call
    it, one call at a time, as base.py says (the server runs it on one worker
    thread). For concurrent reading open a second SqliteStore on the same file: WAL
    readers do not block the writer; each store reloads its stream and job names
    when another connection has committed (PRAGMA data_version). An iterator from
    ``records`` holds its read statements until exhausted or closed; rows committed
    meanwhile may or may not appear.

Known issues
    A job's window and its "running" status use record times as the nodes' clocks
    give them (not clock-corrected). Opening does not run integrity_check (it reads
    the whole file). At ~850 lines this module is past the house size: the read
    side (_merge, _sources, _scan) would split off cleanly.
"""

from __future__ import annotations

import functools
import heapq
import logging
import math
import re
import sqlite3
import time
from collections import defaultdict, deque
from contextlib import contextmanager
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import compress, groupby, islice, repeat
from operator import attrgetter, eq, is_, itemgetter, lt
from pathlib import Path
from typing import Any

import msgpack

from agent.wire import KIND_PROC_EXIT, KIND_RANK_TRACEBACK, Record

from .base import JobInfo, NodeClock, Selection, StoreError

log = logging.getLogger(__name__)

APPLICATION_ID = 0x66666C74  # "fflt"
JOB_MARGIN_NS = 10 * 60 * 10**9  # jobless records this close to a job belong to it
RUNNING_NS = 60 * 10**9  # a job with a record this recent is running
EXIT_CODE_KEYS = ("exitcode", "exit_code", "code", "returncode")
PRUNE_CHUNK = 50_000  # rows deleted per transaction
PAGE_SIZE = 16384  # new files: ~10% cheaper inserts than 4 KiB pages (bench/RESULTS.md)
WAL_AUTOCHECKPOINT = 1024  # pages (16 MiB)
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024
MIN_SQLITE = (3, 8, 3)  # partial indexes, WITHOUT ROWID, deterministic functions
_IN_MAX = 500  # longer IN lists are filtered in Python (old SQLite allows 999 variables)
_T_MIN, _T_MAX = -(2**63), 2**63 - 1

# Record columns in wire order (agent/wire.py), as insert_columns takes them.
COLUMNS = ("source", "kind", "message", "occurred_ns", "observed_ns", "boot_id", "mono_ns",
           "job", "rank", "local_rank", "pid", "severity", "fields")
_column_getters = tuple(map(attrgetter, COLUMNS))
_node_stream = attrgetter("node", "stream")
_seq_of = attrgetter("seq")
_pack = msgpack.Packer().pack
_FAIL_KINDS = frozenset((KIND_RANK_TRACEBACK, KIND_PROC_EXIT))

_SCHEMA_V1 = """
CREATE TABLE streams (
    sid INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    stream TEXT NOT NULL,
    high_seq INTEGER,
    free_first_ns INTEGER,
    free_last_ns INTEGER,
    UNIQUE (node, stream));
CREATE TABLE records (
    id INTEGER PRIMARY KEY,
    sid INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    t_ns INTEGER NOT NULL,
    jid INTEGER,
    rank INTEGER,
    source TEXT NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL,
    occurred_ns INTEGER,
    observed_ns INTEGER NOT NULL,
    boot_id TEXT,
    mono_ns INTEGER,
    local_rank INTEGER,
    pid INTEGER,
    severity INTEGER NOT NULL,
    fields BLOB);
CREATE UNIQUE INDEX records_key ON records (sid, seq);
CREATE INDEX records_job ON records (jid, t_ns, rank);
CREATE INDEX records_free ON records (sid, t_ns, seq) WHERE jid IS NULL;
CREATE TABLE jobs (
    jid INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL UNIQUE,
    first_ns INTEGER NOT NULL,
    last_ns INTEGER NOT NULL,
    records INTEGER NOT NULL,
    failed INTEGER NOT NULL);
CREATE TABLE job_nodes (jid INTEGER NOT NULL, node TEXT NOT NULL,
    PRIMARY KEY (jid, node)) WITHOUT ROWID;
CREATE TABLE job_ranks (jid INTEGER NOT NULL, rank INTEGER NOT NULL,
    PRIMARY KEY (jid, rank)) WITHOUT ROWID;
CREATE TABLE node_clocks (
    node TEXT NOT NULL,
    measured_ns INTEGER NOT NULL,
    offset_ns INTEGER NOT NULL,
    uncertainty_ns INTEGER NOT NULL);
CREATE INDEX node_clocks_node ON node_clocks (node, measured_ns);
"""


def _run_script(db: sqlite3.Connection, script: str) -> None:
    """Each statement of ``script`` (executescript would COMMIT the migration)."""
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _v1(db: sqlite3.Connection) -> None:
    _run_script(db, _SCHEMA_V1)


# Applied in order at open, all in one transaction; never edit a released one,
# append a new one (the schema version is len(MIGRATIONS)).
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1]

_INSERT = ("INSERT OR IGNORE INTO records (sid, seq, t_ns, jid, rank, source, kind, message, "
           "occurred_ns, observed_ns, boot_id, mono_ns, local_rank, pid, severity, fields) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_SELECT = ("SELECT t_ns, sid, seq, jid, rank, source, kind, message, occurred_ns, observed_ns, "
           "boot_id, mono_ns, local_rank, pid, severity, fields FROM records ")


def _is_failure(kind: str, fields: dict) -> bool:
    if kind == KIND_RANK_TRACEBACK:
        return True
    if kind != KIND_PROC_EXIT:
        return False
    if any(type(fields.get(k)) is int and fields[k] != 0 for k in EXIT_CODE_KEYS):
        return True
    return bool(fields.get("signal"))


@functools.lru_cache(maxsize=64)
def _regex(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def _regexp(pattern: str, text: str) -> bool:
    """SQL ``text REGEXP pattern``: re.search (grep runs in SQLite: no row is built
    for a line that does not match)."""
    return _regex(pattern).search(text) is not None


def _in(column: str, values: Iterable[Any]) -> tuple[str, list[Any], set | None]:
    """(SQL condition, its parameters, or a set to filter in Python when too long)."""
    values = sorted(set(values))
    if len(values) > _IN_MAX:
        return "", [], set(values)
    return f" AND {column} IN ({', '.join('?' * len(values))})", values, None


def _merge(sources: list[tuple[int, Callable[[], Iterator[tuple]]]]) -> Iterator[tuple]:
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


class SqliteStore:
    """The Store protocol (base.py) on one SQLite file; see the module docstring."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0,
                 power_safe: bool = False, cache_mib: int = 64,
                 now_ns: Callable[[], int] = time.time_ns) -> None:
        """Open (creating or migrating) the store at ``path``; StoreError if it can not be.

        busy_timeout_s: how long to wait for another connection's write lock.
        power_safe: synchronous=FULL, so commits survive a power loss, not only a
        kill of the process. cache_mib: SQLite page cache. now_ns: the clock for
        job status and prune ages (tests)."""
        self.path = str(path)
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
        db.create_function("regexp", 2, _regexp, deterministic=True)
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
        """insert() for one wire batch as columns (agent/wire.py BatchColumns): record
        i is seqs[i] and cols[c][i] for every c in COLUMNS; no Record objects built."""
        if not len(seqs):
            return 0
        return self._write(lambda: self._insert_columns(node, stream, seqs, cols),
                           f"insert of {len(seqs)} records of node={node} stream={stream}")

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
        if not (seqs[0] > floor and (isinstance(seqs, range)
                                     or all(map(lt, seqs, islice(seqs, 1, None))))):
            seqs, cols = self._only_new(sid, floor, seqs, cols)
            if not seqs:
                return 0
        (source, kind, message, occurred, observed, boot_id, mono, job, rank, local_rank,
         pid, severity, fields) = (cols[c] for c in COLUMNS)
        n = len(seqs)
        t = occurred if None not in occurred else [
            b if o is None else o for o, b in zip(occurred, observed)]
        packed = repeat(None) if not any(fields) else [_pack(f) if f else None for f in fields]
        failed = set() if _FAIL_KINDS.isdisjoint(kind) else {
            job[i] for i, k in enumerate(kind) if k in _FAIL_KINDS and _is_failure(k, fields[i])}
        # One aggregate per job, by C-level passes over the columns (a batch holds a
        # job or two, and its node's jobless records).
        jobs = set(job)
        jid_of: dict[str | None, int | None] = {None: None}
        for j in jobs - {None}:
            if len(jobs) == 1:
                ts, ranks = t, rank
            else:
                mine = list(map(eq, job, repeat(j)))
                ts, ranks = list(compress(t, mine)), compress(rank, mine)
            jid_of[j] = self._job_add(j, node, min(ts), max(ts), len(ts), set(ranks),
                                      j in failed)
        jids = repeat(jid_of[job[0]]) if len(jobs) == 1 else map(jid_of.__getitem__, job)
        free = (t if jobs == {None} else list(compress(t, map(is_, job, repeat(None))))
                if None in jobs else ())
        new = db.executemany(_INSERT, zip(
            repeat(sid), seqs, t, jids, rank, source, kind, message, occurred, observed,
            boot_id, mono, local_rank, pid, severity, packed)).rowcount
        top = max(floor, seqs[-1])
        db.execute("UPDATE streams SET high_seq = ? WHERE sid = ?", (top, sid))
        self._high[sid] = top
        if free:
            lo, hi = min(free), max(free)
            db.execute("UPDATE streams SET free_first_ns = min(coalesce(free_first_ns, ?), ?), "
                       "free_last_ns = max(coalesce(free_last_ns, ?), ?) WHERE sid = ?",
                       (lo, lo, hi, hi, sid))
        if new != n:  # only if someone else wrote the rows under our feet: recount
            log.warning("store insert path=%s node=%s stream=%s expected=%d new=%d", self.path,
                        node, stream, n, new)
            db.execute("UPDATE jobs SET records = (SELECT count(*) FROM records r WHERE "
                       "r.jid = jobs.jid)")
        return new

    def _only_new(self, sid: int, floor: int, seqs: Sequence[int],
                  cols: dict[str, Sequence[Any]]) -> tuple[list[int], dict[str, list[Any]]]:
        """The records of a batch not stored yet, first of duplicates kept, by seq."""
        first: dict[int, tuple] = {}
        for row in zip(seqs, *(cols[c] for c in COLUMNS)):
            first.setdefault(row[0], row)
        old = sorted(s for s in first if s <= floor)
        have: set[int] = set()
        for i in range(0, len(old), _IN_MAX):
            chunk = old[i:i + _IN_MAX]
            marks = ", ".join("?" * len(chunk))
            have.update(s for (s,) in self._conn().execute(
                f"SELECT seq FROM records WHERE sid = ? AND seq IN ({marks})", (sid, *chunk)))
        keep = [first[s] for s in sorted(first) if s not in have]
        if not keep:
            return [], {}
        columns = list(map(list, zip(*keep)))
        return columns[0], dict(zip(COLUMNS, columns[1:]))

    def _job_add(self, job: str, node: str, first_ns: int, last_ns: int, count: int,
                 ranks: set[int | None], failed: bool) -> int:
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
        ranks.discard(None)
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
        status = ("running" if self._now_ns() - last_ns <= RUNNING_NS
                  else "failed" if failed else "ended")
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

    # --- reading -------------------------------------------------------------------

    def records(self, sel: Selection) -> Iterator[Record]:
        """Matching records ordered by (t_ns, node, stream, seq), streamed.

        ValueError for a bad ``grep`` or a negative ``limit`` (raised here, not on
        the first next())."""
        try:
            if sel.grep is not None:
                _regex(sel.grep)
        except re.error as e:
            raise ValueError(f"grep: bad regular expression {sel.grep!r}: {e}") from e
        if sel.limit is not None and sel.limit < 0:
            raise ValueError(f"limit: must be >= 0, got {sel.limit}")
        if sel.ranks is not None and not sel.ranks or sel.nodes is not None and not sel.nodes:
            return iter(())  # an empty filter matches nothing
        with self._sql("reading records"):
            self._refresh()
            sources = self._sources(sel)
        records = self._records(sources)
        return records if sel.limit is None else islice(records, sel.limit)

    def _records(self, sources: list) -> Iterator[Record]:
        jobs = self._jobs
        with self._sql("reading records"):
            for _, node, stream, seq, row in _merge(sources):
                (jid, rank, source, kind, message, occurred, observed, boot_id, mono,
                 local_rank, pid, severity, fields) = row[3:]
                if jid is not None and jid not in jobs:
                    self._load_names()  # a job another connection added meanwhile
                yield Record(node=node, stream=stream, seq=seq, source=source, kind=kind,
                             message=message, occurred_ns=occurred, observed_ns=observed,
                             boot_id=boot_id, mono_ns=mono,
                             job=None if jid is None else jobs.get(jid), rank=rank,
                             local_rank=local_rank, pid=pid, severity=severity,
                             fields={} if fields is None else msgpack.unpackb(fields))

    def _sources(self, sel: Selection) -> list:
        """(lo, open) per index scan the selection needs (see _merge)."""
        db = self._conn()
        lo = _T_MIN if sel.since_ns is None else sel.since_ns
        hi = _T_MAX if sel.until_ns is None else sel.until_ns
        filter_sql, filter_args, rank_set = ("", [], None) if sel.ranks is None else _in(
            "rank", sel.ranks)
        if sel.grep is not None:  # in SQL: rows that do not match are never built
            filter_sql += " AND message REGEXP ?"
            filter_args = [*filter_args, sel.grep]
        wanted = None if sel.nodes is None else set(sel.nodes)
        if sel.job is not None:
            row = db.execute("SELECT jid, first_ns, last_ns FROM jobs WHERE job = ?",
                             (sel.job,)).fetchone()
            if row is None:
                return []
            jid, first, last = row
            job_nodes = {n for (n,) in db.execute(
                "SELECT node FROM job_nodes WHERE jid = ?", (jid,))}
            nodes = job_nodes if wanted is None else job_nodes & wanted
            jobs = [(jid, first, last, job_nodes)]
            free_lo, free_hi = max(lo, first - JOB_MARGIN_NS), min(hi, last + JOB_MARGIN_NS)
        else:
            nodes_of = defaultdict(set)
            for jid, node in db.execute("SELECT jid, node FROM job_nodes"):
                nodes_of[jid].add(node)
            jobs = [(jid, first, last, nodes_of[jid]) for jid, first, last in db.execute(
                "SELECT jid, first_ns, last_ns FROM jobs WHERE first_ns <= ? AND last_ns >= ?",
                (hi, lo))]
            nodes = set(self._node_sids) if wanted is None else wanted
            free_lo, free_hi = lo, hi
        sources = []
        for jid, first, last, job_nodes in jobs:
            if wanted is not None and not job_nodes & wanted:
                continue
            if wanted is None:
                sid_sql, sid_args, sid_set = "", [], None
            else:
                sid_sql, sid_args, sid_set = _in("sid", (
                    s for n in job_nodes & wanted for s in self._node_sids.get(n, ())))
            a, b = max(lo, first), min(hi, last)
            if a <= b:
                sql = (_SELECT + "INDEXED BY records_job WHERE jid = ? AND t_ns BETWEEN ? AND ?"
                       + filter_sql + sid_sql + " ORDER BY t_ns")
                args = [jid, a, b, *filter_args, *sid_args]
                sources.append((a, self._opener(sql, args, rank_set, sid_set, True)))
        free_sids = {s for n in nodes for s in self._node_sids.get(n, ())}
        for sid, first, last in db.execute(
                "SELECT sid, free_first_ns, free_last_ns FROM streams "
                "WHERE free_first_ns IS NOT NULL").fetchall():
            a, b = max(free_lo, first), min(free_hi, last)
            if sid in free_sids and a <= b:
                sql = (_SELECT + "INDEXED BY records_free WHERE sid = ? AND jid IS NULL AND "
                       "t_ns BETWEEN ? AND ?" + filter_sql + " ORDER BY t_ns, seq")
                sources.append((a, self._opener(sql, [sid, a, b, *filter_args], rank_set, None,
                                                False)))
        return sources

    def _opener(self, sql: str, args: list, ranks: set | None, sids: set | None,
                ties: bool) -> Callable[[], Iterator[tuple]]:
        return lambda: self._scan(sql, args, ranks, sids, ties)

    def _scan(self, sql: str, args: list, ranks: set | None, sids: set | None,
              ties: bool) -> Iterator[tuple]:
        """(t_ns, node, stream, seq, row) of one index scan in that order; ``ties``:
        rows of equal t_ns come in rowid order and are sorted here."""
        streams = self._streams
        check = ranks is not None or sids is not None
        cur = self._conn().execute(sql, args)
        try:
            tied: list[tuple] = []
            prev = None
            for row in cur:
                if check and ((ranks is not None and row[4] not in ranks)
                              or (sids is not None and row[1] not in sids)):
                    continue
                names = streams.get(row[1])
                if names is None:
                    self._load_names()  # a stream another connection added meanwhile
                    names = streams[row[1]]
                item = (row[0], names[0], names[1], row[2], row)
                if not ties:
                    yield item
                elif row[0] == prev:
                    tied.append(item)
                else:
                    if len(tied) > 1:
                        tied.sort()
                    yield from tied
                    tied = [item]
                    prev = row[0]
            if len(tied) > 1:
                tied.sort()
            yield from tied
        finally:
            cur.close()

    # --- retention -----------------------------------------------------------------

    def prune(self, *, max_age_s: float | None, max_bytes: int | None) -> int:
        """Delete records older than max_age_s (by t_ns), then the oldest until the
        live pages take at most max_bytes; return how many records went. Clock
        estimates older than max_age_s go too, but each node's latest stays."""
        if max_age_s is not None and max_age_s < 0:
            raise ValueError(f"max_age_s: must be >= 0, got {max_age_s}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes: must be >= 0, got {max_bytes}")
        with self._sql("prune"):
            return self._prune(max_age_s, max_bytes)

    def _prune(self, max_age_s: float | None, max_bytes: int | None) -> int:
        deleted = 0
        if max_age_s is not None:
            cutoff = self._now_ns() - int(max_age_s * 1e9)
            deleted += self._delete_before(cutoff)
            self._write(lambda: self._conn().execute(
                "DELETE FROM node_clocks WHERE measured_ns < ? AND measured_ns < "
                "(SELECT max(measured_ns) FROM node_clocks c WHERE c.node = node_clocks.node)",
                (cutoff,)), "prune of clocks")
        if max_bytes is not None:
            while (used := self.used_bytes()) > max_bytes:
                lo_id, hi_id = self._conn().execute(
                    "SELECT min(id), max(id) FROM records").fetchone()
                if lo_id is None:
                    break
                per_record = used / (hi_id - lo_id + 1)  # ids over-count: a low estimate
                cutoff = self._kth_oldest(math.ceil((used - max_bytes) / per_record * 1.05))
                n = self._delete_before(cutoff + 1)
                if not n:
                    break
                deleted += n
        return deleted

    def used_bytes(self) -> int:
        """Bytes of the pages in use (page_count - freelist_count), what max_bytes bounds."""
        db = self._conn()
        with self._sql("used_bytes"):
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            free = db.execute("PRAGMA freelist_count").fetchone()[0]
            return (pages - free) * db.execute("PRAGMA page_size").fetchone()[0]

    def _kth_oldest(self, k: int) -> int:
        """The t_ns of the k-th oldest record (the newest one if there are fewer)."""
        db = self._conn()

        def scan(sql: str, arg: int) -> Callable[[], Iterator[tuple]]:
            return lambda: iter(db.execute(sql, (arg,)))
        sources = [(first, scan("SELECT t_ns FROM records INDEXED BY records_job "
                                "WHERE jid = ? ORDER BY t_ns", jid))
                   for jid, first in db.execute("SELECT jid, first_ns FROM jobs").fetchall()]
        sources += [(first, scan("SELECT t_ns FROM records INDEXED BY records_free "
                                 "WHERE sid = ? AND jid IS NULL ORDER BY t_ns", sid))
                    for sid, first in db.execute(
                        "SELECT sid, free_first_ns FROM streams "
                        "WHERE free_first_ns IS NOT NULL").fetchall()]
        t = _T_MIN
        for (t,) in islice(_merge(sources), max(k, 1)):
            pass
        return t

    def _delete_before(self, cutoff: int) -> int:
        """Delete every record with t_ns < cutoff, PRUNE_CHUNK rows a transaction."""
        db = self._conn()
        self._refresh()
        total = 0
        for (jid,) in db.execute("SELECT jid FROM jobs WHERE first_ns < ?", (cutoff,)).fetchall():
            while (n := self._write(lambda: self._delete_job_chunk(jid, cutoff), "prune")):
                total += n
                if n < PRUNE_CHUNK:
                    break
        for (sid,) in db.execute("SELECT sid FROM streams WHERE free_first_ns < ?",
                                 (cutoff,)).fetchall():
            while (n := self._write(lambda: self._delete_free_chunk(sid, cutoff), "prune")):
                total += n
                if n < PRUNE_CHUNK:
                    break
        return total

    def _delete_job_chunk(self, jid: int, cutoff: int) -> int:
        db = self._conn()
        n = db.execute("DELETE FROM records WHERE id IN (SELECT id FROM records INDEXED BY "
                       "records_job WHERE jid = ? AND t_ns < ? LIMIT ?)",
                       (jid, cutoff, PRUNE_CHUNK)).rowcount
        row = db.execute("SELECT t_ns FROM records INDEXED BY records_job WHERE jid = ? "
                         "ORDER BY t_ns LIMIT 1", (jid,)).fetchone()
        if row is None:
            for table in ("jobs", "job_nodes", "job_ranks"):
                db.execute(f"DELETE FROM {table} WHERE jid = ?", (jid,))
            self._jids.pop(self._jobs.pop(jid, None), None)
        else:
            db.execute("UPDATE jobs SET records = records - ?, first_ns = ? WHERE jid = ?",
                       (n, row[0], jid))
        return n

    def _delete_free_chunk(self, sid: int, cutoff: int) -> int:
        db = self._conn()
        n = db.execute("DELETE FROM records WHERE id IN (SELECT id FROM records INDEXED BY "
                       "records_free WHERE sid = ? AND jid IS NULL AND t_ns < ? LIMIT ?)",
                       (sid, cutoff, PRUNE_CHUNK)).rowcount
        row = db.execute("SELECT t_ns FROM records INDEXED BY records_free WHERE sid = ? AND "
                         "jid IS NULL ORDER BY t_ns LIMIT 1", (sid,)).fetchone()
        if row is None:
            db.execute("UPDATE streams SET free_first_ns = NULL, free_last_ns = NULL "
                       "WHERE sid = ?", (sid,))
        else:
            db.execute("UPDATE streams SET free_first_ns = ? WHERE sid = ?", (row[0], sid))
        return n

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
