"""Build the report (REPORT.md, ``firstfault.report/1``) from Events. Pure.

The same function serves ``firstfault analyze`` (Events read from files) and
the collector's ``report`` (Events rebuilt from stored records): give it the
Events, the catalog, what is known about the inputs (ranks and nodes seen,
gaps) and optionally a checkpoint directory's inspection.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone


from firstfault.analysis import timeline
from firstfault.analysis.catalog import Catalog
from firstfault.analysis.checkpoint import DiskCheckpoint, SaveMark, checkpoint_report
from firstfault.analysis.context import NEEDLES as CONTEXT_NEEDLES
from firstfault.analysis.findings import MAX_KEPT, PROGRESS, read_findings
from firstfault.analysis.flight_recorder import FRAnalysis
from firstfault.analysis.flight_recorder import analyze as analyze_flight
from firstfault.analysis.hostlist import HostlistError, expand_hostlist
from firstfault.analysis.lanes import LaneWatcher, timeline_report
from firstfault.analysis.memlines import NEEDLES as MEMORY_NEEDLES
from firstfault.analysis.memory import MARKED_PHASES, MemoryWatcher, memory_report
from firstfault.analysis.model import Event, Frame
from firstfault.analysis.phase import phase_from_frames
from firstfault.analysis.seen import watch
from firstfault.analysis.timeline import NodeClock
from firstfault.analysis.verdict import (
    BLAME,
    HANG_ID,
    Finding,
    confidence,
    distinct_failures,
    exit_of,
    fingerprint,
    link_identity,
    link_kernel,
    phase_of,
    rank_firsts,
    stopped_first,
)

SCHEMA = "firstfault.report/1"
# Context signatures of the catalog the analysis reads facts from.
FAILURE_RANK = "torchelastic.failure_rank"
FAILURE_HOST = "torchelastic.failure_host"
SAVE_MARKS = {"deepspeed.checkpoint_save_start": "start", "deepspeed.checkpoint_saving_file": "file",
              "deepspeed.checkpoint_saved": "done"}
TEXT_MAX = 2000


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


def needles(catalog: Catalog) -> list[str]:
    """Every literal string that makes a line worth scanning."""
    return [n for s in catalog.signatures for n in s.needles] + list(CONTEXT_NEEDLES) + list(MEMORY_NEEDLES)


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


@dataclass(slots=True)
class _Facts:
    """Per-rank facts the verdict and the checkpoint rules read."""

    progress: dict[int, Event] = field(default_factory=dict)
    steps: dict[int, int] = field(default_factory=dict)
    marks: list[SaveMark] = field(default_factory=list)
    exits: dict[int, dict] = field(default_factory=dict)


def build_report(events: Iterable[Event], catalog: Catalog, inputs: Inputs | None = None) -> dict:
    inp = inputs or Inputs()
    mem = MemoryWatcher()
    lanes = LaneWatcher() if inp.timeline else None
    read = read_findings(watch(events, *filter(None, (mem, lanes))), catalog, inp.clocks)
    findings = read.findings
    rank_nodes = dict(inp.rank_nodes)
    pids = _identify(findings, rank_nodes, read.procs)
    facts = _facts(findings, rank_nodes)
    for ev in read.procs:  # what the agents saw of process exits
        r = ev.rank if ev.rank is not None else pids.get(ev.pid or -1)
        if r is not None and ev.fields.get("exit"):
            facts.exits.setdefault(r, ev.fields["exit"])
            rank_nodes.setdefault(r, ev.node)
    progress = facts.progress

    errors = [f for f in findings if f.role in ("root", "cascade")]
    firsts = rank_firsts(errors)
    rank_dumps = _hang_dumps(read.dumps, pids, firsts)
    groups = distinct_failures(errors, firsts, read.counts)
    world = read.ctx.world_size or inp.world_size or max(
        (ev.fields["world_size"] for ev in read.procs if "world_size" in ev.fields), default=None)
    known_ranks = set(rank_nodes) | (set(range(world)) if world else set())

    gaps = list(inp.gaps)
    fr = _flight(read.flight, world, gaps)
    first_f: Finding | None = None
    failure_ns = None
    casc: list[Finding] = []
    if groups:
        first_f = groups[0].findings[0]
        failure_ns = first_f.ev.occurred_ns
    elif any(ff.role == "cascade" for ff in errors):
        casc = sorted(firsts.values(), key=lambda ff: ff.ev.occurred_ns or 0)
        failure_ns = casc[0].ev.occurred_ns if casc else None

    clean = {r for r, ex in facts.exits.items() if ex.get("code") == 0}
    ckpt = checkpoint_report(
        facts.marks, failure_at_ns=failure_ns, world_size=world,
        ranks_progress={r: ev.occurred_ns for r, ev in progress.items()},
        clean_exit_ranks=clean, disk=inp.disk)
    saved = {t["tag"] for t in ckpt["tags"] if t["verdict"] == "safe"}
    saving = _saving_since(facts.marks, progress, saved)

    first = None
    blame = "unknown"
    if first_f is not None:
        # a tie is another distinct failure that can not be ordered after this one; the
        # same failure on other ranks at the same time is "ranks_sharing", not a tie
        tied = [h for g in groups[1:] for h in g.findings if timeline.overlap(first_f.ev, h.ev)]
        peers = [h for h in errors if h.role == "cascade" and h.ev.frames]
        first = _first(first_f, groups[0].ranks, tied, phase_of(first_f, saving, peers), rank_nodes)
        blame = BLAME.get(first_f.category, "unknown")
    elif casc or (fr and fr.culprits):
        r, how = stopped_first(errors, known_ranks, progress, rank_dumps)
        r, how, fr_decided = _with_flight_recorder(r, how, fr)
        first = _inferred(r, how, casc, progress, facts.steps, saving, rank_nodes, rank_dumps.get(r))
        if fr_decided:
            first["confidence"] = "medium"
        if fr and r is not None and first["phase"] == "unknown":  # where its last collective was called
            ph = phase_from_frames([Frame(f.file, f.line, f.func) for f in reversed(fr.frames_of(r))])
            if ph:
                first["phase"], first["phase_from"] = ph, "Flight Recorder frames"

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


def _hang_dumps(dumps: list[Event], pids: Mapping[int, int], firsts: Mapping[int, Finding]) -> dict[int, Event]:
    """Each rank's stack dump at the hang: its newest from before its own first error (after
    that the rank was already raising or dying: a dump taken then says where it died, not
    where it waited), else its newest."""
    out: dict[int, Event] = {}
    for d in sorted(dumps, key=timeline.order_key):
        r = d.rank if d.rank is not None else pids.get(d.pid or -1)
        if r is None:
            continue
        first = firsts.get(r)
        late = first is not None and d.occurred_ns is not None and first.ev.occurred_ns is not None \
            and d.occurred_ns > first.ev.occurred_ns
        if not late or r not in out or out[r].fields.get("late"):
            out[r] = d
            d.fields["late"] = late
    return out


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


def _with_flight_recorder(rank: int | None, how: list[str], fr: FRAnalysis | None) -> tuple[int | None, list[str], bool]:
    """The hang's inferred rank with the Flight Recorder's word: it decides when the stacks
    named no rank, or only weaker signs (progress, silence) named one; a rank a stack dump
    named stays, with the recorder's view beside it. (rank, how, decided by the recorder)."""
    if fr is None or not fr.how:
        return rank, how, False
    strong = fr.basis in ("behind", "mismatch") and len(fr.culprits) == 1
    by_stack = bool(how) and "stack dump" in how[0]
    if rank is not None and rank in fr.culprits:
        return rank, how + [f"Flight Recorder: {fr.how[0]}"], strong
    if strong and not by_stack:
        return fr.culprits[0], [f"Flight Recorder: {x}" for x in fr.how] + how, True
    return rank, how + [f"Flight Recorder: {x}" for x in fr.how], False


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



