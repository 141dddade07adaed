"""Match Events against the catalog and keep what the verdict needs, in bounded memory.

One pass over the Events: stack dumps and stream summaries are set aside, context
lines teach the Context, every other Event (and each line of a multi-line exception
message) is matched against the catalog. Of repeated findings only the first of
each (stream, rank, fingerprint) is kept, with a count; of progress lines only the
latest of each rank. The findings come back in timeline order, kernel findings
outside the window of the job's logs left out, and an Xid that both the kernel
log and NVML reported merged into one finding (``merge_xids``).
"""

from __future__ import annotations

import re
import signal as _signal
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from firstfault.analysis import timeline
from firstfault.analysis.catalog import Catalog, Match
from firstfault.analysis.context import NEEDLES as CONTEXT_NEEDLES
from firstfault.analysis.context import Context
from firstfault.analysis.events import (
    KIND_FLIGHT_RECORDER,
    KIND_LINE,
    KIND_RECORD,
    KIND_STACK,
    KIND_STREAM,
    KIND_TRACEBACK,
    Event,
)
from firstfault.analysis.ownership import owned
from firstfault.analysis.parse import elapsed_s

KERNEL_WINDOW_NS = 10 * 60 * 1_000_000_000  # kernel events this far outside the job's logs are not its
XID_SAME_NS = 2_000_000_000  # the kernel's and NVML's report of one Xid lie this close (plus uncertainties)
MAX_KEPT = 200_000  # distinct findings kept in memory


@dataclass(frozen=True, slots=True)
class Finding:
    """An Event with the catalog signature it matched. Immutable: a stage that learns more of it
    (its rank, that it is a cascade) makes a new one (``dataclasses.replace``)."""

    ev: Event
    match: Match
    links: list[str] = field(default_factory=list)  # how identity was linked, for the evidence; never appended to
    cap: str | None = None  # the most confidence the evidence allows (judge.judge_signals), None: no cap

    @property
    def sig(self) -> str:
        return self.match.signature.id

    def has(self, trait: str) -> bool:
        """Whether its signature carries ``trait`` (catalog.TRAITS)."""
        return trait in self.match.signature.traits

    @property
    def role(self) -> str:
        return self.match.role

    @property
    def category(self) -> str:
        return self.match.category


def linked(f: Finding, link: str | None = None, **ev: object) -> Finding:
    """``f`` with its Event's ``ev`` changes (``rank_from`` goes into its fields) and one more link."""
    rank_from = ev.pop("rank_from", None)
    if rank_from is not None:
        ev["fields"] = {**f.ev.fields, "rank_from": rank_from}
    return replace(f, ev=replace(f.ev, **ev) if ev else f.ev, links=[*f.links, link] if link else f.links)


