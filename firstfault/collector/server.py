"""The collector's ingest: an asyncio TCP (optionally TLS) server speaking firstfault/wire.py.

Per connection (one agent stream), in order:

0. The listening sockets, TLS (and telling TLS from plain text) and the bound on
   connections that have not yet sent their first bytes: firstfault/collector/listener.py.
1. ``hello`` first, in a frame of at most HELLO_MAX_BYTES. A version this side does
   not speak -> ``error`` ERR_VERSION; a token that is none of the configured ones
   (firstfault/common/tokens.py: constant time) -> ERR_AUTH; the connection is then
   closed. Without a configured token every hello is accepted, which start() allows
   only on a loopback address. The hello must come within HELLO_TIMEOUT_S; at most
   ``limits.max_unauthenticated`` connections wait for theirs, a new one beyond that
   closes the oldest. ``set_tokens()`` (the daemon's SIGHUP) changes the tokens and
   closes the sessions whose token is no longer one of them.
   Identity: with ``node_tokens`` a hello must carry a token of the node it names; with
   ``bind_node`` (mutual TLS) its node must be the client certificate's common name or a
   DNS name of it. A stream belongs to the connection that has it open: a hello for a
   live (node, stream) from another host or with another token is refused (ERR_AUTH,
   logged, counted as ``stream_claimed``); from the same host with the same token it is
   the agent reconnecting, and the older connection is closed.
2. ``welcome`` with ``store.high_seq(node, stream)`` and this session's limits; a
   first ``ping`` follows at once, then one every ``clock.ping_interval_s``.
3. ``batch`` frames: node and stream must equal the hello's, and each batch's first seq
   must be above the last seq of this connection's previous batch (else ERR_PROTOCOL).
   The records go to ``store.insert`` (or ``store.insert_columns(node, stream,
   seqs, cols)`` where the store has it: no Record objects built) in the single
   store thread; ``ack`` with the batch's highest seq is sent only after it
   returned, i.e. once the rows are durable. ``pong`` frames feed ClockTracker
   (t4 stamped on decoding); an agent's own ``ping`` is answered with ``pong``.
   Batches that queue while the store thread is busy are stored together (group
   commit, firstfault/collector/storequeue.py), each still acked only once durable.
   A batch's ``cols`` is a wire.PackedColumns: a store may keep the columns' bytes
   as the frame carried them.

Guarantees
    * An ack covers only records the store has committed; a store failure sends
      ERR_INTERNAL and closes that connection without acking.
    * Backpressure: a connection's next frame is not read while its batch is being
      stored, and the records read but not yet stored, over all connections, never
      exceed ``limits.max_inflight_records``: before a frame's body is read, the
      most records a body of that length can hold (MIN_RECORD_BYTES each, at most
      MAX_BATCH_RECORDS) are reserved, cut to the real count once decoded, and given
      back when the store returns. A slow store thus slows reading from sockets.
    * Anything malformed, oversize, unknown or out of order: ``error`` with the
      WireError's code, one log line ``peer=.. node=.. code=.. reason=..``, a count
      in Metrics.errors, and only that connection is closed.
    * stop(): stop accepting, let batches being stored finish and be acked, tell
      the other connections ERR_SHUTDOWN, save clock estimates, return.

Store calls run on one thread (``writer``), as firstfault/collector/store/base.py asks; pass
the executor the store was opened on (SQLite connections belong to their thread).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from firstfault.collector.clock import ClockTracker
from firstfault.collector.config import ClockConfig, LimitsConfig, TLSConfig, is_loopback_host
from firstfault.collector.listener import Listener
from firstfault.collector.metrics import LogLimiter, Metrics, RecordBudget
from firstfault.collector.store.base import Store
from firstfault.collector.storequeue import StoreQueue
from firstfault.common.tokens import accepts, digest
from firstfault.wire import (
    ERR_AUTH,
    ERR_INTERNAL,
    ERR_PROTOCOL,
    ERR_SHUTDOWN,
    ERR_TOO_LARGE,
    MAX_BATCH_RECORDS,
    MAX_TEXT_BYTES,
    Ack,
    BatchColumns,
    Error,
    Hello,
    Ping,
    Pong,
    Welcome,
    WireError,
    encode_message,
)
from firstfault.wiredecode import FrameDecoder

log = logging.getLogger(__name__)

HELLO_MAX_BYTES = 16 * 1024  # a hello is at most ~2 KiB; nothing bigger before auth
HELLO_TIMEOUT_S = 10.0  # (or the read timeout if shorter): idle strangers do not hold slots
# The fewest body bytes one record takes in a batch: one byte for each of the 13
# columns' values (nil, fixint, empty str or map) plus one more for each of the
# non-empty source and kind strings. So a body of N bytes holds < N/15 + 1 records.
MIN_RECORD_BYTES = 15
_PREFIX_BYTES = 4


class _Closing(Exception):
    """End this connection: send ``error`` (code, reason) unless code is None."""

    def __init__(self, code: str | None, reason: str, count_as: str | None = None,
                 level: int = logging.WARNING) -> None:
        super().__init__(reason)
        self.code, self.reason, self.level = code, reason, level
        self.count_as = count_as or code


class _Session:
    __slots__ = ("reader", "writer", "peer", "host", "node", "stream", "decoder", "task",
                 "reading", "held", "pings", "welcomed", "token", "evicted", "last_seq")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.host = peer[0] if isinstance(peer, tuple) else str(peer)
        self.last_seq = -1  # the highest seq of this connection's batches: the next must be above
        self.node = self.stream = None
        self.decoder = FrameDecoder(HELLO_MAX_BYTES, batch_columns=True)
        self.task = asyncio.current_task()
        self.reading = False  # waiting on the socket or the budget, holding nothing
        self.held = 0  # records of the budget this session holds
        self.pings: dict[int, None] = {}  # t1 of pings not yet answered, oldest first
        self.welcomed = False
        self.token = b""  # the digest of the token its hello carried
        self.evicted: tuple[str, str] | None = None  # closed from outside: (code, reason)


def cert_names(peercert: dict | None) -> set[str]:
    """The names a client certificate gives its holder: subject common name, DNS names."""
    if not peercert:
        return set()
    names = {v for rdn in peercert.get("subject", ()) for k, v in rdn if k == "commonName"}
    return names | {v for k, v in peercert.get("subjectAltName", ()) if k == "DNS"}


def make_ssl_context(tls: TLSConfig) -> ssl.SSLContext | None:
    """The server's TLS context (mutual TLS when tls.client_ca is set); None: plain TCP."""
    if not tls.enabled:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(tls.cert), str(tls.key))
    if tls.client_ca is not None:
        ctx.load_verify_locations(cafile=str(tls.client_ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class IngestServer:
    """The ingest server; see the module docstring for what it guarantees."""

    def __init__(self, store: Store, *, token: str | tuple[str, ...] | None = None,
                 limits: LimitsConfig = LimitsConfig(), clock: ClockConfig = ClockConfig(),
                 ssl_context: ssl.SSLContext | None = None,
                 writer: ThreadPoolExecutor | None = None,
                 metrics: Metrics | None = None,
                 node_tokens: dict[str, tuple[str, ...]] | None = None,
                 bind_node: bool = False) -> None:
        """``node_tokens``: {node: its tokens}: a hello must carry a token of the node it
        names (``token`` is then not asked of agents). ``bind_node``: a hello's node must
        be named by the client certificate (mutual TLS)."""
        self.store = store
        self.tokens = (token,) if isinstance(token, str) else token
        self.node_tokens = node_tokens
        self.bind_node = bind_node
        self._nobody = (secrets.token_hex(32),)  # compared for an unknown node: same time
        self._live: dict[tuple[str, str], _Session] = {}  # (node, stream) -> its connection
        self.limits, self.clock_config = limits, clock
        self.ssl_context = ssl_context
        self.metrics = metrics or Metrics()
        self.clocks = ClockTracker(clock.samples, clock.drift_ppm)
        self.budget = RecordBudget(limits.max_inflight_records, self.metrics)
        self._own_writer = writer is None
        self._writer = writer or ThreadPoolExecutor(1, thread_name_prefix="firstfault-store")
        self.queue = StoreQueue(store, self._writer)
        self._listener: Listener | None = None
        self._sessions: dict[_Session, None] = {}  # oldest first
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self._log_limiter = LogLimiter()
        self.address: tuple[str, int] | None = None
        self.observer: Any = None  # told of stored batches, pongs and closes (notify/notifier.py)

    # --- life cycle ---------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Listen on host:port (0: any free port); returns the bound (host, port)."""
        if self.tokens is None and self.node_tokens is None and not is_loopback_host(host):
            raise ValueError(f"refusing to listen on {host}:{port} without a token: "
                             "agents could connect from the network unauthenticated")
        lim = self.limits
        self._listener = Listener(
            self._handle, ssl_context=self.ssl_context, metrics=self.metrics,
            first_bytes_s=min(lim.read_timeout_s, HELLO_TIMEOUT_S), log_limiter=self._log_limiter,
            ssl_handshake_s=min(lim.read_timeout_s, HELLO_TIMEOUT_S), max_pending=lim.max_unauthenticated)
        self.address = await self._listener.start(host, port)
        self._tasks = [asyncio.create_task(self._ping_loop(), name="firstfault-ping"),
                       asyncio.create_task(self._clock_save_loop(), name="firstfault-clocks")]
        log.info("ingest listening address=%s:%s tls=%s mtls=%s auth=%s", *self.address,
                 self.ssl_context is not None,
                 self.ssl_context is not None and self.ssl_context.verify_mode == ssl.CERT_REQUIRED,
                 "node tokens" if self.node_tokens is not None else
                 "token" if self.tokens is not None else "none (loopback)")
        return self.address

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop accepting; finish the batches being stored; close every connection."""
        if self._stopping:
            return
        self._stopping = self.queue.stopping = True
        if self._listener is not None:
            self._listener.close()
        for t in self._tasks:
            t.cancel()
        for s in list(self._sessions):
            if s.reading and s.task is not None:
                s.task.cancel()  # idle: told ERR_SHUTDOWN; busy ones finish their batch
        tasks = [s.task for s in self._sessions if s.task is not None]
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=grace_s)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2.0)
        await self._save_clocks()
        if self._own_writer:
            self._writer.shutdown(wait=True)
        log.info("ingest stopped records_stored=%d", self.metrics.records_stored)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the store thread (for the daemon's pruning, say)."""
        return await asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)

    def set_tokens(self, tokens: tuple[str, ...]) -> int:
        """Accept ``tokens`` from now on; close the sessions whose token is not one of
        them (they reconnect with their new one). How many were closed."""
        self.tokens = tokens
        return self.recheck()

    def recheck(self) -> int:
        """Close the welcomed sessions whose token is no longer accepted for their node
        (after the tokens or the node tokens changed); how many were closed."""
        closed = 0
        for s in list(self._sessions):
            accepted = (self.node_tokens.get(s.node, ()) if self.node_tokens is not None
                        else self.tokens if self.tokens is not None else None)
            if accepted is None:
                continue
            if s.welcomed and not any(digest(t) == s.token for t in accepted):
                self._evict(s, ERR_AUTH, "token no longer accepted (rotated): reconnect with the new one")
                closed += 1
        return closed

    def _bound_strangers(self) -> None:
        """At most limits.max_unauthenticated sessions wait for their hello: close the oldest."""
        waiting = [s for s in self._sessions if not s.welcomed and not s.evicted]
        for s in waiting[:max(0, len(waiting) - self.limits.max_unauthenticated)]:
            self._evict(s, ERR_INTERNAL, "too many connections waiting for their hello")

    def _evict(self, s: _Session, code: str, why: str) -> None:
        s.evicted = (code, why)
        if s.reading and s.task is not None:
            s.task.cancel()  # else it ends at its next read

    # --- one connection -----------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        s = _Session(reader, writer)
        m = self.metrics
        if self._stopping or len(self._sessions) >= self.limits.max_connections:
            m.connections_rejected += 1
            why = ("collector stopping" if self._stopping else
                   f"too many connections ({self.limits.max_connections}); reconnect later")
            await self._close(s, _Closing(ERR_SHUTDOWN if self._stopping else ERR_INTERNAL,
                                          why, count_as="rejected"))
            return
        self._sessions[s] = None
        self._bound_strangers()
        m.connections_open += 1
        clean = False
        try:
            await self._session(s)
        except _Closing as c:
            clean = c.count_as == "eof"
            await self._close(s, c)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, OSError) as e:
            await self._close(s, _Closing(None, f"connection lost: {type(e).__name__}: {e}",
                                          count_as="reset"))
        except asyncio.CancelledError:
            # stop() past its grace time, or the loop is closing: no ack was sent
            await self._close(s, _Closing(ERR_SHUTDOWN, "collector stopping",
                                          level=logging.INFO, count_as="shutdown"))
        except Exception as e:  # a bug here must not take the other connections down
            log.exception("ingest session failed peer=%s node=%s", s.peer, s.node)
            await self._close(s, _Closing(ERR_INTERNAL, f"collector error: {type(e).__name__}"))
        finally:
            self._sessions.pop(s, None)
            if self._live.get((s.node, s.stream)) is s:
                del self._live[(s.node, s.stream)]
            m.connections_open -= 1
            if s.welcomed:
                self._observe("closed", s.node, clean)

    async def _session(self, s: _Session) -> None:
        msg = await self._read(s)
        if not isinstance(msg, Hello):
            raise _Closing(ERR_PROTOCOL, f"expected hello first, got {msg.TYPE}")
        self._check_identity(s, msg)
        s.node, s.stream, s.token = msg.node, msg.stream, digest(msg.token)
        self._own(s)
        try:
            high = await self.call(self.store.high_seq, s.node, s.stream)
        except Exception as e:
            raise _Closing(ERR_INTERNAL, f"store failed: {type(e).__name__}: {e}") from e
        lim = self.limits
        s.decoder.max_frame_bytes = lim.max_frame_bytes
        await self._send(s, Welcome(high_seq=high, collector_ns=time.time_ns(),
                                    max_frame_bytes=lim.max_frame_bytes,
                                    max_batch_records=lim.max_batch_records))
        s.welcomed = True
        log.info("agent connected peer=%s node=%s stream=%s agent=%s/%s high_seq=%s",
                 s.peer, s.node, s.stream, msg.agent_name, msg.agent_version, high)
        self._ping(s)
        while True:
            msg = await self._read(s, budgeted=True)
            try:
                if isinstance(msg, BatchColumns):
                    await self._batch(s, msg)
                elif isinstance(msg, Pong):
                    self._pong(s, msg)
                elif isinstance(msg, Ping):
                    t2 = time.time_ns()
                    await self._send(s, Pong(msg.t1, t2, time.time_ns()))
                elif isinstance(msg, Error):
                    raise _Closing(None, f"agent sent error {msg.code}: {msg.reason}",
                                   count_as="peer_error", level=logging.INFO)
                else:
                    raise _Closing(ERR_PROTOCOL, f"unexpected {msg.TYPE} after welcome")
            finally:
                self._give_back(s)
            if self._stopping:
                raise _Closing(ERR_SHUTDOWN, "collector stopping", level=logging.INFO,
                               count_as="shutdown")

    def _check_identity(self, s: _Session, hello: Hello) -> None:
        """ERR_AUTH unless the hello's credentials may speak for the node it names: a token
        (of that very node, with node tokens) and, with bind_node, its certificate's name."""
        if self.node_tokens is not None:
            if not accepts(self.node_tokens.get(hello.node, self._nobody), hello.token):
                raise _Closing(ERR_AUTH, f"the token is not one of node {hello.node!r}'s "
                               "(node_tokens_file)" if hello.token else "missing token")
        elif self.tokens is not None and not accepts(self.tokens, hello.token):
            raise _Closing(ERR_AUTH, "bad or missing token" if hello.token else "missing token")
        if self.bind_node:
            names = cert_names(s.writer.get_extra_info("peercert"))
            if hello.node not in names:
                raise _Closing(ERR_AUTH, f"node {hello.node!r} is not named by the client certificate "
                               f"(it names {', '.join(sorted(names)) or 'nothing'}; tls.bind_node)")

    def _own(self, s: _Session) -> None:
        """A stream belongs to the connection that has it open: a hello for a live stream
        from another host or with another token is refused (logged); from the same host
        with the same token it is the agent reconnecting, and the old connection goes."""
        key = (s.node, s.stream)
        old = self._live.get(key)
        if old is not None and not old.evicted:
            if old.host != s.host or old.token != s.token:
                raise _Closing(ERR_AUTH, f"stream {s.stream!r} of node {s.node!r} is live on another "
                               f"connection (from {old.peer}): refused", count_as="stream_claimed")
            self._evict(old, ERR_PROTOCOL, "the same agent opened this stream again: this connection is replaced")
        self._live[key] = s

    def _give_back(self, s: _Session, keep: int = 0) -> None:
        """Return the session's budget beyond ``keep`` records."""
        if s.held > keep:
            self.budget.release(s.held - keep)
            s.held = keep

    async def _read(self, s: _Session, budgeted: bool = False) -> Any:
        """The next message; a batch keeps its records' budget in s.held (until stored)."""
        if s.evicted:
            raise _Closing(*s.evicted, count_as="evicted")
        if self._stopping:
            raise _Closing(ERR_SHUTDOWN, "collector stopping", level=logging.INFO,
                           count_as="shutdown")
        s.reading = True
        try:
            timeout = self.limits.read_timeout_s
            if not s.welcomed:
                timeout = min(timeout, HELLO_TIMEOUT_S)
            try:
                async with asyncio.timeout(timeout):
                    prefix = await s.reader.readexactly(_PREFIX_BYTES)
                s.decoder.feed(prefix)  # a length over the limit raises here, unread
                n = int.from_bytes(prefix, "big")
                if budgeted:
                    s.held = await self.budget.acquire(
                        min(MAX_BATCH_RECORDS, n // MIN_RECORD_BYTES + 1))
                async with asyncio.timeout(timeout):
                    body = await s.reader.readexactly(n)
            except TimeoutError:
                raise _Closing(ERR_PROTOCOL, f"no whole frame within {timeout:g} s",
                               count_as="timeout") from None
            except asyncio.IncompleteReadError as e:
                if not e.partial and s.decoder.pending == 0:
                    raise _Closing(None, "agent closed the connection", count_as="eof",
                                   level=logging.INFO) from None
                raise _Closing(None, "connection closed inside a frame",
                               count_as="truncated") from None
            except asyncio.CancelledError:
                if not (self._stopping or s.evicted):
                    raise
                asyncio.current_task().uncancel()
                if s.evicted:
                    raise _Closing(*s.evicted, count_as="evicted") from None
                raise _Closing(ERR_SHUTDOWN, "collector stopping", level=logging.INFO,
                               count_as="shutdown") from None
            self.metrics.bytes_received += _PREFIX_BYTES + n
            (msg,) = s.decoder.feed(body)  # exactly one: the body is a whole frame
        except WireError as e:
            self._give_back(s)
            raise _Closing(e.code, str(e)) from None
        except BaseException:
            self._give_back(s)
            raise
        finally:
            s.reading = False
        self._give_back(s, len(msg) if isinstance(msg, BatchColumns) else 0)
        return msg

    async def _batch(self, s: _Session, b: BatchColumns) -> None:
        n = len(b)
        if b.node != s.node or b.stream != s.stream:
            raise _Closing(ERR_PROTOCOL, f"batch of node={b.node} stream={b.stream} on the "
                           f"session of node={s.node} stream={s.stream}")
        if b.seqs[0] <= s.last_seq:  # in order only: a connection never goes back
            raise _Closing(ERR_PROTOCOL, f"batch from seq {b.seqs[0]} after seq {s.last_seq} on this "
                           "connection: seqs must increase")
        if n > self.limits.max_batch_records:
            raise _Closing(ERR_TOO_LARGE, f"batch of {n} records over this session's limit "
                           f"of {self.limits.max_batch_records}")
        m = self.metrics
        m.records_received += n
        ack = encode_message(Ack(b.seqs[-1]))

        def durable(result: tuple[int, float]) -> None:  # counted before the ack leaves: an agent that
            new, seconds = result                          # has its ack sees the counts that include it
            m.observe_store(seconds)
            m.records_stored += new
            m.records_duplicate += n - new
            m.batches += 1
            s.writer.write(ack)

        try:  # the ack is written the moment the commit is back (StoreQueue: on_durable)
            await self.queue.store_batch(b, durable)
        except Exception as e:
            raise _Closing(ERR_INTERNAL, f"store failed: {type(e).__name__}: {e}",
                           level=logging.ERROR) from e
        s.last_seq = b.seqs[-1]
        self._give_back(s)  # stored: no longer in flight
        self._observe("stored", s.node, b.cols)
        await s.writer.drain()

    async def _send(self, s: _Session, msg: Any) -> None:
        s.writer.write(encode_message(msg))
        await s.writer.drain()

    async def _close(self, s: _Session, c: _Closing) -> None:
        if c.count_as not in ("eof", "shutdown"):
            self.metrics.error(c.count_as)
        if c.level >= logging.WARNING:
            ok, suppressed = self._log_limiter.allow(c.count_as)
            if ok:
                log.log(c.level, "connection closed peer=%s node=%s stream=%s code=%s "
                        "reason=%r%s", s.peer, s.node, s.stream, c.count_as, c.reason,
                        f" suppressed={suppressed}" if suppressed else "")
        else:
            log.log(c.level, "connection closed peer=%s node=%s stream=%s reason=%r",
                    s.peer, s.node, s.stream, c.reason)
        w = s.writer
        try:
            if c.code is not None and not w.is_closing():
                reason = c.reason.encode()[:MAX_TEXT_BYTES].decode("utf-8", "ignore")
                w.write(encode_message(Error(c.code, reason)))
            w.close()
            await asyncio.wait_for(w.wait_closed(), 2.0)
        except (OSError, ssl.SSLError, TimeoutError, asyncio.CancelledError):
            w.transport.abort()

    # --- clocks -------------------------------------------------------------------

    def _ping(self, s: _Session) -> None:
        t = s.writer.transport
        if t.is_closing() or t.get_write_buffer_size() > 1 << 20:
            return  # a peer that reads nothing gets no more pings
        t1 = time.time_ns()
        s.pings[t1] = None
        while len(s.pings) > 4:
            del s.pings[next(iter(s.pings))]
        s.writer.write(encode_message(Ping(t1)))

    def _pong(self, s: _Session, p: Pong) -> None:
        t4 = time.time_ns()
        if p.t1 not in s.pings:
            return  # not a ping of ours (or answered twice): no sample
        del s.pings[p.t1]
        if self.clocks.add(s.node, p.t1, p.t2, p.t3, t4):
            self.metrics.clock_samples += 1
        self._observe("pong", s.node, p.t1)  # between frames: none of this session in flight

    def _observe(self, event: str, *args: Any) -> None:
        """Tell the observer (the notifier) ``event``; its trouble never touches ingest."""
        if self.observer is None:
            return
        try:
            getattr(self.observer, event)(*args)
        except Exception as e:
            ok, _ = self._log_limiter.allow("observer")
            if ok:
                log.error("observer failed event=%s error=%s: %s", event, type(e).__name__, e)

    def probe(self, nodes: Any) -> None:
        """Ping the agents of ``nodes`` now (the notifier wants to know they are caught up)."""
        wanted = set(nodes)
        for s in list(self._sessions):
            if s.welcomed and s.node in wanted:
                self._ping(s)

    async def _ping_loop(self) -> None:
        while True:
            await asyncio.sleep(self.clock_config.ping_interval_s)
            for s in list(self._sessions):
                if s.welcomed:
                    self._ping(s)

    async def _clock_save_loop(self) -> None:
        while True:
            await asyncio.sleep(self.clock_config.save_interval_s)
            await self._save_clocks()

    async def _save_clocks(self) -> None:
        now = time.time_ns()
        nodes = self.clocks.take_updated()
        for i, node in enumerate(nodes):
            est = self.clocks.estimate(node, now)
            if est is None:
                continue
            try:
                await self.call(self.store.save_clock, est)
            except asyncio.CancelledError:  # stop() cancelled the save loop: stop saves them
                self.clocks.give_back(nodes[i:])  # (node i may be saved twice: harmless)
                raise
            except Exception as e:
                log.error("clock save failed node=%s error=%s: %s", node, type(e).__name__, e)
