"""Decide: the first distinct failure, or the hang it is inferred from. Pure.

Input: the judged Findings (judge.py; an Event on the timeline with the catalog signature it
matched, identity given by identify.py) and each rank's state (rankstate.py). Output: one
Decision. Nothing here edits a Finding: a rule that learns more of one returns a new one.
Rules, in order:

1. Each rank's first error is its earliest root finding, else its earliest cascade
   (rankstate.rank_firsts). A cascade (collective timeout, peer closed or reset, launcher
   SIGTERM) never wins while any root exists.
2. Root findings are grouped by fingerprint (signature + message with numbers blanked); the
   first distinct failure is the earliest finding of the earliest group, told where a rank
   said it, the rank its launcher reported failed where no line named one, its category from
   the text's words where its traceback was cut (judge.with_mentioned_category). Another
   candidate within clock uncertainty is reported as a tie.
3. No root at all but cascades, stack dumps or a Flight Recorder culprit (or a kill from
   outside): the job hung (not where the only cascades are a launcher stopping its workers:
   a worker ended, rule 4); the rank that stopped first is inferred (hang.py), with the Flight
   Recorder's word (``_with_flight_recorder``), and what the log says that rank was doing instead
   (timeout_cause.py: one rank's work outlasting the timeout, code after training ended).
4. Nothing failed in words: a worker's non-zero exit is the failure (judge.exit_failure), its
   category from the text's words where they name one; with no exit in the text, a launcher
   that stopped its workers says one ended (judge.launcher_stopped).
5. No line of the log says what failed (nothing, or only cascades whose hang names no rank
   beyond a low guess): a failure the text names in words (a title, a note) is the answer at
   low confidence (judge.named_in_words), not "no failure" or "stopped first"; with no such
   words and no exit, the kernel's OOM report with its kill line cut off (judge.oom_reported),
   then an exception a line carries from another process (Ray's RayTaskError whose
   worker traceback is cut off), else the last exception the text quotes inside a sentence
   (judge.quoted_exception), at low confidence.

The phase of the failure is decided once, later (failure_phase.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from firstfault.analysis import timeline
from firstfault.analysis.events import Event
from firstfault.analysis.findings import Finding, Read, exit_of, fingerprint, linked
from firstfault.analysis.flight_recorder import FRAnalysis
from firstfault.analysis.flight_recorder import analyze as analyze_flight
from firstfault.analysis.hang import Inference, launcher_act, ranges, stopped_first
from firstfault.analysis.judge import (
    exit_failure,
    heading_phase,
    launcher_stopped,
    named_in_words,
    oom_reported,
    phase_heading,
    quoted_exception,
    with_mentioned_category,
)
from firstfault.analysis.ownership import reports_another
from firstfault.analysis.rankstate import RankState, nccl_work
from firstfault.analysis.timeout_cause import Cause, timeout_cause

BLAME = {
    "user-code": "code",
    "config": "config",
    "gpu-memory": "resources",
    "host-memory": "resources",
    "numerics": "numerics",
    "framework": "framework",
    "hardware": "hardware",
    "network": "infrastructure",
    "storage": "infrastructure",
}
HANG_ID = "hang.stopped_first"
MAX_EVIDENCE = 5  # lines of evidence an inferred failure shows


@dataclass(frozen=True, slots=True)
class Group:
    key: str
    findings: list[Finding]  # in time order
    ranks: list[int]
    count: int = 0


def distinct_failures(findings: list[Finding], firsts: Mapping[int, Finding], counts: Mapping[str, int]) -> list[Group]:
    """Root-cause groups, earliest first: per-rank first roots plus roots tied to no rank.

    ``counts`` says how often each fingerprint was seen in all the input.
    """
    groups: dict[str, Group] = {}
    cands = [f for f in firsts.values() if f.role == "root"]
    cands += [f for f in findings if f.role == "root" and f.ev.rank is None]
    # what a person wrote about the log (a heading) comes after every line of the log itself; of lines
    # with no time (a paste: their order says little), the last resorts (a traceback cut before its
    # exception line, an exception no signature knows) come after a failure a signature names (the
    # same failure, most often, told whole on another rank); of those, a process's report of another's
    # failure (mp.spawn's parent, a launcher) after the failure it reports, which its launcher prints below it;
    # and a failure whose signature is never more than a guess (max_confidence low: NCCL's proxy socket that
    # may have lost a process that ended, a result code's back trace) after one a signature names surely
    cands.sort(key=lambda f: (bool(f.ev.fields.get("prose")), f.ev.occurred_ns is None, f.ev.occurred_ns or 0,
                              f.ev.occurred_ns is None and f.has("generic"),
                              f.ev.occurred_ns is None and reports_another(f),
                              f.ev.occurred_ns is None and f.match.signature.max_confidence == "low",
                              f.ev.stream, f.ev.seq))
    for f in cands:
        key = fingerprint(f)
        g = groups.get(key)
        if g is None:
            g = groups[key] = Group(key, [], [], counts.get(key, 1))
        g.findings.append(f)
        if f.ev.rank is not None and f.ev.rank not in g.ranks:
            g.ranks.append(f.ev.rank)
    return list(groups.values())


def confidence(f: Finding, tied: bool) -> str:
    """high when a specific signature names the rank and the category and nothing ties or caps it
    (a failure whose category is unknown says what happened, not whose fault it is: no bet)."""
    got = "high"
    if tied or f.has("generic") or f.ev.rank is None or f.category == "unknown" or any("only rank" in x for x in f.links):
        got = "medium"
    return min(got, f.cap or "high", f.match.signature.max_confidence, key=_LEVELS.index)


_LEVELS = ("low", "medium", "high")




@dataclass(frozen=True, slots=True)
class Decision:
    """The decide stage's output: what failed first, or how the job hung."""

    groups: list[Group]  # root-cause groups, earliest first
    first: Finding | None  # the first distinct failure a line names (rule 2)
    tied: list[Finding]  # other distinct failures that can not be ordered after it
    exited: Finding | None  # a worker's non-zero exit when nothing failed in words (rule 4)
    inference: Inference | None  # the hang, when no line names a failure (rule 3)
    fr_decided: bool  # the Flight Recorder decided the hang's rank
    cascades: list[Finding]  # the survivors' errors a hang is inferred from (evidence)
    outside: list[Finding]  # the launcher was signalled from outside
    flight: FRAnalysis | None  # the Flight Recorder analysis (None: no dumps given)
    failure_ns: int | None  # when the job failed, where known
    world: int | None  # the job's world size, where known
    known_ranks: set[int]
    gaps: list[dict] = field(default_factory=list)  # what the decision could not read (dumps)
    cause: Cause | None = None  # what the log says the hang's waited-for rank was doing (timeout_cause.py)

    @property
    def named(self) -> Finding | None:
        """The failure a finding says: the first distinct failure, else a worker's exit."""
        return self.first if self.first is not None else self.exited


