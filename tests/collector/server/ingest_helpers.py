"""Helpers of the ingest server tests (conftest.py and the tests import them): an
in-memory Store, a server on its own event loop thread, and a blocking test agent that
speaks firstfault/wire.py over a real socket."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from firstfault import wire
from firstfault.collector.server import IngestServer
from firstfault.wire import Ack, Batch, Error, Hello, Ping, Pong, Record, Welcome, encode_message
from firstfault.wiredecode import FrameDecoder


class FakeStore:
    """The Store protocol in memory; counts every key offered; can block, slow down, fail."""

    def __init__(self, *, delay_s: float = 0.0, gate: threading.Event | None = None) -> None:
        self.delay_s = delay_s
        self.gate = gate  # insert waits until it is set
        self.fail: Exception | None = None
        self.rows: dict[tuple[str, str, int], Record] = {}
        self.offered: Counter = Counter()  # (node, stream, seq) -> times passed to insert
        self.inserted_at: list[tuple[float, int]] = []  # (monotonic time insert returned, last seq)
        self.clocks_saved: list = []
        self.entered = threading.Event()  # set when an insert starts
        self.lock = threading.Lock()

    def high_seq(self, node: str, stream: str) -> int | None:
        with self.lock:
            seqs = [k[2] for k in self.rows if k[0] == node and k[1] == stream]
        return max(seqs) if seqs else None

    def insert(self, records) -> int:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail is not None:
            raise self.fail
        new = 0
        with self.lock:
            for r in records:
                key = (r.node, r.stream, r.seq)
                self.offered[key] += 1
                if key not in self.rows:
                    self.rows[key] = r
                    new += 1
            self.inserted_at.append((time.monotonic(), records[-1].seq))
        return new

    def seqs(self, node: str, stream: str) -> list[int]:
        with self.lock:
            return sorted(k[2] for k in self.rows if k[0] == node and k[1] == stream)

    def save_clock(self, clock) -> None:
        self.clocks_saved.append(clock)

    def clocks(self) -> dict:
        return {c.node: c for c in self.clocks_saved}

    def prune(self, *, max_age_s=None, max_bytes=None) -> int:
        return 0

    def close(self) -> None:
        pass


class LoopThread:
    """An asyncio loop on a daemon thread; run(coro) waits for its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def make_records(node: str, stream: str, start: int, n: int) -> list[Record]:
    """n realistic ~150-byte DeepSpeed log lines with seqs start..start+n-1."""
    return [Record(
        node=node, stream=stream, seq=s, source="ranklog", kind="rank.line",
        message=f"[2026-12-02 10:11:{s % 60:02d},782] [INFO] [logging.py:123:log_dist] "
                f"[Rank {s % 8}] step={s} loss={1 / (s + 1):.4f} lr=1e-4",
        occurred_ns=1796206319782000000 + s, observed_ns=1796206319790000000 + s,
        job="12345", rank=s % 8, local_rank=s % 8, pid=24211 + s % 8)
        for s in range(start, start + n)]


class ClosedByServer(Exception):
    def __init__(self, error: Error | None) -> None:
        super().__init__(f"closed by the server with {error}")
        self.error = error


