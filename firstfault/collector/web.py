"""The collector's web page, on its HTTP port beside the API.

    GET  /               the jobs, newest first: status, first failure, nodes, ranks; ?q= filters
    GET  /jobs/{job}     the job's HTML report (reports/html.py); while the job runs the page
                         reloads its own data every 5 s
    GET  /paste          a form: paste a log or upload a file (plain or gzip)
    POST /paste          the offline report of that log, as HTML; nothing is stored unless the
                         form's "keep" box is ticked (then it becomes job ``paste-<id>``)
    GET|POST /login      where a browser gives the token when the collector asks for one

Auth is the API's (api.py): none on loopback, else the token, which a browser sends as
the ``firstfault_token`` cookie that /login sets (HttpOnly, SameSite=Strict). A POST
whose ``Origin`` is another site is refused, so no other page can make a visitor's
browser paste or log in. Every page carries the Content-Security-Policy of
reports/html.py (nothing is loaded from anywhere; only our own inline style and script
run) and every piece of log text is escaped there. A paste request sends at most
``max_paste`` bytes and its parts inflate to at most ``max_paste`` bytes, in all (per
request, not per part), at most MAX_PARTS parts; it is read in memory only.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import zlib
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from aiohttp import web

from firstfault.analysis import traceback as tb
from firstfault.analysis.catalog import Catalog
from firstfault.analysis.parse import looks_srun_labelled, strip_prefixes
from firstfault.analysis.reads import scan_needles
from firstfault.analysis.report import Inputs, build_report, iso
from firstfault.analysis.scan import StreamInfo, scan_stream
from firstfault.collector import query
from firstfault.collector.pasteworker import PasteFailed, PasteWorker
from firstfault.common import redact
from firstfault.reports.html import CSS, csp, e, render_html
from firstfault.wire import Record

MAX_PASTE = 32 << 20  # bytes a paste request may send, and bytes its parts may inflate to, in all
MAX_PARTS = 16  # form parts of one paste request
COOKIE = "firstfault_token"
FIRST_BUDGET_S = 2.0  # time the jobs page spends on first failures it has not seen yet


def html_response(text: str, *, status: int = 200, connect: str = "'none'") -> web.Response:
    """An HTML page with the headers every page of ours carries: a policy that forbids loads."""
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8", headers={
        "Content-Security-Policy": csp(connect) + "; frame-ancestors 'none'", "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin", "Cache-Control": "no-store"})  # same-origin: a form of ours sends its Origin


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{e(title)}</title><style>{CSS}</style></head><body><header><h1>{e(title)}</h1>"
            "<p><a href='/'>Jobs</a> · <a href='/paste'>Paste a log</a></p></header>"
            f"<main>{body}</main></body></html>\n")


class Web:
    """The pages; ``api`` is the collector's Api (store, catalog, token, its store thread)."""

    def __init__(self, api, *, max_paste: int = MAX_PASTE) -> None:
        self.api = api
        self.max_paste = max_paste
        self.worker = PasteWorker()
        self.firsts: dict[str, tuple[int, int, str]] = {}  # job -> (records, last_ns, first failure line)

    # --- jobs ---------------------------------------------------------------------------
    def _first_line(self, job) -> str | None:
        got = self.firsts.get(job.job)
        if got and got[:2] == (job.records, job.last_ns):
            return got[2]
        return None

    def _jobs_rows(self, q: str) -> list[tuple]:
        jobs = self.api.store.jobs()
        if q:
            ql = q.lower()
            jobs = [j for j in jobs if ql in j.job.lower() or ql in j.status or any(ql in n.lower() for n in j.nodes)]
        rows, deadline = [], time.monotonic() + FIRST_BUDGET_S
        for j in jobs[:500]:
            first = self._first_line(j)
            if first is None and time.monotonic() < deadline:
                rep = query.report(self.api.store, j.job, self.api.catalog, redactor=self.api.redactor)
                ff = rep.get("first_failure")
                first = "none found" if ff is None else (
                    f"rank {ff['rank'] if ff.get('rank') is not None else '?'}"
                    + (f" on {ff['node']}" if ff.get("node") else "") + f": {ff['signature']} ({ff.get('phase')})")
                self.firsts[j.job] = (j.records, j.last_ns, first)
            rows.append((j, first))
        return rows

    async def jobs(self, request: web.Request) -> web.Response:
        q = request.query.get("q", "").strip()[:200]
        rows = await self.api._call(self._jobs_rows, q)
        body = ["<form method='get' action='/' role='search'><label for='q'>Filter jobs</label> "
                f"<input id='q' name='q' type='search' value='{e(q)}' placeholder='job, node or status'> "
                "<button type='submit'>Filter</button></form>",
                "<table class='grid'><thead><tr><th scope='col'>job</th><th scope='col'>status</th>"
                "<th scope='col'>first failure</th><th scope='col'>nodes</th><th scope='col'>ranks</th>"
                "<th scope='col'>records</th><th scope='col'>first → last (UTC)</th></tr></thead><tbody>"]
        for j, first in rows:
            nodes = ", ".join(j.nodes[:4]) + (f" +{len(j.nodes) - 4}" if len(j.nodes) > 4 else "")
            body.append(f"<tr><th scope='row'><a href='/jobs/{e(_quote(j.job))}'>{e(j.job)}</a></th><td>{e(j.status)}</td>"
                        f"<td>{e(first or 'open the job to see')}</td><td>{len(j.nodes)}: {e(nodes)}</td>"
                        f"<td>{len(j.ranks)}</td><td>{j.records}</td><td>{e(iso(j.first_ns))} → {e(iso(j.last_ns))}</td></tr>")
        body.append("</tbody></table>")
        if not rows:
            body.append("<p>No jobs" + (" match the filter." if q else " yet: agents have sent no job's records.") + "</p>")
        return html_response(_page("firstfault: jobs", "".join(body)))

    async def job(self, request: web.Request) -> web.Response:
        job = request.match_info["job"]
        info = await self.api._call(self.api.store.job, job)
        if info is None:
            raise query.QueryError(f"no job {job!r} in the store")
        rep = await self.api._call(lambda: query.report(self.api.store, job, self.api.catalog,
                                                         redactor=self.api.redactor, timeline=True))
        page = await asyncio.to_thread(render_html, rep, live=True, status=info.status)
        return html_response(page, connect="'self'")

    # --- paste ----------------------------------------------------------------------------
    async def paste_form(self, request: web.Request) -> web.Response:
        body = ("<form method='post' action='/paste' enctype='multipart/form-data'>"
                f"<p>Paste a log (a launcher's console, one rank's log, or a kernel log) or upload a file, "
                f"plain or gzip, at most {self.max_paste >> 20} MiB. It is analysed in memory and shown; "
                "nothing is kept unless you tick the box.</p>"
                "<p><label for='text'>Log text</label><br><textarea id='text' name='text' rows='16' cols='100'></textarea></p>"
                "<p><label for='file'>or a file</label> <input id='file' name='file' type='file'></p>"
                "<p><label for='tz'>Time zone of times without one</label> <input id='tz' name='tz' value='UTC'></p>"
                "<p><input id='keep' name='keep' type='checkbox' value='1'> <label for='keep'>Keep it in the collector "
                "as a job (paste-…), to share its link</label></p><p><button type='submit'>Analyse</button></p></form>")
        return html_response(_page("firstfault: paste a log", body))

    async def paste(self, request: web.Request) -> web.Response:
        data, fields = await self._read_paste(request)
        try:
            tz = ZoneInfo(fields.get("tz") or "UTC")
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {fields.get('tz')!r} (e.g. UTC, Europe/Berlin)") from None
        if not data.strip():
            raise ValueError("nothing to analyse: paste a log or choose a file")
        redactor = self.api.redactor  # as the agents do before spooling: no secret is stored or shown
        if fields.get("keep") == "1":
            job = f"paste-{uuid.uuid4().hex[:12]}"
            records = await asyncio.to_thread(_kept_records, data, job, redactor)  # off the event loop
            await self.api._ingest_call(lambda store: store.insert(records))
            raise web.HTTPSeeOther(f"/jobs/{job}")
        try:
            page = await self.worker.render(data, tz, redactor)  # a process of its own (pasteworker.py)
        except PasteFailed as e:
            raise web.HTTPServiceUnavailable(text=f"{e}\n") from None
        return html_response(page)

    async def _read_paste(self, request: web.Request) -> tuple[bytes, dict]:
        """The pasted log and the form's other fields. The limits hold per request, not per
        part: at most ``max_paste`` bytes arrive in all, at most ``max_paste`` bytes come out
        of inflating every part together, and at most MAX_PARTS parts are read."""
        fields: dict[str, str] = {}
        parts: list[bytes] = []
        budget = _Budget(self.max_paste)
        if request.content_type.startswith("multipart/"):
            reader = await request.multipart()
            count = 0
            while (part := await reader.next()) is not None:
                count += 1
                if count > MAX_PARTS:
                    raise ValueError(f"at most {MAX_PARTS} form parts")
                raw = bytearray()
                while chunk := await part.read_chunk():
                    budget.take(len(chunk))
                    raw += chunk
                raw = bytes(raw)
                if part.name in ("text", "file"):
                    parts.append(raw.replace(b"\r\n", b"\n") if part.name == "text" else raw)
                elif part.name:
                    fields[part.name] = raw.decode("utf-8", "replace")[:200]
        elif request.content_type == "application/x-www-form-urlencoded":
            form = await request.post()
            text = str(form.get("text", "")).replace("\r\n", "\n").encode()
            budget.take(len(text))
            parts.append(text)
            fields.update({k: str(form.get(k, ""))[:200] for k in ("tz", "keep")})
        else:  # a raw body: curl --data-binary @log.gz /paste
            raw = await request.read()
            budget.take(len(raw))
            parts.append(raw)
        inflated = _Budget(self.max_paste)  # inflating runs off the event loop
        return await asyncio.to_thread(lambda: b"\n".join(_gunzip(p, inflated) for p in parts if p)), fields

    # --- login ------------------------------------------------------------------------------
    async def login_form(self, request: web.Request) -> web.Response:
        return html_response(_page("firstfault: token", "<form method='post' action='/login'><p>This collector asks for "
                                   "its token.</p><p><label for='token'>Token</label> <input id='token' name='token' "
                                   "type='password' autocomplete='current-password'></p>"
                                   "<p><button type='submit'>Go on</button></p></form>"))

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        token = str(form.get("token", ""))
        if not self.api.token_ok(f"Bearer {token}"):
            raise web.HTTPUnauthorized(text="wrong token\n")
        resp = web.HTTPSeeOther("/")
        resp.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
        raise resp

    def routes(self) -> list:
        return [web.get("/", self.jobs), web.get("/jobs/{job}", self.job), web.get("/paste", self.paste_form),
                web.post("/paste", self.paste), web.get("/login", self.login_form), web.post("/login", self.login)]