def decide(findings: list[Finding], state: RankState, read: Read, rank_nodes: Mapping[int, str | None],
           world_size: int | None = None) -> Decision:
    """The first distinct failure of the judged ``findings`` (rules 1-4 of the module)."""
    errors, firsts, activity = state.errors, state.firsts, state.activity
    groups = distinct_failures(errors, firsts, read.counts)
    world = read.ctx.world_size or world_size or max(
        (ev.fields["world_size"] for ev in read.procs if "world_size" in ev.fields), default=None) or read.ctx.seen_size
    known_ranks = set(rank_nodes) | (set(range(world)) if world else set())
    implied: set[int] = set()
    if not world and known_ranks:  # ranks exist up to the highest one seen (no more is known)
        implied = set(range(max(known_ranks) + 1)) - known_ranks
        known_ranks |= implied
    outside = [f for f in findings if f.has("stopped-from-outside")]  # the launcher was signalled from outside
    gaps: list[dict] = []
    fr = _flight(read.flight, world, gaps)
    first = exited = inf = None
    tied: list[Finding] = []
    casc: list[Finding] = []
    failure_ns = None
    fr_decided = False
    dumps = state.dumps.at_hang
    if groups:
        first = with_mentioned_category(_with_exit_rank(_among_sharing(_with_rank(groups[0].findings),
                                                                       groups[0].findings, findings),
                                                        activity.exits, findings), findings)
        failure_ns = first.ev.occurred_ns
        # a tie is another distinct failure that can not be ordered after this one; the
        # same failure on other ranks at the same time is "ranks_sharing", not a tie
        tied = [h for g in groups[1:] for h in g.findings if timeline.overlap(first.ev, h.ev)]
    elif any(ff.role == "cascade" for ff in errors) or dumps:
        casc = (sorted(firsts.values(), key=lambda ff: ff.ev.occurred_ns or 0) or outside
                or [ff for ff in errors if ff.role == "cascade"][:MAX_EVIDENCE])  # cascades no rank said
        failure_ns = min((c.ev.occurred_ns for c in casc if c.ev.occurred_ns is not None), default=None)
    # only a launcher stopping its workers (no rank waited, no stack, no signal from outside): a worker
    # ended and the launcher stopped the rest (DeepSpeed's sigkill_handler, torchrun's SIGTERMs): no hang
    stopping = bool(casc) and not dumps and not outside and not (fr and fr.culprits) and all(
        launcher_act(ff) for ff in errors if ff.role == "cascade")
    if first is None and not stopping and (casc or dumps or (fr and fr.culprits)):
        inf, fr_decided = _with_flight_recorder(
            stopped_first(errors, known_ranks, activity.progress, dumps, nccl_work(findings), implied), fr)
        if not fr_decided and (inf.rank is None or inf.confidence == "low"):
            first = named_in_words(findings, phases=False)  # rule 5: the words name a failure the cascades do not
        if first is None and (said := phase_heading(findings)) is not None:  # the title names the phase
            inf = replace(inf, phase=(heading_phase(said),
                                      f"the text's title says so: {said.ev.text.strip()[:120]}"))
    elif first is None:
        exited = exit_failure(findings)
        if exited is not None:
            exited = with_mentioned_category(exited, findings)
        else:  # a launcher's word that a worker ended outranks a title's that one was killed (death words)
            first = named_in_words(findings, deaths=not stopping)
        if first is None and exited is None and stopping:
            exited = with_mentioned_category(launcher_stopped(casc), findings)
        if first is None and exited is None:
            first = oom_reported(findings) or quoted_exception(findings)  # rule 5's last resorts
    if first is not None and not groups:  # named in words (rule 5): its own group
        inf = None
        groups = [Group(fingerprint(first), [first], [first.ev.rank] if first.ev.rank is not None else [],
                        read.counts.get(fingerprint(first), 1))]
        failure_ns = first.ev.occurred_ns
    cause = timeout_cause(findings) if inf is not None and not outside else None  # rule 3: what it waited for
    return Decision(groups, first, tied, exited, inf, fr_decided, casc, outside, fr, failure_ns, world, known_ranks,
                    gaps, cause)


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


