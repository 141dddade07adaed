"""Build the report (REPORT.md, ``firstfault.report/1``) from Events. Pure.

The same function serves ``firstfault analyze`` (Events read from files) and
the collector's ``report`` (Events rebuilt from stored records): give it the
Events, the catalog, what is known about the inputs (ranks and nodes seen,
gaps) and optionally a checkpoint directory's inspection.

``build_report`` is the analysis as a row of stages (ARCHITECTURE.md draws it): place
(timeline.py) -> classify (findings.py) -> identify (identify.py) -> judge (judge.py) -> rank
state (rankstate.py) -> decide (verdict.py) -> assess (assess.py) -> phase (failure_phase.py)
-> report (``report`` here: the dict). Each stage's output is one frozen dataclass the next
reads; none changes what it was given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from firstfault.analysis.assess import Assessment, assess
from firstfault.analysis.catalog import Catalog
from firstfault.analysis.checkpoint import DiskCheckpoint
from firstfault.analysis.events import Event
from firstfault.analysis.failure_phase import failure_phase
from firstfault.analysis.findings import MAX_KEPT, Finding, Read, exit_of, fingerprint, read_findings
from firstfault.analysis.frames import failing_frame, no_frame_reason
from firstfault.analysis.hang import Inference, ranges
from firstfault.analysis.hostlist import HostlistError, expand_hostlist
from firstfault.analysis.identify import identify
from firstfault.analysis.judge import judge
from firstfault.analysis.lanes import LaneWatcher, timeline_report
from firstfault.analysis.lasterror import prefer_details
from firstfault.analysis.memory import MemoryWatcher
from firstfault.analysis.phase import ENCLOSING_PHASES
from firstfault.analysis.rankstate import RankActivity, RankState, rank_state
from firstfault.analysis.timeline import NodeClock, placed
from firstfault.analysis.timeout_cause import Cause, save_wait
from firstfault.analysis.verdict import BLAME, HANG_ID, MAX_EVIDENCE, Decision, confidence, decide

SCHEMA = "firstfault.report/1"
TEXT_MAX = 2000
UNTIMED = ("no timestamped line comes near it: when it happened is unknown (only the order of lines "
           "within each log is known)")


@dataclass(slots=True)
class Inputs:
    """What the reader knows besides the Events."""

    job: str | None = None
    rank_nodes: dict[int, str | None] = field(default_factory=dict)  # every rank a stream belonged to
    world_size: int | None = None
    launcher: str | None = None
    gaps: list[dict] = field(default_factory=list)
    clocks: Mapping[str, NodeClock] | None = None
    disk: DiskCheckpoint | None = None
    generated_ns: int | None = None
    marks: list[dict] = field(default_factory=list)  # job marks (records.mark_of) of this job
    nodes_seen: set[str] = field(default_factory=set)  # nodes that sent records of the job
    timeline: bool = False  # also build the ``timeline`` object (swimlanes of the HTML report)


def iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    dt = datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{(ns // 1_000_000) % 1000:03d}Z"


def _text(ev: Event) -> str:
    t = ev.fields.get("message") if ev.kind == "traceback" else None
    t = t or ev.text
    return t if len(t) <= TEXT_MAX else t[:TEXT_MAX] + " …"


def _evidence(f: Finding) -> dict:
    ev = f.ev
    out = {"node": ev.node, "rank": ev.rank, "source": ev.source, "at": iso(ev.occurred_ns),
           "origin": ev.origin, "text": _text(ev)}
    gpu = {k: ev.fields[k] for k in ("gpu", "uuid", "pci_bus_id") if ev.fields.get(k) is not None}
    if gpu:
        out["gpu"] = gpu
    if f.links:
        out["linked_by"] = "; ".join(f.links)
    return out


def watch(events: Iterable[Event], *watchers: Callable[[Event], None]) -> Iterator[Event]:
    """Every Event, after each watcher (the memory and timeline views) has seen it: views that
    want more than the findings keep watch the one pass over the Events."""
    for ev in events:
        for w in watchers:
            w(ev)
        yield ev


def build_report(events: Iterable[Event], catalog: Catalog, inputs: Inputs | None = None) -> dict:
    """The report of ``events``: the analysis' row of stages, each one typed output the next reads."""
    inp = inputs or Inputs()
    mem = MemoryWatcher(clocks=inp.clocks)  # the memory and timeline views watch the one pass
    lanes = LaneWatcher() if inp.timeline else None
    events = placed(events, inp.clocks)  # one clock, once
    read = read_findings(watch(events, *filter(None, (mem, lanes))), catalog)  # catalog -> findings
    found = prefer_details(read.findings)  # an NCCL wrapper or back trace gives way to its cause
    ident = identify(found, inp.rank_nodes, read.procs)  # ranks, nodes, pids
    findings = judge(ident.findings, read.procs, read.kernel_span, ident.nodes)  # deaths, signals
    state = rank_state(findings, ident, read.dumps)  # firsts, stack dumps, progress, exits, saves
    dec = decide(findings, state, read, ident.nodes, inp.world_size)  # first failure, cascades, hang
    # ZeRO-3 (its config, or a line only it prints): all-gathers gather parameters
    sharded = True if read.ctx.config.get("zero_stage") == 3 or read.ctx.sharded_by else None
    ass = assess(dec, state, mem, pids=ident.pids, rank_nodes=ident.nodes, disk=inp.disk)
    phase = failure_phase(dec, state, findings, ass.saving, sharded, ass.memory["phase_at_failure"],
                          ass.memory["phases_from"])
    out = report(inp, read, findings, ident.nodes, state, dec, ass, phase)
    if lanes is not None:
        out["timeline"] = timeline_report(lanes, findings, rank_nodes=ident.nodes,
                                          firsts=state.firsts, first=dec.first, procs=read.procs,
                                          checkpoint=ass.checkpoint, pids=ident.pids)
    return out


