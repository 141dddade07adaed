"""Random and mutated frames (from the golden frames in tests/data/wire/) against one
server: it never crashes, answers only with protocol messages, ends a bad connection
with one error, keeps its budget, and still serves a well-behaved agent after."""

from __future__ import annotations

import resource
import socket
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firstfault.collector.config import ClockConfig, LimitsConfig
from firstfault.collector.server import IngestServer
from firstfault.wire import Ack, Error, Ping, Pong, Welcome, WireError
from firstfault.wiredecode import FrameDecoder
from tests.collector.server.ingest_helpers import FakeStore, LoopThread, Running

WIRE = Path(__file__).resolve().parents[2] / "data" / "wire"
GOLDEN = {p.stem: p.read_bytes() for p in sorted(WIRE.glob("*.bin"))}
BOUND = 20_000


@pytest.fixture(scope="module")
def fuzz_server():
    lt = LoopThread()

    async def make():
        s = IngestServer(FakeStore(), limits=LimitsConfig(
            read_timeout_s=3, max_inflight_records=BOUND, max_batch_records=10_000),
            clock=ClockConfig(ping_interval_s=0.2, save_interval_s=0.5))
        await s.start("127.0.0.1", 0)
        return s

    running = Running(lt, lt.run(make()))
    running.rss_before = _rss_bytes()
    yield running
    running.stop(grace_s=2)
    lt.close()


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@st.composite
def mutated(draw) -> bytes:
    frame = bytearray(GOLDEN[draw(st.sampled_from(sorted(GOLDEN)))])
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "splice", "prefix", "dup"]))
        if not frame:
            break
        i = draw(st.integers(0, len(frame) - 1))
        if op == "flip":
            frame[i] = draw(st.integers(0, 255))
        elif op == "cut":
            del frame[i:i + draw(st.integers(1, 16))]
        elif op == "splice":
            frame[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == "prefix":  # a length that lies, up to far over the limit
            frame[:4] = struct.pack(">I", draw(st.sampled_from(
                [0, 1, len(frame), len(frame) + 7, 1 << 16, 8 << 20, (8 << 20) + 1, 2**32 - 1])))
        else:
            frame += bytes(frame)
    return bytes(frame)


sessions = st.tuples(
    st.booleans(),  # starts with a good hello (then batches of its node/stream apply)
    st.lists(st.one_of(mutated(), st.binary(max_size=64),
                       st.sampled_from(sorted(GOLDEN.values()))), min_size=1, max_size=4),
)


def _talk(address, data: bytes) -> list:
    """Send data, close our side, read every message until the server closes."""
    with socket.create_connection(address, timeout=10) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it had already closed on us: what it sent is still readable
        decoder, msgs, chunks = FrameDecoder(), [], []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        msgs.extend(decoder.feed(b"".join(chunks)))
        assert decoder.pending == 0, "the server sent a partial frame"
        return msgs


@settings(max_examples=250, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sessions)
def test_fuzzed_sessions_never_hurt_the_server(fuzz_server, session):
    with_hello, frames = session
    data = (GOLDEN["hello"] if with_hello else b"") + b"".join(frames)
    try:
        msgs = _talk(fuzz_server.address, data)
    except WireError as e:  # the server's own frames must always decode
        pytest.fail(f"server sent an undecodable frame: {e}")
    assert all(isinstance(m, (Welcome, Ack, Ping, Pong, Error)) for m in msgs), msgs
    errors = [m for m in msgs if isinstance(m, Error)]
    assert len(errors) <= 1 and (not errors or msgs[-1] is errors[0])
    assert fuzz_server.server.budget.peak <= BOUND


def test_after_the_fuzz_everything_is_given_back(fuzz_server):
    srv = fuzz_server
    a = srv.agent(node="gpu-99", stream="after-fuzz")
    a.hello()
    a.stream_records(0, batches=3, size=100)
    a.close()
    srv.settle(lambda: srv.metrics.connections_open == 0 and srv.server.budget.used == 0)
    assert srv.server.budget.peak <= BOUND
    assert sum(srv.metrics.errors.values()) > 100  # the fuzz did reach the error paths
    assert srv.metrics.connections > 250
    assert _rss_bytes() - srv.rss_before < 200 << 20
