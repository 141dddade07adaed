"""Each rank's state as the logs leave it: its first error, its stack dumps, progress, exits,
checkpoint saves and signs of life. Pure.

``rank_state`` is the stage (one typed output, RankState) between judging the findings and
deciding the first failure; the verdict, the hang inference and the checkpoint rules read it.

RankActivity (``collect``): each rank's latest progress and step, its exit (the agents' own exit
records first, exits.best_exits), the checkpoint save marks, and each rank's last sign of life
outside a checkpoint save (progress, or an error or stack dump whose frames are elsewhere),
which tells whether the rank returned from a save. Stack dumps (``stack_dumps``, one pass):
each rank's latest, and its stack at the hang.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from firstfault.analysis import timeline
from firstfault.analysis.checkpoint import SaveMark
from firstfault.analysis.events import Event
from firstfault.analysis.exits import best_exits
from firstfault.analysis.findings import Finding, exit_of
from firstfault.analysis.hang import Work, launcher_act
from firstfault.analysis.identify import Identity
from firstfault.analysis.phase import phase_from_frames

SAVE_MARKS = {"save-start": "start", "save-file": "file", "save-done": "done"}  # trait -> checkpoint.SaveMark kind
STEP_PHASES = frozenset({"forward", "backward", "param-gather", "optimizer-step", "data"})


@dataclass(frozen=True, slots=True)
class RankActivity:
    progress: dict[int, Event] = field(default_factory=dict)
    steps: dict[int, int] = field(default_factory=dict)
    saves: list[SaveMark] = field(default_factory=list)  # the checkpoint save lines
    exits: dict[int, dict] = field(default_factory=dict)
    alive: dict[int, int] = field(default_factory=dict)  # rank -> last sign of life outside a save (ns, at least)
    in_save: dict[int, int] = field(default_factory=dict)  # rank -> last seen inside a save (ns)
    reached: dict[int, int] = field(default_factory=dict)  # rank -> a step it was in (its errors' frames show it)


@dataclass(frozen=True, slots=True)
class StackDumps:
    latest: dict[int, Event]  # each rank's latest stack dump
    at_hang: dict[int, Event]  # each rank's stack at the hang


def stack_dumps(dumps: Iterable[Event], pids: Mapping[int, int], single: bool,
                firsts: Mapping[int, Finding] | None = None) -> StackDumps:
    """The stack dumps of each rank (by its rank, pid, or on one node its local rank), in one pass:
    its latest, and its stack at the hang: its latest dump from before its own first error
    (``firsts``) where there is one (a dump taken after it, e.g. on a peer's timeout line,
    catches the rank already raising or dying: it says where the rank died, not where it
    waited), else its latest."""
    latest: dict[int, Event] = {}
    at_hang: dict[int, Event] = {}
    late_of: dict[int, bool] = {}
    for d in sorted(dumps, key=lambda d: (d.occurred_ns is not None, timeline.order_key(d))):  # timed ones win
        r = d.rank if d.rank is not None else pids.get(d.pid or -1)
        if r is None and single:
            r = d.local_rank
        if r is None:
            continue
        latest[r] = d
        first = (firsts or {}).get(r)
        late = (first is not None and d.occurred_ns is not None and first.ev.occurred_ns is not None
                and d.occurred_ns > first.ev.occurred_ns)
        if not late or late_of.get(r, True):
            at_hang[r], late_of[r] = d, late
    return StackDumps(latest, at_hang)


@dataclass(frozen=True, slots=True)
class RankState:
    """The rank_state stage's output."""

    errors: list[Finding]  # the root and cascade findings, in timeline order
    firsts: dict[int, Finding]  # each rank's first error (verdict.rank_firsts)
    dumps: StackDumps
    activity: RankActivity


def rank_state(findings: list[Finding], ident: Identity, dumps: Iterable[Event]) -> RankState:
    """Each rank's first error, stack dumps and activity, from the judged findings (judge.judge)."""
    errors = [f for f in findings if f.role in ("root", "cascade")]
    firsts = rank_firsts(errors)
    stacks = stack_dumps(dumps, ident.pids, ident.single_node, firsts)
    return RankState(errors, firsts, stacks, collect(findings, ident.rank_nodes, ident.pids, stacks.latest, ident.exits))


def rank_firsts(findings: Iterable[Finding]) -> dict[int, Finding]:
    """Each rank's first error: earliest root, else earliest cascade (findings are in time order)."""
    root: dict[int, Finding] = {}
    cascade: dict[int, Finding] = {}
    for f in findings:
        r = f.ev.rank
        if r is None:
            continue
        if f.role == "root":
            root.setdefault(r, f)
        elif f.role == "cascade":
            cascade.setdefault(r, f)
    return {r: root.get(r) or cascade[r] for r in set(root) | set(cascade)}


MAX_TASKS = 4096


def task_ranks(spec: str) -> list[int]:
    """The task numbers of srun's range list (``0-3,5``, a hostlist's ``[0-3,5]`` too), as ranks
    the way its one-task line names one; at most MAX_TASKS, none where the list does not parse."""
    out: list[int] = []
    for part in spec.strip("[]").split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            return []
        a, b = int(lo), int(hi or lo)
        if b < a or len(out) + b - a + 1 > MAX_TASKS:
            return []
        out.extend(range(a, b + 1))
    return out


