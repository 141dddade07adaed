"""Lifecycle phase bands from the marks a rank's log leaves. Pure.

Marks (``PhaseMark``, kept by memory.MemoryWatcher): DeepSpeed's see_memory_usage messages that
open and close a phase (``Engine before forward`` ... ``Engine after step`` with
``"memory_breakdown": true``; memlines.point), its resolved-config print (initialize is
over), a checkpoint save's start, and the throughput line that ends a step. DeepSpeed
prints them on rank 0 only and the ranks train in lockstep, so the bands are the job's,
from the one stream that marks the most phases (``phase_bands``): ``init`` from the first
line to the end of initialize, then the phases the marks open and close, or one ``train``
band for a run of steps, and ``checkpoint-save`` from a save's start to the next step.
A band holds (start, end]; ``Bands`` answers which phase covers a time by bisection.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass
from itertools import accumulate

from firstfault.analysis.events import Event

MARKED_PHASES = ("forward", "backward", "optimizer-step", "param-gather")  # phases a log line opens and closes


@dataclass(slots=True)
class PhaseMark:
    """A log line that opens, closes or points at a lifecycle phase (not a job's start/end mark)."""

    ev: Event  # the placed Event that marks it (its text dropped)
    phase: str  # a phase name, "step" (a step ended), "init-end"
    what: str  # open | close | point
    label: str
    stream: str
    tag: str | None = None  # checkpoint-save: the tag being saved


@dataclass(frozen=True, slots=True)
class Band:
    phase: str
    start_ns: int
    end_ns: int
    label: str
    open_end: bool = False  # the stream ended inside it: its rank stopped in this phase


def phase_bands(marks: list[tuple[int, int, PhaseMark]], first_ns: int | None, end_ns: int | None,
                saved: frozenset[str] = frozenset()) -> tuple[list[Band], str | None]:
    """The job's phase bands from one stream's placed marks (time, uncertainty, mark), and that stream.

    A phase still open at the end (a rank that stopped inside it) lasts to the end, except
    a checkpoint save whose tag is known complete (``saved``): it ended, when is not logged."""
    if not marks:
        return [], None
    by_stream: dict[str, list[tuple[int, PhaseMark]]] = defaultdict(list)
    for t, _, m in marks:
        by_stream[m.stream].append((t, m))
    stream, own = max(by_stream.items(), key=lambda kv: (sum(m.what != "point" for _, m in kv[1]), len(kv[1]),
                                                         kv[1][0][1].ev.source == "ranklog"))
    own.sort(key=lambda tm: tm[0])
    start = min(first_ns if first_ns is not None else own[0][0], own[0][0])
    end = max(end_ns if end_ns is not None else own[-1][0], own[-1][0])
    train = [i for i, (_, m) in enumerate(own) if m.phase not in ("init", "init-end")]
    ends = [i for i, (_, m) in enumerate(own) if m.phase == "init-end" and (not train or i < train[0])]
    cut = ends[-1] if ends else (train[0] if train else None)
    bands: list[Band] = []
    init_end = own[cut][0] if cut is not None else end
    bands.append(Band("init", start, init_end, "from the first line to the end of initialize"))
    if cut is None:
        return bands, stream
    fine = any(m.what == "open" and m.phase not in ("init", "checkpoint-save") for _, m in own)
    t_prev = init_end
    open_: tuple[int, PhaseMark] | None = None
    for t, m in own[cut + (1 if ends else 0):]:
        if m.phase in ("init", "init-end"):
            continue
        if m.phase == "step":
            if open_ is not None and open_[1].phase == "checkpoint-save":
                bands.append(Band("checkpoint-save", open_[0], t, open_[1].label))
                open_ = None
            elif open_ is None and not fine and t > t_prev:
                if bands and bands[-1].phase == "train" and bands[-1].end_ns == t_prev:  # one band for a run of steps
                    bands[-1] = Band("train", bands[-1].start_ns, t, m.label)
                else:
                    bands.append(Band("train", t_prev, t, m.label))
            t_prev = t
            continue
        if open_ is not None and (m.what == "open" or m.phase == open_[1].phase):
            bands.append(Band(open_[1].phase, open_[0], t, open_[1].label))
            open_ = None
        if m.what == "open":
            open_ = (t, m)
        t_prev = t
    if open_ is not None and open_[1].tag is not None and open_[1].tag in saved:
        bands.append(Band(open_[1].phase, open_[0], open_[0], open_[1].label + " (complete; its end is not logged)"))
    elif open_ is not None:
        bands.append(Band(open_[1].phase, open_[0], max(end, open_[0]), open_[1].label + " (still open at the end)",
                          open_end=True))
    return bands, stream


class Bands:
    """Phase bands in start order, for asking which phases cover a time (bisect, not a scan)."""

    def __init__(self, bands: list[Band]) -> None:
        self.bands = sorted(bands, key=lambda b: b.start_ns)
        self.starts = [b.start_ns for b in self.bands]
        self.reach = list(accumulate((b.end_ns for b in self.bands), max))  # the latest end so far

    def phase_at(self, t: int | None, unc: int = 0) -> str | None:
        """The phase of the bands over [t - unc, t + unc], when they all agree. A band holds
        (start, end]: a figure printed with the line that ends a step belongs to that step."""
        if t is None:
            return None
        hit = set()
        j = bisect_left(self.starts, t + unc) - 1  # bands that start before t + unc
        while j >= 0 and self.reach[j] >= t - unc:
            if self.bands[j].end_ns >= t - unc:
                hit.add(self.bands[j].phase)
                if len(hit) > 1:
                    return None
            j -= 1
        return hit.pop() if hit else None


def marked_phase(bands: list[Band], t: int | None, unc: int) -> str | None:
    """The phase DeepSpeed's marks put the failure in (a source of failure_phase.py, which decides):
    the bands over its time interval, when they agree; else, when the
    marking rank stopped logging inside a phase DeepSpeed marks (it printed "Engine before step" and
    never "Engine after step") that began before the failure could have, that phase: ranks run in
    lockstep, so it waited there, in the collective of that phase, for the rank that failed."""
    ph = Bands(bands).phase_at(t, unc)
    if ph is not None or t is None or not bands:
        return ph
    last = bands[-1]
    if last.open_end and last.phase in MARKED_PHASES and last.start_ns <= t + unc:
        return last.phase
    return None
