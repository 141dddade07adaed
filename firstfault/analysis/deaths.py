"""A rank the agent saw die by a signal is a failure, not a hang. Pure.

In collector mode a rank that calls ``abort()`` or crashes in native code leaves no
traceback and often no launcher line in what the agents follow; its only witness is
the agent's own exit record (procs ``proc.exit``: the kernel's wait status, its time
from a pidfd). Without a finding for it the verdict saw only its peers' cascades
(``Connection reset by peer``) and inferred a hang. Here each such exit becomes a root
finding (signature RANK_SIGNAL) naming the signal and what it means, unless a finding
of the rank's own already reports the same exit (a launcher's summary). The verdict's
rules then apply as to a launcher's ``exitcode: -N``: a SIGABRT after or with a
collective timeout is a cascade (PyTorch's watchdog abort), a SIGKILL is judged against
the kernel's log (judge.judge_signals).

A death that comes after the job had already failed is how a rank ended, not why the job
did: after an error of the rank's own (a collective timeout it raised), or after another
rank of the job had already exited with a failure (the launcher then tears the rest down:
torchrun, the DeepSpeed launcher, ``srun --kill-on-bad-exit`` and mpirun signal the
survivors, and a rank in a collective's teardown often dies by SIGSEGV or SIGABRT). Such a
death is a cascade finding: shown, never the first failure while a root stands.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from firstfault.analysis.catalog import Match, Signature, render
from firstfault.analysis.events import Event
from firstfault.analysis.findings import Finding, exit_of, linked
from firstfault.analysis.hang import launcher_act

RANK_SIGNAL = "agent.rank_signal"
OOM_BEFORE_NS = 60 * 1_000_000_000
MEANING = {
    "SIGABRT": "it aborted itself: a C++ exception nobody caught or a failed assertion in native code (a CUDA, NCCL "
               "or extension error), or os.abort(); PyTorch's watchdog also aborts a rank after a collective error",
    "SIGSEGV": "an invalid memory access in native code (a C/C++/CUDA extension, a library bug, corrupted memory)",
    "SIGBUS": "a memory access the hardware could not complete: often a memory-mapped file that shrank (a dataset or "
              "checkpoint on a shared filesystem) or a full /dev/shm",
    "SIGKILL": "it was killed outright: the kernel OOM killer, the scheduler or an operator sends SIGKILL",
    "SIGILL": "an illegal instruction: a binary built for another CPU or GPU architecture, or corrupted code",
    "SIGFPE": "an arithmetic fault in native code (an integer division by zero)",
}
SIGNATURE = Signature(
    id=RANK_SIGNAL, role="root", category="unknown", phases=(), needles=(), patterns=(),
    summary="A worker (pid {pid}) died from {signal} without a Python error: {meaning}.",
    first_action=("Check the node's kernel log at that time (segfault, OOM kill, MCE) and rerun with "
                  "PYTHONFAULTHANDLER=1 to get a stack from the dying process."),
    reference="firstfault/agent/sources/procs.py (the exit status of the rank process, read from its zombie); "
              "signal(7)",
    examples=())


def _finding(ev: Event, after: str | None) -> Finding:
    """The death as a root finding, or as a cascade when ``after`` names what failed before it."""
    ex = ev.fields["exit"]
    groups = {"pid": str(ev.pid), "signal": ex["signal"], "exitcode": str(ex["code"]), "meaning": MEANING[ex["signal"]]}
    death = replace(ev, text=f"pid {ev.pid} exited: signal {-ex['code']} ({ex['signal']})", fields={})
    summary = render(SIGNATURE.summary, groups)
    links = ["the agent saw the rank process end by this signal"]
    if after:
        summary = f"A worker (pid {ev.pid}) died from {ex['signal']} after {after}: how it ended, not why the job did."
        links.append(f"it died after {after}")
    return Finding(death, Match(SIGNATURE, groups, SIGNATURE.category, "cascade" if after else SIGNATURE.role,
                                summary), links=links)


def _failed_before(ev: Event, findings: list[Finding], procs: list[Event]) -> str | None:
    """What had already failed in the job when ``ev`` (a rank's death) came: an error of the
    rank's own, a launcher's line that it was stopping this process, or another rank's failing
    exit. None when the death came first.

    A rank's own error is before its death even where its line has no time of its own and the
    agent's receipt stands for it (clock "agent", an upper bound: a traceback is read after it is
    written, late on a loaded node): a dead process prints nothing (a launcher's report of it, which
    may come after, is not its own). So is a launcher's "Killing subprocess <pid>" of this pid: the
    launcher prints it, then signals (the DeepSpeed launcher SIGTERMs its workers and SIGKILLs those
    alive 30 s later)."""
    at = ev.occurred_ns
    if at is None:
        return None
    own = [f for f in findings if f.ev.rank == ev.rank and f.role in ("root", "cascade") and (
        (f.ev.occurred_ns is not None and f.ev.occurred_ns < at)
        or (not launcher_act(f) and (f.ev.occurred_ns is None or f.ev.clock == "agent")))]
    if own:
        return "an error of its own"
    if ev.pid is not None and any(f.has("launcher-stop") and f.match.groups.get("pid") == str(ev.pid)
                                  for f in findings):
        return "its launcher said it was stopping it"
    peers = [p for p in procs if p.fields.get("proc") == "exit" and p.rank is not None and p.rank != ev.rank
             and (p.fields.get("exit") or {}).get("code") not in (None, 0)
             and p.occurred_ns is not None and p.occurred_ns + p.uncertainty_ns < at]
    if peers:
        first = min(peers, key=lambda p: p.occurred_ns)
        return f"rank {first.rank} had already exited ({_exit_words(first.fields['exit'])})"
    return None


def _exit_words(ex: dict) -> str:
    return ex["signal"] if ex.get("signal") else f"code {ex['code']}"


def _oom_kill_of(ev: Event, findings: list[Finding]) -> Finding | None:
    """The kernel's OOM kill that explains a SIGKILL: of this rank, or of no rank yet, on its node,
    up to OOM_BEFORE_NS before the exit (the kill comes first)."""
    at = ev.occurred_ns
    for f in findings:
        k = f.ev
        if (k.source == "kernel" and f.category == "host-memory" and f.role == "root" and k.rank in (None, ev.rank)
                and k.node == ev.node and at is not None and k.occurred_ns is not None
                and at - OOM_BEFORE_NS <= k.occurred_ns <= at + k.uncertainty_ns + ev.uncertainty_ns):
            return f
    return None


def link_oom_kills(procs: Iterable[Event], findings: list[Finding]) -> list[Finding]:
    """``findings`` where a kernel OOM kill of no rank yet explains a SIGKILL of a rank the agents
    saw (``_oom_kill_of``): the kill is that rank's (part of the identify stage)."""
    out = list(findings)
    for ev in procs:
        ex = ev.fields.get("exit") or {}
        if ev.fields.get("proc") != "exit" or ex.get("signal") != "SIGKILL" or ev.rank is None:
            continue
        oom = _oom_kill_of(ev, out)
        if oom is not None and oom.ev.rank is None:
            out[next(i for i, f in enumerate(out) if f is oom)] = linked(oom, f"rank {ev.rank} (pid {ev.pid}) died by SIGKILL on {ev.node} just "
                                              "after, as the agent saw", rank=ev.rank)
    return out


