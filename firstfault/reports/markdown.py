"""The report as GitHub-flavoured Markdown, to paste into an issue.

Every value from the report is inert Markdown (firstfault/reports/escape.py): text through
``md_text`` (``_cell``), names in code spans through ``md_code``, log text in fenced blocks
through ``md_block``; nothing of a log can open a tag, a link, a heading or a table cell.
"""

from __future__ import annotations

from firstfault.reports.escape import md_block as _fence
from firstfault.reports.escape import md_code as _code
from firstfault.reports.escape import md_text
from firstfault.reports.memtable import HEADER, memory_rows
from firstfault.reports.text import alike_text, frame_line, node_context_lines, nodes_line


def _cell(v) -> str:
    """``v`` as Markdown text (inline, table-safe), at most 200 characters of it."""
    return md_text("" if v is None else str(v)[:200])


def render_markdown(rep: dict) -> str:
    out: list[str] = []
    ff = rep.get("first_failure")
    job = f" — job {_cell(rep['job'])}" if rep.get("job") else ""
    out.append(f"## firstfault report{job}")
    out.append("")
    if ff is None:
        out.append("**No failure found** in the given logs.")
    else:
        rank = "unknown rank" if ff.get("rank") is None else f"rank {_cell(ff['rank'])}"
        node = f" on {_code(ff['node'])}" if ff.get("node") else ""
        inferred = " *(inferred)*" if ff.get("inferred") else ""
        out.append(f"**First failure: {rank}{node}**{inferred} — {md_text(ff['summary'])}")
        out.append("")
        out.append("| | |")
        out.append("|---|---|")
        for k, v in (("signature", _code(ff["signature"])), ("category", ff["category"]), ("blame", rep["blame"]),
                     ("phase", ff["phase"]), ("occurred", ff.get("occurred_at") or f"unknown: {ff.get('time_note') or 'no timestamp'}"),
                     ("clock", ff.get("clock")),
                     ("confidence", ff["confidence"]),
                     ("within clock uncertainty", "yes" if ff.get("within_clock_uncertainty") else "no"),
                     ("failed alike", alike_text(ff.get("ranks_sharing"))),
                     ("failing at", frame_line(ff))):
            if k == "failing at" and v is None:
                continue
            out.append(f"| {k} | {v if k == 'signature' else _cell(v)} |")
        out.append("")
        out.append(f"**Do first:** {md_text(ff['first_action'])}")
        for how in ff.get("inferred_from") or []:
            out.append(f"- inferred: {md_text(how)}")
        ev = ff.get("evidence") or []
        if ev:
            out.append("")
            out.append("<details><summary>Evidence</summary>")
            out.append("")
            for e in ev:
                out.append(f"{_code(e.get('origin') or e.get('source'))} at {_cell(e.get('at'))}")
                out.append("")
                out.append(_fence(e.get("text") or ""))
            out.append("")
            out.append("</details>")
    ranks = rep.get("ranks") or {}
    if ranks:
        out.append("")
        out.append("### First error of every rank")
        out.append("")
        out.append("| rank | node | role | signature | at | exit | last step |")
        out.append("|---|---|---|---|---|---|---|")
        for r, info in ranks.items():
            fe = info.get("first_error") or {}
            ex = info.get("exit") or {}
            lp = info.get("last_progress") or {}
            exit_s = "" if not ex else f"{ex.get('code')} {ex.get('signal') or ''}".strip()
            out.append(f"| {_cell(r)} | {_cell(info.get('node'))} | {_cell(fe.get('role'))} | {_cell(fe.get('signature'))} "
                       f"| {_cell(fe.get('at'))} | {_cell(exit_s)} | {_cell(lp.get('step'))} |")
    if rep.get("nodes"):
        out.append("")
        out.append(f"**Nodes ({len(rep['nodes'])}):** {_cell(nodes_line(rep['nodes']))}")
    rows, more = memory_rows(rep)
    if rows:
        out += ["", "### Memory by phase", "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
        if more:
            out.append(f"\n{more} more in the JSON report (`memory`).")
        out += [f"- {_cell(n)}" for n in (rep.get("memory") or {}).get("notes", [])[:6]]
    node_ctx = node_context_lines(rep)
    if node_ctx:
        out += ["", f"<details><summary>{md_text(node_ctx[0])}</summary>", "",
                _fence("\n".join(node_ctx[1])), "", "</details>"]
    ck = rep.get("checkpoint") or {}
    out.append("")
    out.append("### Checkpoint")
    out.append("")
    out.append(f"**{_cell(ck.get('verdict', 'unknown'))}**"
               + (f", resume from {_code(ck['resume_from'])}" if ck.get("resume_from") else "")
               + (f" — {md_text(ck['reason'])}" if ck.get("reason") else ""))
    ctx = rep.get("context") or {}
    out.append("")
    out.append("### Context")
    out.append("")
    out.append("| | |")
    out.append("|---|---|")
    for k, v in (ctx.get("versions") or {}).items():
        out.append(f"| {_cell(k)} | {_cell(v)} |")
    for k in ("launcher", "launch_command", "world_size", "zero_stage", "offload_optimizer", "offload_param",
              "precision", "gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
        out.append(f"| {k} | {_cell(ctx.get(k))} |")
    if ctx.get("missing"):
        out.append("")
        out.append("Still missing for a bug report: " + "; ".join(map(md_text, ctx["missing"])))
    if rep.get("partial"):
        out.append("")
        out.append("> Partial analysis: " + "; ".join(
            md_text(f"{g.get('file') or g.get('node') or ('rank ' + str(g.get('rank')))}: {g.get('reason')}")
            for g in rep.get("gaps", [])))
    return "\n".join(out) + "\n"
