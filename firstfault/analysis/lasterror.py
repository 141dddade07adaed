"""An ncclResult wrapper and the NCCL cause printed under it. Pure.

PyTorch 2.x reports a failed NCCL call as one message over several lines (NCCLUtils.cpp
getNcclErrorDetailStr, ProcessGroupNCCL C10D_NCCL_CHECK):

    torch.distributed.DistBackendError: NCCL error in: .../ProcessGroupNCCL.cpp:1970, internal error - ...
    ncclInternalError: Internal check failed.
    Last error:
    NET/OFI Unable to insert remote address into address vector for device 1. RC: 0

The first lines only name the ncclResult code (signatures with the trait ``nccl-result``); the
line after "Last error:" (``ncclGetLastError``) names the cause, and a signature of its own matches
it (a socket connect, an IB or OFI failure, a duplicate GPU, a CUDA failure, or a peer's socket that
closed: a cascade, whatever code the wrapper names, trait ``peer-socket``). When the message
is a Python traceback the catalog sees it whole and the specific signature wins by file order;
when it is not (a paste of the message alone, a watchdog's C++ exception text), each line is a
finding of its own and the wrapper, one line earlier, would be taken for the failure.

``prefer_details`` drops such a wrapper when its cause follows it in the same stream within
``MAX_GAP`` lines, from the same rank (or both without one), and is a root of a specific
signature: the cause stands for the failure, with the wrapper's words added to its links (a new
finding: the ones given are not changed).

The same holds of NCCL's own back trace (``<file>:<line> -> <code>``, trait ``nccl-trace``): it only
says which ncclResult climbed out of the calls, and the WARN that a process printed just before it
(a cascade like "Connection closed by remote peer" as much as a root) says what happened; NCCL up to
2.12 returned a peer's closed socket as a system error (2), so a survivor's back trace would read
as a network root of its own. ``prefer_details`` drops a back trace when an earlier finding of the
same process (stream and pid) lies within ``TRACE_REACH`` lines above it; a back trace with none
(a paste cut below the WARN) stays, the only sign of the failure. A dropped back trace through
init.cc (the communicator's set-up) is told in the links of the failure above it (``CLIMBED``): the
phase it failed in (failure_phase.nccl_setup).

A native stack trace (trait ``native-trace``: c10's "Exception raised from ... (most recent call
first):" and its "frame #N:" lines, glibc's backtrace_symbols lines) is the tail of the message printed
above it: a watchdog's timeout, a CUDA error, a fatal signal. ``prefer_details`` drops one when a
failure of the same stream (the same rank, or either without one) lies within ``NATIVE_REACH`` lines
above it; one with none (a paste that kept only the frames) stays, the only sign of the failure.

Invariants: the order of the findings kept is unchanged; a wrapper with no such cause below it,
a back trace with no finding of its process above it, and every other finding, are returned as
they came.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol, TypeVar

from firstfault.analysis.hang import launcher_act

WRAPPER = "nccl-result"  # the catalog trait of a signature that only names an ncclResult code
MAX_GAP = 8  # lines from the wrapper to its cause: the code's detail line, "Last error:", the cause,
#               each with a blank line after it where a paste doubled the line breaks
TRACE = "nccl-trace"  # the catalog trait of NCCL's error back trace lines
PEER_SOCKET = "peer-socket"  # the catalog trait of NCCL's words that its socket to a peer closed or broke
TRACE_REACH = 40  # lines a back trace climbs (one line per call) above which its WARN may be
NATIVE = "native-trace"  # the catalog trait of a native stack trace's lines
NATIVE_REACH = 80  # lines from a message to its stack trace: a traceback or a long message between
# NCCL's communicator set-up: a back trace through src/init.cc (ncclCommInitRank, ncclCommInitAll,
# ncclCommSplit, 2.10-2.28) failed while making a communicator (failure_phase.nccl_setup)
SETUP_SITE = re.compile(r"(?:\S*/)?init\.cc:\d+$")
CLIMBED = "NCCL's back trace under it climbs through its communicator set-up:"  # a link of the cause
_ORIGIN = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[\d+\] ")  # NCCL's "host:pid:tid [cudaDev] "


class _Event(Protocol):
    stream: str
    seq: int
    rank: int | None
    pid: int | None
    text: str
    frames: tuple  # a traceback's: where its wrapper was raised, for the cause below it


class _Match(Protocol):
    groups: dict[str, str]


class _Finding(Protocol):  # findings.Finding (a dataclass), as much of it as is read here
    ev: _Event
    links: list[str]
    match: _Match

    @property
    def role(self) -> str: ...

    def has(self, trait: str) -> bool: ...


F = TypeVar("F", bound=_Finding)


def _specific_cause(f: _Finding) -> bool:
    """A root of a specific signature, or NCCL's word that a peer's socket closed (PEER_SOCKET: the wrapper
    only said which ncclResult that became, "internal error" as often as "remote process exited")."""
    stands = f.role == "root" or (f.role == "cascade" and f.has(PEER_SOCKET))
    return stands and not f.has(WRAPPER) and not f.has(TRACE) and not f.has("generic") and not f.has("mention")


def prefer_details(findings: Sequence[F]) -> list[F]:
    """``findings`` without each wrapper whose "Last error:" cause follows it, and without each NCCL
    back trace whose process printed a failure shortly above it (module doc)."""
    causes: dict[tuple[str, int | None], list[F]] = {}
    for f in findings:
        if _specific_cause(f):
            causes.setdefault((f.ev.stream, f.ev.rank), []).append(f)
    dropped: set[int] = set()
    explained: dict[int, list[str]] = {}  # id(cause) -> the wrappers' words, for its links
    raised: dict[int, tuple] = {}  # id(cause) -> the frames of the wrapper it explains (where it was raised)
    for w in findings:
        if not w.has(WRAPPER):
            continue
        below = [c for c in causes.get((w.ev.stream, w.ev.rank), ()) if 0 < c.ev.seq - w.ev.seq <= MAX_GAP]
        if below:
            cause = min(below, key=lambda c: c.ev.seq)
            dropped.add(id(w))
            words = w.ev.text.strip().splitlines()[0][:160] if w.ev.text.strip() else ""
            explained.setdefault(id(cause), []).append(f"the NCCL error it explains: {words}")
            if w.ev.frames and not cause.ev.frames:
                raised.setdefault(id(cause), w.ev.frames)
    seen: dict[tuple[str, str], list[F]] = {}  # (stream, process) -> its failures that are no back trace
    for f in findings:
        proc = _process(f.ev)
        if proc is not None and f.role in ("root", "cascade") and not f.has(TRACE):
            seen.setdefault((f.ev.stream, proc), []).append(f)
    for t in findings:
        proc = _process(t.ev) if t.has(TRACE) else None
        above = [f for f in seen.get((t.ev.stream, proc), ()) if 0 < t.ev.seq - f.ev.seq <= TRACE_REACH] if proc else []
        if above:
            dropped.add(id(t))
            if climbs_setup(t):  # where it failed: set-up
                cause = max(above, key=lambda f: f.ev.seq)
                said = f"{CLIMBED} {t.match.groups['site']}"
                if said not in explained.get(id(cause), ()):
                    explained.setdefault(id(cause), []).append(said)
    failed: dict[str, list[tuple[int, int | None, bool]]] = {}  # stream -> (line, rank, a rank's error) of its failures
    for f in findings:
        if f.role in ("root", "cascade") and not f.has(NATIVE):
            survivor = f.role == "cascade" and not launcher_act(f)  # a rank's own error, not its launcher's act
            failed.setdefault(f.ev.stream, []).append((f.ev.seq, f.ev.rank, survivor))
    for t in findings:
        if t.has(NATIVE):
            stream, seq = _line_of(t.ev)
            if any(_tail_of(seq, t.ev.rank, *f) for f in failed.get(stream, ())):
                dropped.add(id(t))
    return [_explaining(f, explained.get(id(f)), raised.get(id(f))) for f in findings if id(f) not in dropped]


def _explaining(f: F, words: list[str] | None, frames: tuple | None) -> F:
    """A cause with the words of the wrappers it explains in its links, and where the first was
    raised as its frames when it has none of its own (a "Last error:" line has no traceback)."""
    if not words:
        return f
    if frames:
        f = replace(f, ev=replace(f.ev, frames=frames))
    return replace(f, links=[*f.links, *words])


def climbs_setup(t: _Finding) -> bool:
    """Whether ``t`` is a line of NCCL's back trace at a site of its communicator set-up (SETUP_SITE)."""
    return t.has(TRACE) and SETUP_SITE.match(t.match.groups.get("site") or "") is not None


