"""Which rank stopped first when no rank failed on its own: a hang, or a job killed from outside. Pure.

Only cascades exist (collective timeouts, lost peers, a launcher that was told to
stop), so the first failure is inferred, and the answer says so, how, and how sure
it is. Inputs are parsed already: each rank's errors (Findings), its last progress,
its stack dump (faulthandler, py-spy, a torchelastic dump: frames, outermost first;
or the stacks another reader parsed, e.g. from Flight Recorder records), the NCCL
work status lines of each rank, and the world size. Rules, strongest first:

1. Stacks (``stack_outlier``): the one rank whose stack is outside any collective
   while the others wait in one is where the job stopped (medium). Also
   (``no_timeout_outlier``) the one rank that reported no collective timeout while
   others did, with a stack dump outside any collective, even when it lost its peer
   afterwards or the launcher's kill is its only error (medium).
2. NCCL work (``work_laggards``): ranks whose last enqueued collective is below the
   one the others timed out in never reached it (PyTorch's watchdog prints
   ``last enqueued NCCL work: E, last completed NCCL work: C``; ranks that did not
   time out print theirs on the dump signal) (medium when one rank, low when more).
2b. Desync (``odd_collective``): at one sequence number of one process group, one rank timed
   out in another collective than every other rank that timed out there (two or more of them,
   agreeing): the ranks' programs took different paths, and the odd one is the likelier to have
   left the common one (medium). PyTorch only checks this itself under
   TORCH_DISTRIBUTED_DEBUG=DETAIL ("Detected mismatch between collectives").
3. Silence: ranks that reported nothing while the others timed out waiting in a
   collective (medium when one rank, low when more). Where the lines of one rank alone were
   given and the world size is unknown, a rank known only because ranks are numbered up to
   the highest one seen (``implied``) may simply be left out of the paste: its silence names
   no one (a suspect at low, never the rank). A gap between ranks whose lines were given
   is a rank that printed nothing.
4. Progress: the rank whose last progress line is earliest (low).

A rank that timed out in a collective itself reached it: it waits, whatever its work
counters say (status lines of two runs pasted together disagree that way).

Several suspects and nothing to single one out: ``rank`` is None and ``suspects``
names them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from firstfault.analysis.events import Event, Frame
from firstfault.analysis.findings import exit_of
from firstfault.analysis.stacks import in_collective
from firstfault.analysis.timeline import overlap

# match groups of lines in which a launcher reports an exit or sends a signal
LAUNCHER_GROUPS = frozenset({"exitcode", "signal", "sent_signal", "death_signal"})


@dataclass(frozen=True, slots=True)
class Work:
    """One rank's NCCL work status: the collective it timed out in (seq, None when it did not),
    the last it enqueued and the last it completed, in process group ``pg``."""

    rank: int
    pg: str
    seq: int | None
    enqueued: int
    completed: int


@dataclass(slots=True)
class Inference:
    rank: int | None
    how: list[str]
    confidence: str  # medium | low
    suspects: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    where: Frame | None = None  # the innermost frame of the rank's stack, when a stack decided
    phase: tuple[str, str] | None = None  # (phase, from where) words outside the evidence give (a title), last


def stack_outlier(stacks: Mapping[int, Sequence[Frame]], waiting: Iterable[int] = ()) -> tuple[int | None, list[int]]:
    """(the one rank whose stack is outside any collective while others wait in one, or None;
    the ranks waiting: those whose stacks are in a collective, and ``waiting``, the ranks other
    evidence shows waiting, e.g. their own collective timeouts)."""
    waiting = set(waiting) | {r for r, frames in stacks.items() if in_collective(frames)}
    elsewhere = [r for r in stacks if r not in waiting]
    return (elsewhere[0] if waiting and len(elsewhere) == 1 else None), sorted(waiting)


def no_timeout_outlier(errors, dumps: Mapping[int, Event]) -> int | None:
    """Rule 1b: the one rank whose stack dump is outside any collective and that reported no
    collective timeout while other ranks did. A rank that stopped (outside the step's
    collective) and later lost its peer, or was killed by the launcher, still stands out."""
    timed = {f.ev.rank for f in errors if f.has("collective-timeout") and f.ev.rank is not None}
    if not timed:
        return None
    lone = [r for r, d in dumps.items() if r not in timed and d.frames and not in_collective(d.frames)]
    return lone[0] if len(lone) == 1 else None


def work_laggards(work: Iterable[Work]) -> tuple[list[int], str]:
    """Ranks that never enqueued the collective others timed out in, and why; ([], "") when
    the status lines single out nobody. Per process group: the one with timeouts."""
    by_pg: dict[str, list[Work]] = {}
    for w in work:
        by_pg.setdefault(w.pg, []).append(w)
    for pg, ws in sorted(by_pg.items()):
        timed = [w for w in ws if w.seq is not None]
        if not timed:
            continue
        stuck = max(w.seq for w in timed)
        waited = {w.rank for w in timed}  # a rank that timed out reached a collective: it waits
        late = sorted({w.rank for w in ws if w.enqueued < stuck and w.rank not in waited})
        if late and len(late) < len({w.rank for w in ws}):
            on = sorted({w.rank for w in timed if w.seq == stuck})
            return late, (f"rank(s) {ranges(late)} last enqueued NCCL work below {stuck}, the collective "
                          f"rank(s) {ranges(on)} timed out in (process group {pg}): they never reached it")
    return [], ""


def odd_collective(errors) -> tuple[int | None, str]:
    """Rule 2b: the one rank that timed out in another collective than the others did at the same
    sequence number of the same process group (at least two others, all in one collective), and why;
    (None, "") when no such rank."""
    at: dict[tuple[str | None, str], dict[int, str]] = {}
    for f in errors:
        g = f.match.groups
        if f.ev.rank is not None and g.get("seq") and g.get("op") and f.has("collective-timeout"):
            at.setdefault((g.get("pg"), g["seq"]), {})[f.ev.rank] = g["op"]
    for (_, seq), ops in sorted(at.items(), key=lambda kv: int(kv[0][1])):
        counts = Counter(ops.values())
        if len(counts) != 2:
            continue
        (common, n), (other, m) = counts.most_common()
        if m == 1 and n >= 2:
            odd = next(r for r, op in ops.items() if op == other)
            others = sorted(r for r, op in ops.items() if op == common)
            return odd, (f"at collective sequence {seq}, rank {odd} timed out in {other} while rank(s) "
                         f"{ranges(others)} timed out in {common}: the ranks called different collectives, and "
                         f"rank {odd} is the one that left the others' path")
    return None, ""


def launcher_act(f) -> bool:
    """A line where a launcher reports or sends a signal or exit, or stops its workers (not the rank's
    own words)."""
    return not LAUNCHER_GROUPS.isdisjoint(f.match.groups) or f.has("launcher-stop")


def stopped_first(errors, known_ranks: Iterable[int], progress: Mapping[int, Event],
                  dumps: Mapping[int, Event] | None = None, work: Iterable[Work] = (),
                  implied: Iterable[int] = ()) -> Inference:
    """Infer the rank that stopped first when only cascades exist (see the module's rules).

    A rank is waiting when it reported a cascade of its own (a timeout, a lost peer) or
    its stack dump shows it in a collective; being sent SIGTERM by the launcher
    afterwards is no sign of waiting. ``implied``: the known ranks no input line belongs to,
    known only as numbers below the highest rank seen (the world size is unknown); their silence
    names no one only where the lines of one rank alone were given.
    """
    errors = list(errors)
    dumps = dumps or {}
    known = sorted(set(known_ranks) | {f.ev.rank for f in errors if f.ev.rank is not None} | set(dumps))
    implied = set(implied) if len(set(known) - set(implied)) == 1 else set()  # one rank's lines alone
    # a rank's SIGABRT judged a cascade (judge.py) where the collective timeout names no rank (a title, a copy
    # without its prefix) is most likely that rank's own watchdog taking it down: it waited (a timeout of another
    # named rank leaves the aborted rank a suspect)
    unnamed = any(f.has("collective-timeout") and f.ev.rank is None for f in errors)
    timed_out = {f.ev.rank for f in errors if f.role == "cascade" and f.ev.rank is not None
                 and (not launcher_act(f) or (unnamed and (exit_of(f) or {}).get("signal") == "SIGABRT"))}
    outlier, waiting_list = stack_outlier({r: d.frames for r, d in dumps.items()}, timed_out)
    waiting = set(waiting_list)
    if outlier is not None:
        fr = dumps[outlier].frames[-1] if dumps[outlier].frames else None
        at = f" in {fr.func} ({fr.file}:{fr.line})" if fr else ""
        return Inference(outlier, [f"the stack dump of rank {outlier} shows it{at}, not in a collective, while "
                                   f"rank(s) {ranges(sorted(waiting))} waited in one"], "medium",
                         [outlier], sorted(waiting), fr)
    lone = no_timeout_outlier(errors, dumps)
    if lone is not None:
        fr = dumps[lone].frames[-1]
        timed = ranges(sorted({f.ev.rank for f in errors if f.has("collective-timeout") and f.ev.rank is not None}))
        return Inference(lone, [f"rank {lone} reported no collective timeout while rank(s) {timed} timed out, and its "
                                f"stack dump shows it in {fr.func} ({fr.file}:{fr.line}), not in a collective"],
                         "medium", [lone], sorted(waiting), fr)
    late, why = work_laggards(work)
    if late:
        return Inference(late[0] if len(late) == 1 else None, [why], "medium" if len(late) == 1 else "low",
                         late, sorted(waiting))
    odd, why = odd_collective(errors)
    if odd is not None:
        return Inference(odd, [why], "medium", [odd], sorted(waiting))
    silent = [r for r in known if r not in waiting]
    if waiting and silent:
        coll = next((f.match.groups for f in errors if f.match.groups.get("seq") and f.match.groups.get("op")), None)
        what = f" ({coll['op']}, sequence {coll['seq']})" if coll else ""
        how = [f"rank(s) {ranges(silent)} reported no error of their own while rank(s) {ranges(sorted(waiting))} "
               f"timed out or lost their peer waiting in a collective{what}"]
        if len(silent) == 1:
            how[0] = how[0].replace("rank(s) ", "rank ", 1).replace("their own", "its own")
            if silent[0] in implied:
                how.append(f"no line of rank {silent[0]} was given and the world size is unknown: it may only be "
                           "missing from the text, so its silence singles out no one")
                return Inference(None, how, "low", silent, sorted(waiting))
            return Inference(silent[0], how, "medium", silent, sorted(waiting))
        if implied.issuperset(silent):
            how.append("no line of these ranks was given and the world size is unknown: they may only be missing "
                       "from the text")
            return Inference(None, how, "low", silent, sorted(waiting))
        first = _earliest(silent, progress)
        if first is not None:
            how.append(f"of them rank {first} logged progress for the last time earliest")
        return Inference(first, how, "low", silent, sorted(waiting))
    pool = silent or known
    first = _earliest(pool, progress)
    if first is not None:
        return Inference(first, [f"rank {first} logged progress for the last time earliest of the ranks that "
                                 "logged progress"], "low", [first], sorted(waiting))
    if len(silent) == 1 and silent[0] not in implied:  # (only reached with nobody waiting)
        return Inference(silent[0], [f"rank {silent[0]} is the only rank not seen waiting in a collective"], "low",
                         silent, sorted(waiting))
    return Inference(None, ["no rank stands out: every rank reported a timeout or none logged progress"], "low",
                     [], sorted(waiting))


def _earliest(pool: Sequence[int], progress: Mapping[int, Event]) -> int | None:
    """The rank of ``pool`` whose last progress is earliest, when clocks can order it."""
    timed = sorted((progress[r].occurred_ns, r) for r in pool
                   if r in progress and progress[r].occurred_ns is not None)
    if timed and (len(timed) == 1 or not overlap(progress[timed[0][1]], progress[timed[1][1]])):
        return timed[0][1]
    return None


def ranges(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (sorted input)."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