def report(inp: Inputs, read: Read, findings: list[Finding], rank_nodes: Mapping[int, str | None], state: RankState, dec: Decision,
           ass: Assessment, phase: tuple[str, str] | None) -> dict:
    """The report's dict (REPORT.md) from the stages' outputs."""
    activity, firsts = state.activity, state.firsts
    first = None
    blame = "unknown"
    if dec.first is not None:
        first = _first(dec.first, dec.groups[0].ranks, dec.tied, phase, rank_nodes)
        first["failing_frame"] = failing_frame(dec.first.ev.frames)  # the line that failed (analysis/frames.py)
        if first["failing_frame"] is None:
            first["failing_frame_note"] = no_frame_reason((exit_of(dec.first) or {}).get("signal"),
                                                          dec.first.has("oom-kill"))
    elif dec.inference is not None:
        timeouts = [f for f in findings if f.has("collective-timeout")]
        first = _inferred(dec.inference, dec.cascades, activity, phase, rank_nodes, dec.outside, dec.cause, timeouts)
        if dec.fr_decided:
            first["confidence"] = "medium"
        first["failing_frame"] = None  # none for an inferred hang
    elif dec.exited is not None:
        exited = dec.exited
        first = _first(exited, [exited.ev.rank] if exited.ev.rank is not None else [], [], phase, rank_nodes)
        first["failing_frame"] = None
        first["failing_frame_note"] = no_frame_reason((exit_of(exited) or {}).get("signal"), exited.has("oom-kill"))
    if first is not None:  # whose fault: that of the failure's category, however it was found
        blame = BLAME.get(first["category"], "unknown")
    ranks_out = {}
    for r in sorted(dec.known_ranks | set(firsts) | set(activity.exits)):
        fe = firsts.get(r)
        ranks_out[str(r)] = {
            "node": rank_nodes.get(r),
            "first_error": None if fe is None else {
                "signature": fe.sig, "category": fe.category, "role": fe.role,
                "at": iso(fe.ev.occurred_ns), "origin": fe.ev.origin, "text": _text(fe.ev),
                "fingerprint": fingerprint(fe)},
            "last_progress": None if r not in activity.progress else {
                "step": activity.steps.get(r), "at": iso(activity.progress[r].occurred_ns)},
            "exit": activity.exits.get(r),
        }
    gaps = [*inp.gaps, *dec.gaps]
    if read.dropped:
        gaps.append({"source": "analysis", "reason": (
            f"{read.dropped} findings beyond the first {MAX_KEPT} distinct ones were counted, not kept")})
    if dec.world:
        gaps += [{"rank": r, "reason": "no log of this rank was given"} for r in range(dec.world) if r not in rank_nodes]
    nodes = _nodes(rank_nodes, inp.nodes_seen | {f.ev.node for f in findings if f.ev.node}, inp.marks, gaps)
    return {
        "schema": SCHEMA,
        "job": inp.job,
        "generated_at": iso(inp.generated_ns),
        "partial": bool(gaps),
        "gaps": gaps,
        "first_failure": first,
        "blame": blame,
        "distinct_failures": [
            {"signature": g.findings[0].sig, "category": g.findings[0].category, "ranks": sorted(g.ranks),
             "first_at": iso(g.findings[0].ev.occurred_ns), "count": g.count,
             "text": _text(g.findings[0].ev), "fingerprint": g.key}
            for g in dec.groups
        ],
        "ranks": ranks_out,
        "nodes": nodes,
        "context": read.ctx.to_report(world_size=dec.world, launcher=inp.launcher),
        "checkpoint": ass.checkpoint,
        "memory": ass.memory,
        **({"flight_recorder": dec.flight.to_report()} if dec.flight else {}),  # only where dumps were given
    }