def _line_of(ev: _Event) -> tuple[str, int]:
    """The stream and line of an Event; a line of an exception's message (findings._message_lines: stream
    "<stream>#<seq>") stands at its exception's line."""
    base, _, at = ev.stream.rpartition("#")
    return (base, int(at)) if base and at.isdigit() else (ev.stream, ev.seq)


def _tail_of(trace_seq: int, trace_rank: int | None, seq: int, rank: int | None, survivor: bool) -> bool:
    """Whether a native stack trace at line ``trace_seq`` may be the tail of the failure at ``seq``: within
    NATIVE_REACH lines below it, of the same rank (or either without one). A survivor's error (a rank's
    own cascade, not a launcher stopping it) may also lie below: interleaved ranks, or a paste that put
    one rank's frames above another's message."""
    gap = trace_seq - seq if not survivor else abs(trace_seq - seq)
    return 0 <= gap <= NATIVE_REACH and (rank is None or trace_rank is None or rank == trace_rank)


def _process(ev: _Event) -> str | None:
    """The process that printed an NCCL line: its "host:pid" (from the line: a WARN line's pid is not
    always on the Event), else the Event's pid."""
    m = _ORIGIN.search(ev.text)
    if m is not None:
        return f"{m.group('host')}:{m.group('pid')}"
    return f"?:{ev.pid}" if ev.pid is not None else None