def _among_sharing(first: Finding, same: list[Finding], findings: list[Finding]) -> Finding:
    """The first of a failure other ranks share with no time to order them (a paste without times): the
    order of the text is all there is, so the rank is no bet (medium at most); torchrun's Root Cause
    block, when it names one of those ranks, says which it recorded first. Ranks whose times say they
    failed together are a failure of the job at once (ranks_sharing names them): nothing to order."""
    if first.ev.rank is None:
        return first
    sharing = {h.ev.rank: h for h in same if h.ev.rank not in (None, first.ev.rank)
               and (first.ev.occurred_ns is None or h.ev.occurred_ns is None)}
    if not sharing:
        return first
    root = root_cause_rank(findings)
    if root in sharing:
        f = linked(sharing[root], f"rank {root}: {ROOT_CAUSE}; rank(s) {ranges(sorted({first.ev.rank, *sharing}))} "
                                  "failed the same way, untimed", rank_from=ROOT_CAUSE)
    else:
        f = linked(first, f"rank(s) {ranges(sorted(sharing))} failed the same way, untimed: rank {first.ev.rank} "
                          "is the first printed, not known to be the first")
    return replace(f, cap=min(f.cap or "high", "medium", key=_LEVELS.index))


def root_cause_rank(findings: list[Finding]) -> int | None:
    """The rank of the exit row under torchrun's "Root Cause (first observed failure):" header, when
    every such header names the same one (each node's agent prints its own); else None.

    ChildFailedError.get_first_failure (torch/distributed/elastic/multiprocessing/errors/__init__.py,
    1.9-2.9) takes the failure of least ProcessFailure.timestamp: the worker's error file's
    timestamp (@record), else int(time.time()) when the agent built the failure; whole seconds,
    a tie goes to the first worker of the group (the lowest local rank). First observed, to the second."""
    named = set()
    for h in (f for f in findings if "root_cause" in f.match.groups):
        rows = [f for f in findings if f.ev.stream == h.ev.stream and f.ev.seq > h.ev.seq and f.ev.rank is not None
                and exit_of(f) is not None]
        if rows:
            named.add(min(rows, key=lambda f: f.ev.seq).ev.rank)
    return named.pop() if len(named) == 1 else None


