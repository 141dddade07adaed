"""The report as plain text for a terminal: the root cause first, then per-rank firsts and the checkpoint.

Every value from the report goes through firstfault/reports/escape.py ``terminal`` (``_t``):
log text cannot move the cursor, retitle the terminal, reorder or forge a line.
"""

from __future__ import annotations

from firstfault.reports.escape import terminal as _t
from firstfault.reports.escape import terminal_lines
from firstfault.reports.memtable import HEADER, memory_rows


def clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: cut at the last space before the limit (unless
    that loses more than a third of it) and marked with an ellipsis, never mid-word unmarked."""
    if len(text) <= width:
        return text
    cut = text[:width - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > width * 2 // 3 else cut).rstrip() + "…"


def ranks_text(ranks) -> str:
    """``rank 2`` or ``ranks 1, 2, 5`` (a list of ranks said as one, never a bare number that reads as a count)."""
    ranks = list(ranks or [])
    return "none" if not ranks else f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def alike_text(ranks) -> str:
    """The first failure's ``ranks_sharing``: ``rank 1 only`` or ``ranks 1, 3``."""
    return ranks_text(ranks) + (" only" if len(ranks or []) == 1 else "")


def _rank_line(r: str, info: dict) -> str:
    fe = info.get("first_error")
    ex = info.get("exit")
    where = f" ({_t(info['node'])})" if info.get("node") else ""
    tail = ""
    if ex:
        tail = f"  exit {_t(ex.get('code'))}" + (f" {_t(ex['signal'])}" if ex.get("signal") else "")
    if fe is None:
        return f"  rank {_t(r)}{where}: no error seen{tail}"
    first_line = terminal_lines((fe.get("text") or "").strip())
    text = first_line[-1] if first_line else ""
    return (f"  rank {_t(r)}{where}: [{_t(fe['role'])}] {_t(fe['signature'])} at "
            f"{_t(fe.get('at') or '?')}{tail}\n      {clip(text, 160)}")


def nodes_line(nodes: list[dict]) -> str:
    """``gpu-01 (ranks 0, 1), gpu-02 (sent nothing)``: the notes themselves are listed as gaps."""
    def one(n: dict) -> str:
        what = f"ranks {', '.join(map(str, n['ranks']))}" if n.get("ranks") else "sent nothing" if n.get("note") else ""
        return _t(n["node"]) + (f" ({_t(what)})" if what else "")
    return ", ".join(map(one, nodes))


def _memory(rep: dict) -> list[str]:
    rows, more = memory_rows(rep)
    mem = rep.get("memory") or {}
    if not rows:
        return []
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    out = ["", "Memory by phase:"]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [HEADER, *rows]]
    if more:
        out.append(f"  ... {more} more (--format json: memory)")
    out += [f"  - {n}" for n in mem.get("notes", [])[:6]]
    return out


def frame_line(ff: dict) -> str | None:
    """``train.py line 12, in backward (raised in .../torch/_tensor.py line 626, in backward)``, raw text
    (each format escapes it); without frames why there are none (``failing_frame_note``), else None."""
    fr = ff.get("failing_frame")
    if not fr:
        note = ff.get("failing_frame_note")
        return f"no Python frame: {note}" if note else None
    where = f"{fr['file']} line {fr['line']}, in {fr['function']}"
    if not fr.get("in_user_code"):
        return f"{where} (no frame in your own code)"
    ra = fr.get("raising") or {}
    if (ra.get("file"), ra.get("line")) == (fr["file"], fr["line"]):
        return where
    return f"{where} (raised in {ra.get('file')} line {ra.get('line')}, in {ra.get('function')})"


def node_context_lines(rep: dict, limit: int = 5) -> tuple[str, list[str]] | None:
    """A heading and up to ``limit`` raw lines of the report's node context (collector reports)."""
    ctx = rep.get("node_context") or {}
    if not ctx.get("count"):
        return None
    head = (f"Node context, not the job's ({ctx['count']} kernel or cgroup records of its nodes in its lifetime "
            f"name none of its processes):")
    lines = []
    for ev in (ctx.get("events") or [])[:limit]:
        text = (ev.get("text") or "").strip().splitlines()
        lines.append(f"{ev.get('at')} {ev.get('node')}: {text[0][:200] if text else ''}")
    return head, lines


