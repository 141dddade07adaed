"""Lines -> records: the one machine that says which lines of a stream are one traceback or stack dump.

The agent's ranklog source (which lines it ships as one ``rank.traceback`` or ``rank.stacks``
record) and the offline scanner (scan.py: which lines become one Event) both feed it, line by
line, each line ``visible`` (traceback.visible: no ``\\r`` redraws, no colours) and then
peeled (prefixes.peel: what the prefixes said comes along, a group keeps its first line's)::

    [rank1]: Traceback (most recent call last):      key "rank1", text "Traceback (most ..."
    [rank1]:   File "/w/train.py", line 226, in <module>
    [rank0]: step 5 done                              key "rank0": another printer, not part of it
    [rank1]: ValueError: feature vector has 17 columns

A traceback glued after text the peeler does not know (a collector's ``2023-04-29 06:01:12.977
[task (pid 28936)] [id] Traceback (most recent call last):``) learns that text's shape (``lead``:
its digits any digits): its later lines carry the same prefix, which comes off them before its
grammar reads them. Unknown leading text does not hide the traceback's frames.

A line is one of three records: a plain line, a line of a traceback, a line of a stack dump.
What is open is kept per key (who printed the line: interleaved ranks stay apart), at most one
group a key. A group opens on a line its opener recognises (traceback.opening: a header, a
frame line, a header glued after other output; a stack dump's first line) and ends before the
first line of its key that its grammar says END to (traceback.Grammar, stacks.DumpGrouping or
an assembler that keeps frames as well: stacks.Assembler, traceback.Assembler). Blank lines
the grammar HELD are part of it only if a line it takes follows; when it ends they are plain
lines again (``Group.held`` after ``closed``).

Two openers, one machine: ``RANK_LOG`` groups what a rank log holds (tracebacks, faulthandler
dumps: the agent ships their lines as they were), ``READER`` keeps what the analysis reads of
them as well (frames, exception, a py-spy dump's pid; scan.py).

Invariants: pure, no I/O; a line is in at most one group; ``feed`` returns a group once as
ended (or ``close`` does); memory is the open groups' items (the caller's, None keeps none).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from firstfault.analysis import stacks
from firstfault.analysis import traceback as tb
from firstfault.analysis.prefixes import Peeled
from firstfault.analysis.traceback import END, HELD

TRACEBACK, STACKS = "traceback", "stacks"  # what a group is


class Grouping(Protocol):
    def step(self, text: str) -> int:
        """TAKEN, HELD or END (traceback.py) for the next line of the group's key."""


# text (prefix off, visible) -> None, or (what opens, where in the text, its grammar)
Opener = Callable[[str], "tuple[str, int, Grouping] | None"]


def rank_log_opener(text: str) -> tuple[str, int, Grouping] | None:
    """Tracebacks and faulthandler dumps, grouped by their grammars alone (the agent)."""
    if stacks.starts_dump(text):
        return STACKS, 0, stacks.DumpGrouping(text)
    at = tb.opening(text)
    return None if at is None else (TRACEBACK, at, tb.Grammar(text[at:]))


def reader_opener(text: str) -> tuple[str, int, Grouping] | None:
    """Tracebacks and stack dumps (faulthandler, py-spy), their frames read as they come (the
    analysis: the grouping is the assembler, ``Group.grouping.result()`` at the end)."""
    at = tb.opening(text)
    if at is not None:
        return TRACEBACK, at, tb.Assembler(text[at:])
    if stacks.is_start(text):
        return STACKS, 0, stacks.Assembler(text)
    return None


RANK_LOG: Opener = rank_log_opener
READER: Opener = reader_opener


@dataclass(eq=False, slots=True)
class Group:
    """One traceback or stack dump of one key, open until its grammar ends it."""

    key: str
    kind: str  # TRACEBACK | STACKS
    grouping: Grouping
    at: int  # where in its first line it opens (a header glued after other output)
    first: Peeled  # its first line, and what that line's prefixes said (rank, node, time)
    items: list = field(default_factory=list)  # the caller's handles of its lines, in order
    held: list = field(default_factory=list)  # blank lines it may take; once closed: not its own
    closed: bool = False
    data: Any = None  # the caller's (the Event it becomes, the time it was last fed)
    lead: re.Pattern[str] | None = None  # the shape of an unknown prefix before it (lead_shape)


_DIGITS = re.compile(r"\d+")
MAX_LEAD = 200


def lead_shape(lead: str) -> re.Pattern[str] | None:
    """The shape of the text a traceback is glued after, as a prefix of its later lines: the text with
    each run of digits any run of digits (a time, a pid, a task number change from line to line).
    None where it ends in no separator a prefix ends with (a space, ``]``, ``:``, ``|``)."""
    if not lead.strip() or len(lead) > MAX_LEAD or lead[-1] not in " \t]:|":
        return None
    return re.compile(r"\d+".join(re.escape(part) for part in _DIGITS.split(lead)))


class Assembly:
    """The open groups of one stream, per key; ``feed`` every line in stream order."""

    __slots__ = ("open", "_opener")

    def __init__(self, opener: Opener = RANK_LOG) -> None:
        self.open: dict[str, Group] = {}
        self._opener = opener

    def feed(self, line: Peeled, item: Any = None, *,
             key: str | None = None) -> tuple[Group | None, Group | None, bool]:
        """Offer one line, its prefixes peeled (of a visible line): ``key`` who printed it
        (``line.key`` unless told), ``item`` the caller's handle (kept in the group; None:
        nothing kept). Returns (the group of ``key`` that ended before this line, closed; the
        group the line is now in, taken or held, or None for a plain line; whether that group
        opened on this line)."""
        text = line.text
        if key is None:
            key = line.key
        ended = None
        g = self.open.get(key)
        if g is not None:
            if g.lead is not None and (m := g.lead.match(text)) is not None:
                text = text[m.end():]
            verdict = g.grouping.step(text)
            if verdict != END:
                if item is not None:
                    if verdict == HELD:
                        g.held.append(item)
                    else:
                        if g.held:  # a chain separator: the blank lines were its own
                            g.items.extend(g.held)
                            g.held = []
                        g.items.append(item)
                return None, g, False
            ended = self.close(key)
        got = self._opener(text)
        if got is None:
            return ended, None, False
        kind, at, grouping = got
        g = self.open[key] = Group(key, kind, grouping, at, line, [] if item is None else [item],
                                   lead=lead_shape(text[:at]) if at else None)
        return ended, g, True

    def close(self, key: str) -> Group:
        """End the group of ``key`` as it stands (its stream ended, it went quiet, it grew too big)."""
        g = self.open.pop(key)
        g.closed = True
        return g

    def close_all(self) -> list[Group]:
        return [self.close(k) for k in list(self.open)]