def _nodes(rank_nodes: Mapping[int, str | None], seen: set[str], marks: list[dict], gaps: list[dict]) -> list[dict]:
    """Every node of the job: those that sent its records, and those only its marks name (a
    node's agent marked the job start, or the scheduler's node list names it), noted and
    listed as gaps, since a node that ran the job but sent nothing is evidence too."""
    ranks: dict[str, list[int]] = {}
    for r, n in rank_nodes.items():
        if n:
            ranks.setdefault(n, []).append(r)
    sent = seen | set(ranks)
    marked: dict[str, set[str]] = {}
    listed: dict[str, str] = {}  # node -> the node whose mark lists it
    for m in marks:
        marked.setdefault(m["node"], set()).add(m["event"])
        try:
            for n in expand_hostlist(m["nodes"] or ""):
                listed.setdefault(n, m["node"])
        except HostlistError as e:
            gaps.append({"node": m["node"], "source": "marks", "reason": f"node list of its job mark unreadable: {e}"})
    out = []
    for n in sorted(sent | set(marked) | set(listed)):
        note = None
        if n not in sent and n in marked:
            note = f"its agent marked the job ({', '.join(sorted(marked[n]))}) but sent no records of the job"
        elif n not in sent:
            note = f"in the job's node list (mark from {listed[n]}) but its agent sent no records of the job"
        out.append({"node": n, "ranks": sorted(ranks.get(n, [])), "marked": sorted(marked.get(n, ())), "note": note})
        if note:
            gaps.append({"node": n, "reason": note})
    return out



def _headless_step(conf: str, ev: Event, phase: tuple[str, str]) -> str:
    """At most medium for a traceback pasted without its head, unless the frames that are there name a save, a
    load or set-up (phases.toml, [[enclosing]]): an outer frame that is cut off (save_checkpoint,
    from_pretrained) would hold any other phase, and a heading's words are a person's."""
    if conf == "high" and ev.fields.get("fragment") and not (phase[1] == "frames" and phase[0] in ENCLOSING_PHASES):
        return "medium"
    return conf


def _first(f: Finding, ranks: list[int], tied: list[Finding], phase: tuple[str, str], rank_nodes) -> dict:
    ev = f.ev
    summary = f.match.summary
    if ev.rank is not None and f"rank {ev.rank}" not in summary.lower():
        where = f" on {ev.node}" if ev.node else ""
        summary = f"Rank {ev.rank}{where}: {summary}"
    return {
        "rank": ev.rank,
        "node": ev.node or rank_nodes.get(ev.rank),
        "pid": ev.pid,
        "occurred_at": iso(ev.occurred_ns),
        "observed_at": iso(ev.observed_ns),
        "clock": ev.clock,
        "uncertainty_ms": ev.uncertainty_ns // 1_000_000,
        "signature": f.sig,
        "fingerprint": fingerprint(f),
        "category": f.category,
        "phase": phase[0],
        "phase_from": phase[1],
        "summary": summary,
        "first_action": f.match.first_action,
        "reference": f.match.signature.reference,
        "evidence": [_evidence(f)],
        "rank_from": ev.fields.get("rank_from") or ("agent process identity" if ev.rank is not None else None),
        "ranks_sharing": sorted(ranks) if ranks else ([ev.rank] if ev.rank is not None else []),
        "confidence": _headless_step(confidence(f, bool(tied)), ev, phase),
        "within_clock_uncertainty": bool(tied),
        "tied_with": sorted({h.ev.rank for h in tied if h.ev.rank is not None}),
        "inferred": False,
        "time_note": None if ev.occurred_ns is not None else UNTIMED,
    }


