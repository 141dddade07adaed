"""SqliteStore: the collector's embedded default store, one SQLite file (stdlib sqlite3):
the core (core.py, the tables and the ingest) over SqliteDialect, what SQLite needs.

Schema version ``len(MIGRATIONS)`` = 3, kept in ``PRAGMA user_version``; ``PRAGMA
application_id`` is 0x66666c74, "fflt"; sqlite_schema.py has the DDL and migrations.

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
    Pages of 16 KiB (new files). ``used_bytes`` (what ``prune(max_bytes=)`` bounds) is
    the live pages, page_count - freelist_count. There is no auto_vacuum (it costs
    every insert): freed pages go on the freelist and new blocks reuse them, so the
    file stays near its high-water mark and stops growing; ``VACUUM`` offline to
    shrink it. The WAL is checkpointed every WAL_AUTOCHECKPOINT pages and cut back
    to JOURNAL_SIZE_LIMIT after; the ingest's store (``checkpoint_thread``) has a thread
    checkpoint it instead (walcheckpoint.py), its commits only at SAFETY_PAGES.

Threads
    One connection per store object (check_same_thread=False): any thread may call
    it, one call at a time, as base.py says (the server runs it on one worker
    thread). A write transaction is BEGIN IMMEDIATE: one writer at a time over the
    file, so no row needs locking. For concurrent reading open a second SqliteStore
    on the same file: WAL readers do not block the writer; each store reloads its
    names when another connection has committed (PRAGMA data_version).

Known issues: opening does not run integrity_check (it reads the whole file).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from firstfault.collector.store.base import Marker, StoreError
from firstfault.collector.store.blocks import COLUMNS
from firstfault.collector.store.core import BlockStore
from firstfault.collector.store.dialect import INSERT_BLOCK, INSERT_MARKS, INSERT_PENDING
from firstfault.collector.store.sqlite_schema import MIGRATIONS
from firstfault.collector.store.walcheckpoint import SAFETY_PAGES, WalCheckpointer

__all__ = ["COLUMNS", "MIGRATIONS", "SqliteDialect", "SqliteStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")
APPLICATION_ID = 0x66666C74  # "fflt"
PAGE_SIZE = 16384  # new files: ~10% cheaper inserts than 4 KiB pages (bench/RESULTS.md)
WAL_AUTOCHECKPOINT = 1024  # pages (16 MiB)
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024
MIN_SQLITE = (3, 24, 0)  # upsert (ON CONFLICT), partial indexes, WITHOUT ROWID


class SqliteDialect:
    """What SQLite needs (dialect.Dialect): the file, its pragmas and migrations."""

    for_update = ""  # BEGIN IMMEDIATE: the one writer holds the whole file

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0,
                 power_safe: bool = False, cache_mib: int = 64, checkpoint_thread: bool = False) -> None:
        self.path = self.name = str(path)
        self._checkpointer: WalCheckpointer | None = None
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
            self._open(power_safe, cache_mib, SAFETY_PAGES if checkpoint_thread else WAL_AUTOCHECKPOINT)
            if checkpoint_thread:
                self._checkpointer = WalCheckpointer(self.path)
                self._checkpointer.start()
        except BaseException as e:
            self._db.close()
            self._db = None
            if isinstance(e, sqlite3.DatabaseError):
                raise StoreError(f"{self.path}: not a usable SQLite database ({e}); move "
                                 "it aside and start with a new file") from e
            if isinstance(e, sqlite3.Error):
                raise StoreError(f"{self.path}: can not open the store: {e}") from e
            raise

    def _open(self, power_safe: bool, cache_mib: int, autocheckpoint_pages: int) -> None:
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
        db.execute(f"PRAGMA wal_autocheckpoint={autocheckpoint_pages}")
        db.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
        self._migrate(db)
        self._data_version = db.execute("PRAGMA data_version").fetchone()[0]

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

    # --- dialect.Dialect ----------------------------------------------------------------

    def conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"{self.path}: the store is closed")
        return self._db

    def hint(self, index: str) -> str:
        return f"INDEXED BY {index}"

    def execute(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn().execute(sql, args)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.conn().executemany(sql, rows)

    def insert_block(self, row: Sequence[Any], marks: Sequence[Any] | None) -> int:
        db = self.conn()
        bid = db.execute(INSERT_BLOCK, row).lastrowid
        if marks is None:
            db.execute(INSERT_PENDING, (bid,))
        else:
            db.execute(INSERT_MARKS, (bid, *marks))
        return bid

    @contextmanager
    def errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: {what} failed: {e}") from e

    def transaction(self, work: Callable[[], T], what: str) -> T:
        db = self.conn()
        with self.errors(what):
            db.execute("BEGIN IMMEDIATE")
            try:
                result = work()
                db.execute("COMMIT")
                return result
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def changed(self) -> bool:
        v = self.conn().execute("PRAGMA data_version").fetchone()[0]
        if v == self._data_version:
            return False
        self._data_version = v
        return True

    @staticmethod
    def escape(s: str) -> str:
        return s

    @staticmethod
    def unescape(s: str) -> str:
        return s

    def used_bytes(self) -> int:
        """Bytes of the pages in use (page_count - freelist_count)."""
        db = self.conn()
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        return (pages - free) * db.execute("PRAGMA page_size").fetchone()[0]

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        if self._db is not None:
            self._db.close()
            self._db = None


class SqliteStore(BlockStore):
    """The store on one SQLite file: BlockStore over a SqliteDialect."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0,
                 power_safe: bool = False, cache_mib: int = 64,
                 now_ns: Callable[[], int] = time.time_ns, marker: Marker | None = None,
                 checkpoint_thread: bool = False) -> None:
        """Open (creating or migrating) the store at ``path``; StoreError if it can not be.

        busy_timeout_s: how long to wait for another connection's write lock.
        power_safe: synchronous=FULL, so commits survive a power loss, not only a
        kill of the process. cache_mib: SQLite page cache. now_ns: the clock for
        job status and prune ages (tests). marker: marks at insert what a report
        will read (base.Marker; firstfault/analysis/reads.py), None for no marks.
        checkpoint_thread: the WAL checkpointed by a thread of its own (walcheckpoint.py), not
        by the commit that fills it: for the ingest's writer, whose acks wait on its commits."""
        dialect = SqliteDialect(path, busy_timeout_s=busy_timeout_s, power_safe=power_safe,
                                cache_mib=cache_mib, checkpoint_thread=checkpoint_thread)
        self.path = dialect.path
        try:
            super().__init__(dialect, marker=marker, now_ns=now_ns)
        except BaseException:
            dialect.close()
            raise

    @property
    def _db(self) -> sqlite3.Connection | None:
        """The connection (tests and tools that look at the file)."""
        return self.d._db