def _quote(job: str) -> str:
    from urllib.parse import quote

    return quote(job, safe="")


class _Budget:
    """Bytes a request may still use; 413 once it would use more."""

    def __init__(self, limit: int) -> None:
        self.limit = self.left = limit

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise web.HTTPRequestEntityTooLarge(max_size=self.limit, actual_size=self.limit - self.left)


def _gunzip(raw: bytes, budget: _Budget) -> bytes:
    """raw, or what it inflates to when it is gzip; either taken from ``budget`` (the
    request's inflated bytes), inflating never more than what is left of it."""
    if raw[:2] != b"\x1f\x8b":
        budget.take(len(raw))
        return raw
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(raw, max(budget.left, 0) + 1)
    except zlib.error as err:
        raise ValueError(f"not a readable gzip file: {err}") from None
    budget.take(len(out))  # more than is left: it stopped at left + 1
    return out


def analyze_paste(data: bytes, catalog: Catalog, tz, *, name: str = "pasted log",
                  redactor: redact.Redactor | None = None, redacted: Counter | None = None) -> dict:
    """The offline report of one pasted log, with the timeline for the HTML page; its events
    redacted by ``redactor`` before the analysis reads them (``redacted`` counts what was)."""
    head = data[:65536].decode("utf-8", "replace").splitlines()[:200]
    info = StreamInfo(stream=name, source="launcher", year=datetime.now(timezone.utc).year, tz=tz,
                      srun_labels=looks_srun_labelled(head), observed_ns=time.time_ns())
    events = redact.events(scan_stream([data], info, scan_needles(catalog)), redactor,
                           Counter() if redacted is None else redacted)
    return build_report(events, catalog, Inputs(timeline=True, generated_ns=time.time_ns()))


