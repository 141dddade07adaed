"""The shipper: sends the spool to a collector and lets the spool drop what was acked.

One asyncio loop in its own thread, one TCP connection (TLS optional) at a time,
speaking firstfault/wire.py:

1. connect to the current collector; send ``hello`` (node, the spool's stream,
   token); wait for ``welcome``. Its ``high_seq`` says what the collector already
   stored: that much is acked in the spool, and sending resumes right after it
   (a collector that lost data gets back whatever the spool still holds).
2. send batches read from the spool as frames (``Spool.read_frame_after``: the
   spooled column bytes go out as they are, nothing is decoded), up to
   ``window_records`` unacked records in flight, each frame within the welcome's limits; when there
   is nothing new, sleep until ``Spool.watch`` says more is readable.
3. meanwhile read the collector: ``ack`` -> ``Spool.ack`` (segments it covers are
   deleted) and ``on_ack``; ``ping`` -> ``pong`` at once (the collector's clock
   probe: t2 on receipt, t3 on reply); ``error`` -> log its code and reason and
   close. Nothing heard for ``idle_timeout_s`` (the collector pings every 10 s)
   means the connection is dead.
4. any failure (refused, reset, timeout, malformed frame, ``error``) closes the
   connection; the next attempt goes to the next collector of the list (failover,
   round robin) after an exponential backoff with jitter (``backoff_initial_s``
   doubling to ``backoff_max_s``, each 50-100 % of that), reset by a session that
   got an ack.

``stop(flush_timeout_s)`` first waits, up to that long, until every record
appended so far is acked (the agent stops its sources before, so this is the
SIGTERM flush), then closes. What is not acked stays in the spool for next time.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Callable

from firstfault import wire, wiredecode
from firstfault.agent.osthread import name_this_thread
from firstfault.agent.spool import Spool
from firstfault.common.settings import Address
from firstfault.wire import Ack, Error, Hello, Ping, Pong, Welcome

log = logging.getLogger(__name__)

AGENT_NAME = "firstfault-agent"
SEND_BYTES = 1 << 20  # spool bytes a batch takes at most (bench/agent.py: RSS)


class SessionError(Exception):
    """The collector closed the session, said ``error``, or broke the protocol."""


@dataclass
class ShipperStats:
    connected_to: str | None = None
    sessions: int = 0  # sessions that got a welcome
    failures: int = 0  # connection attempts or sessions that failed
    batches: int = 0
    records: int = 0
    bytes: int = 0
    acked_seq: int | None = None
    last_error: str | None = None
    pongs: int = 0


MTLS_HINT = ("a collector that asks for client certificates closes on one it does not accept: "
             "check [tls] cert and key; its log says why")


def explain(e: BaseException) -> str:
    """A failed connection as an operator should read it: for TLS, what to check."""
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if isinstance(e, ssl.SSLCertVerificationError):
        return (f"TLS: the collector's certificate is not accepted: {e.verify_message} "
                f"(check [tls] ca and server_name) [{text}]")
    if isinstance(e, ssl.SSLError):
        if "ALERT" in (e.reason or ""):
            return (f"TLS: the collector refused this agent ({e.reason}): check [tls] cert and "
                    f"key against the collector's client_ca [{text}]")
        return (f"TLS handshake failed ({e.reason or e}): does the collector speak TLS on this "
                f"port? ([tls] cert and key on the collector) [{text}]")
    return text


class Shipper:
    def __init__(self, spool: Spool, collectors: list[Address] | tuple[Address, ...], *,
                 token: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 server_name: str | None = None, agent_version: str = "0",
                 window_records: int = 50_000, connect_timeout_s: float = 5.0,
                 idle_timeout_s: float = 60.0, backoff_initial_s: float = 0.5,
                 backoff_max_s: float = 30.0, on_ack: Callable[[int], None] | None = None,
                 rng: random.Random | None = None) -> None:
        if not collectors:
            raise ValueError("shipper: no collector to send to")
        self.spool, self.collectors = spool, list(collectors)
        self.token, self.ssl_context, self.server_name = token or "", ssl_context, server_name
        self.agent_version = agent_version
        self.window_records, self.connect_timeout_s = window_records, connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self.on_ack = on_ack
        self.stats = ShipperStats()
        self._rng = rng or random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ff-shipper", daemon=True)

    # --- control, from any thread ----------------------------------------------

    def start(self) -> Shipper:
        self._thread.start()
        self._started.wait()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def flushed(self) -> bool:
        """Whether every record appended so far is acked."""
        st = self.spool.stats()
        return st.last_seq is None or (st.acked_seq is not None and st.acked_seq >= st.last_seq)

    def stop(self, flush_timeout_s: float = 0.0) -> bool:
        """Wait up to ``flush_timeout_s`` for everything to be acked, then close; True if
        all was acked."""
        deadline = time.monotonic() + flush_timeout_s
        while not self.flushed() and time.monotonic() < deadline and self.alive:
            time.sleep(0.02)
        done = self.flushed()
        if self._loop is not None and self.alive:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        if not done:
            st = self.spool.stats()
            log.warning("shipper stopped with records unacked unacked=%d last_seq=%s acked_seq=%s",
                        st.unacked_records, st.last_seq, st.acked_seq)
        return done

    # --- the loop ---------------------------------------------------------------

    def backoff_s(self, failures: int) -> float:
        base = min(self.backoff_max_s, self.backoff_initial_s * 2 ** min(failures - 1, 30))
        return base * (0.5 + 0.5 * self._rng.random())

    def _run(self) -> None:
        name_this_thread()
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self.readable = asyncio.Event()  # set when the spool has more to read
        self.spool.watch(self._spool_readable)
        try:
            await self._sessions()
        finally:
            self.spool.watch(None)

    def _spool_readable(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self.readable.set)
        except RuntimeError:  # the loop is closed: nobody is waiting
            pass

    async def _sessions(self) -> None:
        self._started.set()
        failures, i = 0, 0
        while not self._stop.is_set():
            addr = self.collectors[i % len(self.collectors)]
            acked_before, welcomed = self.stats.acked_seq, self.stats.sessions
            try:
                await self._session(addr)
            except (OSError, asyncio.TimeoutError, wire.WireError, SessionError) as e:
                error = explain(e)
                if (self.ssl_context is not None and self.stats.sessions == welcomed
                        and isinstance(e, ConnectionError)):
                    error += f" ({MTLS_HINT})"
                if error != self.stats.last_error:
                    log.warning("collector session failed collector=%s error=%s", addr, error)
                self.stats.last_error = error
            finally:
                self.stats.connected_to = None
            if self._stop.is_set():
                break
            self.stats.failures += 1
            failures = 1 if self.stats.acked_seq != acked_before else failures + 1
            i += 1
            try:
                await asyncio.wait_for(self._stop.wait(), self.backoff_s(failures))
            except asyncio.TimeoutError:
                pass

    async def _session(self, addr: Address) -> None:
        ssl_args = {}
        if self.ssl_context is not None:
            ssl_args = {"ssl": self.ssl_context, "server_hostname": self.server_name or addr.host}
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(addr.host, addr.port, **ssl_args), self.connect_timeout_s)
        try:
            writer.write(wire.encode_message(Hello(
                node=self.spool.node, stream=self.spool.stream, token=self.token,
                agent_ns=time.time_ns(), agent_name=AGENT_NAME,
                agent_version=self.agent_version)))
            decoder = wiredecode.FrameDecoder()
            welcome = await self._first(reader, decoder)
            self.stats.sessions += 1
            self.stats.connected_to = str(addr)
            log.info("shipping collector=%s high_seq=%s", addr, welcome.high_seq)
            if welcome.high_seq is not None:
                self._acked(welcome.high_seq)
            session = _Session(self, reader, writer, decoder, welcome)
            await session.run(self._stop)
        finally:
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), 2)
            except (OSError, asyncio.TimeoutError, ssl.SSLError):
                pass

    async def _first(self, reader: asyncio.StreamReader, decoder: wiredecode.FrameDecoder) -> Welcome:
        while True:
            data = await asyncio.wait_for(reader.read(1 << 16), self.idle_timeout_s)
            if not data:
                raise SessionError("the collector closed the connection before welcome" + (
                    f" ({MTLS_HINT})" if self.ssl_context else ""))
            for msg in decoder.feed(data):
                if isinstance(msg, Welcome):
                    return msg
                if isinstance(msg, Error):
                    raise SessionError(f"collector refused: {msg.code}: {msg.reason}")
                raise SessionError(f"expected welcome, got {msg.TYPE}")

    def _acked(self, seq: int) -> None:
        if self.stats.acked_seq is not None and seq <= self.stats.acked_seq:
            return
        self.spool.ack(seq)
        self.stats.acked_seq = seq
        if self.on_ack is not None:
            self.on_ack(seq)


class _Session:
    """One connection after welcome: a writer (batches) and a reader (acks, pings)."""

    def __init__(self, shipper: Shipper, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, decoder: wiredecode.FrameDecoder, welcome: Welcome) -> None:
        self.s, self.reader, self.writer, self.decoder = shipper, reader, writer, decoder
        self.max_records = welcome.max_batch_records
        # spool entry bytes ~ wire bytes; 1 MiB frames keep the agent's RSS low
        self.max_bytes = min(welcome.max_frame_bytes // 2, SEND_BYTES)
        self.sent = welcome.high_seq
        self.acked = welcome.high_seq if welcome.high_seq is not None else -1
        self.ack_event = asyncio.Event()
        self.heard = asyncio.get_running_loop().time()  # when the collector last sent bytes

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._write()),
                 asyncio.create_task(self._idle()), asyncio.create_task(stop.wait())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()  # raises the reader's or writer's error
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _idle(self) -> None:
        """TimeoutError once nothing was heard for idle_timeout_s (one timer, not one a read)."""
        loop, limit = asyncio.get_running_loop(), self.s.idle_timeout_s
        while (left := self.heard + limit - loop.time()) > 0:
            await asyncio.sleep(left)
        raise TimeoutError(f"nothing heard from the collector for {limit:g} s")

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await self.reader.read(1 << 16)
            self.heard = loop.time()
            if not data:
                raise SessionError("the collector closed the connection")
            for msg in self.decoder.feed(data):
                if isinstance(msg, Ack):
                    self.acked = max(self.acked, msg.seq)
                    self.s._acked(msg.seq)
                    self.ack_event.set()
                elif isinstance(msg, Ping):
                    t2 = time.time_ns()
                    self.writer.write(wire.encode_message(Pong(msg.t1, t2, time.time_ns())))
                    self.s.stats.pongs += 1
                elif isinstance(msg, Error):
                    raise SessionError(f"collector error {msg.code}: {msg.reason}")
                else:
                    raise SessionError(f"unexpected {msg.TYPE} from the collector")

    async def _write(self) -> None:
        spool, stats = self.s.spool, self.s.stats
        max_records, woken = self.max_records, 0
        while True:
            if self.sent is not None and self.sent - self.acked >= self.s.window_records:
                self.ack_event.clear()
                await self.ack_event.wait()
                continue
            self.s.readable.clear()  # before the read: news after it sets it again
            try:
                batch = (None if self.sent is not None and spool.visible_seq <= self.sent
                         else spool.read_frame_after(self.sent, max_records, self.max_bytes))
            except wire.WireError as e:
                if e.code != wire.ERR_TOO_LARGE or max_records == 1:
                    raise
                max_records //= 2
                continue
            if batch is None:
                if woken > 1:  # told there is more, found none, again (its segment went): no spinning
                    await asyncio.sleep(0.1)
                try:
                    async with asyncio.timeout(1.0):
                        await self.s.readable.wait()
                    woken += 1
                except TimeoutError:
                    woken = 0
                continue
            woken = 0
            seqs, frame = batch
            max_records = self.max_records
            self.writer.write(frame)
            await self.writer.drain()
            self.sent = seqs[-1]
            stats.batches += 1
            stats.records += len(seqs)
            stats.bytes += len(frame)
