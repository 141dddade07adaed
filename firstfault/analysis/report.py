"""Build the report (REPORT.md, ``firstfault.report/1``) from Events. Pure.

The same function serves ``firstfault analyze`` (Events read from files) and
the collector's ``report`` (Events rebuilt from stored records): give it the
Events, the catalog, what is known about the inputs (ranks and nodes seen,
gaps) and optionally a checkpoint directory's inspection.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from firstfault.analysis import timeline
from firstfault.analysis.bands import MARKED_PHASES
from firstfault.analysis.catalog import Catalog
from firstfault.analysis.checkpoint import DiskCheckpoint, checkpoint_report
from firstfault.analysis.deaths import merged, signal_deaths
from firstfault.analysis.exits import agent_exits, best_exits
from firstfault.analysis.facts import Facts, collect, identify, nccl_work, rank_dumps, saving_since
from firstfault.analysis.findings import MAX_KEPT, read_findings
from firstfault.analysis.flight_recorder import FRAnalysis
from firstfault.analysis.flight_recorder import analyze as analyze_flight
from firstfault.analysis.frames import failing_frame
from firstfault.analysis.hang import Inference, ranges, stopped_first
from firstfault.analysis.hostlist import HostlistError, expand_hostlist
from firstfault.analysis.lanes import LaneWatcher, timeline_report
from firstfault.analysis.memory import MemoryWatcher, memory_report
from firstfault.analysis.model import Event, Frame
from firstfault.analysis.phase import phase_from_frames, phase_hint
from firstfault.analysis.seen import watch
from firstfault.analysis.timeline import NodeClock
from firstfault.analysis.verdict import (
    BLAME,
    HANG_ID,
    Finding,
    confidence,
    distinct_failures,
    exit_failure,
    fingerprint,
    judge_signals,
    phase_of,
    rank_firsts,
    with_mentioned_category,
)

SCHEMA = "firstfault.report/1"
TEXT_MAX = 2000
MAX_EVIDENCE = 5  # lines of evidence an inferred failure shows
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


def build_report(events: Iterable[Event], catalog: Catalog, inputs: Inputs | None = None) -> dict:
    inp = inputs or Inputs()
    mem = MemoryWatcher()
    lanes = LaneWatcher() if inp.timeline else None
    read = read_findings(watch(events, *filter(None, (mem, lanes))), catalog, inp.clocks)
    findings = read.findings
    rank_nodes = dict(inp.rank_nodes)
    pids, single = identify(findings, rank_nodes, read.procs)
    findings = merged(findings, signal_deaths(read.procs, findings))  # analysis/deaths.py
    facts = collect(findings, rank_nodes, pids, rank_dumps(read.dumps, pids, single))
    seen_exits = agent_exits(read.procs, pids)  # the agents' own exit records first (analysis/exits.py)
    facts.exits = best_exits(facts.exits, seen_exits)
    for r, (_, node) in seen_exits.items():
        rank_nodes.setdefault(r, node)
    judge_signals(findings, read.kernel_span, rank_nodes)
    progress = facts.progress

    errors = [f for f in findings if f.role in ("root", "cascade")]
    firsts = rank_firsts(errors)
    dumps = rank_dumps(read.dumps, pids, single, firsts)  # each rank's stack at the hang
    groups = distinct_failures(errors, firsts, read.counts)
    world = read.ctx.world_size or inp.world_size or max(
        (ev.fields["world_size"] for ev in read.procs if "world_size" in ev.fields), default=None) or read.ctx.seen_size
    known_ranks = set(rank_nodes) | (set(range(world)) if world else set())
    if not world and known_ranks:  # ranks exist up to the highest one seen (no more is known)
        known_ranks |= set(range(max(known_ranks) + 1))
    outside = [f for f in findings if f.has("stopped-from-outside")]  # the launcher was signalled from outside

    sharded = True if read.ctx.config.get("zero_stage") == 3 else None  # ZeRO-3: all-gathers gather parameters
    gaps = list(inp.gaps)
    fr = _flight(read.flight, world, gaps)
    first_f: Finding | None = None
    failure_ns = None
    casc: list[Finding] = []
    if groups:
        first_f = with_mentioned_category(_with_exit_rank(_with_rank(groups[0].findings), facts.exits), findings)
        failure_ns = first_f.ev.occurred_ns
    elif any(ff.role == "cascade" for ff in errors) or dumps:
        casc = (sorted(firsts.values(), key=lambda ff: ff.ev.occurred_ns or 0) or outside
                or [ff for ff in errors if ff.role == "cascade"][:MAX_EVIDENCE])  # cascades no rank said
        failure_ns = min((c.ev.occurred_ns for c in casc if c.ev.occurred_ns is not None), default=None)

    clean = {r for r, ex in facts.exits.items() if ex.get("code") == 0}
    ckpt = checkpoint_report(
        facts.marks, failure_at_ns=failure_ns, world_size=world, ranks_progress=facts.alive,
        clean_exit_ranks=clean, disk=inp.disk, ranks_in_save=facts.in_save,
        ranks_steps={r: max(facts.steps.get(r, 0), facts.reached.get(r, 0)) for r in {*facts.steps, *facts.reached}})
    saved = {t["tag"] for t in ckpt["tags"] if t["verdict"] == "safe"}
    saving = saving_since(facts.marks, facts.alive, saved)

    first = None
    blame = "unknown"
    if first_f is not None:
        # a tie is another distinct failure that can not be ordered after this one; the
        # same failure on other ranks at the same time is "ranks_sharing", not a tie
        tied = [h for g in groups[1:] for h in g.findings if timeline.overlap(first_f.ev, h.ev)]
        peers = [h for h in errors if h.role == "cascade" and h.ev.frames]
        first = _first(first_f, groups[0].ranks, tied,
                       phase_of(first_f, saving, peers, errors, _before(first_f, findings), sharded), rank_nodes)
        blame = BLAME.get(first_f.category, "unknown")
    elif casc or dumps or (fr and fr.culprits):
        inf, fr_decided = _with_flight_recorder(
            stopped_first(errors, known_ranks, progress, dumps, nccl_work(findings)), fr)
        first = _inferred(inf, casc, facts, saving, rank_nodes, dumps.get(inf.rank), outside, sharded)
        if fr_decided:
            first["confidence"] = "medium"
        if fr and inf.rank is not None and first["phase"] == "unknown":  # where its last collective was called
            ph = phase_from_frames([Frame(f.file, f.line, f.func) for f in reversed(fr.frames_of(inf.rank))])
            if ph:
                first["phase"], first["phase_from"] = ph, "Flight Recorder frames"
    elif (exited := exit_failure(findings)) is not None:  # nothing failed in words: a worker's exit is all
        first = _first(exited, [exited.ev.rank] if exited.ev.rank is not None else [], [],
                       phase_of(exited, saving, []), rank_nodes)

    ranks_out = {}
    for r in sorted(known_ranks | set(firsts) | set(facts.exits)):
        fe = firsts.get(r)
        ranks_out[str(r)] = {
            "node": rank_nodes.get(r),
            "first_error": None if fe is None else {
                "signature": fe.sig, "category": fe.category, "role": fe.role,
                "at": iso(fe.ev.occurred_ns), "origin": fe.ev.origin, "text": _text(fe.ev),
                "fingerprint": fingerprint(fe)},
            "last_progress": None if r not in progress else {
                "step": facts.steps.get(r), "at": iso(progress[r].occurred_ns)},
            "exit": facts.exits.get(r),
        }
    if first is not None:  # the line that failed (analysis/frames.py); none for an inferred hang
        first["failing_frame"] = failing_frame(first_f.ev.frames) if first_f is not None else None
    if read.dropped:
        gaps.append({"source": "analysis", "reason": (
            f"{read.dropped} findings beyond the first {MAX_KEPT} distinct ones were counted, not kept")})
    if world:
        gaps += [{"rank": r, "reason": "no log of this rank was given"} for r in range(world) if r not in rank_nodes]
    nodes = _nodes(rank_nodes, inp.nodes_seen | {f.ev.node for f in findings if f.ev.node}, inp.marks, gaps)
    memory = memory_report(mem, clocks=inp.clocks, pids=pids, rank_nodes=rank_nodes, failure=first,
                           failure_ns=first_f.ev.occurred_ns if first_f else failure_ns,
                           failure_unc_ns=first_f.ev.uncertainty_ns if first_f else 0,
                           local_is_global=len({n for n in rank_nodes.values() if n}) <= 1, saved=frozenset(saved))
    at = memory["phase_at_failure"]  # a phase DeepSpeed's own marks (memory_breakdown) open, around the failure
    if first is not None and first["phase"] == "unknown" and not first["inferred"] and at in MARKED_PHASES:
        first["phase"], first["phase_from"] = at, f"DeepSpeed's phase marks (memory_breakdown) in {memory['phases_from']}"
    out = {
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
            for g in groups
        ],
        "ranks": ranks_out,
        "nodes": nodes,
        "context": read.ctx.to_report(world_size=world, launcher=inp.launcher),
        "checkpoint": ckpt,
        "memory": memory,
        **({"flight_recorder": fr.to_report()} if fr else {}),  # only where dumps were given
    }
    if lanes is not None:
        out["timeline"] = timeline_report(lanes, findings, clocks=inp.clocks, rank_nodes=rank_nodes, firsts=firsts,
                                          first=first_f, procs=read.procs, checkpoint=ckpt, pids=pids)
    return out


def _with_rank(same: list[Finding]) -> Finding:
    """The first finding of a failure, or the same failure where a rank said it: a message with no
    rank (a title, a launcher's copy) that can not be ordered before the ranked one is that rank's."""
    first = same[0]
    if first.ev.rank is not None:
        return first
    ranked = next((h for h in same if h.ev.rank is not None), None)
    if ranked is None or (first.ev.occurred_ns is not None and not timeline.overlap(first.ev, ranked.ev)):
        return first
    return ranked


def _before(f: Finding, findings: list[Finding], most: int = 2000) -> list[str]:
    """The lines of ``f``'s stream that the findings kept before it, oldest first (at most ``most``):
    what was printed before the failure, for the phase hints of set-up lines."""
    lines = sorted((h.ev.seq, h.ev.text) for h in findings if h.ev.stream == f.ev.stream and h.ev.seq < f.ev.seq)
    return [t for _, t in lines[-most:]]


def _with_exit_rank(f: Finding, exits: Mapping[int, dict]) -> Finding:
    """A failure no line tied to a rank is the rank's whose exit the launcher reported as the
    only failure (not stopped by the launcher itself); confidence at most medium."""
    if f.ev.rank is not None or f.ev.source == "kernel":
        return f
    failed = [r for r, ex in exits.items() if ex.get("code") not in (0, None) and ex.get("signal") not in ("SIGTERM", "SIGINT")]
    if len(failed) != 1:
        return f
    ev = replace(f.ev, rank=failed[0], fields={**f.ev.fields, "rank_from": "launcher summary (the only rank that failed)"})
    return replace(f, ev=ev, cap="medium" if f.cap in (None, "high") else f.cap,
                   links=[*f.links, f"rank {failed[0]} is the only rank its launcher reported failed"])


def _flight(events: list[Event], world: int | None, gaps: list[dict]) -> FRAnalysis | None:
    """The Flight Recorder analysis of the newest dump of each rank (None: no dumps)."""
    dumps = {}
    for ev in sorted(events, key=lambda e: e.occurred_ns or 0):
        if "error" in ev.fields:
            gaps.append({"node": ev.node, "rank": ev.rank, "source": "flight_recorder",
                         "reason": f"dump {ev.fields.get('path') or ev.origin} unreadable: {ev.fields['error']}"})
        elif ev.rank is not None:
            dumps[ev.rank] = ev.fields["dump"]
    return analyze_flight(dumps, world) if dumps else None


def _with_flight_recorder(inf: Inference, fr: FRAnalysis | None) -> tuple[Inference, bool]:
    """The hang's inference with the Flight Recorder's word: it decides when the stacks
    named no rank, or only weaker signs (progress, silence, lagging work) named one; a rank a
    stack dump named stays, with the recorder's view beside it. (inference, decided by the recorder)."""
    if fr is None or not fr.how:
        return inf, False
    strong = fr.basis in ("behind", "mismatch") and len(fr.culprits) == 1
    said = [f"Flight Recorder: {x}" for x in fr.how]
    if inf.rank is not None and inf.rank in fr.culprits:
        return replace(inf, how=inf.how + said[:1]), strong
    if strong and inf.where is None:  # no stack decided
        return replace(inf, rank=fr.culprits[0], how=said + inf.how, suspects=list(fr.culprits)), True
    return replace(inf, how=inf.how + said), False


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
        "first_action": f.match.signature.first_action,
        "reference": f.match.signature.reference,
        "evidence": [_evidence(f)],
        "rank_from": ev.fields.get("rank_from") or ("agent process identity" if ev.rank is not None else None),
        "ranks_sharing": sorted(ranks) if ranks else ([ev.rank] if ev.rank is not None else []),
        "confidence": confidence(f, bool(tied)),
        "within_clock_uncertainty": bool(tied),
        "tied_with": sorted({h.ev.rank for h in tied if h.ev.rank is not None}),
        "inferred": False,
        "time_note": None if ev.occurred_ns is not None else UNTIMED,
    }


