"""What the Flight Recorder dumps of all ranks say about a hang. Pure.

Input: one FRDump per rank (firstfault/analysis/frdump.py). For every process group
(by name; ``desc`` names it for people) and rank: the last collective the rank entered
(highest ``collective_seq_id``, or ``last_enqueued`` of its ``pg_status`` when the ring
buffer dropped it) and the last it finished (``last_completed``; gloo marks a collective
that failed by timeout finished too, so "finished" is not "succeeded"). Then, per group:

- **behind**: the group's newest collective (``seq``) was entered by some ranks; a member
  whose last entered collective is older never entered it, so the others waited for it;
- **mismatch**: at one ``seq`` the ranks entered different collectives (op, input sizes
  or dtypes differ): a rank took another branch. The smaller side is the odd one out
  when one side is larger;
- **no dump**: a member of the group that left no dump (the rank that stopped often
  never writes one).

Membership comes from ``pg_config`` where it lists ranks; gloo leaves it empty, so a
group is then the ranks whose entries name it, and the default group (``default_pg`` or
name ``0``) is the whole world. Point-to-point entries are left out. torch's own
``fr_trace`` analyzer matches entries one by one across ranks and stops at the first
mismatch; this reads the same facts but only to name the rank(s) to look at first:
``culprits`` and ``how`` (sentences), earliest stuck collective first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from firstfault.analysis.frdump import Entry, FRDump

DEFAULT_GROUPS = ("default_pg",)


@dataclass(slots=True)
class RankInGroup:
    """Where one rank stood in one process group when it dumped."""

    rank: int
    pg: str
    desc: str
    entered: int | None  # last collective_seq_id entered
    entered_op: str | None
    finished: int | None  # last collective_seq_id finished (done or failed)
    entry: Entry | None  # the last entered entry, if the buffer holds it


@dataclass(slots=True)
class Stuck:
    pg: str
    desc: str
    seq: int
    op: str
    entered: list[int]  # ranks that entered collective ``seq``
    behind: dict[int, int | None]  # rank -> its last entered seq (< seq)
    no_dump: list[int]
    created_ns: int | None = None


@dataclass(slots=True)
class Mismatch:
    pg: str
    desc: str
    seq: int
    calls: dict[str, list[int]]  # what each side called -> ranks
    odd: list[int]  # the smaller side's ranks when one side is larger, else []
    created_ns: int | None = None


@dataclass(slots=True)
class FRAnalysis:
    ranks: dict[int, list[RankInGroup]] = field(default_factory=dict)
    stuck: list[Stuck] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    no_dump: list[int] = field(default_factory=list)
    culprits: list[int] = field(default_factory=list)
    basis: str | None = None  # why the culprits: behind | mismatch | no-dump
    how: list[str] = field(default_factory=list)

    def frames_of(self, rank: int) -> tuple:
        """The frames (innermost first, as torch records them) of the last collective ``rank``
        entered where it is a culprit: where in its code it was."""
        for g in self.ranks.get(rank, []):
            if g.entry is not None and g.entry.frames and (
                    any(g.pg == s.pg for s in self.stuck) or any(g.pg == m.pg for m in self.mismatches)):
                return g.entry.frames
        return ()

    def to_report(self) -> dict:
        """The report's ``flight_recorder`` section (firstfault.report/1, additive)."""
        def at(seq, op):
            return None if seq is None else {"seq": seq, "op": op}
        return {
            "dumps": sorted(self.ranks),
            "no_dump": self.no_dump,
            "ranks": {str(r): [{"pg": g.pg, "desc": g.desc, "last_entered": at(g.entered, g.entered_op),
                                "last_finished": at(g.finished, None)} for g in gs]
                      for r, gs in sorted(self.ranks.items())},
            "stuck": [{"pg": s.pg, "desc": s.desc, "seq": s.seq, "op": s.op, "entered": s.entered,
                       "behind": {str(r): v for r, v in sorted(s.behind.items())}, "no_dump": s.no_dump}
                      for s in self.stuck],
            "mismatches": [{"pg": m.pg, "desc": m.desc, "seq": m.seq,
                            "calls": [{"call": c, "ranks": rs} for c, rs in m.calls.items()], "odd": m.odd}
                           for m in self.mismatches],
            "culprits": self.culprits,
            "basis": self.basis,
            "how": self.how,
        }


def _group_name(pg: str, desc: str) -> str:
    return f"process group {pg}" + (f" ({desc})" if desc and desc != pg else "")


def _call(e: Entry) -> str:
    sizes = ",".join("x".join(map(str, s)) or "scalar" for s in e.input_sizes)
    return f"{e.op_name}({sizes}{' ' + '/'.join(sorted(set(e.input_dtypes))) if e.input_dtypes else ''})"


def _ranks(rs) -> str:
    rs = sorted(rs)
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def _members(dumps: Mapping[int, FRDump], world: set[int]) -> dict[str, tuple[str, set[int]]]:
    """pg name -> (desc, member ranks)."""
    out: dict[str, tuple[str, set[int]]] = {}
    for rank, d in dumps.items():
        for e in d.entries:
            if e.is_p2p:
                continue
            desc, members = out.get(e.pg, (e.desc, set()))
            members.add(rank)
            out[e.pg] = (desc or e.desc, members)
    for d in dumps.values():
        for name, (desc, ranks) in d.groups.items():
            if name in out and ranks:
                out[name][1].update(ranks)
    for name, (desc, members) in out.items():
        if desc in DEFAULT_GROUPS or (name == "0" and not desc):
            members.update(world)
    return out


