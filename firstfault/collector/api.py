"""The collector's HTTP API (aiohttp): read-only queries and metrics.

    GET /healthz                          "ok" while the store answers
    GET /metrics                          Prometheus text (ingest counters, store latency)
    GET /api/jobs                         {"jobs": [...]} newest first
    GET /api/jobs/{job}/report            the report; ?format=json|md|text|html (default json);
                                          ?timeline=1 adds the swimlanes' timeline object to json
    GET /api/jobs/{job}/timeline          {"records": [...]}: the job's own records; ?rank=&node=&since=
                                          &until=&grep=&limit= (grep: a literal part of the message);
                                          &context=1 adds its nodes' kernel and cgroup records of its
                                          lifetime that name none of its processes (node_context: true);
                                          &format=jsonl streams one record a line
    GET /api/jobs/{job}/bundle            the bug-report .tar.gz

Read-only: the API's routes are GET (and HEAD); any other method is 405. Bound to loopback
by default. On any other address a token is required (``Authorization: Bearer <token>``;
any line of the token file, compared in constant time: firstfault/common/tokens.py;
``tokens`` is replaced on SIGHUP). Closed to other origins: no CORS header is ever
sent, a request whose ``Origin`` is not this server's own is refused (403), every
response says ``Cross-Origin-Resource-Policy: same-origin`` and ``nosniff``, and
without a token (loopback) a request must name a loopback host (``Host``), so a web
page cannot reach the API through DNS rebinding. Nothing from a record is executed
or used as a path.

No request can hold the collector: queries read a store of their own on a thread of
their own, one at a time (the daemon opens a second store, so ingest and /healthz never
wait for a query); ``grep`` is a literal match (linear in the text: no pattern a user
sends can backtrack); a streamed timeline reads in steps of at most CHUNK records or
STEP_BUDGET_S seconds, and other requests take the store between steps; every query
value is checked (a bad one answers 400, never 500).

The web pages (web.py: ``/``, ``/jobs/{job}``, ``/paste``, ``/login``) share these rules; a
browser sends the token as a cookie that ``/login`` sets, and only ``/paste`` and ``/login``
take a POST (a form of this very page). Every HTML response carries the report's
Content-Security-Policy (nothing loads from anywhere) and ``frame-ancestors 'none'``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from html import escape
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from firstfault.analysis.catalog import Catalog
from firstfault.collector import query
from firstfault.collector.store.base import Selection, Store, check_selection
from firstfault.collector.web import COOKIE, MAX_PASTE, Web, html_response
from firstfault.common.prometheus import CONTENT_TYPE
from firstfault.common.redact import Redactor
from firstfault.common.tokens import accepts
from firstfault.reports import FORMATS, needs_timeline, render

JSON_CT = "application/json"
CHUNK = 2000  # records read from the store per step of a streamed timeline
STEP_BUDGET_S = 0.1  # a step of a streamed timeline stops after this long (others go between steps)
MAX_GREP = 1000  # characters of a timeline's grep
MAX_EPOCH_S = 2**63 / 1e9  # the last time a 64-bit ns count holds


def _same_origin(request: web.Request) -> bool:
    """No Origin (not a browser, or a same-origin GET), or this very server's host."""
    origin = request.headers.get("Origin")
    return origin is None or origin.partition("://")[2] == request.host


def _error_page(title: str, text: str) -> str:
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title></head>"
            f"<body><h1>{escape(title)}</h1><p>{escape(text)}</p><p><a href='/'>Jobs</a></p></body></html>\n")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _hostname(host: str) -> str:
    """The name in a Host header: ``127.0.0.1:7141`` -> 127.0.0.1, ``[::1]:7141`` -> ::1."""
    if host.startswith("["):
        return host[1:host.find("]")]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def parse_selection(job: str, q) -> Selection:
    """Selection from query parameters; ValueError names the bad one (the API answers 400).
    ``grep`` is a literal part of the message, never a pattern (no request can run long)."""
    def ints(name):
        v = q.get(name)
        try:
            return tuple(int(x) for x in v.split(",")) if v else None
        except ValueError:
            raise ValueError(f"{name}: expected numbers, comma separated: {v!r}") from None

    def ns(name):
        v = q.get(name)
        if v is None:
            return None
        if not re.fullmatch(r"\d+(\.\d*)?", v):
            return _iso_ns(v, name)
        seconds = float(v)
        if not seconds < MAX_EPOCH_S:
            raise ValueError(f"{name}: not a time (epoch seconds before year 2262): {v[:40]!r}")
        return int(seconds * 1e9)

    grep = q.get("grep")
    limit = q.get("limit")
    nodes = q.get("node")
    try:
        if grep is not None and len(grep) > MAX_GREP:
            raise ValueError(f"grep: at most {MAX_GREP} characters")
        sel = Selection(job=job, nodes=tuple(nodes.split(",")) if nodes else None, ranks=ints("rank"),
                        since_ns=ns("since"), until_ns=ns("until"), grep=grep,
                        limit=int(limit) if limit is not None else None)
        check_selection(sel)
    except ValueError as e:
        raise ValueError(f"bad query: {str(e)[:200]}") from None
    return sel


