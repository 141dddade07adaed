"""The ingest port's sockets: accept, tell TLS from plain text, shake hands, bound strangers.

For every connection, before the ingest server (server.py) sees it:

1. The first bytes are peeked (``MSG_PEEK``: nothing is consumed), waiting at most
   ``first_bytes_s``: a TLS client starts with a handshake record (``16 03``), an agent
   speaking plain TCP with a frame's length prefix (``00 00 ..``).
2. A plain-text client on a TLS port gets an ``error`` frame in plain text (code
   ``protocol``: "this port speaks TLS ...", which a plain agent can read and log), a
   TLS client on a plain port the same ("this port does not speak TLS", which its TLS
   layer takes for a bad record); both are closed, logged with the peer as a clear
   one-line error, and counted (Metrics.errors ``tls_mismatch``).
3. On a TLS port the handshake runs (``ssl_handshake_s`` at most); a failure (the client's
   certificate unknown, expired, missing under mutual TLS; no common protocol) is logged
   with OpenSSL's reason and counted (``tls``).
4. ``handle(reader, writer)`` runs in the connection's own task.

Strangers are bounded: at most ``max_pending`` connections may be in steps 1-3 at once; a
new one beyond that closes the oldest (an agent sends its first bytes at once, so a flood
of idle or slow connections cannot keep it out). The listening sockets are bound like
``asyncio.start_server`` binds them (every address of the host, SO_REUSEADDR, backlog 1024).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Awaitable, Callable

from firstfault.collector.metrics import LogLimiter, Metrics
from firstfault.wire import ERR_PROTOCOL, Error, encode_message

log = logging.getLogger(__name__)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
TLS_RECORD = b"\x16\x03"  # a TLS handshake record (ClientHello), any TLS version
PLAIN_ON_TLS = ("this port speaks TLS and this client does not: configure [tls] ca on the "
                "agent (cert and key too when the collector asks for client certificates)")
NO_TLS = ("this port does not speak TLS: turn TLS off on the agent or configure [tls] cert "
          "and key on the collector")


def looks_like_tls(first: bytes) -> bool:
    return first[:2] == TLS_RECORD


class Listener:
    """The listening sockets of one port; see the module docstring."""

    def __init__(self, handle: Handler, *, ssl_context: ssl.SSLContext | None = None,
                 first_bytes_s: float = 10.0, ssl_handshake_s: float = 10.0,
                 max_pending: int = 256, metrics: Metrics | None = None,
                 log_limiter: LogLimiter | None = None) -> None:
        self.handle, self.ssl_context = handle, ssl_context
        self.first_bytes_s, self.ssl_handshake_s = first_bytes_s, ssl_handshake_s
        self.max_pending = max_pending
        self.metrics = metrics or Metrics()
        self.log_limiter = log_limiter or LogLimiter()
        self.sockets: list[socket.socket] = []
        self._accepting: list[asyncio.Task] = []
        # oldest first; the value: its socket until the task starts (then None)
        self._pending: dict[asyncio.Task, socket.socket | None] = {}
        self.tasks: set[asyncio.Task] = set()  # every connection's task

    async def start(self, host: str, port: int) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen = set()
        try:
            for family, kind, proto, _, addr in infos:
                if (family, addr) in seen:
                    continue
                seen.add((family, addr))
                sock = socket.socket(family, kind, proto)
                self.sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if port == 0 and len(self.sockets) > 1:  # every address on the first one's port
                    addr = (addr[0], self.sockets[0].getsockname()[1], *addr[2:])
                sock.bind(addr)
                sock.listen(1024)
                sock.setblocking(False)
        except BaseException:
            self.close()
            raise
        self._accepting = [asyncio.create_task(self._accept(s), name="firstfault-accept")
                           for s in self.sockets]
        return self.sockets[0].getsockname()[:2]

    def close(self) -> None:
        """Stop accepting and end the connections not yet handed over."""
        for t in self._accepting:
            t.cancel()
        for s in self.sockets:
            s.close()
        while self._pending:
            self._end_pending(next(iter(self._pending)))

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as e:  # out of descriptors, say: the backlog waits
                log.error("ingest accept failed error=%s", e)
                await asyncio.sleep(0.5)
                continue
            self.metrics.connections += 1
            task = asyncio.create_task(self._connection(conn), name="firstfault-connection")
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            self._pending[task] = conn
            while len(self._pending) > self.max_pending:
                self._end_pending(next(iter(self._pending)))
                self.metrics.error("pending_evicted")

    def _end_pending(self, task: asyncio.Task) -> None:
        """Cancel a connection not yet handed over. One whose task has not started yet
        (a burst is accepted without yielding) never runs a line of _connection, so
        its socket is closed here: else it stays open, unread, until garbage collected."""
        conn = self._pending.pop(task)
        task.cancel()
        if conn is not None:
            conn.close()

    async def _connection(self, conn: socket.socket) -> None:
        me = asyncio.current_task()
        if me in self._pending:
            self._pending[me] = None  # started: this task closes its socket from now on
        try:
            peer = _peer(conn)
            try:
                reader, writer = await self._open(conn, peer)
            except asyncio.CancelledError:  # evicted or stopping: nothing to say
                conn.close()
                return
            finally:
                self._pending.pop(me, None)
            if reader is None:
                conn.close()
                return
        except BaseException:
            conn.close()
            raise
        await self.handle(reader, writer)

    async def _open(self, conn: socket.socket, peer: str):
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        first = await self._peek(conn)
        if not first:
            return None, None  # closed, or silent for first_bytes_s
        tls = self.ssl_context is not None
        if tls != looks_like_tls(first):
            self.metrics.error("tls_mismatch")
            self._warn("tls_mismatch", "ingest %s peer=%s: %s", "plain-text client on the TLS port"
                       if tls else "TLS client on a port without TLS", peer,
                       PLAIN_ON_TLS if tls else NO_TLS)
            try:  # what was sent is read first: closing on unread bytes would reset
                conn.recv(1 << 16)
                conn.send(encode_message(Error(ERR_PROTOCOL, PLAIN_ON_TLS if tls else NO_TLS)))
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return None, None
        reader = asyncio.StreamReader(limit=2**16)
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, conn, ssl=self.ssl_context,
                ssl_handshake_timeout=self.ssl_handshake_s if tls else None)
        except (ssl.SSLError, OSError, TimeoutError) as e:
            self.metrics.error("tls")
            why = (getattr(e, "verify_message", None) or getattr(e, "reason", None) or (
                "the client ended the handshake (does it trust this collector's certificate? "
                "its [tls] ca and server_name)" if isinstance(e, ConnectionError) else
                f"{type(e).__name__}: {e}"))
            self._warn("tls", "ingest TLS handshake failed peer=%s reason=%s", peer, why)
            return None, None
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def _peek(self, conn: socket.socket) -> bytes:
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        loop.add_reader(conn.fileno(), lambda: readable.done() or readable.set_result(None))
        try:
            async with asyncio.timeout(self.first_bytes_s):
                await readable
            return conn.recv(8, socket.MSG_PEEK)
        except (TimeoutError, OSError):
            return b""
        finally:
            loop.remove_reader(conn.fileno())

    def _warn(self, code: str, fmt: str, *args) -> None:
        ok, suppressed = self.log_limiter.allow(code)
        if ok:
            log.warning(fmt + (f" suppressed={suppressed}" if suppressed else ""), *args)


def _peer(conn: socket.socket) -> str:
    try:
        peer = conn.getpeername()
    except OSError:
        return "?"
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