class Agent:
    """A blocking test agent. recv() answers pings (on ``clock()``) and returns the rest."""

    def __init__(self, address, *, node: str = "gpu-01", stream: str = "s1",
                 clock: Callable[[], int] = time.time_ns, ssl_context: ssl.SSLContext | None = None,
                 timeout: float = 10.0) -> None:
        self.node, self.stream, self.clock = node, stream, clock
        sock = socket.create_connection(address, timeout=timeout)
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(sock, server_hostname="localhost")
        self.sock = sock
        self.decoder = FrameDecoder()
        self.pending: list = []
        self.pongs = 0

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, msg) -> None:
        self.sock.sendall(encode_message(msg))

    def hello(self, token: str = "", version: int = wire.PROTOCOL_VERSION) -> Welcome:
        self.send(Hello(version=version, node=self.node, stream=self.stream, token=token,
                        agent_ns=self.clock(), agent_name="test-agent", agent_version="0"))
        msg = self.recv()
        assert isinstance(msg, Welcome), msg
        return msg

    def recv(self, timeout: float | None = None):
        """The next non-ping message; ClosedByServer at EOF (with the error sent, if any)."""
        if timeout is not None:
            self.sock.settimeout(timeout)
        while True:
            while self.pending:
                msg = self.pending.pop(0)
                if isinstance(msg, Ping):
                    t2 = self.clock()
                    self.send(Pong(msg.t1, t2, self.clock()))
                    self.pongs += 1
                    continue
                if isinstance(msg, Error):  # the server closes after it
                    raise ClosedByServer(msg)
                return msg
            data = self.sock.recv(65536)
            if not data:
                raise ClosedByServer(None)
            self.pending.extend(self.decoder.feed(data))

    def expect_error(self, timeout: float = 10.0) -> Error | None:
        """Read until the server closes; the error it sent (None: closed without one).
        Pings are not answered here: a pong sent to a socket the server has closed
        draws a reset that can discard the error still unread."""
        self.sock.settimeout(timeout)
        try:
            while True:
                for msg in self.pending:
                    if isinstance(msg, Error):
                        return msg
                self.pending = []
                data = self.sock.recv(65536)
                if not data:
                    return None
                self.pending.extend(self.decoder.feed(data))
        except (ConnectionResetError, BrokenPipeError):
            return None

    def send_batch(self, records: list[Record]) -> None:
        self.send(Batch(tuple(records)))

    def wait_ack(self, seq: int, timeout: float = 10.0) -> None:
        while True:
            msg = self.recv(timeout)
            if isinstance(msg, Ack) and msg.seq >= seq:
                assert msg.seq == seq, (msg, seq)
                return

    def stream_records(self, start: int, batches: int, size: int) -> int:
        """Send batches one after another, each acked before the next; the next seq."""
        for _ in range(batches):
            self.send_batch(make_records(self.node, self.stream, start, size))
            self.wait_ack(start + size - 1)
            start += size
        return start

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Running:
    """A started IngestServer on a LoopThread."""

    def __init__(self, lt: LoopThread, server: IngestServer) -> None:
        self.lt, self.server = lt, server
        self.address = server.address
        self.store = server.store
        self.metrics = server.metrics
        self.agents: list[Agent] = []

    def agent(self, **kw) -> Agent:
        a = Agent(self.address, **kw)
        self.agents.append(a)  # closed when the test ends
        return a

    def stop(self, grace_s: float = 10.0) -> None:
        self.lt.run(self.server.stop(grace_s))

    def settle(self, cond: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until cond() holds (it reads server state from another thread: poll)."""
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, "condition not reached"
            time.sleep(0.01)


class CollectorProcess:
    """``python -m firstfault collector`` as a subprocess on ports it picks; its stderr
    collected, ``ingest`` and ``http`` the (host, port) it listens on."""

    def __init__(self, db, *extra: str) -> None:
        root = Path(__file__).resolve().parents[3]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "firstfault", "collector", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
             "--db", str(db), *extra], cwd=root, stderr=subprocess.PIPE, text=True)
        self.ingest = self.http = None
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.ready.wait(30), "collector did not start:\n" + "".join(self.lines)

    @property
    def address(self):
        return self.ingest

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            m = re.search(r"(ingest|http) listening address=([\d.]+):(\d+)", line)
            if m:
                setattr(self, m.group(1), (m.group(2), int(m.group(3))))
                if self.ingest and self.http:
                    self.ready.set()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(30)


def make_pki(d):
    """Certificates made here: a CA (``ca``) and, signed by it, ``server`` (localhost) and
    ``client``; for the refusals, ``server-expired``, ``server-wrong-name`` (only
    other.example), ``client-expired``, and ``other-ca`` with ``server-other-ca`` and
    ``client-other-ca`` signed by that one. Each as NAME.pem and NAME.key in ``d``."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)

    def cert(name, issuer_key, issuer_name, key, ca=False, san=None, expired=False):
        b = (x509.CertificateBuilder().subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(issuer_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - (10 * day if expired else day))
            .not_valid_after(now - 5 * day if expired else now + day)
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    def write(name, key, crt):
        (d / f"{name}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        (d / f"{name}.pem").write_bytes(crt.public_bytes(serialization.Encoding.PEM))

    for ca_file, prefix in (("ca", ""), ("other-ca", "-other-ca")):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"test {ca_file}")])
        write(ca_file, ca_key, cert(f"test {ca_file}", ca_key, ca_name, ca_key, ca=True))
        made = [("server", "localhost", False), ("client", "localhost", False)]
        if not prefix:
            made += [("server-expired", "localhost", True), ("client-expired", "localhost", True),
                     ("server-wrong-name", "other.example", False)]
        for name, san, expired in made:
            key = ec.generate_private_key(ec.SECP256R1())
            base = name.split("-")[0]
            write(name if not prefix else base + prefix, key,
                  cert(base, ca_key, ca_name, key, san=san, expired=expired))
    return d