ROOT_CAUSE = ("torchrun's Root Cause (first observed failure): of the ranks that failed, the one its agent "
              "recorded first, to the second (a tie goes to the lowest rank)")


def _with_exit_rank(f: Finding, exits: Mapping[int, dict], findings: list[Finding] = ()) -> Finding:
    """A failure no line tied to a rank is the rank's whose exit the launcher reported as the
    only failure (not stopped by the launcher itself), or, where no exit code was reported, the one
    rank a launcher's word that a worker failed names (Ray Train's "Worker N has failed.", mpirun's
    first process to exit); confidence at most medium. Where several ranks failed, the one
    torchrun's Root Cause block names (``root_cause_rank``), at low."""
    if f.ev.rank is not None or f.ev.source == "kernel":
        return f
    failed = [r for r, ex in exits.items() if ex.get("code") not in (0, None) and ex.get("signal") not in ("SIGTERM", "SIGINT")]
    if not failed:  # no exit code said: a launcher's word that a worker failed, where it names the rank
        failed = sorted({h.ev.rank for h in findings if h.has("child-failed") and h.ev.rank is not None})
    if len(failed) > 1 and (root := root_cause_rank(list(findings))) in failed:
        ev = replace(f.ev, rank=root, fields={**f.ev.fields, "rank_from": ROOT_CAUSE})
        return replace(f, ev=ev, cap="low", links=[*f.links, f"rank {root}: {ROOT_CAUSE}; rank(s) "
                                                             f"{ranges(sorted(failed))} failed"])
    if len(failed) != 1:
        return f
    ev = replace(f.ev, rank=failed[0], fields={**f.ev.fields, "rank_from": "launcher summary (the only rank that failed)"})
    return replace(f, ev=ev, cap="medium" if f.cap in (None, "high") else f.cap,
                   links=[*f.links, f"rank {failed[0]} is the only rank its launcher reported failed"])


def _flight(events: list[Event], world: int | None, gaps: list[dict]) -> FRAnalysis | None:
    """The Flight Recorder analysis of the newest dump of each rank (None: no dumps); an unreadable
    dump is a gap."""
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