def signal_deaths(procs: Iterable[Event], findings: list[Finding]) -> list[Finding]:
    """Root findings for the rank exits by a signal of MEANING the agents saw, where no finding of
    that rank reports the same exit, and no kernel OOM kill of the rank explains a SIGKILL. Call it
    once identity is linked (identify.identify, which gives such a kill the rank: link_oom_kills)."""
    said = {(f.ev.rank, (exit_of(f) or {}).get("code")) for f in findings if f.ev.rank is not None}
    procs = list(procs)
    out = []
    for ev in procs:
        ex = ev.fields.get("exit") or {}
        if ev.fields.get("proc") != "exit" or ex.get("signal") not in MEANING or ev.rank is None:
            continue
        if (ev.rank, ex.get("code")) in said:
            continue
        if ex["signal"] != "SIGKILL" or _oom_kill_of(ev, findings) is None:
            out.append(_finding(ev, _failed_before(ev, findings, procs)))
    return out


def merged(findings: list[Finding], more: list[Finding]) -> list[Finding]:
    """``findings`` (in timeline order) with ``more`` placed before the first later one."""
    out = list(findings)
    for f in sorted(more, key=lambda f: f.ev.occurred_ns or 0):
        at = f.ev.occurred_ns
        i = next((i for i, g in enumerate(out) if at is not None and g.ev.occurred_ns is not None
                  and g.ev.occurred_ns > at), len(out))
        out.insert(i, f)
    return out