def _iso_ns(v: str, name: str) -> int:
    from datetime import datetime

    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{name}: not a time (ISO 8601 or epoch seconds): {v[:40]!r}") from None
    if dt.tzinfo is None:
        raise ValueError(f"{name}: give a zone (Z or +hh:mm): {v[:40]!r}")
    try:
        return int(dt.timestamp() * 1e9)
    except (OverflowError, ValueError):
        raise ValueError(f"{name}: out of range: {v[:40]!r}") from None


class Api:
    def __init__(self, store: Store, catalog: Catalog, *, token: str | tuple[str, ...] | None = None,
                 metrics: Callable[[], str] | None = None,
                 call: Callable[..., Awaitable[Any]] | None = None, max_paste: int = MAX_PASTE,
                 redactor: Redactor | None = None, ingest: Store | None = None,
                 ingest_call: Callable[..., Awaitable[Any]] | None = None) -> None:
        """``call(fn, *args)`` runs a call of ``store`` on its own thread, one at a time.
        ``ingest`` and ``ingest_call``: the ingest server's store and its thread, where
        /healthz asks and a kept paste is written; the daemon gives the API a second
        store of its own to read (a query, however long, never holds up ingest or
        /healthz). Without them both go to ``store``."""
        self.store = store
        self.ingest, self.ingest_call = ingest, ingest_call
        self.catalog = catalog
        self.tokens = (token,) if isinstance(token, str) else token
        self.redactor = redactor  # reports, timelines and bundles (firstfault/common/redact.py)
        self.metrics = metrics
        self.call = call or asyncio.to_thread
        self.lock = asyncio.Lock()  # one store call at a time
        self.max_paste = max_paste  # bytes of a log pasted into /paste (web.py)

    async def _call(self, fn, *args):
        async with self.lock:
            return await self.call(fn, *args)

    async def _ingest_call(self, fn_of_store: Callable[[Store], Any]):
        """``fn_of_store(store)`` on the ingest store's thread (else as _call)."""
        if self.ingest is None or self.ingest_call is None:
            return await self._call(fn_of_store, self.store)
        return await self.ingest_call(fn_of_store, self.ingest)

    def token_ok(self, authorization: str) -> bool:
        """An ``Authorization`` value (``Bearer <token>``) names a token in use; any does with none."""
        scheme, _, given = authorization.partition(" ")
        return self.tokens is None or (scheme == "Bearer" and accepts(self.tokens, given))

    @web.middleware
    async def auth(self, request: web.Request, handler):
        page = not request.path.startswith(("/api/", "/metrics", "/healthz"))
        if not _same_origin(request):
            return web.json_response({"error": "requests from other origins are refused"}, status=403)
        if self.tokens is None and not is_loopback(_hostname(request.host)):
            return web.json_response({"error": "this API answers loopback names only "
                                      "(Host); off loopback it needs a token"}, status=403)
        if self.tokens is not None and request.path != "/login":
            got = request.headers.get("Authorization") or f"Bearer {request.cookies.get(COOKIE, '')}"
            if not self.token_ok(got):
                if page and request.method == "GET":
                    raise web.HTTPSeeOther("/login")
                return web.json_response({"error": "a valid token is required"}, status=401)
        try:
            return await handler(request)
        except query.QueryError as e:
            if page:
                return html_response(_error_page("Not found", str(e)), status=404)
            return web.json_response({"error": str(e)}, status=404)
        except ValueError as e:
            if page:
                return html_response(_error_page("Bad request", str(e)), status=400)
            return web.json_response({"error": str(e)}, status=400)

    async def healthz(self, request):
        await self._ingest_call(lambda store: store.clocks())
        return web.Response(text="ok\n")

    async def prometheus(self, request):
        text = self.metrics() if self.metrics else ""
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def jobs(self, request):
        return web.json_response({"jobs": await self._call(query.jobs, self.store)})

    async def report(self, request):
        fmt = request.query.get("format", "json")
        if fmt not in FORMATS:
            raise ValueError(f"format: one of {', '.join(FORMATS)}")
        timeline = needs_timeline(fmt) or request.query.get("timeline") == "1"
        rep = await self._call(lambda: query.report(self.store, request.match_info["job"], self.catalog,
                                                    redactor=self.redactor, timeline=timeline))
        # rendering and encoding run off the event loop: a large report would hold it
        if fmt == "json":
            body = await asyncio.to_thread(lambda: json.dumps(rep, ensure_ascii=False).encode())
            return web.Response(body=body, content_type=JSON_CT)
        text = await asyncio.to_thread(render, rep, fmt)
        if fmt == "html":
            return html_response(text)
        return web.Response(text=text, content_type="text/markdown" if fmt == "md" else "text/plain")

    async def timeline(self, request):
        """Streams every matching record in chunks: nothing is cut, memory stays flat."""
        job = request.match_info["job"]
        sel = parse_selection(job, request.query)
        if await self._call(self.store.job, job) is None:
            raise query.QueryError(f"no job {job!r} in the store")
        jsonl = request.query.get("format") == "jsonl"
        context = request.query.get("context") == "1"
        rows = await self._call(lambda: iter(query.timeline(self.store, sel, self.redactor, context=context,
                                                            catalog=self.catalog)))
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson" if jsonl else JSON_CT})
        await resp.prepare(request)
        if not jsonl:
            await resp.write(b'{"records": [')
        first = True
        while chunk := await self._call(take_encoded, rows, CHUNK, STEP_BUDGET_S, jsonl, first):
            first = False
            await resp.write(chunk)
        if not jsonl:
            await resp.write(b"]}\n")
        await resp.write_eof()
        return resp

    async def bundle(self, request):
        job = request.match_info["job"]
        data = await self._call(query.bundle, self.store, job, self.catalog, self.redactor)
        return web.Response(body=data, content_type="application/gzip", headers={
            "Content-Disposition": f'attachment; filename="firstfault-{query.file_part(job)}.tar.gz"'})

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.auth], client_max_size=self.max_paste + (64 << 10))
        app.on_response_prepare.append(_closed_headers)
        pages = Web(self, max_paste=self.max_paste)
        app.add_routes(pages.routes())

        async def close_worker(_app) -> None:
            pages.worker.close()
        app.on_cleanup.append(close_worker)
        app.add_routes([
            web.get("/healthz", self.healthz),
            web.get("/metrics", self.prometheus),
            web.get("/api/jobs", self.jobs),
            web.get("/api/jobs/{job}/report", self.report),
            web.get("/api/jobs/{job}/timeline", self.timeline),
            web.get("/api/jobs/{job}/bundle", self.bundle),
        ])
        return app


