"""PostgresStore: the collector's store on a PostgreSQL server, for when one collector
is not enough (several collectors, one database): the core (core.py: the tables, the
ingest, reads, marks, prune, as SQLite's store) over PostgresDialect, what PostgreSQL
needs. psycopg 3, imported on first use (``pip install 'firstfault[postgres]'``);
selected by ``--db postgresql://...``.

Records are kept as blocks (blocks.py), as in SqliteStore: a row per block of a
batch, not per record (4x less server CPU a record than the row layout of schema
version 2: bench/pgblocks.py). The schema and its migrations, from the row layout
too: postgres_schema.py (made in the connection's current schema, one migration at
a time under an advisory lock).

Several collectors write one database: a write transaction locks its streams' rows
(SELECT ... FOR UPDATE, in sid order), so a stream's writers take turns and
records above its high_seq are new by construction; then new jobs (name order),
then jobs (jid order). A prune holds the job's (or stream's) row. A deadlock, a
serialization failure or a job pruned meanwhile by another collector rolls the
transaction back and the core runs it again (core.RETRIES times). With
synchronous_commit on, the server's default, a committed insert survives even a
crash of the server.

Connection: one, in autocommit mode (transactions explicit); a broken one is
replaced on the next call (a server restart costs the calls that meet it a
StoreError, no more), and the core reloads its names. Any thread may call, one call
at a time (base.py).

Space: ``used_bytes`` is the bytes of the blocks' and marks' values plus ROW_BYTES a
row, summed over the rows (a block row per ~1000 records: cheap), not asked of the
server: tables keep the space of deleted rows for new ones, so the database stays
near its high-water mark (VACUUM FULL, offline, shrinks it).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from firstfault.collector.store import display
from firstfault.collector.store.base import Marker, StoreError
from firstfault.collector.store.core import BlockStore
from firstfault.collector.store.dialect import INSERT_BLOCK, Retry
from firstfault.collector.store.postgres_schema import escape, migrate, unescape

log = logging.getLogger(__name__)

T = TypeVar("T")
ROW_BYTES = 100  # a block or marks row's tuple and index entries besides its values
_BLOCK_MARKS = (f"WITH b AS ({INSERT_BLOCK} RETURNING bid) INSERT INTO marks (bid, mid, seqs, data) "
                "SELECT bid, ?, ?, ? FROM b RETURNING bid")
_BLOCK_PENDING = f"WITH b AS ({INSERT_BLOCK} RETURNING bid) INSERT INTO pending (bid) SELECT bid FROM b RETURNING bid"
_USED = ("SELECT ((SELECT coalesce(sum(octet_length(seqs) + octet_length(data) + "
         "coalesce(octet_length(idx), 0) + coalesce(octet_length(ranks), 0)), 0) + "
         f"{ROW_BYTES} * count(*) FROM blocks) + (SELECT coalesce(sum(octet_length(seqs) + "
         f"octet_length(data)), 0) + {ROW_BYTES} * count(*) FROM marks))::bigint")


class PostgresDialect:
    """What PostgreSQL needs (dialect.Dialect): the connection, its schema, row locks."""

    for_update = " FOR UPDATE"

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0) -> None:
        try:
            import psycopg
        except ImportError as e:
            raise StoreError("the PostgreSQL store needs psycopg 3: pip install "
                             "'firstfault[postgres]'") from e
        self._pg = psycopg
        self.url, self.name = url, display(url)
        self._timeout = connect_timeout_s
        self._db: Any = None
        self._closed = False
        self._reconnected = False
        self._sql: dict[str, str] = {}  # ? placeholders -> %s
        with self.errors("opening the store"):
            self.conn()

    def conn(self) -> Any:
        """The connection; a new one (schema checked) after it broke."""
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
            self._db, self._reconnected = db, True
        return self._db

    def _q(self, sql: str) -> str:
        q = self._sql.get(sql)
        if q is None:
            q = self._sql[sql] = sql.replace("?", "%s")
        return q

    # --- dialect.Dialect ----------------------------------------------------------------

    def hint(self, index: str) -> str:
        return ""  # the planner picks the index itself

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        return self.conn().execute(self._q(sql), args or None)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self.conn().cursor() as cur:
            cur.executemany(self._q(sql), rows)

    def insert_block(self, row: Sequence[Any], marks: Sequence[Any] | None) -> int:
        """The block and its marks (or pending) row in one statement: one round trip."""
        if marks is None:
            return self.execute(_BLOCK_PENDING, row).fetchone()[0]
        return self.execute(_BLOCK_MARKS, (*row, *marks)).fetchone()[0]

    @contextmanager
    def errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._pg.Error as e:
            raise StoreError(f"{self.name}: {what} failed: {str(e).strip()}") from e

    def transaction(self, work: Callable[[], T], what: str) -> T:
        errors = self._pg.errors
        with self.errors(what):
            try:
                with self.conn().transaction():
                    return work()
            except (errors.DeadlockDetected, errors.SerializationFailure) as e:
                raise Retry(type(e).__name__) from e

    def changed(self) -> bool:
        changed, self._reconnected = self._reconnected, False
        return changed

    @staticmethod
    def escape(s: str) -> str:
        return escape(s)

    @staticmethod
    def unescape(s: str) -> str:
        return unescape(s)

    def used_bytes(self) -> int:
        return self.execute(_USED).fetchone()[0]

    def close(self) -> None:
        self._closed = True
        if self._db is not None:
            self._db.close()
            self._db = None


class PostgresStore(BlockStore):
    """The store on a PostgreSQL database: BlockStore over a PostgresDialect."""

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0,
                 now_ns: Callable[[], int] = time.time_ns, marker: Marker | None = None) -> None:
        """Connect to ``url`` (postgres:// or postgresql://, libpq's URI syntax) and
        create or migrate the schema; StoreError if it can not be done. marker: marks
        at insert what a report reads (base.Marker; ``needed`` serves them)."""
        dialect = PostgresDialect(url, connect_timeout_s=connect_timeout_s)
        self.url = url
        try:
            super().__init__(dialect, marker=marker, now_ns=now_ns)
        except BaseException:
            dialect.close()
            raise

    def _conn(self) -> Any:
        """The connection (tests and tools that look at the database)."""
        return self.d.conn()
