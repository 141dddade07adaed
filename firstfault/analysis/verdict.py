"""The first distinct failure: per-rank firsts, fingerprints, cascades, hangs.

Input: Findings (an Event on the timeline with the catalog signature it
matched), their identity given (identify.py). Nothing here edits a Finding: a rule
that learns more of one returns a new one. Rules, in order:

(Identity, which rank a finding is, comes before: identify.py.)

2. Each rank's first error is its earliest root finding, else its earliest
   cascade. A cascade (collective timeout, peer closed or reset, launcher
   SIGTERM) never wins while any root exists.
3. Root findings are grouped by fingerprint (signature + message with numbers
   blanked); the first distinct failure is the earliest finding of the earliest
   group. Another candidate within clock uncertainty is reported as a tie.
4. Signals (``judge_signals``): a worker killed by SIGKILL with no kernel OOM
   record tied to it is host-memory at low confidence when no kernel log of its
   node covers the kill (the OOM killer is the usual sender; the dmesg command
   confirms it), and stays unknown when one does and shows no OOM kill. A SIGABRT
   (exit -6, "Fatal Python error: Aborted") after or with a collective timeout is
   how PyTorch's NCCL watchdog takes a rank down: a cascade.
5. No root at all but cascades (or a kill from outside): the job hung; the rank
   that stopped first is inferred (firstfault/analysis/hang.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from firstfault.analysis.findings import Finding, exit_of, fingerprint
from firstfault.analysis.phase import phase_from_frames, phase_hint

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


@dataclass(slots=True)
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
    # what a person wrote about the log (a heading) comes after every line of the log itself
    cands.sort(key=lambda f: (bool(f.ev.fields.get("prose")), f.ev.occurred_ns is None, f.ev.occurred_ns or 0,
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


_QUIET = ("SIGTERM", "SIGINT")  # how launchers stop the survivors: no failure of the rank's own


def exit_failure(findings: list[Finding]) -> Finding | None:
    """When no line says what failed, a worker that exited non-zero (not stopped by its launcher)
    is the failure, at low confidence: the one under torchrun's Root Cause header first (the
    failure its agent observed first), else the earliest. None when no worker exited so."""
    exits = [f for f in findings if f.ev.source != "kernel" and (ex := exit_of(f)) is not None
             and ex["code"] not in (0, None) and ex["signal"] not in _QUIET]
    if not exits:
        return None
    headers = [f for f in findings if "root_cause" in f.match.groups]  # torchrun's "Root Cause (first observed failure):"
    under = [f for f in exits if any(f.ev.stream == h.ev.stream and f.ev.seq > h.ev.seq for h in headers)]
    pick = min(under, key=lambda f: (f.ev.stream, f.ev.seq)) if under else exits[0]  # exits: in timeline order
    return replace(pick, match=replace(pick.match, role="root"), cap="low",
                   links=[*pick.links, "no line of the job says what failed: this worker's exit is the only sign"])


def with_mentioned_category(f: Finding, findings: Iterable[Finding]) -> Finding:
    """A traceback cut before its exception line says nothing of what failed: where the text
    names a class of failure in words (an issue title, a note, a message, a known failure in a
    heading), the first such mention gives the category, said in the links (confidence stays low)."""
    if not f.has("cut-traceback"):
        return f
    said = next((m for m in findings if m.category not in ("unknown", "cascade")
                 and (m.has("mention") or (m.ev.fields.get("prose") and m.role == "root"))), None)
    if said is None:
        return f
    return replace(f, match=replace(f.match, category=said.category),
                   links=[*f.links, f"category from the text's words: {said.ev.text.strip()[:160]}"])


def phase_of(f: Finding, saving_since: int | None, peers: list[Finding], parts: Iterable[Finding] = (),
             before: Iterable[str] = (), sharded: bool | None = None) -> tuple[str, str]:
    """The phase of a failure and where that came from.

    In order: its own frames; the frames of the same failure told elsewhere (``parts``: the rest
    of a traceback cut into pieces, the same signature's traceback on the same rank); the hints
    that are not frames (phase.phase_hint: a Ray task, the collective a timeout names, set-up lines
    in ``before`` with no progress after them); the signature's one phase hint; a checkpoint save
    under way when it happened; the stacks of the ranks that waited for it (a rank killed without
    a stack was in the phase whose collective the others waited in).
    """
    p = phase_from_frames(f.ev.frames)
    if p:
        return p, "frames"
    for part in parts:
        if part is f or part.ev.rank != f.ev.rank or not part.ev.frames:
            continue
        same = part.sig == f.sig if f.ev.rank is not None else part.ev.stream == f.ev.stream
        if (same or (f.has("cut-traceback") and part.has("cut-traceback") and part.ev.stream == f.ev.stream)) \
                and (p := phase_from_frames(part.ev.frames)):
            return p, "frames of the same failure told elsewhere" if not f.has("cut-traceback") else \
                "frames of the rest of the cut traceback"
    hinted = phase_hint(f.ev.text, before, sharded)
    if hinted:
        return hinted
    if f.has("cut-traceback"):  # a cut traceback's own words are missing: the failure a heading names
        named = next((h for h in parts if h.ev.fields.get("prose") and h.role == "root"
                      and len(h.match.signature.phases) == 1), None)
        if named is not None:
            return named.match.signature.phases[0], "the failure the text names in words"
    hints = f.match.signature.phases
    if len(hints) == 1:
        return hints[0], "signature"
    if saving_since is not None and f.ev.occurred_ns is not None and f.ev.occurred_ns >= saving_since:
        return "checkpoint-save", "checkpoint save under way"
    waited = Counter(ph for g in peers if g.ev.rank != f.ev.rank and (ph := phase_from_frames(g.ev.frames)))
    if waited:
        return waited.most_common(1)[0][0], "stacks of the ranks waiting for it"
    if hints:
        return hints[0], "signature"
    return "unknown", "no evidence"


def confidence(f: Finding, tied: bool) -> str:
    """high when a specific signature names the rank and the category and nothing ties or caps it
    (a failure whose category is unknown says what happened, not whose fault it is: no bet)."""
    got = "high"
    if tied or f.has("generic") or f.ev.rank is None or f.category == "unknown" or any("only rank" in x for x in f.links):
        got = "medium"
    return min(got, f.cap or "high", f.match.signature.max_confidence, key=_LEVELS.index)


_LEVELS = ("low", "medium", "high")


# Signatures of a collective that timed out (the watchdog's abort follows them) and of a rank's
# own words as it is aborted.
DMESG = "dmesg -T | grep -i -E 'killed process|out of memory'"


def _aborted(f: Finding) -> bool:
    ex = exit_of(f)
    return (ex is not None and ex["signal"] == "SIGABRT") or (
        f.has("fatal-error") and f.match.groups.get("reason", "").startswith("Aborted"))


def judge_signals(findings: list[Finding], kernel_span: Mapping[str | None, tuple[int, int]],
                  rank_nodes: Mapping[int, str | None]) -> list[Finding]:
    """``findings`` with what a rank's death by signal says (rule 4 of the module): new Findings
    where a signal changes a category, a role or a cap."""
    oom_ranks = {f.ev.rank for f in findings if f.has("oom-kill") and f.ev.rank is not None}
    timeouts = [f for f in findings if f.has("collective-timeout") or (f.role == "cascade" and f.sig.startswith("nccl."))]
    return [_judged(f, oom_ranks, timeouts, kernel_span, rank_nodes)
            if f.role == "root" and f.ev.source != "kernel" else f for f in findings]


def _judged(f: Finding, oom_ranks: set, timeouts: list[Finding], kernel_span: Mapping[str | None, tuple[int, int]],
            rank_nodes: Mapping[int, str | None]) -> Finding:
    ex = exit_of(f)
    if ex and ex["signal"] == "SIGKILL" and f.ev.rank not in oom_ranks:
        node = f.ev.node or rank_nodes.get(f.ev.rank)
        span = kernel_span.get(node) or (kernel_span.get(None) if node is None or len(kernel_span) == 1 else None)
        at = f.ev.occurred_ns
        where = f" of {node}" if node else ""
        if span and at is not None and span[0] <= at <= span[1] + 60 * 1_000_000_000:
            return replace(f, match=replace(f.match, category="unknown", summary=(
                f"A worker (pid {f.match.groups.get('pid', '?')}) was killed with SIGKILL; the kernel log{where} "
                "covers that time and shows no OOM kill, so something else sent it (the scheduler, an "
                "operator, a health check, the process itself).")), cap="medium",
                links=[*f.links, f"the kernel log{where} covers the kill and holds no OOM kill"])
        return replace(f, match=replace(f.match, category="host-memory"), cap="low",
                       links=[*f.links, f"no kernel log{where} covers the kill: the kernel OOM killer is the usual "
                                        f"sender of SIGKILL; confirm with {DMESG} on that node"])
    if _aborted(f):
        mine = [t for t in timeouts if t.ev.rank == f.ev.rank and f.ev.rank is not None]
        before = [t for t in timeouts if t.ev.occurred_ns is not None and f.ev.occurred_ns is not None
                  and t.ev.occurred_ns <= f.ev.occurred_ns + f.ev.uncertainty_ns + t.ev.uncertainty_ns]
        if mine or before:
            t = (mine or before)[0]
            return replace(f, match=replace(f.match, role="cascade", category="cascade"),
                           links=[*f.links, f"SIGABRT after a collective timeout ({t.sig} on rank {t.ev.rank}): how "
                                            "PyTorch takes a rank down once a collective failed, not a cause"])
        return replace(f, cap="medium")  # an abort alone says little of why (a process can abort at teardown, FACTS.md)
    return f
