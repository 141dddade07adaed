"""The report as one self-contained HTML page: render only, no analysis.

Everything is inline (CSS, JS and the SVG it draws; no fonts, images or scripts are
fetched), so the file opens from a bug-report attachment with no network, and its
Content-Security-Policy forbids any load: scripts and styles run only by their hashes,
``connect-src`` is ``'none'`` (``'self'`` for the collector's live page, which polls
itself). The page works in two layers:

- what the server writes (escaped here): the first failure and its evidence, the key
  events, the per-rank table, memory by phase, checkpoint, context and what is missing;
- what ``assets/report.js`` draws from the report's JSON (embedded as
  ``<script type="application/json">``, which no browser runs): swimlanes per node and
  rank on the corrected clock with zoom and pan, and the memory charts.

Logs are untrusted: every piece of text goes into the page through ``html.escape`` or,
in the script, ``textContent``; the embedded JSON has ``<``, ``>`` and ``&`` as
``\\u003c`` escapes so no ``</script>`` ends it early; control characters (terminal
escapes) and bidirectional overrides are shown as ``\\x1b``-style text (``visible``).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from datetime import datetime, timezone
from importlib import resources

from firstfault.analysis.catalog import shipped
from firstfault.reports.memtable import HEADER as MEMORY_HEADER
from firstfault.reports.memtable import memory_rows
from firstfault.reports.text import alike_text, frame_line, node_context_lines

_ASSETS = resources.files("firstfault.reports") / "assets"
CSS = (_ASSETS / "report.css").read_text(encoding="utf-8")
JS = (_ASSETS / "report.js").read_text(encoding="utf-8")
MAX_KEY_EVENTS = 400
KEY_KINDS = ("first", "rank-first", "root", "kernel", "cgroup-oom", "exit")

# C0 and C1 controls but tab and newline, DEL, and the bidirectional controls
_INVISIBLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


CSS_HASH, JS_HASH = _hash(CSS), _hash(JS)


def csp(connect: str = "'none'") -> str:
    """The page's Content-Security-Policy: nothing loads; only this file's own style and script run."""
    return (f"default-src 'none'; style-src {CSS_HASH}; script-src {JS_HASH}; img-src data:; "
            f"connect-src {connect}; base-uri 'none'; form-action 'self'")


def visible(s: str) -> str:
    """Text with control characters and direction overrides written out (``\\x1b``, ``\\u202e``)."""
    return _INVISIBLE.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", s)


def _display(obj):
    """A copy of the report with every string made visible()."""
    if isinstance(obj, str):
        return visible(obj)
    if isinstance(obj, dict):
        return {visible(str(k)): _display(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_display(v) for v in obj]
    return obj


def _json_for_script(obj) -> str:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def e(v) -> str:
    """One value as escaped HTML text (None as nothing)."""
    return "" if v is None else html.escape(str(v), quote=True)


def _kv(rows) -> str:
    return "<table class='kv'><tbody>" + "".join(
        f"<tr><th scope='row'>{e(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</tbody></table>"


def _first(rep: dict) -> str:
    ff = rep.get("first_failure")
    if ff is None:
        return "<section id='first' class='first none' aria-labelledby='first-h'><h2 id='first-h'>No failure found</h2>" \
               "<p>No failure was found in the given logs.</p></section>"
    rank = "unknown rank" if ff.get("rank") is None else f"rank {ff['rank']}"
    node = f" on {ff['node']}" if ff.get("node") else ""
    inferred = " (inferred)" if ff.get("inferred") else ""
    unc = f" ±{ff['uncertainty_ms']} ms" if ff.get("uncertainty_ms") else ""
    rows = [("signature", f"<code>{e(ff['signature'])}</code>"), ("category", e(ff.get("category"))),
            ("blame", e(rep.get("blame"))), ("phase", e(ff.get("phase")) + (
                f" <span class='muted'>({e(ff.get('phase_from'))})</span>" if ff.get("phase_from") else "")),
            ("occurred", e(f"{ff.get('occurred_at') or 'unknown'}{unc}") + f" <span class='muted'>(clock: "
                         f"{e(ff.get('clock') or 'none')})</span>"),
            ("confidence", e(ff.get("confidence")) + (" — tied within clock uncertainty with rank(s) "
                                                      + e(", ".join(map(str, ff.get("tied_with") or [])))
                                                      if ff.get("within_clock_uncertainty") else "")),
            ("failed alike", e(alike_text(ff.get("ranks_sharing"))))]
    if frame_line(ff):
        rows.append(("failing at", f"<code id='ff-frame'>{e(frame_line(ff))}</code>"))
    out = [f"<section id='first' class='first' aria-labelledby='first-h'><h2 id='first-h'>First failure: "
           f"<span id='ff-who'>{e(rank + node)}</span>{e(inferred)}</h2>",
           f"<p class='summary'>{e(ff.get('summary'))}</p>", _kv(rows),
           f"<p class='action'><strong>Do first:</strong> {e(ff.get('first_action'))}</p>"]
    out += [f"<p class='muted'>inferred: {e(h)}</p>" for h in ff.get("inferred_from") or []]
    for ev in ff.get("evidence") or []:
        where = f"{ev.get('origin') or ev.get('source')} at {ev.get('at')}"
        link = f"<p class='muted'>linked: {e(ev['linked_by'])}</p>" if ev.get("linked_by") else ""
        out.append(f"<details open class='evidence'><summary>Evidence: {e(where)}</summary>"
                   f"<pre class='raw'>{e(ev.get('text'))}</pre>{link}</details>")
    out.append("</section>")
    return "".join(out)


def _timeline_shell(rep: dict) -> str:
    tl = rep.get("timeline")
    if not tl or not tl.get("lanes"):
        return ""
    n = len(tl["events"]["lane"])
    return (
        "<section id='timeline' aria-labelledby='tl-h'><h2 id='tl-h'>Timeline</h2>"
        f"<p class='muted'>{len(tl['lanes'])} lanes, {n} events shown of {tl.get('seen', n)} read"
        " (every finding; plain and progress lines thinned evenly). Times on the corrected clock, UTC;"
        " a bar around a mark is its clock uncertainty. Drag to pan, Ctrl+wheel or the buttons to zoom;"
        " click a mark for its raw line.</p>"
        "<div class='toolbar' role='toolbar' aria-label='Timeline view'>"
        "<button type='button' id='tl-first'>Zoom to first failure</button>"
        "<button type='button' id='tl-fit'>Show all</button>"
        "<button type='button' id='tl-in' aria-label='Zoom in'>+</button>"
        "<button type='button' id='tl-out' aria-label='Zoom out'>−</button>"
        "<button type='button' id='tl-left' aria-label='Pan left'>◀</button>"
        "<button type='button' id='tl-right' aria-label='Pan right'>▶</button>"
        "<label for='tl-filter'>Lanes</label>"
        "<input id='tl-filter' type='search' placeholder='rank or node, e.g. 3 or gpu-07' autocomplete='off'>"
        "<span id='tl-range' class='muted' aria-live='polite'></span></div>"
        "<div id='tl-legend' class='legend'></div>"
        "<div id='tl-scroll' class='tl-scroll' tabindex='0' aria-label='Swimlanes; arrow keys pan, plus and minus zoom'>"
        "<noscript>The swimlanes need JavaScript; the tables below hold the same findings.</noscript></div>"
        "<div id='tl-tip' class='tip' role='tooltip' hidden></div>"
        "<section id='tl-details' class='details' aria-live='polite' aria-labelledby='tl-details-h'>"
        "<h3 id='tl-details-h'>Selected events</h3><p class='muted'>Click a mark or a key event.</p></section>"
        "</section>")


def _key_events(rep: dict) -> str:
    tl = rep.get("timeline")
    if not tl:
        return ""
    ev, lanes = tl["events"], tl["lanes"]
    starts = shipped().ids_with("save-start")  # a save's start is a key event, its files and end are not
    idx = [i for i, k in enumerate(ev["kind"]) if k in KEY_KINDS or (k == "checkpoint" and ev["sig"][i] in starts)]
    idx.sort(key=lambda i: (ev["kind"][i] != "first", ev["t_ms"][i]))
    rows = []
    for i in idx[:MAX_KEY_EVENTS]:
        text = (ev["text"][i] or "").strip().splitlines()
        line = text[-1] if text else ""
        hit = f" → rank {ev['link'][i]}" if ev["link"][i] is not None else ""
        rows.append(f"<tr class='k-{e(ev['kind'][i])}'><td><button type='button' class='show' data-i='{i}'>Show</button></td>"
                    f"<td>{e(_utc(ev['t_ms'][i]))}</td><td>{e(lanes[ev['lane'][i]]['label'])}{e(hit)}</td>"
                    f"<td>{e(ev['kind'][i])}</td><td><code>{e(ev['sig'][i])}</code></td><td class='line'>{e(line[:240])}</td></tr>")
    more = f"<p class='muted'>{len(idx) - MAX_KEY_EVENTS} more on the timeline.</p>" if len(idx) > MAX_KEY_EVENTS else ""
    return ("<section id='key' aria-labelledby='key-h'><h2 id='key-h'>Key events</h2>"
            "<table class='grid'><caption class='sr'>First failure, each rank's first error, kernel events, "
            "exits and checkpoint saves</caption><thead><tr><th scope='col'><span class='sr'>Action</span></th>"
            "<th scope='col'>time (UTC)</th><th scope='col'>lane</th><th scope='col'>kind</th><th scope='col'>signature</th>"
            "<th scope='col'>line</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>" + more + "</section>")


def _utc(t_ms) -> str:
    if t_ms is None:
        return ""
    dt = datetime.fromtimestamp(t_ms / 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%d %H:%M:%S.") + f"{int(t_ms) % 1000:03d}"


def _ranks(rep: dict) -> str:
    ranks = rep.get("ranks") or {}
    if not ranks:
        return ""
    rows = []
    for r, info in ranks.items():
        fe = info.get("first_error") or {}
        ex = info.get("exit") or {}
        lp = info.get("last_progress") or {}
        exit_s = "" if not ex else f"{ex.get('code')} {ex.get('signal') or ''}".strip()
        text = (fe.get("text") or "").strip().splitlines()
        rows.append(f"<tr class='role-{e(fe.get('role') or 'none')}'><th scope='row'>{e(r)}</th><td>{e(info.get('node'))}</td>"
                    f"<td>{e(fe.get('role'))}</td><td><code>{e(fe.get('signature'))}</code></td><td>{e(fe.get('at'))}</td>"
                    f"<td>{e(exit_s)}</td><td>{e(lp.get('step'))}</td><td class='line'>{e((text[-1] if text else '')[:240])}</td></tr>")
    return ("<section id='ranks' aria-labelledby='ranks-h'><h2 id='ranks-h'>First error of every rank</h2>"
            "<table class='grid'><thead><tr><th scope='col'>rank</th><th scope='col'>node</th><th scope='col'>role</th>"
            "<th scope='col'>signature</th><th scope='col'>at</th><th scope='col'>exit</th><th scope='col'>last step</th>"
            "<th scope='col'>line</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>")


def _memory(rep: dict) -> str:
    mem = rep.get("memory") or {}
    rows, more = memory_rows(rep)
    head = "<section id='memory' aria-labelledby='mem-h'><h2 id='mem-h'>Memory by phase</h2>"
    if not rows:
        return head + "<p>No memory figures in the logs or the agents' records.</p>" + "".join(
            f"<p class='muted'>missing: {e(m)}</p>" for m in mem.get("missing", [])) + "</section>"
    table = ("<table class='grid'><thead><tr>" + "".join(f"<th scope='col'>{e(h)}</th>" for h in MEMORY_HEADER)
             + "</tr></thead><tbody>" + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
             + "</tbody></table>")
    notes = "".join(f"<li>{e(n)}</li>" for n in mem.get("notes", []))
    return (head + "<div class='mem-controls'><label for='mem-rank'>Memory of rank</label> <select id='mem-rank'></select></div>"
            "<div id='mem-chart' class='mem-chart'></div>" + table
            + (f"<p class='muted'>{more} more rows in the JSON report (memory).</p>" if more else "")
            + (f"<ul class='notes'>{notes}</ul>" if notes else "")
            + "".join(f"<p class='muted'>missing: {e(m)}</p>" for m in mem.get("missing", [])) + "</section>")


def _rest(rep: dict) -> str:
    out = []
    others = rep.get("distinct_failures", [])[1:]
    if others:
        out.append("<section aria-labelledby='df-h'><h2 id='df-h'>Other distinct failures</h2><ul>" + "".join(
            f"<li><code>{e(d['signature'])}</code> ({e(d['category'])}) ranks {e(d['ranks'])} at {e(d.get('first_at'))}</li>"
            for d in others) + "</ul></section>")
    ck = rep.get("checkpoint") or {}
    verdict = ck.get("verdict", "unknown")
    tags = "".join(f"<li><code>{e(t['tag'])}</code>: {e(t.get('verdict'))}" + "".join(
        f"<br><span class='muted'>{e(p)}</span>" for p in t.get("problems", [])) + "</li>" for t in ck.get("tags", []))
    out.append(f"<section id='checkpoint' aria-labelledby='ck-h'><h2 id='ck-h'>Checkpoint</h2><p class='verdict v-{e(verdict)}'>"
               f"<strong>{e(verdict)}</strong>" + (f", resume from <code>{e(ck['resume_from'])}</code>" if ck.get("resume_from")
                                                   else "") + f"</p><p>{e(ck.get('reason'))}</p><ul>{tags}</ul></section>")
    node_ctx = node_context_lines(rep, limit=20)
    if node_ctx:
        out.append("<section id='node-context' aria-labelledby='nctx-h'><h2 id='nctx-h'>Node context</h2>"
                   f"<p class='muted'>{e(node_ctx[0])}</p><pre class='raw'>{e(chr(10).join(node_ctx[1]))}</pre></section>")
    if rep.get("nodes"):
        out.append("<section aria-labelledby='nodes-h'><h2 id='nodes-h'>Nodes</h2><ul>" + "".join(
            f"<li>{e(n['node'])}: ranks {e(', '.join(map(str, n.get('ranks') or [])) or 'none')}"
            + (f" <span class='muted'>({e(n['note'])})</span>" if n.get("note") else "") + "</li>"
            for n in rep["nodes"]) + "</ul></section>")
    ctx = rep.get("context") or {}
    rows = [(k, e(v)) for k, v in (ctx.get("versions") or {}).items()]
    rows += [(k, e(ctx.get(k))) for k in ("launcher", "launch_command", "world_size", "zero_stage", "offload_optimizer",
                                           "offload_param", "precision", "gradient_accumulation_steps",
                                           "train_micro_batch_size_per_gpu")]
    missing = list(ctx.get("missing") or [])
    out.append("<section id='context' aria-labelledby='ctx-h'><h2 id='ctx-h'>Context</h2>" + _kv(rows)
               + ("<h3>Still missing for a bug report</h3><ul>" + "".join(f"<li>{e(m)}</li>" for m in missing) + "</ul>"
                  if missing else "") + "</section>")
    if rep.get("partial"):
        out.append("<section id='gaps' aria-labelledby='gaps-h'><h2 id='gaps-h'>Partial analysis</h2><ul>" + "".join(
            f"<li>{e(g.get('file') or g.get('node') or ('rank ' + str(g.get('rank'))))}: {e(g.get('reason'))}</li>"
            for g in rep.get("gaps", [])) + "</ul></section>")
    return "".join(out)


def render_html(report: dict, *, live: bool = False, status: str | None = None) -> str:
    """The whole page. ``live``: served by the collector, the page polls itself while ``status``
    is ``running``."""
    rep = _display(report)
    job = f" — job {rep['job']}" if rep.get("job") else ""
    title = f"firstfault report{job}"
    body_attrs = f" data-live='{'1' if live else '0'}' data-status='{e(status or '')}'"
    policy = e(csp("'self'" if live else "'none'"))
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{policy}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'><meta name='referrer' content='no-referrer'>"
        f"<title>{e(title)}</title><style>{CSS}</style></head>"
        f"<body{body_attrs}><a class='skip' href='#first'>Skip to the first failure</a><div id='ff-main'>"
        f"<header><h1>{e(title)}</h1><p class='muted'>generated {e(rep.get('generated_at') or '')}"
        + (" · <strong>partial</strong>: some inputs are missing (see the end)" if rep.get("partial") else "")
        + (f" · job status: {e(status)}" if status else "") + "</p></header><main>"
        + _first(rep) + _timeline_shell(rep) + _key_events(rep) + _ranks(rep) + _memory(rep) + _rest(rep)
        + "</main><script type='application/json' id='ff-data'>" + _json_for_script(rep) + "</script></div>"
        f"<script>{JS}</script></body></html>\n")
