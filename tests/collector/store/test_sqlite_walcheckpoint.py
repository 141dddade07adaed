"""The ingest store's WAL is checkpointed by a thread of its own (walcheckpoint.py), not inside
the commits the agents' acks wait for; every other store checkpoints as SQLite does."""

import threading
import time

from firstfault.collector.store import sqlite as sq
from firstfault.collector.store import walcheckpoint as wc
from firstfault.collector.store.base import Selection
from firstfault.collector.store.sqlite import SqliteStore


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ff-store-ckpt"]


def _wait(what, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_the_ingest_store_s_wal_is_checkpointed_by_its_own_thread(tmp_path, rec):
    path = tmp_path / "ff.db"
    with SqliteStore(path, checkpoint_thread=True) as s:
        assert s._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == wc.SAFETY_PAGES
        assert len(_threads()) == 1
        size = path.stat().st_size
        s.insert([rec(i) for i in range(2000)])
        checkpointer = s.d._checkpointer
        _wait(lambda: checkpointer.checkpoints >= 1)
        assert path.stat().st_size > size  # the pages reached the database file, not the writer's doing
        assert len(list(s.records(Selection()))) == 2000
    assert _threads() == []  # close() stopped it


def test_other_stores_checkpoint_in_their_commits(tmp_path, rec):
    path = tmp_path / "ff.db"
    with SqliteStore(path) as s:
        assert s._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == sq.WAL_AUTOCHECKPOINT
        s.insert([rec(0)])
        assert _threads() == []


def test_a_long_wal_is_started_over(tmp_path, rec, monkeypatch):
    monkeypatch.setattr(wc, "RESTART_FRAMES", 1)  # every WAL is long: each round RESTARTs
    path = tmp_path / "ff.db"
    with SqliteStore(path, checkpoint_thread=True) as s:
        s.insert([rec(i) for i in range(2000)])
        checkpointer = s.d._checkpointer
        _wait(lambda: checkpointer.restarts >= 1)
        s.insert([rec(2000)])  # the writer goes on after it
        assert len(list(s.records(Selection()))) == 2001