def collect(findings: list[Finding], rank_nodes: Mapping[int, str | None], pids: Mapping[int, int],
            dumps: Mapping[int, Event], agent_exits: Mapping[int, tuple[dict, str | None]] | None = None) -> RankActivity:
    """Progress, checkpoint saves, exits and signs of life of each rank; ``agent_exits``: the
    exits the agents saw (identify.Identity.exits), which come first (exits.best_exits)."""
    activity = RankActivity()
    for f in findings:
        ev = f.ev
        save = next((SAVE_MARKS[t] for t in f.match.signature.traits if t in SAVE_MARKS), None)
        if f.has("progress"):
            # DeepSpeed logs progress on rank 0 only; an unlabelled line is rank 0's on one node
            r = ev.rank if ev.rank is not None else (0 if len(rank_nodes) <= 1 else None)
            if r is not None:
                activity.progress[r] = ev
                if f.match.groups.get("step") is not None:
                    activity.steps[r] = max(activity.steps.get(r, 0), int(f.match.groups["step"]))
        elif save is not None and f.match.groups.get("tag"):
            activity.saves.append(SaveMark(ev.rank, f.match.groups["tag"], save, ev.occurred_ns,
                                           f.match.groups.get("path"), f.match.groups.get("engine")))
        elif f.has("launcher-ok"):
            r = ev.rank if ev.rank is not None else pids.get(int(f.match.groups.get("pid", "-1")))
            if r is not None:
                activity.exits.setdefault(r, {"code": 0, "signal": None})
        elif f.has("group-ok"):
            for r, node in rank_nodes.items():
                if node == ev.node or len({n for n in rank_nodes.values()}) <= 1:
                    activity.exits.setdefault(r, {"code": 0, "signal": None})
        ex = exit_of(f)
        if ex and ev.rank is not None and ev.source != "kernel":
            activity.exits.setdefault(ev.rank, ex)
        elif ex and ex["code"] and ev.source != "kernel" and f.match.groups.get("tasks"):
            for r in task_ranks(f.match.groups["tasks"]):  # srun's "tasks 2-7,9: Exited with exit code 1"
                activity.exits.setdefault(r, ex)
    for f in findings:  # the kernel OOM killer ends a process with SIGKILL
        if f.ev.source == "kernel" and f.category == "host-memory" and f.role == "root" and f.ev.rank is not None:
            activity.exits.setdefault(f.ev.rank, {"code": -9, "signal": "SIGKILL", "by": "kernel OOM killer"})
    # Progress that names its step speaks through the step (a line placed by its neighbours in a console
    # where ranks interleave may land after another rank's save line it came before); times count only
    # by their lower bound.
    lives = [ev for r, ev in activity.progress.items() if r not in activity.steps]
    stacks = [f.ev for f in findings if f.role in ("root", "cascade") and f.ev.frames and not launcher_act(f)]
    stacks += [d for d in dumps.values() if d.frames]
    rank_of = {id(d): r for r, d in dumps.items()}
    for ev in lives + stacks:
        r = ev.rank if ev.rank is not None else rank_of.get(id(ev))
        if r is None or ev.occurred_ns is None:
            continue
        held = activity.in_save if phase_from_frames(ev.frames) == "checkpoint-save" else activity.alive
        at = ev.occurred_ns - ev.uncertainty_ns if held is activity.alive else ev.occurred_ns
        held[r] = max(held.get(r, at), at)
    _steps_reached(findings, activity)
    if agent_exits:
        exits = best_exits(activity.exits, agent_exits)
        activity.exits.clear()
        activity.exits.update(exits)
    return activity


def _steps_reached(findings: list[Finding], activity: RankActivity) -> None:
    """A rank's error whose frames are in a training step, after its last progress line of step S
    in the same log, is in a step after S: the rank had returned from a save made after step S."""
    last: dict[tuple, tuple[int, int]] = {}  # (stream, rank) -> (seq, step) of its latest progress line
    for f in findings:
        if f.has("progress") and f.ev.rank is not None and f.match.groups.get("step") is not None:
            last[(f.ev.stream, f.ev.rank)] = (f.ev.seq, int(f.match.groups["step"]))
    for f in findings:
        got = last.get((f.ev.stream, f.ev.rank))
        if (got and f.ev.frames and f.ev.seq > got[0] and f.role in ("root", "cascade") and not launcher_act(f)
                and phase_from_frames(f.ev.frames) in STEP_PHASES):
            activity.reached[f.ev.rank] = max(activity.reached.get(f.ev.rank, 0), got[1] + 1)


def nccl_work(findings: Iterable[Finding]) -> list[Work]:
    """Each rank's NCCL work status lines (trait nccl-work-status: nccl.work_status and
    nccl.work_timeout_status), newest last."""
    out = []
    for f in findings:
        if not f.has("nccl-work-status"):
            continue
        g = f.match.groups
        pg = g.get("pg", "0")
        rank = f.ev.rank if f.ev.rank is not None else (int(g["pg_rank"]) if pg == "0" and "pg_rank" in g else None)
        if rank is not None:
            out.append(Work(rank, pg, int(g["seq"]) if "seq" in g else None, int(g["enqueued"]), int(g["completed"])))
    return out


def saving_since(marks: list[SaveMark], alive: Mapping[int, int], saved: set[str]) -> int | None:
    """Start of a checkpoint save that training had not left, or None.

    All ranks save together, so a start logged by rank 0 counts for all. A save
    is over when any rank showed life outside a save after it or its tag is whole
    (on disk or by the logs).
    """
    starts = [(m.at_ns, m.tag) for m in marks if m.what == "start" and m.at_ns is not None]
    if not starts:
        return None
    s, tag = max(starts)
    if tag in saved or any(at > s for at in alive.values()):
        return None
    return s
