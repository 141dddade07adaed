"""The ingest server over real sockets on 127.0.0.1: sessions, acks, dedupe, errors,
backpressure, clocks, TLS, graceful stop. The store is the in-memory FakeStore."""

from __future__ import annotations

import collections
import socket
import ssl
import struct
import threading
import time

import msgpack
import pytest

from firstfault import wire, wiredecode
from firstfault.collector.config import ClockConfig, LimitsConfig, TLSConfig
from firstfault.collector.metrics import Metrics
from firstfault.collector.server import make_ssl_context
from firstfault.wire import Batch, Hello, Ping, Pong
from tests.collector.server.ingest_helpers import ClosedByServer, FakeStore, make_pki, make_records


def frame(obj) -> bytes:
    body = msgpack.packb(obj)
    return struct.pack(">I", len(body)) + body


def test_concurrent_agents_all_acked_and_stored(serve):
    srv = serve()
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            a = srv.agent(node=f"gpu-{i:02d}", stream=f"s{i}")
            assert a.hello().high_seq is None
            a.stream_records(0, batches=20, size=50)
            a.close()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for i in range(6):
        assert srv.store.seqs(f"gpu-{i:02d}", f"s{i}") == list(range(1000))
    m = srv.metrics
    assert m.records_received == m.records_stored == 6000 and m.records_duplicate == 0
    assert m.batches == 120 and m.connections == 6
    srv.settle(lambda: m.connections_open == 0)
    assert m.errors == {} and srv.server.budget.used == 0


def test_welcome_reports_the_stored_high_seq(serve):
    srv = serve()
    a = srv.agent()
    a.hello()
    a.stream_records(0, batches=2, size=10)
    a.close()
    w = srv.agent().hello()
    assert w.high_seq == 19 and w.max_batch_records == wire.MAX_BATCH_RECORDS
    assert srv.agent(stream="other").hello().high_seq is None


def test_ack_only_after_insert_returned(serve):
    gate = threading.Event()
    store = FakeStore(gate=gate)
    srv = serve(store)
    a = srv.agent()
    a.hello()
    a.send_batch(make_records("gpu-01", "s1", 0, 10))
    assert store.entered.wait(5)
    with pytest.raises(socket.timeout):  # the store holds the batch: no ack
        a.wait_ack(9, timeout=0.5)
    gate.set()
    a.wait_ack(9)
    acked_at = time.monotonic()
    assert store.inserted_at and store.inserted_at[0][0] <= acked_at
    assert store.seqs("gpu-01", "s1") == list(range(10))


def test_columns_fast_path_used_when_the_store_has_it(serve):
    class ColumnStore(FakeStore):
        def __init__(self):
            super().__init__()
            self.column_calls = []

        def insert_columns(self, node, stream, seqs, cols):
            self.column_calls.append((node, stream, list(seqs), cols["message"][:1]))
            recs = [wire.Record(node=node, stream=stream, seq=s, source=src, kind=k, message=msg,
                                observed_ns=obs)
                    for s, src, k, msg, obs in zip(seqs, cols["source"], cols["kind"],
                                                   cols["message"], cols["observed_ns"])]
            return self.insert(recs)

    store = ColumnStore()
    srv = serve(store)
    a = srv.agent()
    a.hello()
    a.stream_records(0, batches=3, size=7)
    assert [c[2] for c in store.column_calls] == [list(range(i, i + 7)) for i in (0, 7, 14)]
    assert store.seqs("gpu-01", "s1") == list(range(21))


