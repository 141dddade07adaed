"""PostgresStore's read side and retention (a base class of PostgresStore in
postgres.py, which holds the connection and the names it uses).

Reads page through each index scan by keyset: PAGE rows a query, the next page
after the last row of the one before ((t_ns, sid, seq) > that row), so no
transaction stays open and a pruner is never blocked; rows committed meanwhile may
or may not appear. A job's scan and one scan per stream for jobless records are
merged in Python by sqlite_read.merge, as SqliteStore does, into (t_ns, node, stream,
seq) order. ``grep`` is a literal substring of the true message, found in SQL (strpos; a row with
escaped text is checked again here).

Retention: ``used_bytes`` is what the records take as counted when they are written
and deleted (ROW_BYTES per row plus its message and fields), not asked of the
server: tables keep the space of deleted rows for new ones, so the database stays
near its high-water mark (VACUUM FULL, offline, shrinks it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import msgpack

from firstfault.collector.store.base import Selection, check_prune, check_selection, prune_to_size
from firstfault.collector.store.postgres_schema import escape, unescape
from firstfault.collector.store.shared import JOB_MARGIN_NS, merge
from firstfault.wire import Record

PAGE = 5000  # rows a read query fetches
PRUNE_CHUNK = 50_000  # rows deleted per transaction (a job's row is locked meanwhile)
ROW_BYTES = 225  # a row's tuple and index entries besides message and fields: on new
# tables used_bytes() ~ pg_total_relation_size(records) (bench/store.py --postgres)
_T_MIN, _T_MAX = -(2**63), 2**63 - 1
_SELECT = ("SELECT t_ns, sid, seq, jid, rank, source, kind, message, occurred_ns, observed_ns, "
           "boot_id, mono_ns, local_rank, pid, severity, fields, escaped FROM records WHERE ")


class PostgresReads:
    """records(), prune() and used_bytes() of PostgresStore."""

    _conn: Callable[[], Any]
    _sql: Callable[[str], Any]
    _write: Callable[..., Any]
    _load_names: Callable[[], None]
    _now_ns: Callable[[], int]
    _streams: dict[int, tuple[str, str]]
    _node_sids: dict[str, list[int]]
    _jobs: dict[int, str]
    _jids: dict[str, int]

    def records(self, sel: Selection) -> Iterator[Record]:
        """Matching records ordered by (t_ns, node, stream, seq), streamed page by page.

        ValueError for a bad ``grep`` or a negative ``limit`` (raised here, not on
        the first next())."""
        return self._read(sel, False)

    def _read(self, sel: Selection, needed_only: bool) -> Iterator[Record]:
        """records(); ``needed_only``: of the job's own records only those marked needed."""
        if not check_selection(sel):
            return iter(())  # an empty filter matches nothing
        where, args = "", []
        if sel.ranks is not None:
            where, args = " AND rank = ANY(%s)", [sorted(set(sel.ranks))]
        if sel.grep is not None:
            where, args = where + " AND strpos(message, %s) > 0", [*args, escape(sel.grep)]
        with self._sql("reading records"):
            self._load_names()
            sources = self._sources(sel, where, args, needed_only)
        records = self._records(sources, sel.grep)
        return records if sel.limit is None else islice(records, sel.limit)

    def needed(self, sel: Selection, marker: str) -> Iterator[Record]:
        """base.Store.needed: of a job whose every record ``marker`` marked at insert
        (jobs.marked_by), only the marked ones; otherwise, and for a selection with a
        window, a grep or a limit, every record (its nodes' jobless records always)."""
        if (sel.job is None or sel.grep is not None or sel.limit is not None
                or sel.since_ns is not None or sel.until_ns is not None):
            return self.records(sel)
        with self._sql("reading records"):
            row = self._conn().execute(
                "SELECT j.marked_by = m.mk FROM jobs j, markers m WHERE j.job = %s AND "
                "m.name = %s", (escape(sel.job), marker)).fetchone()
        return self._read(sel, bool(row and row[0]))

    def _records(self, sources: list, grep: str | None) -> Iterator[Record]:
        """The rows as Records; an escaped row's true message is checked for ``grep`` again
        (strpos saw its escaped text: ``0`` is found in an escaped NUL)."""
        jobs = self._jobs
        with self._sql("reading records"):
            for _, node, stream, seq, row in merge(sources):
                (jid, rank, source, kind, message, occurred, observed, boot_id, mono,
                 local_rank, pid, severity, fields, escaped) = row[3:]
                if escaped:
                    source, kind, message = unescape(source), unescape(kind), unescape(message)
                    boot_id = None if boot_id is None else unescape(boot_id)
                    if grep is not None and grep not in message:
                        continue
                if jid is not None and jid not in jobs:
                    self._load_names()  # a job another collector added meanwhile
                yield Record(node=node, stream=stream, seq=seq, source=source, kind=kind,
                             message=message, occurred_ns=occurred, observed_ns=observed,
                             boot_id=boot_id, mono_ns=mono,
                             job=None if jid is None else jobs.get(jid), rank=rank,
                             local_rank=local_rank, pid=pid, severity=severity,
                             fields={} if fields is None else msgpack.unpackb(fields))

    def _sources(self, sel: Selection, where: str, args: list, needed_only: bool) -> list:
        """(lo, open) per index scan the selection needs (see sqlite_read.merge)."""
        db = self._conn()
        lo = _T_MIN if sel.since_ns is None else sel.since_ns
        hi = _T_MAX if sel.until_ns is None else sel.until_ns
        wanted = None if sel.nodes is None else set(sel.nodes)
        if sel.job is not None:
            row = db.execute("SELECT jid, first_ns, last_ns FROM jobs WHERE job = %s AND "
                             "records > 0", (escape(sel.job),)).fetchone()
            if row is None:
                return []
            jid, first, last = row
            job_nodes = {unescape(n) for (n,) in db.execute(
                "SELECT node FROM job_nodes WHERE jid = %s", (jid,))}
            nodes = job_nodes if wanted is None else job_nodes & wanted
            jobs = [(jid, first, last, job_nodes)]
            free_lo, free_hi = max(lo, first - JOB_MARGIN_NS), min(hi, last + JOB_MARGIN_NS)
        else:
            nodes_of = defaultdict(set)
            for jid, node in db.execute("SELECT jid, node FROM job_nodes"):
                nodes_of[jid].add(unescape(node))
            jobs = [(jid, first, last, nodes_of[jid]) for jid, first, last in db.execute(
                "SELECT jid, first_ns, last_ns FROM jobs WHERE records > 0 AND first_ns <= %s "
                "AND last_ns >= %s", (hi, lo))]
            nodes = set(self._node_sids) if wanted is None else wanted
            free_lo, free_hi = lo, hi
        sources = []
        for jid, first, last, job_nodes in jobs:
            if wanted is not None and not job_nodes & wanted:
                continue
            a, b = max(lo, first), min(hi, last)
            if a > b:
                continue
            sql, sql_args = "jid = %s AND t_ns BETWEEN %s AND %s" + where, [jid, a, b, *args]
            if needed_only:
                sql += " AND needed"
            if wanted is not None:
                sql += " AND sid = ANY(%s)"
                sql_args.append([s for n in job_nodes & wanted for s in self._node_sids[n]])
            sources.append((a, self._opener(sql, sql_args, ("t_ns", "sid", "seq"), True)))
        free_sids = {s for n in nodes for s in self._node_sids.get(n, ())}
        for sid, first, last in db.execute(
                "SELECT sid, free_first_ns, free_last_ns FROM streams "
                "WHERE free_first_ns IS NOT NULL").fetchall():
            a, b = max(free_lo, first), min(free_hi, last)
            if sid in free_sids and a <= b:
                sql = "sid = %s AND jid IS NULL AND t_ns BETWEEN %s AND %s" + where
                sources.append((a, self._opener(sql, [sid, a, b, *args], ("t_ns", "seq"), False)))
        return sources

    def _opener(self, where: str, args: list, keys: tuple[str, ...],
                ties: bool) -> Callable[[], Iterator[tuple]]:
        return lambda: self._scan(where, args, keys, ties)

    def _scan(self, where: str, args: list, keys: tuple[str, ...],
              ties: bool) -> Iterator[tuple]:
        """(t_ns, node, stream, seq, row) of one index scan in that order; ``ties``:
        rows of equal t_ns come in sid order and are sorted here by names."""
        streams = self._streams
        tied: list[tuple] = []
        prev = None
        for row in self._pages(_SELECT + where, args, keys):
            names = streams.get(row[1])
            if names is None:
                self._load_names()  # a stream another collector added meanwhile
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

    def _pages(self, sql: str, args: list, keys: tuple[str, ...]) -> Iterator[tuple]:
        """The rows of ``sql`` (columns t_ns, sid, seq first) in ``keys`` order, PAGE
        rows a query, each page after the last row of the one before (keyset)."""
        order = ", ".join(keys)
        at = [("t_ns", "sid", "seq").index(k) for k in keys]
        page = f"{sql} ORDER BY {order} LIMIT {PAGE}"
        after = (f"{sql} AND ({order}) > ({', '.join(['%s'] * len(keys))}) "
                 f"ORDER BY {order} LIMIT {PAGE}")
        rows = self._conn().execute(page, args).fetchall()
        while True:
            yield from rows
            if len(rows) < PAGE:
                return
            last = rows[-1]
            rows = self._conn().execute(after, [*args, *(last[i] for i in at)]).fetchall()

    # --- retention -----------------------------------------------------------------

    def prune(self, *, max_age_s: float | None, max_bytes: int | None) -> int:
        """Delete records older than max_age_s (by t_ns), then the oldest until
        used_bytes() is at most max_bytes; return how many records went. Clock
        estimates older than max_age_s go too, but each node's latest stays."""
        check_prune(max_age_s, max_bytes)
        with self._sql("prune"):
            self._load_names()
            deleted = 0
            if max_age_s is not None:
                cutoff = self._now_ns() - int(max_age_s * 1e9)
                deleted += self._delete_before(cutoff)
                self._write(lambda db: db.execute(
                    "DELETE FROM node_clocks WHERE measured_ns < %s AND measured_ns < (SELECT "
                    "max(measured_ns) FROM node_clocks c WHERE c.node = node_clocks.node)",
                    (cutoff,)), "prune of clocks")
            if max_bytes is not None:
                deleted += prune_to_size(max_bytes, self.used_bytes, self._record_count,
                                         self._kth_oldest, self._delete_before)
            return deleted

    def _record_count(self) -> int:
        return self._conn().execute(
            "SELECT ((SELECT coalesce(sum(records), 0) FROM jobs) + "
            "(SELECT coalesce(sum(free_records), 0) FROM streams))::bigint").fetchone()[0]

    def used_bytes(self) -> int:
        """The bytes the records take (ROW_BYTES a row plus message and fields), what
        max_bytes bounds."""
        with self._sql("used_bytes"):
            return self._conn().execute(
                "SELECT ((SELECT coalesce(sum(bytes), 0) FROM jobs) + "
                "(SELECT coalesce(sum(free_bytes), 0) FROM streams))::bigint").fetchone()[0]

    def _kth_oldest(self, k: int) -> int:
        """The t_ns of the k-th oldest record (the newest one if there are fewer)."""
        db = self._conn()

        def scan(where: str, arg: int, keys: tuple[str, ...]) -> Callable[[], Iterator[tuple]]:
            return lambda: self._pages("SELECT t_ns, sid, seq FROM records WHERE " + where,
                                       [arg], keys)
        sources = [(first, scan("jid = %s", jid, ("t_ns", "sid", "seq"))) for jid, first in
                   db.execute("SELECT jid, first_ns FROM jobs WHERE records > 0").fetchall()]
        sources += [(first, scan("sid = %s AND jid IS NULL", sid, ("t_ns", "seq")))
                    for sid, first in db.execute(
                        "SELECT sid, free_first_ns FROM streams "
                        "WHERE free_first_ns IS NOT NULL").fetchall()]
        t = _T_MIN
        for (t, *_) in islice(merge(sources), max(k, 1)):
            pass
        return t

    def _delete_before(self, cutoff: int) -> int:
        """Delete every record with t_ns < cutoff, PRUNE_CHUNK rows a transaction."""
        db = self._conn()
        total = 0
        for (jid,) in db.execute("SELECT jid FROM jobs WHERE first_ns < %s", (cutoff,)).fetchall():
            total += self._chunks(lambda db, lo: self._delete_job_chunk(db, jid, cutoff, lo))
        for (sid,) in db.execute("SELECT sid FROM streams WHERE free_first_ns < %s",
                                 (cutoff,)).fetchall():
            total += self._chunks(lambda db, lo: self._delete_free_chunk(db, sid, cutoff, lo))
        return total

    def _chunks(self, chunk: Callable[[Any, int], tuple[int, int]]) -> int:
        """``chunk(db, lo)`` transactions until one deletes fewer than PRUNE_CHUNK rows.
        lo, the latest t_ns deleted so far, is where the next chunk's index scan starts,
        not at the entries of the rows deleted before (dead until vacuumed)."""
        total, lo = 0, _T_MIN
        while True:
            n, lo = self._write(lambda db: chunk(db, lo), "prune")
            total += n
            if n < PRUNE_CHUNK:
                return total

    _DELETE = ("WITH gone AS (DELETE FROM records WHERE ctid = ANY(ARRAY(SELECT ctid FROM "
               "records WHERE {} AND t_ns >= %s AND t_ns < %s LIMIT %s)) RETURNING t_ns, "
               "char_length(message) + coalesce(length(fields), 0) AS size) "
               "SELECT count(*), coalesce(sum(size), 0), max(t_ns) FROM gone")

    def _delete_job_chunk(self, db: Any, jid: int, cutoff: int, lo: int) -> tuple[int, int]:
        """(rows deleted, the latest t_ns deleted); the job's row follows (first_ns
        stays low until the last chunk: it may be below the earliest record, never above)."""
        if db.execute("SELECT 1 FROM jobs WHERE jid = %s FOR UPDATE", (jid,)).fetchone() is None:
            return 0, lo  # another collector pruned it
        n, size, top = db.execute(self._DELETE.format("jid = %s"),
                                  (jid, lo, cutoff, PRUNE_CHUNK)).fetchone()
        row = None if n == PRUNE_CHUNK else db.execute(
            "SELECT t_ns FROM records WHERE jid = %s ORDER BY t_ns LIMIT 1", (jid,)).fetchone()
        if n < PRUNE_CHUNK and row is None:
            for table in ("jobs", "job_nodes", "job_ranks"):
                db.execute(f"DELETE FROM {table} WHERE jid = %s", (jid,))
            self._jids.pop(self._jobs.pop(jid, None), None)
        else:
            db.execute("UPDATE jobs SET records = records - %s, bytes = bytes - %s, first_ns = "
                       "coalesce(%s, first_ns) WHERE jid = %s",
                       (n, size + ROW_BYTES * n, row and row[0], jid))
        return n, lo if top is None else top

    def _delete_free_chunk(self, db: Any, sid: int, cutoff: int, lo: int) -> tuple[int, int]:
        """As _delete_job_chunk, for a stream's jobless records."""
        db.execute("SELECT 1 FROM streams WHERE sid = %s FOR UPDATE", (sid,))
        n, size, top = db.execute(self._DELETE.format("sid = %s AND jid IS NULL"),
                                  (sid, lo, cutoff, PRUNE_CHUNK)).fetchone()
        row, gone = None, False
        if n < PRUNE_CHUNK:
            row = db.execute("SELECT t_ns FROM records WHERE sid = %s AND jid IS NULL "
                             "ORDER BY t_ns LIMIT 1", (sid,)).fetchone()
            gone = row is None
        db.execute("UPDATE streams SET free_first_ns = CASE WHEN %s THEN NULL ELSE "
                   "coalesce(%s, free_first_ns) END, free_last_ns = CASE WHEN %s THEN NULL "
                   "ELSE free_last_ns END, free_records = free_records - %s, free_bytes = "
                   "free_bytes - %s WHERE sid = %s",
                   (gone, row and row[0], gone, n, size + ROW_BYTES * n, sid))
        return n, lo if top is None else top
