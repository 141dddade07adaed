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
the kernel's log (verdict.judge_signals).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from firstfault.analysis.catalog import Match, Signature, render
from firstfault.analysis.model import Event
from firstfault.analysis.verdict import Finding, exit_of

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


def _finding(ev: Event) -> Finding:
    ex = ev.fields["exit"]
    groups = {"pid": str(ev.pid), "signal": ex["signal"], "exitcode": str(ex["code"]), "meaning": MEANING[ex["signal"]]}
    death = replace(ev, text=f"pid {ev.pid} exited: signal {-ex['code']} ({ex['signal']})", fields={})
    return Finding(death, Match(SIGNATURE, groups, SIGNATURE.category, SIGNATURE.role,
                                render(SIGNATURE.summary, groups)),
                   links=["the agent saw the rank process end by this signal"])


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


def signal_deaths(procs: Iterable[Event], findings: list[Finding]) -> list[Finding]:
    """Root findings for the rank exits by a signal of MEANING the agents saw, where no finding of
    that rank reports the same exit. Call it once identity is linked (facts.identify): a SIGKILL
    that a kernel OOM kill of no rank yet explains gives that kill the rank instead."""
    said = {(f.ev.rank, (exit_of(f) or {}).get("code")) for f in findings if f.ev.rank is not None}
    out = []
    for ev in procs:
        ex = ev.fields.get("exit") or {}
        if ev.fields.get("proc") != "exit" or ex.get("signal") not in MEANING or ev.rank is None:
            continue
        if (ev.rank, ex.get("code")) in said:
            continue
        oom = _oom_kill_of(ev, findings) if ex["signal"] == "SIGKILL" else None
        if oom is None:
            out.append(_finding(ev))
        elif oom.ev.rank is None:
            oom.ev.rank = ev.rank
            oom.links.append(f"rank {ev.rank} (pid {ev.pid}) died by SIGKILL on {ev.node} just after, as the agent saw")
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
