"""A comparison (``firstfault.compare/1``) as one self-contained HTML page: no script, no
outside resource, every piece of text escaped (log text is untrusted)."""

from __future__ import annotations

from html import escape

from firstfault.analysis.compare import show
from firstfault.reports.compare_text import HEADLINE, MATCH, boundary_line, grouped_fields, outcome_line, source_line

STYLE = """body{font:15px/1.45 system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#1b1b1b}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}table{border-collapse:collapse;width:100%}
td,th{border:1px solid #ccc;padding:.3em .5em;text-align:left;vertical-align:top}
.fixed{color:#0a6b2d}.not-fixed{color:#a4161a}.inconclusive{color:#8a5a00}.changed{background:#fff3cd}
code,pre{font:13px ui-monospace,monospace;white-space:pre-wrap;word-break:break-all}"""


def _e(v) -> str:
    return escape("" if v is None else str(v), quote=True)


def _row(*cells, cls: str = "") -> str:
    attr = f' class="{_e(cls)}"' if cls else ""
    return f"<tr{attr}>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>"


def render_compare_html(c: dict) -> str:
    v = c["verdict"]
    out = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>firstfault compare: {_e(v)}</title><style>{STYLE}</style></head><body>",
           f'<h1 class="{_e(v)}">{_e(HEADLINE[v])}</h1>', "<ul>"]
    out += [f"<li>{_e(r['text'])}</li>" for r in c["reasons"]]
    out += [f"<li><em>note:</em> {_e(n['text'])}</li>" for n in c["notes"]]
    out += ["</ul>", "<table><tr><th></th><th>source</th><th>outcome</th></tr>"]
    out += [_row(name.upper(), source_line(c[name]), outcome_line(c[name])) for name in ("before", "after")]
    out += ["</table>", "<h2>What changed</h2>", "<table><tr><th>field</th><th>BEFORE</th><th>AFTER</th><th></th></tr>"]
    g = grouped_fields(c["changes"])
    for status in ("changed", "one-side", "same", "unknown"):
        out += [_row(r["label"], show(r["before"], r["before_known"]), show(r["after"], r["after_known"]), status,
                     cls=status) for r in g[status]]
    out.append("</table>")
    init = c.get("initiating")
    if init:
        out += [f"<h2>BEFORE's initiating failure (<code>{_e(init['signature'])}</code>) on each rank of AFTER</h2>",
                f"<p>{_e(init.get('summary'))}</p>",
                "<table><tr><th>rank</th><th>BEFORE</th><th>AFTER</th><th>initiating failure</th></tr>"]
        for r, info in c["ranks"].items():
            after = info["after"] or ("not in AFTER" if not info["in_after"] else "no error")
            out.append(_row(r, info["before"] or "no error", after, MATCH[info["initiating_in_after"]]))
        out.append("</table>")
    out += ["<h2>Past the failure point</h2>", f"<p>{_e(boundary_line(c['boundary']))}</p>",
            f"<p><small>{_e(c.get('schema'))}, {_e(c.get('generated_at'))}</small></p>", "</body></html>"]
    return "\n".join(out) + "\n"