def render_text(rep: dict) -> str:
    out: list[str] = []
    ff = rep.get("first_failure")
    job = f" of job {_t(rep['job'])}" if rep.get("job") else ""
    if ff is None:
        out.append(f"No failure found{job} in the given logs.")
    else:
        rank = "unknown rank" if ff.get("rank") is None else f"rank {_t(ff['rank'])}"
        node = f" on {_t(ff['node'])}" if ff.get("node") else ""
        out.append(f"FIRST FAILURE{job}: {rank}{node}" + (" (inferred)" if ff.get("inferred") else ""))
        out.append(f"  {_t(ff['summary'])}")
        out.append(f"  signature   {_t(ff['signature'])}")
        out.append(f"  category    {_t(ff['category'])}    blame: {_t(rep['blame'])}    phase: {_t(ff['phase'])}")
        when = _t(ff.get("occurred_at") or "unknown")
        unc = f" ±{_t(ff['uncertainty_ms'])} ms" if ff.get("uncertainty_ms") else ""
        out.append(f"  occurred    {when}{unc} (clock: {_t(ff.get('clock') or 'none')})" if ff.get("occurred_at")
                   else f"  occurred    unknown: {_t(ff.get('time_note') or 'no timestamp')}")
        tie = ""
        if ff.get("within_clock_uncertainty"):
            with_ = _t(", ".join(map(str, ff.get("tied_with") or [])))
            tie = f"; tied within clock uncertainty with {'rank(s) ' + with_ if with_ else 'another failure'}"
        out.append(f"  confidence  {_t(ff['confidence'])}{tie}")
        if frame_line(ff):
            out.append(f"  failing at  {_t(frame_line(ff))}")
        if len(ff.get("ranks_sharing") or []) > 1:
            out.append(f"  shared by   {_t(ranks_text(ff['ranks_sharing']))}")
        for how in ff.get("inferred_from") or []:
            out.append(f"  inferred    {_t(how)}")
        out.append(f"  do first    {_t(ff['first_action'])}")
        for e in ff.get("evidence", [])[:3]:
            text = terminal_lines((e.get("text") or "").strip())
            out.append(f"  evidence    {_t(e.get('origin') or e.get('source'))}: {clip(text[-1], 200) if text else ''}")
            if e.get("linked_by"):
                out.append(f"              linked: {_t(e['linked_by'])}")
    others = rep.get("distinct_failures", [])[1:]
    if others:
        out.append("")
        out.append("Other distinct failures, earliest first:")
        for d in others:
            out.append(f"  {_t(d['signature'])} ({_t(d['category'])}) ranks {_t(d['ranks'])} at {_t(d.get('first_at'))}")
    if rep.get("ranks"):
        out.append("")
        out.append("First error of every rank:")
        for r, info in rep["ranks"].items():
            out.append(_rank_line(r, info))
    if rep.get("nodes"):
        out.append("")
        out.append(f"Nodes ({len(rep['nodes'])}): {nodes_line(rep['nodes'])}")
    out += _memory(rep)
    node_ctx = node_context_lines(rep)
    if node_ctx:
        out += ["", _t(node_ctx[0])] + [f"  {_t(x)}" for x in node_ctx[1]]
    ck = rep.get("checkpoint") or {}
    out.append("")
    resume = f"; resume from {_t(ck['resume_from'])}" if ck.get("resume_from") else ""
    out.append(f"Checkpoint: {_t(ck.get('verdict', 'unknown'))}{resume}")
    if ck.get("reason"):
        out.append(f"  {_t(ck['reason'])}")
    ctx = rep.get("context") or {}
    vers = ", ".join(f"{_t(k)} {_t(v)}" for k, v in (ctx.get("versions") or {}).items() if v)
    out.append("")
    out.append(f"Context: launcher {_t(ctx.get('launcher') or '?')}, world size {_t(ctx.get('world_size') or '?')}, "
               f"ZeRO stage {_t(ctx.get('zero_stage') if ctx.get('zero_stage') is not None else '?')}"
               + (f", {vers}" if vers else ""))
    if rep.get("partial"):
        out.append("")
        out.append("Partial analysis, inputs missing or unreadable:")
        for g in rep.get("gaps", []):
            what = g.get("file") or (f"rank {g['rank']}" if "rank" in g else g.get("node") or "?")
            out.append(f"  {_t(what)}: {_t(g.get('reason'))}")
    return "\n".join(out) + "\n"
