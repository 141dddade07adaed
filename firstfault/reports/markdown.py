"""The report as GitHub-flavoured Markdown, to paste into an issue."""

from __future__ import annotations

from firstfault.reports.memtable import HEADER, memory_rows
from firstfault.reports.text import nodes_line


def _cell(v) -> str:
    s = "" if v is None else str(v)
    return s.replace("|", "\\|").replace("\n", " ")[:200]


def _fence(text: str) -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}\n{text}\n{ticks}"


def render_markdown(rep: dict) -> str:
    out: list[str] = []
    ff = rep.get("first_failure")
    job = f" — job {rep['job']}" if rep.get("job") else ""
    out.append(f"## firstfault report{job}")
    out.append("")
    if ff is None:
        out.append("**No failure found** in the given logs.")
    else:
        rank = "unknown rank" if ff.get("rank") is None else f"rank {ff['rank']}"
        node = f" on `{ff['node']}`" if ff.get("node") else ""
        inferred = " *(inferred)*" if ff.get("inferred") else ""
        out.append(f"**First failure: {rank}{node}**{inferred} — {ff['summary']}")
        out.append("")
        out.append("| | |")
        out.append("|---|---|")
        for k, v in (("signature", f"`{ff['signature']}`"), ("category", ff["category"]), ("blame", rep["blame"]),
                     ("phase", ff["phase"]), ("occurred", ff.get("occurred_at") or f"unknown: {ff.get('time_note') or 'no timestamp'}"),
                     ("clock", ff.get("clock")),
                     ("confidence", ff["confidence"]),
                     ("within clock uncertainty", "yes" if ff.get("within_clock_uncertainty") else "no"),
                     ("ranks sharing it", ", ".join(map(str, ff.get("ranks_sharing") or [])))):
            out.append(f"| {k} | {_cell(v)} |")
        out.append("")
        out.append(f"**Do first:** {ff['first_action']}")
        for how in ff.get("inferred_from") or []:
            out.append(f"- inferred: {how}")
        ev = ff.get("evidence") or []
        if ev:
            out.append("")
            out.append("<details><summary>Evidence</summary>")
            out.append("")
            for e in ev:
                out.append(f"`{_cell(e.get('origin') or e.get('source'))}` at {_cell(e.get('at'))}")
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
            out.append(f"| {r} | {_cell(info.get('node'))} | {_cell(fe.get('role'))} | {_cell(fe.get('signature'))} "
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
    ck = rep.get("checkpoint") or {}
    out.append("")
    out.append("### Checkpoint")
    out.append("")
    out.append(f"**{ck.get('verdict', 'unknown')}**" + (f", resume from `{ck['resume_from']}`" if ck.get("resume_from") else "")
               + (f" — {ck['reason']}" if ck.get("reason") else ""))
    ctx = rep.get("context") or {}
    out.append("")
    out.append("### Context")
    out.append("")
    out.append("| | |")
    out.append("|---|---|")
    for k, v in (ctx.get("versions") or {}).items():
        out.append(f"| {k} | {_cell(v)} |")
    for k in ("launcher", "launch_command", "world_size", "zero_stage", "offload_optimizer", "offload_param",
              "precision", "gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
        out.append(f"| {k} | {_cell(ctx.get(k))} |")
    if ctx.get("missing"):
        out.append("")
        out.append("Still missing for a bug report: " + "; ".join(ctx["missing"]))
    if rep.get("partial"):
        out.append("")
        out.append("> Partial analysis: " + "; ".join(
            f"{g.get('file') or g.get('node') or ('rank ' + str(g.get('rank')))}: {g.get('reason')}"
            for g in rep.get("gaps", [])))
    return "\n".join(out) + "\n"
