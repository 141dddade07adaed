"""Place: every Event on one clock, with its uncertainty, once, before anything keeps it. Pure.

``placed`` is the stage: the Events in, each placed (``place``), out. An Event's own
timestamp (line, kmsg, journal, the agent's receipt) is used as it is, moved by its node's
clock offset where one is known (the collector estimates offsets from ping/pong exchanges;
offline there are none). An Event without a timestamp of its own sits between the nearest
timestamped lines of its stream (``fields["after_ns"]``, ``fields["before_ns"]``, which the
scanner fills): it is placed at the middle of that interval with half its width as
uncertainty. An Event with no timestamped line around it has no occurred time: its observed
time (a file's mtime, when a pasted log was read) says when someone saw it, never when it
happened, and the two never mix.

The scanner learns a line's upper bound only when a later stamp of its stream comes, after it
yielded the line: so an untimed line, traceback or stack dump waits in ``placed``, with the
rest of its stream behind it, until its bound is known or its stream ended (its summary,
KIND_STREAM). Each stream's Events keep their order; streams may pass one another. What waits
is the needle hits between two stamps of one stream, at most MAX_WAITING: past that, the
first goes on placed by the stamp before it alone (1 s uncertainty), as a stream's last lines are.

Ordering is by placed time, then stream order; two Events are "within clock uncertainty" of
each other when their intervals overlap. ``spread`` spreads lines placed between the same two
stamps over that interval, for views that draw them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from firstfault.analysis.events import KIND_LINE, KIND_STACK, KIND_STREAM, KIND_TRACEBACK, Event

# Beyond this, a stream's neighbouring timestamps say too little: treat the
# event as if only the earlier one were known.
MAX_BRACKET_NS = 3600 * 1_000_000_000
MAX_WAITING = 100_000  # Events of one stream waiting for their later bound (``placed``)


@dataclass(frozen=True, slots=True)
class NodeClock:
    """A node's clock correction: add offset_ns to its times; error bound uncertainty_ns."""

    offset_ns: int = 0
    uncertainty_ns: int = 0


def place(ev: Event, clocks: Mapping[str, NodeClock] | None = None) -> Event:
    """``ev`` with an occurred time, clock and uncertainty where it had none, and its node's clock
    correction applied: a new Event (``ev`` itself is never changed)."""
    at, unc, clock = ev.occurred_ns, ev.uncertainty_ns, ev.clock
    if at is None:
        lo = ev.fields.get("after_ns")
        hi = ev.fields.get("before_ns")
        if lo is not None and hi is not None and 0 <= hi - lo <= MAX_BRACKET_NS:
            at, unc, clock = (lo + hi) // 2, (hi - lo) // 2, "line"
        elif lo is not None:
            at, unc, clock = lo, max(unc, 1_000_000_000), "line"
        elif hi is not None:
            at, unc, clock = hi, max(unc, 1_000_000_000), "line"
    if clocks and ev.node in clocks and at is not None:
        c = clocks[ev.node]
        at, unc = at + c.offset_ns, unc + c.uncertainty_ns
    if (at, unc, clock) == (ev.occurred_ns, ev.uncertainty_ns, ev.clock):
        return ev
    return replace(ev, occurred_ns=at, uncertainty_ns=unc, clock=clock)


def placed(events: Iterable[Event], clocks: Mapping[str, NodeClock] | None = None,
           max_waiting: int = MAX_WAITING) -> Iterator[Event]:
    """The place stage: every Event placed (``place``), each stream's in the order given; an
    untimed line waits until its stream's next stamp bounds it or its stream ended (or
    ``max_waiting`` of its stream wait)."""
    held: dict[str, deque[Event]] = {}  # per stream: Events waiting, the first of them unbounded
    for ev in events:
        q = held.get(ev.stream)
        if q:
            while q and not _waits(q[0]):
                yield place(q.popleft(), clocks)
        if ev.kind == KIND_STREAM:  # the stream ended: nothing more will bound what waits
            while q:
                yield place(q.popleft(), clocks)
            held.pop(ev.stream, None)
        elif q or _waits(ev):
            q = held.setdefault(ev.stream, deque())
            q.append(ev)
            if len(q) > max_waiting:
                yield place(q.popleft(), clocks)
            continue
        yield place(ev, clocks)
    for q in held.values():
        while q:
            yield place(q.popleft(), clocks)


def _waits(ev: Event) -> bool:
    """A scanned line with no time of its own whose later bound has not come yet."""
    return ev.occurred_ns is None and ev.kind in _SCANNED and "before_ns" not in ev.fields


_SCANNED = frozenset({KIND_LINE, KIND_TRACEBACK, KIND_STACK})


def between_stamps(ev: Event) -> bool:
    """Whether ``ev``'s time was placed between two stamps of its stream (it had none of its own)."""
    return "after_ns" in ev.fields or "before_ns" in ev.fields


def own_ns(ev: Event, clocks: Mapping[str, NodeClock] | None = None) -> int | None:
    """The time ``ev``'s own stamp said (``clocks``: those it was placed with), None where it had none."""
    if ev.occurred_ns is None or between_stamps(ev):
        return None
    c = clocks.get(ev.node) if clocks and ev.node is not None else None
    return ev.occurred_ns - c.offset_ns if c else ev.occurred_ns


def spread(events: list[Event]) -> list[tuple[int | None, int, str | None]]:
    """(occurred_ns, uncertainty_ns, clock) of each placed Event, except that lines without a time
    of their own between the same two stamps of one stream (which ``place`` all puts at the middle
    of that interval) are spread over it in stream order: their order is known, only their times
    are not. Lines after a stream's last stamp, bounded only by the file's mtime (which a copy
    resets), follow that stamp a millisecond apart instead."""
    out = [(ev.occurred_ns, ev.uncertainty_ns, ev.clock) for ev in events]
    groups: dict[tuple, list[int]] = {}
    for i, ev in enumerate(events):
        lo, hi = ev.fields.get("after_ns"), ev.fields.get("before_ns")
        if lo is not None and hi is not None and ev.occurred_ns is not None and 0 < hi - lo <= MAX_BRACKET_NS:
            groups.setdefault((ev.stream, lo, hi), []).append(i)
    for (_, lo, hi), idx in groups.items():
        if len(idx) < 2:
            continue
        idx.sort(key=lambda i: events[i].seq)
        mid = out[idx[0]][0]
        at_end = hi == events[idx[0]].observed_ns
        for k, i in enumerate(idx):
            t = lo + (k + 1) * 1_000_000 if at_end else lo + (hi - lo) * (k + 1) // (len(idx) + 1)
            out[i] = (mid + (t - (lo + hi) // 2), out[i][1], out[i][2])  # keep the node's clock offset
    return out


def order_key(ev: Event) -> tuple:
    """Sort key: placed time (unknown last), then stream and position."""
    t = ev.occurred_ns
    return (t is None, t or 0, ev.stream, ev.seq)


def build(events: Iterable[Event], clocks: Mapping[str, NodeClock] | None = None) -> list[Event]:
    """Place every event and return them in timeline order."""
    out = [place(ev, clocks) for ev in events]
    out.sort(key=order_key)
    return out


def overlap(a: Event, b: Event) -> bool:
    """True when a and b can not be ordered: their time intervals overlap."""
    if a.occurred_ns is None or b.occurred_ns is None:
        return True
    return abs(a.occurred_ns - b.occurred_ns) <= a.uncertainty_ns + b.uncertainty_ns
