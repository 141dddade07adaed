"""Bounded samples of long runs, for the views that draw them (memory, the timeline). Pure.

``Bounded`` keeps the first items, an even sample of the middle and the last of a run, and the
one with the highest key; ``Staircase`` keeps, of a set, the last items and those no later one
equals or beats, whatever order they came in (so a store can choose per block what it keeps of
all blocks: analysis/reads.py).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from operator import itemgetter


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
    blocks (analysis/reads.py)."""

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