def take(rows: Iterator[dict], n: int, budget_s: float) -> list[dict]:
    """Up to ``n`` of ``rows``, fewer once ``budget_s`` has passed: one step of a stream,
    after which other requests get the store thread."""
    out: list[dict] = []
    end = time.monotonic() + budget_s
    for r in rows:
        out.append(r)
        if len(out) >= n or time.monotonic() >= end:
            break
    return out


def take_encoded(rows: Iterator[dict], n: int, budget_s: float, jsonl: bool, first: bool) -> bytes:
    """One step of a streamed timeline as the bytes to send (b"" at the end), encoded on the
    store's thread, not on the event loop."""
    chunk = take(rows, n, budget_s)
    if not chunk:
        return b""
    if jsonl:
        return ("\n".join(json.dumps(r, ensure_ascii=False) for r in chunk) + "\n").encode()
    return (("" if first else ",") + ",".join(json.dumps(r, ensure_ascii=False) for r in chunk)).encode()


class _QuietBadRequests(logging.Filter):
    """aiohttp logs a request that is not HTTP (a bad status line, a 70 KiB URL) with a
    traceback at ERROR: one line at WARNING instead, so a flood of them is no flood of
    tracebacks (the client got its 400)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (HttpProcessingError, ConnectionResetError)):
            record.msg, record.args = "http bad request error=%s message=%r", (
                type(exc).__name__, str(getattr(exc, "message", exc))[:200])
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


async def _closed_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Cross-Origin-Resource-Policy"] = "same-origin"
    response.headers["X-Content-Type-Options"] = "nosniff"


async def start(api: Api, host: str, port: int) -> web.AppRunner:
    """Serve the API on host:port; a non-loopback address needs a token."""
    if not is_loopback(host) and api.tokens is None:
        raise ValueError(f"the HTTP API on {host} (not loopback) needs a token: give --token-file")
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _QuietBadRequests) for f in server_log.filters):
        server_log.addFilter(_QuietBadRequests())
    runner = web.AppRunner(api.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
