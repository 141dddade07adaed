"""The ingest server on the real SqliteStore (its insert_columns fast path)."""

from __future__ import annotations

import threading

import msgpack

from firstfault.collector.config import ClockConfig
from tests.collector.server.ingest_helpers import make_records


def test_agents_into_sqlite(serve, tmp_path):
    from firstfault.collector.store.base import Selection
    from firstfault.collector.store.sqlite import SqliteStore

    store = SqliteStore(tmp_path / "ff.db")
    srv = serve(store, clock=ClockConfig(ping_interval_s=0.1, save_interval_s=0.2))
    assert srv.server.queue._insert_columns is not None  # the fast path is taken
    errors = []

    def run(i):
        try:
            a = srv.agent(node=f"gpu-{i}", stream="s")
            a.hello()
            a.stream_records(0, batches=10, size=300)
            a.close()
            b = srv.agent(node=f"gpu-{i}", stream="s")  # reconnect: resend the last batch
            assert b.hello().high_seq == 2999
            b.stream_records(2700, batches=1, size=600)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    srv.settle(lambda: len(srv.server.clocks.nodes()) == 4)
    srv.stop()  # saves the clock estimates
    m = srv.metrics
    assert m.records_stored == 4 * 3300 and m.records_duplicate == 4 * 300
    store.close()
    with SqliteStore(tmp_path / "ff.db") as again:
        for i in range(4):
            recs = list(again.records(Selection(nodes=(f"gpu-{i}",))))
            assert sorted(r.seq for r in recs) == list(range(3300))
        assert recs[0].message.startswith("[2026-12-02") and recs[0].job == "12345"
        clocks = again.clocks()
        assert set(clocks) == {f"gpu-{i}" for i in range(4)}
        assert all(abs(c.offset_ns) <= c.uncertainty_ns + 5_000_000 for c in clocks.values())


def test_group_commits_are_marked_as_they_are_stored(serve, tmp_path):
    """Batches that queue go in one transaction, each block marked as it is written
    (nothing waits in ``pending``), its bytes as the frame carried them."""
    import sqlite3

    from firstfault.analysis.catalog import load_catalog
    from firstfault.analysis.reads import ReportMarker
    from firstfault.collector.store.sqlite import SqliteStore

    gate = threading.Event()
    calls = []

    class SlowFirst(SqliteStore):
        def insert_columns(self, *a, **kw):
            calls.append("one")
            gate.wait(10)  # the others queue meanwhile
            return super().insert_columns(*a, **kw)

        def insert_columns_many(self, batches):
            calls.append(len(batches))
            return super().insert_columns_many(batches)

    store = SlowFirst(tmp_path / "ff.db", marker=ReportMarker(load_catalog()))
    srv = serve(store)
    agents = [srv.agent(node=f"gpu-{i}", stream="s") for i in range(4)]
    for a in agents:
        a.hello()
    agents[0].send_batch(make_records("gpu-0", "s", 0, 300))
    srv.settle(lambda: calls == ["one"])
    for i, a in enumerate(agents[1:], 1):
        a.send_batch(make_records(f"gpu-{i}", "s", 0, 300))
    srv.settle(lambda: srv.server.queue.waiting and len(srv.server.queue.waiting) == 3)
    gate.set()
    for a in agents:
        a.wait_ack(299)
    assert calls == ["one", 3]  # one group commit of the three that queued
    db = sqlite3.connect(tmp_path / "ff.db")
    assert db.execute("SELECT count(*) FROM pending").fetchone()[0] == 0
    blocks = db.execute("SELECT count(*) FROM blocks").fetchone()[0]
    assert blocks >= 4 and db.execute("SELECT count(*) FROM marks").fetchone()[0] == blocks
    sent = msgpack.packb([make_records("gpu-1", "s", 0, 300)[i].message for i in range(300)])
    assert any(sent in data for (data,) in db.execute("SELECT data FROM blocks"))
    db.close()
    srv.stop()
    assert not srv.server.queue.marks_behind