def _standing(rank: int, d: FRDump, pg: str, desc: str) -> RankInGroup:
    mine = [e for e in d.entries if e.pg == pg and not e.is_p2p]
    last = max(mine, key=lambda e: (e.seq, e.record_id), default=None)
    st = d.status.get(pg, {})
    entered = max(x for x in (last.seq if last else None, st.get("last_enqueued")) if x is not None) \
        if (last or st.get("last_enqueued") is not None) else None
    if entered is not None and entered <= 0 and last is None:
        entered = None
    done = [e.seq for e in mine if e.finished]
    finished = st.get("last_completed") if st.get("last_completed") is not None else max(done, default=None)
    if finished is not None and finished < 0:
        finished = None
    entry = last if last is not None and last.seq == entered else None
    return RankInGroup(rank, pg, desc, entered, entry.op_name if entry else None, finished, entry)


def _mismatch(pg: str, desc: str, dumps: Mapping[int, FRDump], members: set[int]) -> Mismatch | None:
    """The first collective of ``pg`` that the ranks entered differently."""
    by_seq: dict[int, dict[int, Entry]] = {}
    for rank in members & set(dumps):
        for e in dumps[rank].entries:
            if e.pg == pg and not e.is_p2p:
                by_seq.setdefault(e.seq, {})[rank] = e
    for seq in sorted(by_seq):
        got = by_seq[seq]
        if len(got) < 2:
            continue
        calls: dict[str, list[int]] = {}
        for rank, e in sorted(got.items()):
            calls.setdefault(_call(e), []).append(rank)
        if len(calls) < 2:
            continue
        sizes = sorted(len(v) for v in calls.values())
        odd = sorted(r for v in calls.values() if len(v) < sizes[-1] for r in v) if sizes[-1] > sizes[-2] else []
        created = min((e.created_ns for e in got.values() if e.created_ns), default=None)
        return Mismatch(pg, desc, seq, calls, odd, created)
    return None


def analyze(dumps: Mapping[int, FRDump], world_size: int | None = None) -> FRAnalysis:
    """Per-rank standing, stuck collectives, mismatches and the rank(s) to look at first."""
    world = set(range(world_size)) if world_size else set(dumps)
    out = FRAnalysis()
    groups = _members(dumps, world)
    out.no_dump = sorted(set().union(*(m for _, m in groups.values())) - set(dumps)) if groups else []
    for rank, d in sorted(dumps.items()):
        out.ranks[rank] = [_standing(rank, d, pg, desc) for pg, (desc, members) in sorted(groups.items())
                           if rank in members]
    for pg, (desc, members) in sorted(groups.items()):
        standing = [g for gs in out.ranks.values() for g in gs if g.pg == pg]
        if not standing:
            continue
        top = max((g.entered for g in standing if g.entered is not None), default=None)
        m = _mismatch(pg, desc, dumps, members)
        if m is not None:
            out.mismatches.append(m)
        if top is None:
            continue
        at_top = [g for g in standing if g.entered == top]
        behind = {g.rank: g.entered for g in standing if g.entered is None or g.entered < top}
        missing = sorted(members - set(dumps))
        if behind or missing:
            ops = Counter(g.entered_op for g in at_top if g.entered_op)
            created = min((g.entry.created_ns for g in at_top if g.entry and g.entry.created_ns), default=None)
            out.stuck.append(Stuck(pg, desc, top, ops.most_common(1)[0][0] if ops else "?",
                                   sorted(g.rank for g in at_top), behind, missing, created))
    _explain(out)
    return out


def _explain(out: FRAnalysis) -> None:
    """Culprits and sentences: the earliest stuck collective or mismatch decides."""
    cands: list[tuple[int, int, list[int], str]] = []  # (created, order, ranks, sentence)
    basis = ("mismatch", "behind", "no-dump")
    for m in out.mismatches:
        sides = "; ".join(f"{_ranks(rs)} called {c}" for c, rs in m.calls.items())
        who = f"{_ranks(m.odd)} took another branch: " if m.odd else "the ranks disagree: "
        cands.append((m.created_ns or 0, 0, m.odd,
                      f"Collective #{m.seq} of {_group_name(m.pg, m.desc)} is not the same call on every rank, "
                      f"{who}{sides}."))
    for s in out.stuck:
        if s.behind:
            lasts = ", ".join(f"rank {r} last entered #{v}" if v is not None else f"rank {r} entered none"
                              for r, v in sorted(s.behind.items()))
            cands.append((s.created_ns or 0, 1, sorted(s.behind),
                          f"{_ranks(s.behind)} never entered {s.op} #{s.seq} of {_group_name(s.pg, s.desc)}, "
                          f"which {_ranks(s.entered)} entered and waited in ({lasts})."))
        elif s.no_dump:
            cands.append((s.created_ns or 0, 2, s.no_dump,
                          f"{_ranks(s.entered)} entered {s.op} #{s.seq} of {_group_name(s.pg, s.desc)}; "
                          f"{_ranks(s.no_dump)} left no Flight Recorder dump, so whether it entered is unknown."))
    cands.sort(key=lambda c: (c[0] == 0, c[0], c[1]))
    out.how = [c[3] for c in cands]
    for _, order, ranks, _ in cands:
        if ranks:
            out.culprits, out.basis = ranks, basis[order]
            break
    if out.no_dump and not cands:
        out.how.append(f"{_ranks(out.no_dump)} left no Flight Recorder dump.")