def int_or_none(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


# glibc strsignal's descriptions, as a shell prints them for a child a signal ended ("Aborted (core dumped)")
STRSIGNAL = {"Aborted": "SIGABRT", "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL",
             "Killed": "SIGKILL", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS", "Terminated": "SIGTERM"}


def exit_of(f: Finding) -> dict | None:
    """The exit a finding reports ({"code", "signal"}), if it reports one."""
    g = f.match.groups
    code = int_or_none(g.get("exitcode"))
    sig = g.get("signal")
    if code is None and not sig:
        return None
    if not sig and code is not None and code < 0:
        try:
            sig = _signal.Signals(-code).name
        except ValueError:
            sig = None
    sig = STRSIGNAL.get(sig, sig) if sig else sig
    if sig and not sig.startswith("SIG") and sig.isdigit():
        try:
            sig = _signal.Signals(int(sig)).name
        except ValueError:
            pass
    return {"code": code, "signal": sig}


_NUM = re.compile(r"0x[0-9a-fA-F]+|\d+")


def fingerprint(f: Finding) -> str:
    """Signature plus the message with numbers blanked: ranks sharing it failed alike."""
    msg = f.ev.fields.get("message") or f.ev.text
    first = msg.strip().splitlines()[-1] if f.ev.kind == "traceback" and msg.strip() else msg
    if not f.has("generic"):
        first = ""
    return f"{f.sig}|{_NUM.sub('#', first)[:200]}"


@dataclass(frozen=True, slots=True)
class Read:
    """What one pass over the Events kept, in bounded memory."""

    findings: list[Finding]
    counts: dict[str, int]
    dumps: list[Event]
    ctx: Context
    dropped: int
    procs: list[Event]  # process starts and exits the agents saw (pid, rank; fields["exit"]: code, signal)
    kernel_span: dict[str | None, tuple[int, int]]  # per node: the times its kernel log covers
    flight: list[Event] = field(default_factory=list)  # Flight Recorder dumps (KIND_FLIGHT_RECORDER)


def read_findings(events: Iterable[Event], catalog: Catalog) -> Read:
    """One pass over placed Events (timeline.placed): match every Event, keep what the verdict
    needs, in timeline order.

    Memory stays bounded whatever the input size: only the latest progress line of
    each rank is kept, and of repeated findings only the first of each (stream,
    rank, fingerprint), with a count.
    """
    ctx = Context()
    summaries: list[Event] = []
    latest: dict[tuple, Finding] = {}
    kept: dict[tuple, Finding] = {}
    counts: dict[str, int] = defaultdict(int)
    dropped = 0
    dumps: dict[tuple, Event] = {}  # the latest stack dump of each (stream, rank, local rank, pid)
    procs: list[Event] = []
    flight: list[Event] = []
    span: dict[str | None, tuple[int, int]] = {}
    fatal: dict[str, Finding] = {}  # each stream's latest fatal error without frames, for the dump under it
    for ev in events:
        if ev.kind == KIND_FLIGHT_RECORDER:
            flight.append(ev)
            continue
        if ev.source == "kernel" and ev.occurred_ns is not None:
            lo, hi = span.get(ev.node, (ev.occurred_ns, ev.occurred_ns))
            span[ev.node] = (min(lo, ev.occurred_ns), max(hi, ev.occurred_ns))
        if ev.kind == KIND_RECORD and "proc" in ev.fields:
            procs.append(ev)
            continue
        if ev.kind == KIND_STREAM:
            summaries.append(ev)
            continue
        if ev.kind == KIND_STACK:
            dumps[(ev.stream, ev.rank, ev.local_rank, ev.pid)] = ev
            _dumped(fatal.pop(ev.stream, None), ev, kept)
            continue
        if any(n in ev.text for n in CONTEXT_NEEDLES):
            ctx.feed(ev.text)
        if ev.kind == KIND_TRACEBACK:
            ctx.feed_paths(ev.text)
        for sub in [ev, *_message_lines(ev), *_glued_bar(ev)]:
            m = catalog.match(sub.text)
            if sub is ev and ev.fields.get("message") and (m is None or m.role == "context"
                                                           or "quoted-exception" in m.signature.traits):
                # exception groups indent their final line; a traceback's own line beats a quote in its
                # text, and a log line printed into it by another thread (a checkpoint load's)
                m = catalog.match(ev.fields["message"]) or m
            if m is not None:
                f = owned(Finding(sub, m))
                dropped += _keep(f, latest, kept, counts)
                if f.has("fatal-error") and not sub.frames:
                    fatal[sub.stream] = f
    findings = list(kept.values()) + list(latest.values())
    findings.sort(key=lambda f: timeline.order_key(f.ev))
    window = _window(summaries)
    if window:
        findings = [f for f in findings if f.ev.source != "kernel" or f.ev.occurred_ns is None
                    or window[0] <= f.ev.occurred_ns <= window[1]]
    return Read(merge_xids(findings), counts, list(dumps.values()), ctx, dropped, procs, span, flight)


FATAL_DUMP_LINES = 3  # faulthandler: "Fatal Python error: Bus error", a blank line, then the threads


def _dumped(fatal: Finding | None, dump: Event, kept: dict) -> None:
    """A fatal error's frames from the stack dump printed right under it: CPython's faulthandler
    (Modules/faulthandler.c faulthandler_fatal_error) writes "Fatal Python error: <signal>", a blank
    line, then each thread's stack, the current one first ("Current thread 0x... (most recent call
    first):", "Thread 0x..." on 3.8-3.11 when it cannot tell). The dump is where the process was
    when the signal came: the failure's frames (its phase), as a traceback's are."""
    if fatal is None or not dump.frames or not 0 < dump.seq - fatal.ev.seq <= FATAL_DUMP_LINES:
        return
    for key, f in kept.items():
        if f is fatal:
            kept[key] = replace(f, ev=replace(f.ev, frames=dump.frames),
                                links=[*f.links, "its frames: the faulthandler dump printed under it"])
            return


def _pci_key(pci: str | None) -> tuple[int, ...] | None:
    """(domain, bus, device) of a PCI address as NVRM (``0000:3b:00``) or NVML (``00000000:3B:00.0``) writes it."""
    parts = (pci or "").split(":")
    parts[-1] = parts[-1].partition(".")[0]
    try:
        nums = tuple(int(p, 16) for p in parts)
    except ValueError:
        return None
    return (0, *nums) if len(nums) == 2 else nums


def _xid_key(f: Finding) -> tuple:
    return f.ev.node, f.match.groups.get("xid"), _pci_key(f.match.groups.get("pci"))


def merge_xids(findings: list[Finding]) -> list[Finding]:
    """One Xid that the kernel log and NVML both reported is one finding: the kernel's line
    (it names the pid and the driver's detail) takes the GPU, its UUID and its processes
    from NVML's report, which is dropped. Each NVML Xid pairs with the nearest unpaired
    kernel line of the same node, GPU and code within XID_SAME_NS (plus both uncertainties)."""
    kernel = [f for f in findings if f.has("xid-kernel")]
    paired: dict[int, Finding] = {}  # id of a kernel finding -> it with NVML's report merged in
    dropped: set[int] = set()
    for f in findings:
        if not f.has("xid-nvml") or not kernel:
            continue
        key, best = _xid_key(f), None
        for k in kernel:
            if id(k) in paired or _xid_key(k) != key:
                continue
            a, b = k.ev.occurred_ns, f.ev.occurred_ns
            dt = 0 if a is None or b is None else abs(a - b)
            if dt <= XID_SAME_NS + k.ev.uncertainty_ns + f.ev.uncertainty_ns and (best is None or dt < best[0]):
                best = (dt, k)
        if best is None:
            continue
        k = best[1]
        dropped.add(id(f))
        fields = {**k.ev.fields,
                  **{x: v for x in ("gpu", "uuid", "pci_bus_id", "pids") if (v := f.ev.fields.get(x)) is not None}}
        pid = f.ev.pid if k.ev.pid is None and k.match.groups.get("pid") is None else k.ev.pid  # NVRM wrote
        # pid='<unknown>': NVML's one process on that GPU
        paired[id(k)] = linked(k, f"NVML reported the same Xid ({f.ev.text.removeprefix('NVML: ')})",
                               fields=fields, pid=pid)
    return [paired.get(id(f), f) for f in findings if id(f) not in dropped]


def _keep(f: Finding, latest: dict, kept: dict, counts: dict) -> int:
    """Keep what the verdict needs of one finding, in bounded memory; 1 when it had to be dropped."""
    ev = f.ev
    if f.has("progress") or f.has("phase-marker"):  # the latest of a rank's progress, of each of its markers
        key = (ev.stream, ev.rank) if f.has("progress") else (ev.stream, ev.rank, f.sig)
        old = latest.get(key)
        if old is None or (ev.occurred_ns or 0) >= (old.ev.occurred_ns or 0):
            latest[key] = f
        if f.has("work-bar"):  # and the longest-running bar of work, which a later bar may hide (timeout_cause)
            old = latest.get((ev.stream, ev.rank, "work-bar"))
            if old is None or (_ran(f) or 0) >= (_ran(old) or 0):
                latest[(ev.stream, ev.rank, "work-bar")] = f
        return 0
    fp = fingerprint(f)
    counts[fp] += 1
    # lines that name a pid, rank, srun task(s) or tag each say something of their own; so does each
    # code site of a back trace (NCCL's "init.cc:1493 -> 2": a bounded set, the calls it climbed)
    g = f.match.groups
    key = (ev.stream, ev.rank, fp, g.get("pid"), g.get("rank"), g.get("local_rank"), g.get("tag"), tuple(g),
           g.get("task"), g.get("tasks"), g.get("site"))
    if ev.source == "kernel":  # one node's kernel log given twice (dmesg and dmesg -T): once
        key = (ev.node, ev.text)
    if key in kept:
        old = kept[key]
        if ev.source == "kernel" and old.ev.occurred_ns is None and ev.occurred_ns is not None:
            kept[key] = f  # the same message from a log whose times are known
        elif old.ev.fields.get("prose") and not ev.fields.get("prose") and f.role == "root" and not f.has("mention"):
            kept[key] = f  # a heading's words, then the log's own line of the failure: the line is the evidence
        elif ev.frames and not old.ev.frames:  # the same failure told again with its traceback: its frames
            kept[key] = replace(old, ev=replace(old.ev, frames=ev.frames, exc_type=old.ev.exc_type or ev.exc_type))
        return 0
    if len(kept) >= MAX_KEPT:
        return 1
    kept[key] = f
    return 0


def _ran(f: Finding) -> int | None:
    """How long a progress bar had run (tqdm's elapsed time), in seconds."""
    return elapsed_s(f.match.groups.get("elapsed"))


def _message_lines(ev: Event) -> list[Event]:
    """The lines of a multi-line exception message as Events of their own.

    torchrun's ChildFailedError carries its whole failure summary (rank, exitcode,
    pid of every failed worker) in the message; each line says something. Each line keeps the
    traceback's frames and exception type: it is a line of the same exception (PyTorch's
    "NCCL error in: ..." then "ncclSystemError: ..." raised from DDP's constructor is set-up).
    """
    msg = ev.fields.get("message") if ev.kind in (KIND_TRACEBACK, KIND_RECORD) else None
    if not msg or "\n" not in msg:
        return []
    return [Event(text=line, source=ev.source, node=ev.node, job=ev.job, occurred_ns=ev.occurred_ns,
                  observed_ns=ev.observed_ns, clock=ev.clock, uncertainty_ns=ev.uncertainty_ns,
                  origin=ev.origin, stream=f"{ev.stream}#{ev.seq}", seq=i, fields=dict(ev.fields),
                  frames=ev.frames, exc_type=ev.exc_type)
            for i, line in enumerate(msg.splitlines()[1:], 1)]


# tqdm's meter up to its closing bracket: "{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}]"
_BAR = re.compile(r"[^\r|\n]*\d{1,3}%\|[^|\n]*\|[^\[\n]*\[\d+:\d\d(?::\d\d)?<[^\]\n]*\]")


def _glued_bar(ev: Event) -> list[Event]:
    """A progress bar another record was printed straight after, on its line (tqdm redraws with a
    carriage return and no newline, so the next message of the process, or of another one in a
    shared console, lands after the bar): the bar as an Event of its own, matched apart from what
    follows it. The record after it keeps the line: its signature is the one a reader needs first,
    and the bar (how long the work had run) is read on its own."""
    if ev.kind != KIND_LINE or "%|" not in ev.text:
        return []
    bar = None
    for m in _BAR.finditer(ev.text):
        if ev.text[m.end():].strip():
            bar = m
    if bar is None or "%|" in ev.text[bar.end():]:
        return []
    return [replace(ev, text=bar.group(0).lstrip("\r"), fields=dict(ev.fields))]


def _window(events: list[Event]) -> tuple[int, int] | None:
    lo = [e.fields["first_ns"] for e in events if e.fields.get("first_ns") is not None]
    hi = [e.fields["last_ns"] for e in events if e.fields.get("last_ns") is not None]
    if not lo or not hi:
        return None
    return min(lo) - KERNEL_WINDOW_NS, max(hi) + KERNEL_WINDOW_NS
