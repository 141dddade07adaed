"""A comparison (``firstfault.compare/1``) as terminal text and as Markdown, and the lines both share with HTML.

Text from logs is untrusted: the terminal gets no control characters, Markdown escaped
cells and fences.
"""

from __future__ import annotations

from firstfault.analysis.compare import one_side, show
from firstfault.reports.markdown import _cell as _md_cell
from firstfault.reports.markdown import _fence

HEADLINE = {
    "fixed": "FIXED: BEFORE's first failure is gone on every rank and AFTER got past it.",
    "not-fixed": "NOT FIXED: BEFORE's first failure came back in AFTER.",
    "inconclusive": "INCONCLUSIVE: this retry can not tell whether the fix worked.",
}
MATCH = {"same-fingerprint": "came back (same message)", "same-signature": "came back (same signature)", None: "not seen"}


def _cell(v) -> str:
    """A Markdown table cell: pipes and newlines escaped, and no raw HTML."""
    return _md_cell(v).replace("<", "&lt;").replace(">", "&gt;")


def _plain(s) -> str:
    """No terminal control characters from untrusted text."""
    return "".join(c if c.isprintable() else "?" for c in str(s))


def source_line(side: dict) -> str:
    src = side.get("source") or {}
    if "job" in src:
        return f"job {src['job']}"
    what = "logs " + ", ".join(src.get("logs") or [])
    return what + (f" (checkpoints {src['checkpoint_dir']})" if src.get("checkpoint_dir") else "")


def outcome_line(side: dict) -> str:
    ff = side.get("first_failure")
    if ff is None:
        failed = "no failure"
    else:
        rank = "rank ?" if ff.get("rank") is None else f"rank {ff['rank']}"
        failed = f"failed: {rank}, {ff.get('signature')} ({ff.get('category')}, {ff.get('phase')})"
    step = side.get("last_step")
    ck = side.get("checkpoint") or {}
    resume = f", resume from {ck['resume_from']}" if ck.get("resume_from") else ""
    return (f"{failed}; last complete step {'unknown' if step is None else step}; "
            f"checkpoint {ck.get('verdict') or 'unknown'}{resume}")


def boundary_line(bd: dict) -> str:
    if bd.get("before_last_step") is None:
        return "The step where BEFORE failed is unknown."

    def yes(v) -> str:
        return "yes" if v else "no"
    return (f"BEFORE failed after step {bd['before_last_step']} (in step {bd['failing_step']}). AFTER: last complete "
            f"step {'unknown' if bd['after_last_step'] is None else bd['after_last_step']}; passed step "
            f"{bd['failing_step']}: {yes(bd['passed_failing_step'])}; an optimizer step after it: "
            f"{yes(bd['optimizer_step_after'])}; a complete save after it: {bd['checkpoint_after'] or 'no'}.")


def grouped_fields(ch: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"changed": [], "same": [], "one-side": [], "unknown": []}
    for r in ch["fields"]:
        out[r["status"]].append(r)
    return out


def render_text(c: dict) -> str:
    out = [HEADLINE[c["verdict"]]]
    out += [f"  - {_plain(r['text'])}" for r in c["reasons"]]
    out += [f"  note: {_plain(n['text'])}" for n in c["notes"]]
    out.append("")
    for name in ("before", "after"):
        side = c[name]
        out.append(f"{name.upper():<7} {_plain(source_line(side))}")
        out.append(f"        {_plain(outcome_line(side))}")
        if side.get("first_failure"):
            out.append(f"        {_plain(side['first_failure'].get('summary') or '')[:300]}")
    g = grouped_fields(c["changes"])
    out.append("")
    out.append(f"What changed ({len(g['changed'])}):" if g["changed"] else "What changed: nothing the logs show.")
    for r in g["changed"]:
        if "diff" in r:
            out.append(f"  {r['label']}:")
            out += [f"    - {_plain(t)}" for t in r["diff"]["removed"]] + [f"    + {_plain(t)}" for t in r["diff"]["added"]]
        else:
            out.append(f"  {r['label']:<30} {_plain(show(r['before']))} -> {_plain(show(r['after']))}")
    if g["same"]:
        out.append("Same in both: " + ", ".join(r["label"] for r in g["same"]))
    if g["one-side"]:
        out.append("Only one run shows: " + _plain(", ".join(map(one_side, g["one-side"]))))
    if g["unknown"]:
        out.append("Neither run shows: " + ", ".join(r["label"] for r in g["unknown"]))
    init = c.get("initiating")
    if init:
        out.append("")
        out.append(f"BEFORE's initiating failure ({_plain(init['signature'])}) on each rank of AFTER:")
        for r, v in c["ranks"].items():
            after = v["after"] or ("not in AFTER" if not v["in_after"] else "no error")
            out.append(f"  rank {r:<4} BEFORE {_plain(v['before'] or 'no error'):<32} AFTER {_plain(after):<32} "
                       f"{MATCH[v['initiating_in_after']]}")
        for m in c.get("came_back_unranked") or []:
            out.append(f"  no rank   {MATCH[m]}")
    out.append("")
    out.append(boundary_line(c["boundary"]))
    return "\n".join(out) + "\n"


def render_markdown(c: dict) -> str:
    out = [f"## firstfault compare: **{c['verdict']}**", "", _cell(HEADLINE[c["verdict"]]), ""]
    out += [f"- {_cell(r['text'])}" for r in c["reasons"]]
    out += [f"- *note:* {_cell(n['text'])}" for n in c["notes"]]
    out += ["", "| | source | outcome |", "|---|---|---|"]
    for name in ("before", "after"):
        out.append(f"| {name.upper()} | {_cell(source_line(c[name]))} | {_cell(outcome_line(c[name]))} |")
    g = grouped_fields(c["changes"])
    out += ["", "### What changed", "", "| field | BEFORE | AFTER | |", "|---|---|---|---|"]
    for status in ("changed", "one-side", "same", "unknown"):
        for r in g[status]:
            out.append(f"| {_cell(r['label'])} | {_cell(show(r['before'], r['before_known']))} "
                       f"| {_cell(show(r['after'], r['after_known']))} | {status} |")
    cmd = next((r for r in g["changed"] if "diff" in r), None)
    if cmd:
        lines = [f"- {t}" for t in cmd["diff"]["removed"]] + [f"+ {t}" for t in cmd["diff"]["added"]]
        out += ["", "Launch command:", "", _fence("\n".join(lines))]
    if c.get("initiating"):
        out += ["", f"### `{_cell(c['initiating']['signature'])}` on each rank", "",
                "| rank | BEFORE | AFTER | initiating failure |", "|---|---|---|---|"]
        for r, v in c["ranks"].items():
            after = v["after"] or ("not in AFTER" if not v["in_after"] else "no error")
            out.append(f"| {r} | {_cell(v['before'] or 'no error')} | {_cell(after)} | {MATCH[v['initiating_in_after']]} |")
    out += ["", "### Past the failure point", "", _cell(boundary_line(c["boundary"]))]
    return "\n".join(out) + "\n"