def _identify(findings: list[Finding], rank_nodes: dict[int, str | None], procs: Iterable[Event] = ()) -> dict[int, int]:
    """Ranks and nodes for findings that lack them (in place); the pid -> rank map, from the
    findings and from the agents' process records (``procs``)."""
    nodes = {n for n in rank_nodes.values() if n} | {f.ev.node for f in findings if f.ev.node}
    # local ranks name global ranks only on one node: not when a global rank exceeds every local rank seen
    ranks_seen = {f.ev.rank for f in findings if f.ev.rank is not None} | set(rank_nodes)
    locals_seen = {f.ev.local_rank for f in findings if f.ev.local_rank is not None}
    locals_seen |= {int(v) for f in findings if (v := f.match.groups.get("local_rank")) and v.isdigit()}
    single_node = len(nodes) <= 1 and not (ranks_seen and locals_seen and max(ranks_seen) > max(locals_seen))
    _failure_summary(findings, rank_nodes)
    pids = link_identity(findings, single_node=single_node)
    started: dict[str | None, int] = {}
    for ev in procs:
        if ev.pid and ev.rank is not None:
            pids.setdefault(ev.pid, ev.rank)
        if ev.fields.get("proc") == "start" and ev.occurred_ns is not None:
            started[ev.node] = min(started.get(ev.node, ev.occurred_ns), ev.occurred_ns)
    for f in findings:
        if f.ev.rank is not None and f.ev.source != "kernel":
            if f.ev.node:
                rank_nodes[f.ev.rank] = rank_nodes.get(f.ev.rank) or f.ev.node
            else:
                rank_nodes.setdefault(f.ev.rank, None)
    link_kernel(findings, pids, rank_nodes, started)
    return pids