def _kept_records(data: bytes, job: str, redactor) -> list[Record]:
    records = paste_records(data, job)
    if redactor is None:
        return records
    counts: Counter = Counter()
    return [replace(r, message=redactor.text(r.message, counts)) for r in records]


def paste_records(data: bytes, job: str, *, node: str = "paste") -> list[Record]:
    """A pasted log as records of job ``job``, as an agent would ship them: one a line, a
    whole traceback as one ``rank.traceback`` record."""
    now, stream = time.time_ns(), f"paste-{uuid.uuid4().hex[:8]}"
    out: list[Record] = []
    lines = data.decode("utf-8", "replace").split("\n")
    i = 0
    while i < len(lines):
        text = lines[i].rstrip("\r")
        pre = strip_prefixes(text)
        kind, message = "rank.line", text
        if tb.is_start(pre.text):
            asm, j = tb.Assembler(pre.text), i + 1
            while j < len(lines) and asm.feed(strip_prefixes(lines[j].rstrip("\r")).text):
                j += 1
            kind, message, i = "rank.traceback", "\n".join(ln.rstrip("\r") for ln in lines[i:j]), j - 1
        if message.strip():
            out.append(Record(node=node, stream=stream, seq=len(out), source="ranklog", kind=kind,
                              message=message[:60000], observed_ns=now, job=job, rank=pre.rank,
                              local_rank=pre.local_rank, fields={"path": "pasted"}))
        i += 1
    return out
