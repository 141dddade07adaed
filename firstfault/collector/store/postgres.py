"""PostgresStore: the collector's store on a PostgreSQL server, for when one collector
is not enough (several collectors, one database). psycopg 3, imported on first use
(``pip install 'firstfault[postgres]'``); selected by ``--db postgresql://...``.

It implements the Store protocol of base.py with SqliteStore's semantics (that
module's docstring is the reference: the job window, filters, order, failed status,
prune) plus ``insert_columns`` and ``insert_columns_many`` (one transaction for a
group of wire batches: the ingest server's group commit).

The schema and its migrations: postgres_schema.py (made in the connection's current
schema, one migration at a time under an advisory lock). Reads and retention:
postgres_read.py.

Ingest, one transaction per call (committed on return; with synchronous_commit on,
the server's default, it survives even a crash of the server)
    1. the batches' stream rows are locked (SELECT ... FOR UPDATE, in sid order): a
       stream's writers take turns, so records above its high_seq are new by
       construction and those at or below it are looked up first (no conflicts);
    2. job rows are created for new job names (in name order), then the rows go in
       with one binary COPY (the fastest way measured: bench/RESULTS.md);
    3. the jobs' aggregates (first/last time, records, bytes, failed) are updated in
       jid order, job_nodes/job_ranks added, the streams' high_seq and jobless
       bounds set. Locks are taken in one order (streams, new jobs, jobs); a
       deadlock or a job pruned meanwhile by another collector rolls the call back
       and it is tried again (RETRIES times).
New streams get their row in a transaction of their own first (an empty stream
row means what no row means).

Connection: one, in autocommit mode (transactions explicit); a broken one is
replaced on the next call (a server restart costs the calls that meet it a
StoreError, no more). Any thread may call, one call at a time (base.py).

Report marks (base.py's optional ``needed``): with a marker, each job's rows of a
batch are one block for it (one stream, one job, in (t_ns, seq) order) and the rows
it chooses get ``needed``; a job all of whose rows one marker marked (jobs.marked_by)
is reported from those rows alone (index records_needed), any other job, a window,
a grep or a limit from every row; a job's nodes' jobless rows are always read whole.

Known issues: a row per record (SqliteStore keeps blocks of them). As in
SqliteStore, jobs' windows use the nodes' own clocks. Stream and
job names are cached; a job another collector pruned is noticed on the next insert
into it (retry) or read (reload).
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from itertools import compress, groupby, islice, repeat
from operator import attrgetter, eq, is_, lt
from typing import Any

import msgpack

from firstfault.collector.store import display
from firstfault.collector.store.base import JobInfo, Marker, NodeClock, StoreError
from firstfault.collector.store.blocks import COLUMNS
from firstfault.collector.store.postgres_read import _T_MAX, _T_MIN, ROW_BYTES, PostgresReads
from firstfault.collector.store.postgres_schema import escape, migrate, needs_escape, unescape
from firstfault.collector.store.shared import failed_jobs, job_status
from firstfault.wire import Record

log = logging.getLogger(__name__)

RETRIES = 5  # a transaction rolled back by a deadlock is tried this often
_pack = msgpack.Packer().pack
_column_getters = tuple(map(attrgetter, COLUMNS))
_node_stream = attrgetter("node", "stream")
_MARKED_COLUMNS = ("source", "kind", "message", "occurred_ns", "rank", "fields", "pid")
_seq_of = attrgetter("seq")

_COPY = ("COPY records (sid, seq, t_ns, jid, rank, source, kind, message, occurred_ns, "
         "observed_ns, boot_id, mono_ns, local_rank, pid, severity, fields, escaped, needed) "
         "FROM STDIN (FORMAT BINARY)")
_COPY_TYPES = ("int4", "int8", "int8", "int4", "int4", "text", "text", "text", "int8", "int8",
               "text", "int8", "int4", "int4", "int2", "bytea", "bool", "bool")


class _Stale(Exception):
    """A cached job id is gone (another collector pruned the job): retry."""


class PostgresStore(PostgresReads):
    """The Store protocol (base.py) on PostgreSQL; see the module docstring."""

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0,
                 now_ns: Callable[[], int] = time.time_ns, marker: Marker | None = None) -> None:
        """Connect to ``url`` (postgres:// or postgresql://, libpq's URI syntax) and
        create or migrate the schema; StoreError if it can not be done. marker: marks
        at insert what a report reads (base.Marker; ``needed`` serves them)."""
        try:
            import psycopg
        except ImportError as e:
            raise StoreError("the PostgreSQL store needs psycopg 3: pip install "
                             "'firstfault[postgres]'") from e
        self._pg = psycopg
        self.url, self.name = url, display(url)
        self._timeout = connect_timeout_s
        self._now_ns = now_ns
        self._marker = marker
        self._mk: int | None = None  # the marker's id in markers, once it marked records
        self._db: Any = None
        self._closed = False
        self._streams: dict[int, tuple[str, str]] = {}  # sid -> (node, stream)
        self._sids: dict[tuple[str, str], int] = {}
        self._node_sids: dict[str, list[int]] = defaultdict(list)
        self._jobs: dict[int, str] = {}  # jid -> job
        self._jids: dict[str, int] = {}
        self._job_nodes: set[tuple[int, str]] = set()  # known to be in job_nodes
        self._job_ranks: set[tuple[int, int]] = set()
        with self._sql("opening the store"):
            self._conn()

    # --- connection, schema and names -------------------------------------------------

    def _conn(self) -> Any:
        """The connection; a new one (schema checked, names loaded) after it broke."""
        if self._closed:
            raise StoreError(f"{self.name}: the store is closed")
        if self._db is None or self._db.closed or self._db.broken:
            if self._db is not None:
                log.warning("store reconnecting url=%s", self.name)
                self._db.close()
                self._db = None
            try:
                db = self._pg.connect(self.url, autocommit=True,
                                      connect_timeout=max(1, math.ceil(self._timeout)),
                                      application_name="firstfault")
            except self._pg.Error as e:
                raise StoreError(f"{self.name}: can not connect to PostgreSQL: "
                                 f"{str(e).strip()}") from e
            try:
                migrate(db, self.name)
            except BaseException:
                db.close()
                raise
            self._db = db
            self._load_names()
        return self._db

    def _load_names(self) -> None:
        """Streams and jobs by id, cleared in place (running iterators hold these)."""
        db = self._conn()
        self._mk = None  # looked up again: the transaction that added it may be undone
        for names in (self._streams, self._sids, self._node_sids, self._jobs, self._jids):
            names.clear()
        self._job_nodes.clear(), self._job_ranks.clear()
        for sid, node, stream in db.execute("SELECT sid, node, stream FROM streams ORDER BY sid"):
            self._add_stream(sid, unescape(node), unescape(stream))
        for jid, job in db.execute("SELECT jid, job FROM jobs"):
            self._jobs[jid] = job = unescape(job)
            self._jids[job] = jid

    def _add_stream(self, sid: int, node: str, stream: str) -> None:
        self._streams[sid] = (node, stream)
        self._sids[(node, stream)] = sid
        self._node_sids[node].append(sid)

    @contextmanager
    def _sql(self, what: str) -> Iterator[None]:
        """psycopg's errors as StoreError naming the database and what failed."""
        try:
            yield
        except self._pg.Error as e:
            raise StoreError(f"{self.name}: {what} failed: {str(e).strip()}") from e

    def _write(self, work: Callable[[Any], Any], what: str) -> Any:
        """``work(db)`` in one transaction, committed before returning; retried after a
        deadlock, a serialization failure or a stale job id."""
        errors = self._pg.errors
        with self._sql(what):
            for attempt in range(RETRIES):
                db = self._conn()
                try:
                    with db.transaction():
                        return work(db)
                except (errors.DeadlockDetected, errors.SerializationFailure, _Stale) as e:
                    log.warning("store retry what=%r attempt=%d reason=%s", what, attempt + 1,
                                type(e).__name__)
                    self._load_names()
                    last = e
                except BaseException:
                    if self._db is not None and not self._db.broken:
                        self._load_names()  # undo names added by the rolled-back work
                    raise
            raise StoreError(f"{self.name}: {what} failed {RETRIES} times: {last}")

    # --- ingest -------------------------------------------------------------------

    def high_seq(self, node: str, stream: str) -> int | None:
        with self._sql("high_seq"):
            row = self._conn().execute(
                "SELECT high_seq FROM streams WHERE node = %s AND stream = %s",
                (escape(node), escape(stream))).fetchone()
        return None if row is None else row[0]

    def insert(self, records: Sequence[Record]) -> int:
        """Store records durably (committed on return); return how many were new."""
        batches = []
        for (node, stream), group in groupby(records, _node_stream):
            group = list(group)
            batches.append((node, stream, list(map(_seq_of, group)),
                            {c: list(map(get, group)) for c, get in zip(COLUMNS, _column_getters)}))
        return sum(self.insert_columns_many(batches)) if batches else 0

    def insert_columns(self, node: str, stream: str, seqs: Sequence[int],
                       cols: dict[str, Sequence[Any]]) -> int:
        """insert() for one wire batch as columns (firstfault/wire.py BatchColumns)."""
        return self.insert_columns_many([(node, stream, seqs, cols)])[0]

    def insert_columns_many(self, batches: Sequence[tuple[str, str, Sequence[int],
                                                          dict[str, Sequence[Any]]]]) -> list[int]:
        """Several (node, stream, seqs, cols) batches in one transaction; per batch the
        number of new records."""
        full = [b for b in batches if len(b[2])]
        if not full:
            return [0] * len(batches)
        with self._sql("creating streams"):
            for node, stream, _, _ in full:
                if (node, stream) not in self._sids:
                    self._new_stream(node, stream)
        n = sum(len(b[2]) for b in full)
        news = iter(self._write(lambda db: self._insert(db, full), f"insert of {n} records"))
        return [next(news) if len(b[2]) else 0 for b in batches]

    def _new_stream(self, node: str, stream: str) -> None:
        """The stream's row, committed at once (empty, it means what no row means)."""
        db = self._conn()
        db.execute("INSERT INTO streams (node, stream) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                   (escape(node), escape(stream)))
        sid = db.execute("SELECT sid FROM streams WHERE node = %s AND stream = %s",
                         (escape(node), escape(stream))).fetchone()[0]
        self._add_stream(sid, node, stream)

    def _insert(self, db: Any, batches: list) -> list[int]:
        sids = [self._sids[(node, stream)] for node, stream, _, _ in batches]
        high = dict(db.execute("SELECT sid, high_seq FROM streams WHERE sid = ANY(%s) "
                               "ORDER BY sid FOR UPDATE", (sorted(set(sids)),)).fetchall())
        kept = []
        taken: dict[int, set[int]] = defaultdict(set)  # a stream's seqs kept in this call
        for sid, (_, _, seqs, cols) in zip(sids, batches):
            floor = -1 if high[sid] is None else high[sid]
            if not (seqs[0] > floor and (isinstance(seqs, range)
                                         or all(map(lt, seqs, islice(seqs, 1, None))))):
                seqs, cols = self._only_new(db, sid, floor, seqs, cols, taken[sid])
            if seqs:
                high[sid] = max(floor, seqs[-1])
                if sids.count(sid) > 1:
                    taken[sid].update(seqs)
            kept.append((sid, seqs, cols))
        names = sorted({j for _, seqs, cols in kept if seqs for j in cols["job"]} - {None})
        for job in names:
            if job not in self._jids:
                self._new_job(db, job)
        jobs: dict[int, list] = {}  # jid -> [first, last, records, bytes, failed, nodes, ranks]
        streams: dict[int, list] = {}  # sid -> [free first, free last, records, bytes]
        with db.cursor().copy(_COPY) as copy:
            copy.set_types(_COPY_TYPES)
            for sid, seqs, cols in kept:
                if seqs:
                    self._copy_batch(copy, sid, seqs, cols, jobs, streams)
        self._update_jobs(db, jobs)
        for sid in sorted(set(sids)):
            free = streams.get(sid)
            db.execute("UPDATE streams SET high_seq = %s, free_first_ns = least(free_first_ns, "
                       "%s), free_last_ns = greatest(free_last_ns, %s), free_records = "
                       "free_records + %s, free_bytes = free_bytes + %s WHERE sid = %s",
                       (high[sid], *(free or (None, None, 0, 0)), sid))
        return [len(seqs) for _, seqs, _ in kept]

    def _new_job(self, db: Any, job: str) -> None:
        """The job's row (aggregates neutral until _update_jobs, in this transaction)."""
        row = db.execute("INSERT INTO jobs (job, first_ns, last_ns, records, failed, bytes, "
                         "marked_by) VALUES (%s, %s, %s, 0, false, 0, 0) ON CONFLICT DO NOTHING "
                         "RETURNING jid", (escape(job), _T_MAX, _T_MIN)).fetchone()
        if row is None:
            row = db.execute("SELECT jid FROM jobs WHERE job = %s", (escape(job),)).fetchone()
        self._jids[job], self._jobs[row[0]] = row[0], job

    def _copy_batch(self, copy: Any, sid: int, seqs: Sequence[int], cols: dict,
                    jobs: dict[int, list], streams: dict[int, list]) -> None:
        """COPY one batch's rows; add its aggregates to ``jobs`` and ``streams``."""
        (source, kind, message, occurred, observed, boot_id, mono, job, rank, local_rank,
         pid, severity, fields) = (cols[c] for c in COLUMNS)
        node = self._streams[sid][0]
        t = occurred if None not in occurred else [
            b if o is None else o for o, b in zip(occurred, observed)]
        packed = [None] * len(seqs) if not any(fields) else [
            _pack(f) if f else None for f in fields]
        escaped = needs_escape(source, kind, message, boot_id)
        if escaped:
            source, kind, message = ([escape(s) for s in col] for col in (source, kind, message))
            boot_id = [None if b is None else escape(b) for b in boot_id]
        sizes = list(map(len, message)) if not any(packed) else [
            len(m) + (len(p) if p else 0) for m, p in zip(message, packed)]
        job_set = set(job)
        jids = ([self._jids.get(job[0])] * len(seqs) if len(job_set) == 1
                else [None if j is None else self._jids[j] for j in job])
        need = self._needed(seqs, t, cols, jids)
        for row in zip(repeat(sid), seqs, t, jids, rank, source, kind, message, occurred,
                       observed, boot_id, mono, local_rank, pid, severity, packed,
                       repeat(escaped), need):
            copy.write_row(row)
        failed = failed_jobs(kind, fields, job)
        for j in job_set:
            if len(job_set) == 1:
                ts, size, ranks = t, sizes, rank
            else:
                mine = list(map(eq, job, repeat(j))) if j is not None else list(
                    map(is_, job, repeat(None)))
                ts, size, ranks = list(compress(t, mine)), compress(sizes, mine), compress(rank, mine)
            agg = [min(ts), max(ts), len(ts), sum(size) + ROW_BYTES * len(ts)]
            if j is None:
                self._add(streams.setdefault(sid, [_T_MAX, _T_MIN, 0, 0]), agg)
                continue
            jid = self._jids[j]
            self._add(jobs.setdefault(jid, [_T_MAX, _T_MIN, 0, 0, False, set(), set()]), agg)
            jobs[jid][4] |= j in failed
            jobs[jid][5].add(node)
            jobs[jid][6].update(ranks)

    @staticmethod
    def _add(total: list, agg: list) -> None:
        total[0], total[1] = min(total[0], agg[0]), max(total[1], agg[1])
        total[2] += agg[2]
        total[3] += agg[3]

    def _update_jobs(self, db: Any, jobs: dict[int, list]) -> None:
        mk = -1 if self._marker is None else self._marker_id(db)
        for jid in sorted(jobs):
            first, last, count, size, failed, nodes, ranks = jobs[jid]
            cur = db.execute("UPDATE jobs SET first_ns = least(first_ns, %s), last_ns = "
                             "greatest(last_ns, %s), records = records + %s, bytes = bytes + "
                             "%s, failed = failed OR %s, marked_by = CASE WHEN marked_by IN "
                             "(0, %s) THEN %s ELSE -1 END WHERE jid = %s",
                             (first, last, count, size, failed, mk, mk, jid))
            if cur.rowcount != 1:
                raise _Stale(jid)
            new_nodes = sorted((jid, escape(n)) for n in nodes if (jid, n) not in self._job_nodes)
            new_ranks = sorted((jid, r) for r in ranks - {None} if (jid, r) not in self._job_ranks)
            with db.cursor() as cur:
                if new_nodes:
                    cur.executemany("INSERT INTO job_nodes VALUES (%s, %s) ON CONFLICT DO NOTHING",
                                    new_nodes)
                if new_ranks:
                    cur.executemany("INSERT INTO job_ranks VALUES (%s, %s) ON CONFLICT DO NOTHING",
                                    new_ranks)
        for jid, (*_, nodes, ranks) in jobs.items():  # a rollback clears these (_write)
            self._job_nodes.update((jid, n) for n in nodes)
            self._job_ranks.update((jid, r) for r in ranks if r is not None)

    def _marker_id(self, db: Any) -> int:
        """The marker's mk (added on first use, in the insert's transaction)."""
        if self._mk is None:
            name = self._marker.name
            db.execute("INSERT INTO markers (name) VALUES (%s) ON CONFLICT DO NOTHING", (name,))
            self._mk = db.execute("SELECT mk FROM markers WHERE name = %s", (name,)).fetchone()[0]
        return self._mk

    def _needed(self, seqs: Sequence[int], t: Sequence[int], cols: dict,
                jids: Sequence[int | None]) -> list[bool]:
        """Per row, whether the marker chose it: each job's rows of the batch are one
        block (one stream, one job) in (t_ns, seq) order. Jobless rows are not marked
        (a job's report reads its nodes' jobless rows whole, from its window)."""
        need = [False] * len(seqs)
        if self._marker is None:
            return need
        groups: dict[int, list[int]] = defaultdict(list)
        for i, jid in enumerate(jids):
            if jid is not None:
                groups[jid].append(i)
        for rows in groups.values():
            rows.sort(key=lambda i: (t[i], seqs[i]))
            pick = {c: [cols[c][i] for i in rows] for c in _MARKED_COLUMNS}
            for k in self._marker.mark(source=pick["source"], kind=pick["kind"],
                                       message=pick["message"], occurred_ns=pick["occurred_ns"],
                                       rank=pick["rank"], fields=pick["fields"], pid=pick["pid"]):
                need[rows[k]] = True
        return need

    def _only_new(self, db: Any, sid: int, floor: int, seqs: Sequence[int],
                  cols: dict[str, Sequence[Any]],
                  taken: set[int]) -> tuple[list[int], dict[str, list[Any]]]:
        """The records of a batch not stored yet nor in ``taken``, first of duplicates
        kept, by seq."""
        first: dict[int, tuple] = {}
        for row in zip(seqs, *(cols[c] for c in COLUMNS)):
            first.setdefault(row[0], row)
        old = sorted(s for s in first if s <= floor and s not in taken)
        have = set(taken)
        if old:
            have.update(s for (s,) in db.execute(
                "SELECT seq FROM records WHERE sid = %s AND seq = ANY(%s)", (sid, old)))
        keep = [first[s] for s in sorted(first) if s not in have]
        if not keep:
            return [], {}
        columns = list(map(list, zip(*keep)))
        return columns[0], dict(zip(COLUMNS, columns[1:]))

    # --- jobs and clocks ------------------------------------------------------------

    def jobs(self) -> list[JobInfo]:
        """Every job the records name, newest (latest first record) first."""
        db = self._conn()
        nodes, ranks = defaultdict(list), defaultdict(list)
        with self._sql("jobs"):
            for jid, node in db.execute("SELECT jid, node FROM job_nodes"):
                nodes[jid].append(unescape(node))
            for jid, rank in db.execute("SELECT jid, rank FROM job_ranks"):
                ranks[jid].append(rank)
            rows = db.execute("SELECT jid, job, first_ns, last_ns, records, failed FROM jobs "
                              "WHERE records > 0").fetchall()
        infos = [self._job_info(row, nodes[row[0]], ranks[row[0]]) for row in rows]
        return sorted(infos, key=lambda j: (-j.first_ns, j.job))

    def job(self, job: str) -> JobInfo | None:
        db = self._conn()
        with self._sql(f"job {job!r}"):
            row = db.execute("SELECT jid, job, first_ns, last_ns, records, failed FROM jobs "
                             "WHERE job = %s AND records > 0", (escape(job),)).fetchone()
            if row is None:
                return None
            nodes = [unescape(n) for (n,) in db.execute(
                "SELECT node FROM job_nodes WHERE jid = %s", (row[0],))]
            ranks = [r for (r,) in db.execute("SELECT rank FROM job_ranks WHERE jid = %s",
                                              (row[0],))]
        return self._job_info(row, nodes, ranks)

    def _job_info(self, row: tuple, nodes: list[str], ranks: list[int]) -> JobInfo:
        _, job, first_ns, last_ns, count, failed = row
        status = job_status(self._now_ns(), last_ns, bool(failed))
        return JobInfo(job=unescape(job), first_ns=first_ns, last_ns=last_ns,
                       nodes=tuple(sorted(nodes)), ranks=tuple(sorted(ranks)), records=count,
                       status=status)

    def save_clock(self, clock: NodeClock) -> None:
        self._write(lambda db: db.execute(
            "INSERT INTO node_clocks (node, measured_ns, offset_ns, uncertainty_ns) "
            "VALUES (%s, %s, %s, %s)",
            (escape(clock.node), clock.measured_ns, clock.offset_ns, clock.uncertainty_ns)),
            f"save_clock of node={clock.node}")

    def clocks(self) -> dict[str, NodeClock]:
        """The latest clock estimate of every node."""
        with self._sql("clocks"):
            rows = self._conn().execute(
                "SELECT DISTINCT ON (node) node, offset_ns, uncertainty_ns, measured_ns "
                "FROM node_clocks ORDER BY node, measured_ns DESC").fetchall()
        return {unescape(node): NodeClock(unescape(node), offset, unc, measured)
                for node, offset, unc, measured in rows}

    # --- life cycle ----------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent); later calls raise StoreError."""
        self._closed = True
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