def _save_outlasted(summary: str, timeouts: Sequence[Finding]) -> tuple[str, str, str]:
    """(category, summary, first action) of a hang while the job was saving a checkpoint, by the collective the
    ranks timed out in (``timeouts``: timeout_cause.save_wait): waiting for the save to be written (storage) or
    inside its own gather, which a rank did not enter (user-code); inferred, with what would settle it."""
    _, category, what, action = save_wait(timeouts)
    return category, f"{summary} The job was saving a checkpoint: {what}", action


def _inferred(inf: Inference, casc: list[Finding], activity: RankActivity, phase: tuple[str, str], rank_nodes,
              outside: list[Finding], cause: Cause | None = None, timeouts: Sequence[Finding] = ()) -> dict:
    rank = inf.rank
    last = activity.progress.get(rank) if rank is not None else None
    where = "" if last is None else f" after step {activity.steps.get(rank)}" if activity.steps.get(rank) is not None else ""
    if outside:
        sig = outside[0].match.groups.get("death_signal") or "a signal"
        killed = f"The job was stopped from outside (its launcher received {sig}: a cancel, a time limit, an operator)"
        summary = (f"{killed}; no rank had failed. Rank {rank} was where the job stood still: "
                   f"the others waited for it (inferred)." if rank is not None else
                   f"{killed}; no rank had failed and no rank stands out"
                   + (f" (suspects: rank(s) {ranges(inf.suspects)})." if inf.suspects else "."))
    elif rank is None:
        summary = ("The job hung: every rank that reported an error was waiting for a peer, and no one rank stands "
                   "out" + (f"; the suspects are rank(s) {ranges(inf.suspects)}." if inf.suspects else "."))
    else:
        summary = (f"Rank {rank} stopped first{where} and the other ranks timed out waiting for it "
                   "(inferred: no rank reported a failure of its own).")
    # no rank singled out: all the log shows are consequences (timeouts, closed peers); a rank that
    # stopped first is the failure, of a kind nothing said
    category = "cascade" if rank is None else "unknown"
    action = ("Dump the stacks of every rank while it hangs (py-spy dump --pid, or "
              "TORCH_DISTRIBUTED_DEBUG=DETAIL and faulthandler) and look at what "
              + (f"rank {rank}" if rank is not None else f"rank(s) {ranges(inf.suspects)}" if inf.suspects
                 else "the rank that stopped")
              + (" were" if rank is None and len(inf.suspects) > 1 else " was") + " doing instead of the collective.")
    conf, reference, evidence = inf.confidence, None, [_evidence(c) for c in casc[:MAX_EVIDENCE]]
    # the log says what the waited-for rank was doing (timeout_cause.py); a save under way found otherwise
    # (DeepSpeed's timed marks) names the phase over a cause of another phase
    if cause is not None and (phase[0] != "checkpoint-save" or cause.phase == "checkpoint-save"):
        category, summary, action = cause.category, f"{summary} {cause.summary}", cause.action
        conf, reference = cause.confidence, cause.evidence.match.signature.reference
        evidence = [_evidence(cause.evidence), *evidence[:MAX_EVIDENCE - 1]]
    elif phase[0] == "checkpoint-save" and not outside:
        category, summary, action = _save_outlasted(summary, timeouts)
    return {
        "rank": rank,
        "node": rank_nodes.get(rank) if rank is not None else None,
        "pid": None,
        "occurred_at": iso(last.occurred_ns) if last else None,
        "observed_at": iso(casc[0].ev.occurred_ns) if casc else None,
        "clock": last.clock if last else None,
        "uncertainty_ms": None,
        "signature": HANG_ID,
        "fingerprint": None,
        "category": category,
        "phase": phase[0],
        "phase_from": phase[1],
        "summary": summary,
        "first_action": action,
        "reference": reference,
        "evidence": evidence,
        "ranks_sharing": [rank] if rank is not None else [],
        "suspects": inf.suspects,
        "confidence": conf,
        "within_clock_uncertainty": False,
        "tied_with": [],
        "inferred": True,
        "inferred_from": inf.how,
        "killed_from_outside": bool(outside),
        "time_note": None if last else UNTIMED,
    }
