"""Where the collector keeps records: the Store protocol and its backends."""

from __future__ import annotations

from firstfault.collector.store.base import Marker, Store

URL_SCHEMES = ("postgres://", "postgresql://")


def display(db: str) -> str:
    """``db`` for messages and logs: a URL's password left out."""
    scheme, sep, rest = db.partition("://")
    if not sep:
        return db
    where, slash, tail = rest.partition("/")
    user, at, host = where.rpartition("@")
    path, mark, query = tail.partition("?")
    query = "&".join(p for p in query.split("&") if not p.startswith("password="))
    return (f"{scheme}://{user.split(':', 1)[0]}{at}{host}{slash}{path}"
            f"{mark if query else ''}{query}")


def open_store(db: str, *, marker: Marker | None = None, ingest: bool = False) -> Store:
    """The store ``db`` names: a postgres:// or postgresql:// URL (PostgresStore), else
    a SQLite file path (SqliteStore); both mark with ``marker`` (base.Marker) what a
    report reads. ``ingest``: the ingest server's writer, whose acks wait on its commits
    (SQLite's WAL is then checkpointed by a thread of its own). StoreError if it can not
    be opened."""
    if db.startswith(URL_SCHEMES):
        from firstfault.collector.store.postgres import PostgresStore

        return PostgresStore(db, marker=marker)
    from firstfault.collector.store.sqlite import SqliteStore

    return SqliteStore(db, marker=marker, checkpoint_thread=ingest)
