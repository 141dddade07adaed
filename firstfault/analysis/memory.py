"""Memory by lifecycle phase: what each rank held, over time, against its limits. Pure.

The failure guide asks to "record memory by lifecycle phase instead of treating the
final OOM as a steady-state measurement". ``MemoryWatcher`` watches the report's
placed Events (report.watch) and keeps every memory figure with its rank and time:

- from logs (memlines.py): DeepSpeed's see_memory_usage and progress lines, torch's
  memory summary, the CUDA OOM message, the kernel's memcg OOM report (``memory:
  usage``, tied to the process the same report kills) and its ``Killed process``
  line (the victim's RSS at the kill);
- from the agents (records.py, Events with ``fields["memory"]``): ``proc.*``
  ``rss_bytes``, ``cgroup.memory`` ``usage_bytes``/``limit_bytes`` of the cgroup
  holding a rank's pids, ``gpu.memory`` per process ``used_bytes`` (NVML), with the
  GPU's ``total_bytes`` as limit.

Series (per rank, bytes): ``rss`` (host RSS of the process), ``cgroup`` (its memory
cgroup's usage; limit = the cgroup's), ``gpu`` (NVML: GPU memory of the process; limit
= the GPU's), ``allocated`` and ``reserved`` (the framework's allocator: DeepSpeed MA
and CA, torch's summary, the CUDA OOM message), ``host_used`` (DeepSpeed's "CPU
Virtual Memory", the whole node's, as the rank printed it).

Phases (analysis/bands.py): the job's lifecycle bands from the marks DeepSpeed's log
leaves (initialize, the phases ``"memory_breakdown": true`` marks, steps, checkpoint saves).
Memory is bounded per stream (sampling.Bounded: the start, an even sample of the middle, the
end, and each series' peak), except DeepSpeed's throughput line (timer.py, ``MemAllocated=``),
which a run with a small ``steps_per_print`` prints every step on every rank: of those,
per (stream, pid) and per second of the line's own time (``BUCKET_NS``, wider by powers
of two past ``MAX_BUCKETS`` seconds), the watcher keeps the last ``LAST_PER_BUCKET``
lines and the ones no later line of that second equals or beats (sampling.Staircase: the
second's peak and the falls after it). That choice depends on no other second's lines
nor on the order they come in, so the collector's marker (analysis/reads.py) keeps the
same lines per stored block and a report from its marks is the report from every
record. Each kept line is a sample and a step mark: the ``allocated`` series, its peak
and ``at_failure`` come from the kept lines (each second's peak and last line are kept, so
the series' peak and last figure are exact); a second with more than LAST_PER_BUCKET lines
loses its earlier plain ones, so ``at_failure`` may be an earlier line of the failure's
second and a band a step closes may end later within that second. ``count`` is the samples kept. The report's
``memory`` object (README "Memory by phase"; to be added to REPORT.md) is built by
``memory_report``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from statistics import median

from firstfault.analysis import memlines
from firstfault.analysis.bands import Band, Bands, PhaseMark, marked_phase, phase_bands
from firstfault.analysis.context import CONFIG_NEEDLE
from firstfault.analysis.events import KIND_KERNEL, KIND_RECORD, KIND_STREAM, Event
from firstfault.analysis.sampling import Bounded, Staircase
from firstfault.analysis.timeline import NodeClock, own_ns, spread

SERIES = ("rss", "cgroup", "gpu", "allocated", "reserved", "host_used")
MAX_POINTS = 120  # samples per series in the report (peaks, the last and the kernel's kept)
# DeepSpeed's throughput line ends a step (its first steps are warm-up and print none). Not the
# engine's "step=N, skipped=" line: a collector keeps only the latest of those (analysis/reads.py)
# and a report from its marks must be the report from all records.
TIMER = re.compile(r"/global_step=(?P<step>\d+), .*MemAllocated=(?P<ma>[\d.]+)GB, MaxMemAllocated=(?P<max>[\d.]+)GB")
TIMER_NEEDLE = "MemAllocated="  # what every throughput line holds (reads.py finds them by it)
BUCKET_NS = 1_000_000_000  # throughput lines: the staircase of each second (of the line's own clock)
LAST_PER_BUCKET = 8  # throughput lines: the last of each second kept beside its staircase
MAX_BUCKETS = 512  # seconds per (stream, pid) before they widen to 2, 4, ... seconds (<= ~5k lines kept)
_MEMCG_TO_KILL_NS = 5_000_000_000  # a memcg OOM report's usage line and its kill line lie this close
# what every line the watcher reads holds (memlines.NEEDLES, the marks', the kernel's): a fast way past the rest
_ANY = re.compile("|".join(map(re.escape, (*memlines.NEEDLES, "is about to be saved!", CONFIG_NEEDLE, "memory: usage ",
                                           "Killed process ", "out of memory"))))
MAX_BANDS = 1000  # phase bands in the report: the first and the last (a long run has thousands of steps)
_LABEL = {"rss": "host RSS", "cgroup": "memory cgroup", "gpu": "GPU memory (NVML)", "allocated": "allocator: allocated",
          "reserved": "allocator: reserved", "host_used": "node memory used"}


@dataclass(slots=True)
class Sample:
    ev: Event  # the placed Event it was read from (its text dropped, but a kernel report's)
    series: str
    value: int
    limit: int | None
    peak: int | None
    rank: int | None
    pid: int | None
    source: str  # where it was read: a log's line shape or the agent's record kind
    stream: str


SAMPLES_KEPT = (500, 2000, 1000)  # per stream and series: first, middle (evenly), last
MARKS_KEPT = (2000, 6000)  # per stream: first and last phase marks (pairs must stay whole)


def timer_figure(text: str) -> tuple[int, int, int] | None:
    """(step, allocated, max allocated) of DeepSpeed's throughput line, in bytes; None for another line."""
    if TIMER_NEEDLE not in text or (m := TIMER.search(text)) is None:
        return None
    return int(m["step"]), int(float(m["ma"]) * memlines.GIB), int(float(m["max"]) * memlines.GIB)