def _inferred(inf: Inference, casc: list[Finding], facts: Facts, saving: int | None, rank_nodes,
              dump: Event | None, outside: list[Finding], sharded: bool | None = None) -> dict:
    rank = inf.rank
    last = facts.progress.get(rank) if rank is not None else None
    where = "" if last is None else f" after step {facts.steps.get(rank)}" if facts.steps.get(rank) is not None else ""
    dump_phase = dump and phase_from_frames(dump.frames)
    waited = next((h for c in casc if (h := phase_hint(c.ev.text, (), sharded))), None)  # the collective they waited in
    hinted = {c.match.signature.phases[0] for c in casc if len(c.match.signature.phases) == 1}
    said = (hinted.pop(), "the phase the survivors' errors belong to") if len(hinted) == 1 else None
    phase = ((dump_phase, "stack dump") if dump_phase else ("checkpoint-save", "checkpoint save under way")
             if saving is not None else waited or said or ("unknown", "no evidence"))
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
        # no rank singled out: all the log shows are consequences (timeouts, closed peers); a rank that
        # stopped first is the failure, of a kind nothing said
        "category": "cascade" if rank is None else "unknown",
        "phase": phase[0],
        "phase_from": phase[1],
        "summary": summary,
        "first_action": ("Dump the stacks of every rank while it hangs (py-spy dump --pid, or "
                         "TORCH_DISTRIBUTED_DEBUG=DETAIL and faulthandler) and look at what "
                         + (f"rank {rank}" if rank is not None else f"rank(s) {ranges(inf.suspects)}" if inf.suspects
                            else "the rank that stopped")
                         + (" were" if rank is None and len(inf.suspects) > 1 else " was") + " doing instead of the collective."),
        "reference": None,
        "evidence": [_evidence(c) for c in casc[:MAX_EVIDENCE]],
        "ranks_sharing": [rank] if rank is not None else [],
        "suspects": inf.suspects,
        "confidence": inf.confidence,
        "within_clock_uncertainty": False,
        "tied_with": [],
        "inferred": True,
        "inferred_from": inf.how,
        "killed_from_outside": bool(outside),
        "time_note": None if last else UNTIMED,
    }
