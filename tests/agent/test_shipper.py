"""The shipper against a real IngestServer on loopback (in-memory store): everything
spooled arrives once, acks shrink the spool, resends after reconnects, failover,
pongs, refusals, and the stop-time flush."""

from __future__ import annotations

import socket
import time

import pytest

from firstfault.agent.shipper import Shipper
from firstfault.agent.sources.base import Draft
from firstfault.agent.spool import Spool
from firstfault.collector.config import ClockConfig, LimitsConfig, TLSConfig
from firstfault.collector.server import IngestServer, make_ssl_context
from firstfault.common.settings import Address
from tests.collector.server.ingest_helpers import FakeStore, LoopThread, make_pki

NODE = "gpu-01"


def drafts(start: int, n: int) -> list[Draft]:
    return [Draft(source="ranklog", kind="rank.line", observed_ns=1_796_000_000_000_000_000 + i,
                  message=f"[rank0]: step {i} loss 2.{i % 97:02d} " + "x" * 100, rank=0, job="j1")
            for i in range(start, start + n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Collector:
    """An IngestServer on its own loop thread; stop() and start() again on the same port."""

    def __init__(self, store: FakeStore, port: int | None = None, token: str | None = None,
                 ssl_context=None) -> None:
        self.store, self.token, self.lt, self.ssl = store, token, LoopThread(), ssl_context
        self.port = port or free_port()
        self.server = None

    def start(self) -> Collector:
        async def make():
            server = IngestServer(self.store, token=self.token, ssl_context=self.ssl,
                                  limits=LimitsConfig(read_timeout_s=5),
                                  clock=ClockConfig(ping_interval_s=0.2, save_interval_s=0.2))
            await server.start("127.0.0.1", self.port)
            return server
        self.server = self.lt.run(make())
        return self

    def stop(self) -> None:
        self.lt.run(self.server.stop(1.0))

    @property
    def address(self) -> Address:
        return Address("127.0.0.1", self.port)


@pytest.fixture
def spool(tmp_path):
    s = Spool(tmp_path / "spool", node=NODE, max_bytes=4 << 20, segment_bytes=256 << 10, fsync="never")
    yield s
    s.close()


def settle(cond, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def fast(spool, collectors, **kw) -> Shipper:
    kw.setdefault("backoff_initial_s", 0.02)
    kw.setdefault("backoff_max_s", 0.1)
    return Shipper(spool, collectors, **kw)


def test_ships_every_record_once_and_acked_segments_are_deleted(spool):
    store = FakeStore()
    c = Collector(store).start()
    acks: list[int] = []
    spool.append(drafts(0, 3000))
    sh = fast(spool, [c.address], on_ack=acks.append).start()
    spool.append(drafts(3000, 3000))
    settle(sh.flushed)
    assert store.seqs(NODE, spool.stream) == list(range(1, 6001))
    assert max(store.offered.values()) == 1
    assert acks and acks[-1] == 6000 and acks == sorted(acks)
    assert spool.stats().segments <= 2  # the closed, acked ones are gone
    assert sh.stop(1.0) is True
    c.stop()


def test_restarted_collector_gets_the_rest_exactly_once(spool):
    store = FakeStore()
    c = Collector(store).start()
    sh = fast(spool, [c.address]).start()
    spool.append(drafts(0, 2000))
    settle(sh.flushed)
    c.stop()
    spool.append(drafts(2000, 2000))  # spooled while the collector is away
    time.sleep(0.2)
    assert len(store.seqs(NODE, spool.stream)) == 2000
    c.start()
    settle(sh.flushed)
    assert store.seqs(NODE, spool.stream) == list(range(1, 4001))
    assert sh.stats.sessions >= 2 and sh.stats.failures >= 1
    sh.stop(0)
    c.stop()


def test_welcome_high_seq_skips_what_the_collector_has(spool):
    store = FakeStore()
    spool.append(drafts(0, 100))
    first = spool.read_after(None, 60)
    store.insert(first)  # stored earlier through another connection
    c = Collector(store).start()
    sh = fast(spool, [c.address]).start()
    settle(sh.flushed)
    assert store.seqs(NODE, spool.stream) == list(range(1, 101))
    assert all(store.offered[(NODE, spool.stream, s)] == 1 for s in range(1, 101))
    sh.stop(0)
    c.stop()


def test_fails_over_to_the_next_collector(spool):
    store = FakeStore()
    c = Collector(store).start()
    dead = Address("127.0.0.1", free_port())  # nothing listens there
    sh = fast(spool, [dead, c.address]).start()
    spool.append(drafts(0, 500))
    settle(sh.flushed)
    assert store.seqs(NODE, spool.stream) == list(range(1, 501))
    assert sh.stats.failures >= 1 and "Connection" in (sh.stats.last_error or "")
    sh.stop(0)
    c.stop()


def test_answers_the_collectors_clock_probes(spool):
    store = FakeStore()
    c = Collector(store).start()
    sh = fast(spool, [c.address]).start()
    settle(lambda: sh.stats.pongs >= 3 and store.clocks_saved)
    est = store.clocks()[NODE]
    assert abs(est.offset_ns) < 50_000_000  # same machine: the clocks agree
    sh.stop(0)
    c.stop()


def test_a_refusal_is_reported_and_nothing_is_acked(spool):
    store = FakeStore()
    c = Collector(store, token="right-token").start()
    spool.append(drafts(0, 10))
    sh = fast(spool, [c.address], token="wrong-token").start()
    settle(lambda: sh.stats.failures >= 2)
    assert "auth" in sh.stats.last_error
    assert store.seqs(NODE, spool.stream) == [] and spool.stats().acked_seq is None
    assert sh.stop(0) is False
    c.stop()


def test_stop_flushes_what_was_spooled(spool):
    store = FakeStore(delay_s=0.05)  # a slow store: acks lag behind
    c = Collector(store).start()
    sh = fast(spool, [c.address]).start()
    spool.append(drafts(0, 5000))
    assert sh.stop(15.0) is True
    assert store.seqs(NODE, spool.stream) == list(range(1, 5001))
    c.stop()


def test_ships_over_mutual_tls_and_a_client_without_a_cert_is_refused(spool, tmp_path):
    import ssl
    pki = make_pki(tmp_path)
    server_ctx = make_ssl_context(TLSConfig(cert=pki / "server.pem", key=pki / "server.key",
                                            client_ca=pki / "ca.pem"))
    store = FakeStore()
    c = Collector(store, token="t0k", ssl_context=server_ctx).start()
    addr = Address("localhost", c.port)
    anon = ssl.create_default_context(cafile=str(pki / "ca.pem"))  # trusts it, shows no cert
    spool.append(drafts(0, 300))
    refused = fast(spool, [addr], token="t0k", ssl_context=anon).start()
    settle(lambda: refused.stats.failures >= 2)
    assert refused.stop(0) is False and store.seqs(NODE, spool.stream) == []
    mine = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    mine.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
    sh = fast(spool, [addr], token="t0k", ssl_context=mine).start()
    settle(sh.flushed)
    assert store.seqs(NODE, spool.stream) == list(range(1, 301))
    sh.stop(0)
    c.stop()


def test_a_collector_that_goes_silent_is_left_after_idle_timeout_s(spool):
    """A collector that welcomes and then says nothing (no ack, no ping) is dead to the
    shipper after idle_timeout_s: it closes the session and connects again."""
    from firstfault import wire

    srv = socket.create_server(("127.0.0.1", 0))
    sessions = []

    def serve():
        while len(sessions) < 2:
            c, _ = srv.accept()
            sessions.append(c)
            c.recv(1 << 16)  # the hello
            c.sendall(wire.encode_message(wire.Welcome(high_seq=None, collector_ns=time.time_ns())))

    import threading
    threading.Thread(target=serve, daemon=True).start()
    spool.append(drafts(0, 3))
    sh = fast(spool, [Address("127.0.0.1", srv.getsockname()[1])], idle_timeout_s=0.3).start()
    try:
        settle(lambda: len(sessions) == 2, 10)
        assert "nothing heard" in sh.stats.last_error and sh.stats.failures >= 1
    finally:
        sh.stop()
        for c in sessions:
            c.close()
        srv.close()