def _facts(findings: list[Finding], rank_nodes: Mapping[int, str | None]) -> _Facts:
    """Progress, checkpoint saves and exits of each rank."""
    facts = _Facts()
    for f in findings:
        ev, sig = f.ev, f.sig
        if sig == PROGRESS:
            # DeepSpeed logs progress on rank 0 only; an unlabelled line is rank 0's on one node
            r = ev.rank if ev.rank is not None else (0 if len(rank_nodes) <= 1 else None)
            if r is not None:
                facts.progress[r] = ev
                if f.match.groups.get("step") is not None:
                    facts.steps[r] = int(f.match.groups["step"])
        elif sig in SAVE_MARKS and f.match.groups.get("tag"):
            facts.marks.append(SaveMark(ev.rank, f.match.groups["tag"], SAVE_MARKS[sig], ev.occurred_ns,
                                        f.match.groups.get("path")))
        ex = exit_of(f)
        if ex and ev.rank is not None and ev.source != "kernel":
            facts.exits.setdefault(ev.rank, ex)
    for f in findings:  # the kernel OOM killer ends a process with SIGKILL
        if f.ev.source == "kernel" and f.category == "host-memory" and f.role == "root" and f.ev.rank is not None:
            facts.exits.setdefault(f.ev.rank, {"code": -9, "signal": "SIGKILL", "by": "kernel OOM killer"})
    return facts


def _failure_summary(findings: list[Finding], rank_nodes: dict[int, str | None]) -> None:
    """torchrun's failure summary, line by line: "host : H", "rank : N (local_rank: M)",
    "exitcode : X (pid: P)". The rank line names the rank of the exit below it and the
    host line above it names that rank's node."""
    at = {(f.ev.stream, f.ev.seq): f for f in findings if f.sig in (FAILURE_RANK, FAILURE_HOST)}
    for f in findings:
        above = at.get((f.ev.stream, f.ev.seq - 1))
        if above is None or above.sig != FAILURE_RANK:
            continue
        rank = int(above.match.groups["rank"])
        if f.ev.rank is None:
            f.ev.rank = rank
        host = at.get((f.ev.stream, f.ev.seq - 2))
        if host is not None and host.sig == FAILURE_HOST and not rank_nodes.get(rank):
            rank_nodes[rank] = host.match.groups["host"]


def _saving_since(marks: list[SaveMark], progress: Mapping[int, Event], saved: set[str]) -> int | None:
    """Start of a checkpoint save that training had not left, or None.

    All ranks save together, so a start logged by rank 0 counts for all. A save
    is over when any rank logged progress after it or its tag is whole on disk.
    """
    starts = [(m.at_ns, m.tag) for m in marks if m.what == "start" and m.at_ns is not None]
    if not starts:
        return None
    s, tag = max(starts)
    if tag in saved:
        return None
    after = [ev.occurred_ns for ev in progress.values() if ev.occurred_ns is not None and ev.occurred_ns > s]
    return None if after else s


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
        "ranks_sharing": sorted(ranks) if ranks else ([ev.rank] if ev.rank is not None else []),
        "confidence": confidence(f, bool(tied)),
        "within_clock_uncertainty": bool(tied),
        "tied_with": sorted({h.ev.rank for h in tied if h.ev.rank is not None}),
        "inferred": False,
    }


def _inferred(rank, how, casc: list[Finding], progress, steps, saving: int | None, rank_nodes,
              dump: Event | None) -> dict:
    last = progress.get(rank) if rank is not None else None
    where = "" if last is None else f" after step {steps.get(rank)}" if steps.get(rank) is not None else ""
    if rank is None:
        summary = "The job hung: every rank that reported an error was waiting for a peer, and no rank stands out."
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
        "category": "unknown",
        "phase": (dump and phase_from_frames(dump.frames)) or ("checkpoint-save" if saving is not None else "unknown"),
        "phase_from": ("stack dump" if dump and phase_from_frames(dump.frames) else
                       "checkpoint save under way" if saving is not None else "no evidence"),
        "summary": summary,
        "first_action": ("Dump the stacks of every rank while it hangs (py-spy dump --pid, or "
                         "TORCH_DISTRIBUTED_DEBUG=DETAIL and faulthandler) and look at what rank "
                         f"{rank if rank is not None else '?'} was doing instead of the collective."),
        "reference": None,
        "evidence": [_evidence(c) for c in casc[:5]],
        "ranks_sharing": [rank] if rank is not None else [],
        "confidence": "medium" if rank is not None and how and ("no error of its own" in how[0]
                                                                 or "stack dump" in how[0]) else "low",
        "within_clock_uncertainty": False,
        "tied_with": [],
        "inferred": True,
        "inferred_from": how,
    }
