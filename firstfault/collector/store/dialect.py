"""What a store backend holds that the core (core.py) does not: the Dialect protocol.

The core (BlockStore) does everything the stores do alike: ingest of batches into
blocks (blocks.py), report marks (marking.py), reads by job, node, rank and time
(read.py), retention (prune.py), jobs and clocks. A dialect gives it one database:

- SQL text: the core writes its statements with ``?`` placeholders in the SQL both
  SQLite and PostgreSQL accept (``INSERT ... ON CONFLICT DO NOTHING``, ``CASE`` for a
  scalar min or max); ``execute`` turns them into the driver's; ``hint(index)`` is the
  clause that names an index to a planner that needs it (SQLite's INDEXED BY), and
  ``for_update`` the clause that locks the rows a SELECT returns for the transaction
  (PostgreSQL's FOR UPDATE; SQLite's one writer at a time needs none).
- Connection: ``execute`` opens (or, after it broke, reopens) it, creating or
  migrating the schema (the dialect's MIGRATIONS, a list of steps applied in order in
  one transaction, the version their count); ``changed`` says when names the core
  caches may be stale (another connection committed, a reconnect); ``close``.
- Transactions: ``transaction(work, what)`` runs ``work()`` in one write transaction,
  committed on return; driver errors become StoreError naming the database and
  ``what``; a conflict worth trying again (deadlock, serialization) becomes Retry.
- Text: ``escape``/``unescape`` of names stored as text (PostgreSQL's text can not
  hold U+0000); records themselves are msgpack bytes in blocks, never escaped.
- Space: ``used_bytes``, what ``prune(max_bytes=)`` bounds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
INSERT_BLOCK = ("INSERT INTO blocks (sid, jid, seq_lo, seq_hi, t_lo, t_hi, n, ranks, seqs, data, "
                "idx) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
INSERT_MARKS = "INSERT INTO marks (bid, mid, seqs, data) VALUES (?, ?, ?, ?)"
INSERT_PENDING = "INSERT INTO pending (bid) VALUES (?)"


class Retry(Exception):
    """A write transaction was rolled back by a conflict (a deadlock, a job another
    collector pruned meanwhile): the core reloads its names and runs it again."""


class Dialect(Protocol):
    name: str  # the database for messages and logs (a URL without its password)
    for_update: str  # appended to a SELECT that locks its rows: " FOR UPDATE" or ""

    def hint(self, index: str) -> str:
        """The clause after ``FROM table AS alias`` that makes the planner use ``index``."""

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        """A cursor of ``sql`` (``?`` placeholders) run with ``args``."""

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    def insert_block(self, row: Sequence[Any], marks: Sequence[Any] | None) -> int:
        """Insert a ``blocks`` row (INSERT_BLOCK's parameters) and its ``marks`` row's
        (mid, seqs, data), or with None its ``pending`` row; the new bid."""

    def errors(self, what: str) -> AbstractContextManager[None]:
        """Driver errors inside as StoreError naming the database and ``what``."""

    def transaction(self, work: Callable[[], T], what: str) -> T:
        """``work()`` in one write transaction, committed on return (see above)."""

    def changed(self) -> bool:
        """True when the core's cached names may be stale since the last call."""

    def escape(self, s: str) -> str: ...

    def unescape(self, s: str) -> str: ...

    def used_bytes(self) -> int: ...

    def close(self) -> None: ...


def placeholders(n: int) -> str:
    """``?, ?, ...`` n times (an IN list)."""
    return ", ".join("?" * n)


def chunks(items: Sequence[T], size: int = 500) -> Iterator[Sequence[T]]:
    """``items`` in slices of ``size`` (IN lists of bounded length)."""
    for lo in range(0, len(items), size):
        yield items[lo:lo + size]