def timer_key(fig: tuple[int, int, int]) -> int:
    """What a throughput line's staircase ranks it by: the highest figure it holds."""
    return max(fig[1], fig[2])


def timer_key_of(ma: str, max_ma: str) -> int:
    """timer_key of the line whose TIMER match's ``ma`` and ``max`` groups these are."""
    return max(int(float(ma) * memlines.GIB), int(float(max_ma) * memlines.GIB))


class TimerLines:
    """The throughput lines of one (stream, pid) that the memory view keeps: per second
    (``BUCKET_NS``, of each line's own time) a sampling.Staircase (its last LAST_PER_BUCKET lines
    and those no later line beats); past MAX_BUCKETS seconds, the seconds pair up (2 s, then
    4 s...). What stays depends only on the set of lines."""

    __slots__ = ("shift", "buckets")

    def __init__(self) -> None:
        self.shift = 0
        self.buckets: dict[int, Staircase] = {}

    def add(self, t: int, order: tuple, key: int, item) -> None:
        b = (t // BUCKET_NS) >> self.shift
        box = self.buckets.get(b)
        if box is None:
            box = self.buckets[b] = Staircase(LAST_PER_BUCKET)
        box.add(order, key, item)
        while len(self.buckets) > MAX_BUCKETS:
            self.shift += 1
            wide: dict[int, Staircase] = {}
            for k, box in self.buckets.items():
                if (w := wide.get(k >> 1)) is None:
                    wide[k >> 1] = box
                else:
                    w.merge(box)
            self.buckets = wide

    def entries(self) -> list[tuple]:
        return [e for box in self.buckets.values() for e in box.entries]


@dataclass(slots=True)
class MemoryWatcher:
    """Keeps the memory figures and phase marks of the Events it is shown, bounded per stream
    (Bounded: the start, an even sample of the middle, the end, and each series' peak)."""

    _samples: dict[tuple, Bounded] = field(default_factory=dict)
    _marks: dict[str, Bounded] = field(default_factory=dict)
    streams: list[Event] = field(default_factory=list)
    _memcg: dict[str | None, Sample] = field(default_factory=dict)
    _timers: dict[tuple, TimerLines] = field(default_factory=dict)  # their items: (Event, timer_figure)
    _timer_built: list[tuple[PhaseMark, Sample]] | None = None  # what _timers keeps, as marks and samples
    clocks: Mapping[str, NodeClock] | None = None  # the clock corrections the Events were placed with

    def _timer_lines(self) -> list[tuple[PhaseMark, Sample]]:
        """The kept throughput lines, in (time, seq, origin) order. Their marks and samples are made
        here, once, not for each line shown: a long run's lines mostly give way to later ones."""
        if self._timer_built is None:
            kept = sorted((e for t in self._timers.values() for e in t.entries()), key=lambda e: e[0])
            self._timer_built = [_timer_entry(*e[2]) for e in kept]
        return self._timer_built

    @property
    def samples(self) -> list[Sample]:
        return [s for b in self._samples.values() for s in b.items()] + [s for _, s in self._timer_lines()]

    @property
    def marks(self) -> list[PhaseMark]:
        return [m for b in self._marks.values() for m in b.items()] + [m for m, _ in self._timer_lines()]

    def _sample(self, s: Sample) -> None:
        key = (s.stream, s.series, s.pid)
        box = self._samples.get(key)
        if box is None:
            box = self._samples[key] = Bounded(*SAMPLES_KEPT)
        box.add(s, max(s.value, s.peak or 0))

    def _mark(self, m: PhaseMark) -> None:
        box = self._marks.get(m.stream)
        if box is None:
            box = self._marks[m.stream] = Bounded(*MARKS_KEPT)
        box.add(m)

    def __call__(self, ev: Event) -> None:
        if ev.kind == KIND_STREAM:
            self.streams.append(ev)
            return
        if ev.kind == KIND_RECORD and "memory" in ev.fields:
            self._record(ev)
            return
        text = ev.text
        if (fig := timer_figure(text)) is not None:
            # DeepSpeed's throughput line, once a step on a long run: the step's end and its allocator figure
            own = own_ns(ev, self.clocks)  # seconds of the line's own clock, as the store's marks count them
            if own is None:  # no time to put it in a second by: kept as other lines are
                mark, sample = _timer_entry(ev, fig)
                self._mark(mark)
                self._sample(sample)
                return
            lines = self._timers.get((ev.stream, ev.pid))
            if lines is None:
                lines = self._timers[(ev.stream, ev.pid)] = TimerLines()
            lines.add(own, (own, ev.seq, ev.origin), timer_key(fig), (ev, fig))
            self._timer_built = None
            return
        if _ANY.search(text) is None:
            return
        if ev.kind != KIND_KERNEL:
            if "is about to be saved!" in text or CONFIG_NEEDLE in text:
                self._progress_mark(ev)
            elif (p := memlines.point(text)) is not None:
                self._mark(PhaseMark(_kept(ev, text=False), p[0], p[1], p[2], ev.stream))
        for fig in memlines.figures(text):
            s = Sample(_kept(ev, text=ev.kind == KIND_KERNEL), fig.series, fig.value, fig.limit, fig.peak, ev.rank, fig.pid or ev.pid,
                       "kernel OOM report" if ev.kind == KIND_KERNEL else "log", ev.stream)
            if fig.series == "cgroup" and ev.kind == KIND_KERNEL:
                self._memcg[ev.node] = s  # whose it is: the process the same report kills
                continue
            if fig.series == "rss" and ev.kind == KIND_KERNEL:
                cg = self._memcg.pop(ev.node, None)
                if cg is not None and _close(cg.ev, s.ev):
                    cg.pid = s.pid
                    self._sample(cg)
            self._sample(s)

    def _progress_mark(self, ev: Event) -> None:
        text = ev.text
        if CONFIG_NEEDLE in text:
            self._mark(PhaseMark(_kept(ev, text=False), "init-end", "point", "DeepSpeed printed its resolved config", ev.stream))
        elif "is about to be saved!" in text:
            tag = text.partition(" is about to be saved!")[0].rpartition(" ")[2]
            self._mark(PhaseMark(_kept(ev, text=False), "checkpoint-save", "open", f"checkpoint {tag} save started", ev.stream,
                                   tag))

    def _record(self, ev: Event) -> None:
        f = ev.fields
        kind = f["memory"]
        if kind == "cgroup.memory" and f.get("usage_bytes") is not None:
            limit = f.get("hierarchical_limit_bytes") or f.get("limit_bytes")
            for pid in str(f.get("pids") or "").split(","):
                if pid.strip().isdigit():
                    self._sample(Sample(_kept(ev, text=False), "cgroup", int(f["usage_bytes"]), _real_limit(limit), None,
                                               None, int(pid), kind, ev.stream))
        elif kind.startswith("proc.") and f.get("rss_bytes"):
            self._sample(Sample(_kept(ev, text=False), "rss", int(f["rss_bytes"]), None, f.get("peak_rss_bytes"),
                                       ev.rank, ev.pid, kind, ev.stream))
        elif kind == "gpu.memory" and f.get("used_bytes") is not None and ev.pid is not None:
            self._sample(Sample(_kept(ev, text=False), "gpu", int(f["used_bytes"]), f.get("total_bytes"), None,
                                       ev.rank, ev.pid, kind, ev.stream))


def _timer_entry(ev: Event, fig: tuple[int, int, int]) -> tuple[PhaseMark, Sample]:
    """A throughput line's step mark and allocator sample (fig: its timer_figure)."""
    kept = _kept(ev, text=False)
    return (PhaseMark(kept, "step", "point", f"training to the end of step {fig[0]}", ev.stream),
            Sample(kept, "allocated", fig[1], None, fig[2], ev.rank, ev.pid, "log", ev.stream))


def _kept(ev: Event, *, text: bool) -> Event:
    """What a sample or mark keeps of a placed Event: all but its text (unless ``text``) and frames."""
    return replace(ev, text=ev.text if text else "", frames=())


def _close(a: Event, b: Event) -> bool:
    if a.fields.get("seq") is not None and b.fields.get("seq") is not None:
        return 0 < b.fields["seq"] - a.fields["seq"] < 500
    ta, tb = a.occurred_ns or a.observed_ns, b.occurred_ns or b.observed_ns
    return ta is None or tb is None or abs(tb - ta) <= _MEMCG_TO_KILL_NS


def _real_limit(limit) -> int | None:
    """cgroup v1 writes "no limit" as a page-rounded 2**63-1; v2 ships nil."""
    return None if not isinstance(limit, int) or limit >= (1 << 62) else limit


def _decimate(points: list[tuple[int, int]], keep: set[int]) -> list[tuple[int, int]]:
    """At most MAX_POINTS (time, value) points: each time bucket's lowest and highest, plus ``keep``."""
    if len(points) <= MAX_POINTS:
        return points
    lo, hi = points[0][0], points[-1][0]
    width = max(1, (hi - lo) // (MAX_POINTS // 2) + 1)
    buckets: dict[int, list[int]] = {}
    for i, (t, v) in enumerate(points):
        b = buckets.setdefault((t - lo) // width, [i, i])
        if v < points[b[0]][1]:
            b[0] = i
        if v > points[b[1]][1]:
            b[1] = i
    idx = {i for b in buckets.values() for i in b} | keep
    return [points[i] for i in sorted(idx)]


def memory_report(w: MemoryWatcher, *, pids: Mapping[int, int],
                  rank_nodes: Mapping[int, str | None], failed: bool, failure_ns: int | None,
                  failure_unc_ns: int, local_is_global: bool, saved: frozenset[str] = frozenset()) -> dict:
    """The report's ``memory`` object (REPORT.md)."""
    marks, samples = w.marks, w.samples
    when = spread([m.ev for m in marks] + [s.ev for s in samples])
    placed_marks = [(p[0], p[1], m) for m, p in zip(marks, when) if p[0] is not None]
    firsts = [e.fields["first_ns"] for e in w.streams if e.fields.get("first_ns") is not None]
    lasts = [e.fields["last_ns"] for e in w.streams if e.fields.get("last_ns") is not None]
    rows: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    kernel_seen: dict[tuple, tuple] = {}
    unplaced = 0
    for s, (t, unc, _) in zip(samples, when[len(marks):]):
        rank = s.rank
        if rank is None and s.pid is not None:
            rank = pids.get(s.pid)
        if rank is None and local_is_global:
            rank = s.ev.local_rank
        if rank is None or t is None:
            unplaced += 1
            continue
        key = (s.series, s.value, s.pid, s.ev.text) if s.source == "kernel OOM report" else None
        if key is not None:  # one kernel report read from several dumps (kmsg, dmesg, dmesg -T): once
            old = kernel_seen.get(key)
            if old is not None and old[0][1] <= unc:
                continue
            if old is not None:
                rows[old[1]][s.series].remove(old[0])
            kernel_seen[key] = ((t, unc, s), rank)
            rows[rank][s.series].append((t, unc, s))
            continue
        rows[rank][s.series].append((t, unc, s))
    times = [t for r in rows.values() for pts in r.values() for t, _, _ in pts] + [t for t, _, _ in placed_marks]
    end = max([failure_ns or 0, *lasts, *times], default=None) or None
    bands, band_stream = phase_bands(placed_marks, min(firsts + times, default=None), end, saved)
    ranks_out = {}
    notes: list[str] = []
    for rank in sorted(rows):
        series_out = {}
        for name in SERIES:
            pts = rows[rank].get(name)
            if not pts:
                continue
            series_out[name] = _series(name, _one_stream(pts), bands, failure_ns)
            notes += _notes(rank, name, series_out[name])
        ranks_out[str(rank)] = {"node": rank_nodes.get(rank), "series": series_out}
    missing = _missing(rows)
    if unplaced:
        missing.append(f"{unplaced} memory figures named no rank or time and are left out")
    return {
        "unit": "bytes",
        "phases": [{"phase": b.phase, "start_ms": b.start_ns // 1_000_000, "end_ms": b.end_ns // 1_000_000,
                    "label": b.label} for b in (bands if len(bands) <= MAX_BANDS else
                                                bands[:MAX_BANDS // 5] + bands[-(MAX_BANDS - MAX_BANDS // 5):])],
        "phases_from": band_stream,
        "phase_at_failure": marked_phase(bands, failure_ns, failure_unc_ns) if failed else None,
        "ranks": ranks_out,
        "notes": notes,
        "missing": missing,
    }


def _one_stream(pts: list) -> list:
    """One rank's series from its best stream only: a rank's own log over a launcher's copy of it."""
    streams = defaultdict(list)
    for p in pts:
        streams[(p[2].ev.source != "ranklog", p[2].stream)].append(p)
    if len(streams) == 1:
        return sorted(pts, key=lambda p: p[0])
    kernel_or_agent = [p for p in pts if p[2].source != "log"]
    logs = {k: v for k, v in streams.items() if any(p[2].source == "log" for p in v)}
    best = min(logs, key=lambda k: (k[0], -len(logs[k]))) if logs else None
    chosen = [p for p in (logs.get(best, []) if best else []) if p[2].source == "log"] + kernel_or_agent
    return sorted(chosen, key=lambda p: p[0])


def _series(name: str, pts: list, bands: list[Band], failure_ns: int | None) -> dict:
    values = [(t, s.value) for t, _, s in pts]
    limits = [s.limit for _, _, s in pts if s.limit]
    init_end = bands[0].end_ns if bands and bands[0].phase == "init" else None
    before = [p for p in pts if failure_ns is None or p[0] - p[1] <= failure_ns]
    # a sample counts as init or steady only when its whole time interval lies on one side; the
    # kernel's figures are the kill's, not a state
    running = [p for p in before if p[2].source != "kernel OOM report"]
    init = [max(s.value, s.peak or 0) for t, u, s in running if init_end is not None and t + u <= init_end]
    steady = [s.value for t, u, s in running if init_end is None or t - u > init_end]
    by_phase: dict[str, int] = {}
    phases = []
    index = Bands(bands)
    for t, u, s in pts:  # a line's figure is where the line is; the kernel's only within its (seconds') error
        ph = index.phase_at(t, u if s.source == "kernel OOM report" else 0) or "unknown"
        phases.append(ph)
        by_phase[ph] = max(by_phase.get(ph, 0), s.value, s.peak or 0)
    peak = max(max(s.value, s.peak or 0) for _, _, s in pts)
    tops = [i for i, (_, _, s) in enumerate(pts) if max(s.value, s.peak or 0) == peak]
    peak_i = next((i for i in tops if phases[i] != "unknown"), tops[0])
    last = before[-1] if before else None
    kernel = [p for p in pts if p[2].source == "kernel OOM report"]
    at = kernel[-1] if kernel else last
    keep = {peak_i, len(pts) - 1} | {i for i, p in enumerate(pts) if p[2].source == "kernel OOM report"}
    return {
        "label": _LABEL[name],
        "sources": sorted({s.source for _, _, s in pts}),
        "limit": limits[-1] if limits else None,
        "peak": peak,
        "peak_phase": phases[peak_i],
        "init_peak": max(init) if init else None,
        "steady": int(median(steady)) if steady else None,
        "steady_peak": max(steady) if steady else None,
        "by_phase": by_phase,
        "at_failure": None if at is None or failure_ns is None else {
            "value": at[2].value, "limit": at[2].limit, "at_ms": at[0] // 1_000_000, "source": at[2].source,
            "origin": at[2].ev.origin},
        "samples": [[t // 1_000_000, v] for t, v in _decimate(values, keep)],
        "count": len(pts),
    }


def gib(n: int | None) -> str:
    """Bytes as a short human figure (GiB/MiB)."""
    if n is None:
        return "?"
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def _notes(rank: int, name: str, s: dict) -> list[str]:
    out = []
    what = f"rank {rank} {s['label']}"
    ip, st = s["init_peak"], s["steady"]
    if ip and st:
        ratio = ip / st
        if ratio >= 1.2:
            out.append(f"{what}: the init peak {gib(ip)} is {ratio:.1f}x the steady state {gib(st)}; "
                       "initialization, not training, sets the memory this rank needs")
        elif ratio <= 1 / 1.2:
            out.append(f"{what}: the steady state {gib(st)} is above the init peak {gib(ip)}: training grew it")
    at = s.get("at_failure")
    if at and at.get("limit"):
        out.append(f"{what} at the failure: {gib(at['value'])} of its {gib(at['limit'])} limit "
                   f"({100 * at['value'] / at['limit']:.0f}%, {at['source']})")
    elif at and at["source"] == "kernel OOM report":
        out.append(f"{what} at the kill: {gib(at['value'])} (kernel OOM report)")
    return out


def _missing(rows: Mapping[int, Mapping[str, list]]) -> list[str]:
    have = {name for r in rows.values() for name in r}
    out = []
    if "gpu" not in have and "allocated" not in have:
        out.append("GPU memory: no NVML samples (agent with the nvml source) and no allocator figures in the logs "
                   "(DeepSpeed \"memory_breakdown\": true, torch.cuda.memory_summary())")
    if "rss" not in have and "cgroup" not in have:
        out.append("host memory per rank: no agent samples (procs, cgroup sources) and no kernel OOM report")
    return out