class GroupStore(FakeStore):
    """A store with insert_columns_many: one call (one transaction) for several batches."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.groups: list[int] = []

    def insert_columns(self, node, stream, seqs, cols):
        return self.insert_columns_many([(node, stream, seqs, cols)])[0]

    def insert_columns_many(self, batches):
        self.groups.append(len(batches))
        return [self.insert([wire.Record(node=node, stream=stream, seq=s, source=src, kind=k,
                                         message=m, observed_ns=o)
                             for s, src, k, m, o in zip(seqs, cols["source"], cols["kind"],
                                                        cols["message"], cols["observed_ns"])])
                for node, stream, seqs, cols in batches]


def test_batches_queued_behind_a_busy_store_are_committed_together(serve):
    gate = threading.Event()
    store = GroupStore(gate=gate)
    srv = serve(store)
    agents = [srv.agent(stream=f"s{i}") for i in range(4)]
    for a in agents:
        a.hello()
    agents[0].send_batch(make_records("gpu-01", "s0", 0, 5))
    assert store.entered.wait(5)  # the store is busy with that one...
    for i, a in enumerate(agents[1:], 1):  # ...while three more arrive
        a.send_batch(make_records("gpu-01", f"s{i}", 0, 5))
    srv.settle(lambda: len(srv.server.queue.waiting) == 3)
    gate.set()
    for a in agents:
        a.wait_ack(4)
    assert store.groups == [1, 3]
    assert all(store.seqs("gpu-01", f"s{i}") == list(range(5)) for i in range(4))


def test_a_failed_group_acks_none_of_its_batches(serve):
    gate = threading.Event()
    store = GroupStore(gate=gate)
    srv = serve(store)
    agents = [srv.agent(stream=f"s{i}") for i in range(3)]
    for a in agents:
        a.hello()
    agents[0].send_batch(make_records("gpu-01", "s0", 0, 5))
    assert store.entered.wait(5)
    for i, a in enumerate(agents[1:], 1):
        a.send_batch(make_records("gpu-01", f"s{i}", 0, 5))
    srv.settle(lambda: len(srv.server.queue.waiting) == 2)
    store.fail = OSError("disk full")  # the first batch, still in the store, fails too
    gate.set()
    for a in agents:
        assert a.expect_error().code == wire.ERR_INTERNAL
    assert store.seqs("gpu-01", "s1") == [] and srv.metrics.batches == 0


def test_resend_after_a_dropped_connection_stores_each_record_once(serve):
    srv = serve()
    store = srv.store
    a = srv.agent()
    a.hello()
    nxt = a.stream_records(0, batches=5, size=20)  # 0..99 acked
    a.send_batch(make_records("gpu-01", "s1", nxt, 50))  # 100..149, then the link drops
    a.close()
    # The agent reconnects and resends everything after the collector's high mark.
    b = srv.agent()
    high = b.hello().high_seq
    assert high in (99, 149)
    b.stream_records(high + 1, batches=1, size=199 - high)
    assert store.seqs("gpu-01", "s1") == list(range(200))
    assert max(store.offered.values()) == 1  # no record offered twice
    assert srv.metrics.records_duplicate == 0


def test_resends_below_the_high_mark_are_acked_not_duplicated(serve):
    srv = serve()
    a = srv.agent()
    a.hello()
    a.stream_records(0, batches=2, size=10)
    a.close()
    b = srv.agent()
    assert b.hello().high_seq == 19
    b.stream_records(0, batches=1, size=30)  # an agent that ignores high_seq
    assert srv.store.seqs("gpu-01", "s1") == list(range(30))
    assert srv.metrics.records_duplicate == 20 and srv.metrics.records_stored == 30


def _hello_frame(**changes) -> bytes:
    m = Hello(node="bad", stream="x", token="", agent_ns=1, agent_name="a",
              agent_version="0").to_wire()
    m.update(changes)
    return frame(m)


def _batch_frame(node="bad", stream="x", **changes) -> bytes:
    m = Batch(tuple(make_records(node, stream, 0, 2))).to_wire()
    m.update(changes)
    return frame(m)


BAD_SESSIONS = {
    # name: (frames after connecting, expected error code, server token)
    "version": ([_hello_frame(version=2)], wire.ERR_VERSION, None),
    "bad token": ([_hello_frame(token="guess")], wire.ERR_AUTH, "sekrit"),
    "missing token": ([_hello_frame()], wire.ERR_AUTH, "sekrit"),
    "oversize prefix": ([struct.pack(">I", wire.MAX_FRAME_BYTES + 1)], wire.ERR_TOO_LARGE, None),
    "oversize hello": ([struct.pack(">I", 1 << 20) + b"\0" * 100], wire.ERR_TOO_LARGE, None),
    "oversize batch": ([_hello_frame(), struct.pack(">I", wire.MAX_FRAME_BYTES + 1)],
                       wire.ERR_TOO_LARGE, None),
    "garbage": ([b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1"], wire.ERR_MALFORMED, None),
    "not a map": ([frame([1, 2, 3])], wire.ERR_MALFORMED, None),
    "unknown type": ([frame({"type": "subscribe"})], wire.ERR_MALFORMED, None),
    "batch before hello": ([_batch_frame()], wire.ERR_PROTOCOL, None),
    "batch of another node": ([_hello_frame(), _batch_frame(node="other")], wire.ERR_PROTOCOL,
                              None),
    "bad column": ([_hello_frame(), _batch_frame(count=3)], wire.ERR_MALFORMED, None),
    "second hello": ([_hello_frame(), _hello_frame()], wire.ERR_PROTOCOL, None),
    "huge string": ([_hello_frame(), frame({"type": "ping", "t1": "x" * 70000})],
                    wire.ERR_TOO_LARGE, None),
}


@pytest.mark.parametrize("name", sorted(BAD_SESSIONS))
def test_bad_sessions_close_only_that_connection(serve, name):
    frames, code, token = BAD_SESSIONS[name]
    srv = serve(token=token)
    good = srv.agent(node="gpu-good")
    good.hello(token=token or "")
    nxt = good.stream_records(0, batches=2, size=10)

    bad = srv.agent(node="bad", stream="x")
    for f in frames:
        bad.send_raw(f)
    got = bad.expect_error()
    assert got is not None and got.code == code, got
    srv.settle(lambda: srv.metrics.errors.get(code) == 1)

    good.stream_records(nxt, batches=2, size=10)  # the other agent never noticed
    assert srv.store.seqs("gpu-good", "s1") == list(range(40))
    assert srv.store.seqs("bad", "x") == []
    assert f'firstfault_collector_errors_total{{code="{code}"}} 1' in srv.metrics.render_prometheus()


def test_batch_over_the_session_limit_is_refused(serve):
    srv = serve(limits=LimitsConfig(max_batch_records=5, max_inflight_records=100,
                                    read_timeout_s=5))
    a = srv.agent()
    assert a.hello().max_batch_records == 5
    a.send_batch(make_records("gpu-01", "s1", 0, 6))
    assert a.expect_error().code == wire.ERR_TOO_LARGE
    assert srv.store.seqs("gpu-01", "s1") == []


def test_read_timeout_closes_a_silent_connection(serve):
    srv = serve(limits=LimitsConfig(read_timeout_s=0.3), clock=ClockConfig(ping_interval_s=60))
    a = srv.agent()
    a.send_raw(_hello_frame()[:7])  # half a frame, then nothing
    err = a.expect_error()
    assert err.code == wire.ERR_PROTOCOL and "within" in err.reason
    srv.settle(lambda: srv.metrics.errors.get("timeout") == 1)


@pytest.mark.parametrize("after_hello, code, counted", [
    (b"", None, None),  # EOF between frames: the session ends, nothing to count
    (b"\x00\x00\x01\x00abc", None, "truncated"),  # EOF inside a frame
    (b"\x00\x00\x00\x02\xc1\xc1", wire.ERR_MALFORMED, "malformed"),  # a bad frame, socket left open
])
def test_eof_and_bad_frames_close_at_once_not_at_the_read_timeout(serve, after_hello, code, counted):
    """A WireError closes the stream and EOF ends the session when they happen; neither
    waits for the read timeout (30 s here)."""
    srv = serve(limits=LimitsConfig(read_timeout_s=30))
    a = srv.agent()
    a.hello()
    a.send_raw(after_hello)
    if code is None:
        a.sock.shutdown(socket.SHUT_WR)
    t0 = time.monotonic()
    err = a.expect_error(timeout=25)
    assert time.monotonic() - t0 < 5
    assert (err.code if err else None) == code
    srv.settle(lambda: srv.metrics.connections_open == 0, timeout=5)
    assert srv.metrics.errors == ({counted: 1} if counted else {})


def test_a_burst_of_strangers_beyond_the_bound_is_closed_not_leaked(serve):
    """Connections accepted in one burst beyond limits.max_unauthenticated close the
    oldest at once, also those whose task had not started yet (their socket was left
    open, unread, until the garbage collector found it: found by bench/fuzz_ingest.py's
    1,000 idle connections). Each one is welcomed or closed; none hangs."""
    srv = serve(limits=LimitsConfig(read_timeout_s=30, max_unauthenticated=4))
    hello = _hello_frame()
    socks = [socket.create_connection(srv.server.address, timeout=5) for _ in range(300)]
    for s in socks:
        s.sendall(hello)
    outcome = collections.Counter(map(_first_answer, socks))
    assert outcome["hung"] == 0, outcome
    assert outcome["Welcome"] <= 4 and outcome["closed"] + outcome["Error"] >= 296, outcome
    assert srv.metrics.errors["pending_evicted"] + srv.metrics.errors.get("internal", 0) >= 296


def _first_answer(s: socket.socket) -> str:
    """The first message's type, "closed" when it closed first, "hung" if neither came."""
    dec = wiredecode.FrameDecoder()
    try:
        with s:
            while data := s.recv(65536):
                for msg in dec.feed(data):
                    return type(msg).__name__
        return "closed"
    except ConnectionResetError:
        return "closed"
    except TimeoutError:
        return "hung"


