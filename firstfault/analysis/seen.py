"""Watch the Events on their way into the verdict, and place them later. Pure.

The report reads its Events once (they may come from a generator over gigabytes of
logs). Views that want more than the verdict keeps (memory samples, timeline marks)
watch the same pass: ``watch(events, *watchers)`` hands every Event to each watcher
before the verdict sees it.

A watcher that keeps an Event must not trust its time later: the timeline places
Events in place (``timeline.place`` fills a missing time and moves it by the node's
clock offset), and the verdict may already have done so when the watcher reads it.
``Seen`` remembers an Event's time as it was when first seen; ``Seen.placed`` places
a copy, so every view gets the time the timeline gives, exactly once. The bounds of
a line without a time of its own (``fields["after_ns"]``/``["before_ns"]``) are
filled after it was yielded; ``placed`` reads them when called, after the pass.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import itemgetter

from firstfault.analysis import timeline
from firstfault.analysis.model import Event
from firstfault.analysis.timeline import NodeClock


@dataclass(slots=True)
class Seen:
    """What a view keeps of an Event: its origin and text, and its time as first seen. Not
    the Event itself, which may be large (a whole traceback) and is the verdict's to keep
    or drop; ``fields`` is the Event's own dict, where the scanner writes its bounds."""

    source: str
    node: str | None
    stream: str
    seq: int
    origin: str
    rank: int | None
    local_rank: int | None
    observed_ns: int | None
    fields: dict
    occurred_ns: int | None
    uncertainty_ns: int
    clock: str | None
    text: str

    @classmethod
    def of(cls, ev: Event, *, text: bool = True) -> Seen:
        return cls(ev.source, ev.node, ev.stream, ev.seq, ev.origin, ev.rank, ev.local_rank, ev.observed_ns,
                   ev.fields, ev.occurred_ns, ev.uncertainty_ns, ev.clock, ev.text if text else "")

    def placed(self, clocks: Mapping[str, NodeClock] | None) -> tuple[int | None, int, str | None]:
        """(occurred_ns, uncertainty_ns, clock) as the timeline places the Event."""
        copy = Event(text="", source=self.source, node=self.node, occurred_ns=self.occurred_ns,
                     observed_ns=self.observed_ns, clock=self.clock, uncertainty_ns=self.uncertainty_ns,
                     fields={k: self.fields[k] for k in ("after_ns", "before_ns") if k in self.fields})
        copy = timeline.place(copy, clocks)
        return copy.occurred_ns, copy.uncertainty_ns, copy.clock


def watch(events: Iterable[Event], *watchers: Callable[[Event], None]) -> Iterator[Event]:
    """Every Event, after each watcher has seen it."""
    for ev in events:
        for w in watchers:
            w(ev)
        yield ev


def spread(items: list[Seen], clocks: Mapping[str, NodeClock] | None) -> list[tuple[int | None, int, str | None]]:
    """``placed`` of each, except that lines without a time of their own between the same two
    stamps of one stream (which the timeline all puts at the middle of that interval) are
    spread over it in stream order: their order is known, only their times are not. Lines
    after a stream's last stamp, bounded only by the file's mtime (which a copy resets),
    follow that stamp a millisecond apart instead."""
    out = [s.placed(clocks) for s in items]
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(items):
        lo, hi = s.fields.get("after_ns"), s.fields.get("before_ns")
        if s.occurred_ns is None and lo is not None and hi is not None and out[i][0] is not None \
                and 0 < hi - lo <= timeline.MAX_BRACKET_NS:
            groups.setdefault((s.stream, lo, hi), []).append(i)
    for (_, lo, hi), idx in groups.items():
        if len(idx) < 2:
            continue
        idx.sort(key=lambda i: items[i].seq)
        mid = out[idx[0]][0]
        at_end = hi == items[idx[0]].observed_ns
        for k, i in enumerate(idx):
            t = lo + (k + 1) * 1_000_000 if at_end else lo + (hi - lo) * (k + 1) // (len(idx) + 1)
            out[i] = (mid + (t - (lo + hi) // 2), out[i][1], out[i][2])  # keep the node's clock offset
    return out


class Bounded:
    """At most ``head`` + ``middle`` + ``tail`` items of a long run, in order: the first, an even
    sample of the middle (a stride that doubles when full), the last; and the one with the
    highest ``key``, wherever it was."""

    def __init__(self, head: int, tail: int, middle: int = 0) -> None:
        self.head_n, self.tail_n, self.middle_n = head, tail, middle
        self.head: list = []
        self.middle: list = []
        self.tail: deque = deque()
        self.stride, self.passed, self.count = 1, 0, 0
        self.top: tuple | None = None

    def add(self, item, key: int | None = None) -> None:
        self.count += 1
        entry = (self.count, item)
        if key is not None and (self.top is None or key > self.top[0]):
            self.top = (key, entry)
        if len(self.head) < self.head_n:
            self.head.append(entry)
            return
        self.tail.append(entry)
        if len(self.tail) <= self.tail_n:
            return
        out = self.tail.popleft()
        if not self.middle_n:
            return
        self.passed += 1
        if (self.passed - 1) % self.stride == 0:
            self.middle.append(out)
            if len(self.middle) >= self.middle_n:
                self.middle, self.stride = self.middle[::2], self.stride * 2

    def items(self) -> list:
        kept = self.head + self.middle + list(self.tail)
        if self.top is not None and self.top[1] not in kept:
            kept.append(self.top[1])
            kept.sort(key=lambda e: e[0])
        return [item for _, item in kept]



class Staircase:
    """Of a set of items, the last ``last`` (in ``order``) and those that no later item equals or
    beats by ``key`` (its strict suffix maxima: the highest, at its latest occurrence, and the
    falls after it), in order. Unlike Bounded, what it keeps does not depend on the order the
    items came in, and of a part of the set that drops a prefix (in ``order``) it keeps only
    items that the whole kept: so a store can choose, per block, the items this keeps of all
    blocks (analysis/marks.py)."""

    __slots__ = ("last", "entries")

    def __init__(self, last: int) -> None:
        self.last = last
        self.entries: list[tuple] = []  # (order, key, item), order rising

    def add(self, order: tuple, key: int, item) -> None:
        e = self.entries
        i = bisect_right(e, order, key=itemgetter(0))
        if len(e) - i >= self.last and any(x[1] >= key for x in e[i:]):
            return  # neither among the last nor beating every later item
        e.insert(i, (order, key, item))
        keep, top = [], None
        for k, x in enumerate(reversed(e)):  # the later items' highest is among the kept ones
            if k < self.last or top is None or x[1] > top:
                keep.append(x)
            top = x[1] if top is None else max(top, x[1])
        keep.reverse()
        self.entries = keep

    def merge(self, other: Staircase) -> None:
        for order, key, item in other.entries:
            self.add(order, key, item)

    def items(self) -> list:
        return [item for _, _, item in self.entries]
