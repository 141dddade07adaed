"""One timeline: every Event placed on one clock, with its uncertainty.

An Event's own timestamp (line, kmsg, journal) is used as it is, moved by its
node's clock offset where one is known (the collector estimates offsets from
ping/pong exchanges; offline there are none). An Event without a timestamp of
its own sits between the nearest timestamped lines of its stream
(``fields["after_ns"]``, ``fields["before_ns"]``): it is placed at the middle of
that interval with half its width as uncertainty. An Event with no timestamped
line around it has no occurred time: its observed time (a file's mtime, when a
pasted log was read) says when someone saw it, never when it happened, and the
two never mix. Such Events keep their order within their stream.

Ordering is by placed time, then stream order; two Events are "within clock
uncertainty" of each other when their intervals overlap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from firstfault.analysis.model import Event

# Beyond this, a stream's neighbouring timestamps say too little: treat the
# event as if only the earlier one were known.
MAX_BRACKET_NS = 3600 * 1_000_000_000


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