def test_store_failure_is_not_acked(serve):
    store = FakeStore()
    store.fail = OSError("disk full")
    srv = serve(store)
    a = srv.agent()
    a.hello()
    a.send_batch(make_records("gpu-01", "s1", 0, 3))
    err = a.expect_error()
    assert err.code == wire.ERR_INTERNAL and "disk full" in err.reason
    srv.settle(lambda: srv.metrics.errors.get(wire.ERR_INTERNAL) == 1)
    assert srv.metrics.batches == 0


def test_max_connections(serve):
    srv = serve(limits=LimitsConfig(max_connections=2, read_timeout_s=5))
    a, b = srv.agent(stream="a"), srv.agent(stream="b")
    a.hello(), b.hello()
    c = srv.agent(stream="c")
    c.send(Hello(node="gpu-01", stream="c", token="", agent_ns=1, agent_name="t", agent_version="0"))
    assert c.expect_error().code == wire.ERR_INTERNAL  # told once it says something
    assert srv.metrics.connections_rejected == 1
    a.close()
    srv.settle(lambda: srv.metrics.connections_open == 1)
    srv.agent(stream="d").hello()


def test_backpressure_bounds_the_records_in_flight(serve):
    """Six agents push 1000-record batches into a store that takes 30 ms a batch: the
    records read and not stored never exceed the bound, and everything is stored."""
    store = FakeStore(delay_s=0.03)
    bound = 3000
    srv = serve(store, limits=LimitsConfig(max_inflight_records=bound, max_batch_records=1000,
                                           read_timeout_s=30))
    samples: list[int] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            samples.append(srv.server.budget.used)
            time.sleep(0.002)

    def push(i):
        a = srv.agent(node=f"n{i}", timeout=60)
        a.hello()
        for k in range(5):  # pipelined: send everything, then read the acks
            a.send_batch(make_records(f"n{i}", "s1", k * 1000, 1000))
        a.wait_ack(4999, timeout=60)
        a.close()

    w = threading.Thread(target=watch)
    w.start()
    threads = [threading.Thread(target=push, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    w.join()
    assert srv.server.budget.peak <= bound and max(samples) <= bound
    assert max(samples) > 0  # it was in use
    for i in range(6):
        assert store.seqs(f"n{i}", "s1") == list(range(5000))
    srv.settle(lambda: srv.server.budget.used == 0)


def test_clock_offsets_of_a_skewed_and_a_drifting_agent(serve):
    drift = 0.02  # 20,000 ppm: fast enough to see in a second of test
    srv = serve(clock=ClockConfig(ping_interval_s=0.05, save_interval_s=0.2,
                                  drift_ppm=drift * 1e6 * 1.5))
    start = time.time_ns()

    def skewed():
        return time.time_ns() + 5_000_000_000

    def drifting():
        now = time.time_ns()
        return now - 2_000_000_000 + int((now - start) * drift)

    a = srv.agent(node="skewed", clock=skewed)
    b = srv.agent(node="drifting", clock=drifting)
    a.hello(), b.hello()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # keep both answering pings
        for ag in (a, b):
            with pytest.raises(socket.timeout):
                ag.recv(timeout=0.02)
    assert a.pongs >= 10 and b.pongs >= 10
    now = time.time_ns()
    est = srv.lt.run(_estimate(srv.server, "skewed", now))
    assert abs(est.offset_ns - (-5_000_000_000)) <= est.uncertainty_ns < 50_000_000
    est = srv.lt.run(_estimate(srv.server, "drifting", now))
    truth = -(-2_000_000_000 + int((now - start) * drift))
    assert abs(est.offset_ns - truth) <= est.uncertainty_ns
    srv.settle(lambda: {"skewed", "drifting"} <= set(srv.store.clocks()))
    assert abs(srv.store.clocks()["skewed"].offset_ns + 5_000_000_000) < 50_000_000


async def _estimate(server, node, now):
    return server.clocks.estimate(node, now)


def test_agent_ping_is_answered_and_foreign_pongs_ignored(serve):
    srv = serve(clock=ClockConfig(ping_interval_s=60))
    a = srv.agent()
    a.hello()
    t1 = time.time_ns()
    a.send(Ping(t1))
    a.send(Pong(12345, 1, 2))  # answers no ping of the server's: no sample
    pong = a.recv()
    assert isinstance(pong, Pong) and pong.t1 == t1 and pong.t2 <= pong.t3
    assert t1 - 10**9 < pong.t2 < time.time_ns() + 10**9
    assert srv.server.clocks.rejected == 0 and srv.metrics.clock_samples <= 1


def test_graceful_stop_finishes_the_batch_being_stored(serve):
    gate = threading.Event()
    store = FakeStore(gate=gate)
    srv = serve(store)
    busy, idle = srv.agent(stream="busy"), srv.agent(stream="idle")
    busy.hello(), idle.hello()
    busy.send_batch(make_records("gpu-01", "busy", 0, 10))
    assert store.entered.wait(5)
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    assert idle.expect_error().code == wire.ERR_SHUTDOWN  # told at once
    with pytest.raises(OSError):
        srv.agent(timeout=1).hello()  # no longer accepting
    gate.set()
    busy.wait_ack(9)  # the batch in the store was finished and acked
    assert busy.expect_error().code == wire.ERR_SHUTDOWN
    stopper.join(10)
    assert not stopper.is_alive()
    assert store.seqs("gpu-01", "busy") == list(range(10))


def test_no_token_only_on_loopback(serve):
    with pytest.raises(ValueError, match="without a token"):
        serve(host="0.0.0.0")


def test_metrics_render_prometheus_text():
    m = Metrics()
    m.records_received = 5
    m.error("auth")
    m.observe_store(0.003)
    m.observe_store(20.0)
    text = m.render_prometheus()
    assert "firstfault_collector_records_received_total 5\n" in text
    assert 'firstfault_collector_errors_total{code="auth"} 1' in text
    assert 'firstfault_collector_store_seconds_bucket{le="0.0025"} 0' in text
    assert 'firstfault_collector_store_seconds_bucket{le="0.005"} 1' in text
    assert 'firstfault_collector_store_seconds_bucket{le="+Inf"} 2' in text
    assert "firstfault_collector_store_seconds_count 2" in text
    for line in text.splitlines():  # every sample line: name{labels} value
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            float(value)
            assert name.startswith("firstfault_collector_")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_mutual_tls(serve, pki):
    ctx = make_ssl_context(TLSConfig(cert=pki / "server.pem", key=pki / "server.key",
                                     client_ca=pki / "ca.pem"))
    srv = serve(ssl_context=ctx, token="t0k")
    client = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    client.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
    a = srv.agent(ssl_context=client)
    a.hello(token="t0k")
    a.stream_records(0, batches=2, size=5)
    assert srv.store.seqs("gpu-01", "s1") == list(range(10))

    anonymous = ssl.create_default_context(cafile=str(pki / "ca.pem"))  # no client cert
    with pytest.raises((ssl.SSLError, ClosedByServer, ConnectionError)):
        b = srv.agent(ssl_context=anonymous, stream="anon")
        b.hello(token="t0k")
    assert srv.store.seqs("gpu-01", "anon") == []
