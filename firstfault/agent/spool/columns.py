"""Records as columns, for a source that hands many at once to the spool (Spool.append_columns).

A source that reads lines in chunks (ranklog) knows most of a record's values per
chunk or per file, not per line: the file's job, rank and fields, the chunk's read
time. ``Runs`` keeps such a column as (value, count) runs, so the spool packs and
checks each value once, and no tuple is built per record (building rows and
turning them back into columns cost ~0.3 µs a record: bench/RESULTS.md).

``message`` is a plain list: each value a str, or each bytes that are UTF-8 text
(the tailer's lines as read, once the source knew the chunk is valid UTF-8: they are
packed as msgpack str without being decoded; the spool checks them again). Never
both: the spool packs a column as text only when its first or last value is bytes
(a bytes value among str would go out as msgpack bin, which the wire refuses), so
ColumnsBuilder.build turns a mixed column to str (``as_text``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

from firstfault.wire import COLUMNS, KIND_RANK_LINE, SOURCE_RANKLOG

MESSAGE = COLUMNS.index("message")
FIELDS = COLUMNS.index("fields")


_COUNT = itemgetter(1)  # of a run


class Runs(list):
    """A column as ``[value, count]`` runs, in record order."""

    __slots__ = ()

    def add(self, value: Any, count: int = 1) -> None:
        if self and self[-1][0] is value:
            self[-1][1] += count
        elif count:
            self.append([value, count])

    def values(self) -> list[Any]:
        return list(chain.from_iterable(repeat(v, k) for v, k in self))

    def records(self) -> int:
        """How many records the runs hold."""
        return sum(map(_COUNT, self))

    def cut(self, lo: int, hi: int) -> Runs:
        """The runs of records lo..hi-1."""
        out, at = Runs(), 0
        for v, k in self:
            a, b = max(lo, at), min(hi, at + k)
            if a < b:
                out.append([v, b - a])
            at += k
            if at >= hi:
                break
        return out

    def at(self, i: int) -> Any:
        """Record i's value."""
        at = 0
        for v, k in self:
            at += k
            if i < at:
                return v
        raise IndexError(i)

    def set(self, i: int, value: Any) -> None:
        """Record i takes ``value`` (its run split around it)."""
        at = 0
        for j, (v, k) in enumerate(self):
            if at <= i < at + k:
                parts = [[v, i - at], [value, 1], [v, at + k - i - 1]]
                self[j:j + 1] = [p for p in parts if p[1]]
                return
            at += k
        raise IndexError(i)

    def update(self, changes: Mapping[int, Callable[[Any], Any]]) -> None:
        """Record i takes ``changes[i](its value)``, each in a run of its own: one pass over
        the runs for all of them (``set`` per record scans and splices the runs each time:
        a wake's last row of each of N files made that N² work)."""
        if not changes:
            return
        todo = sorted(changes)
        out: list[list] = []
        at = t = 0
        for v, k in self:
            end = at + k
            if t < len(todo) and todo[t] < end:
                pos = at
                while t < len(todo) and todo[t] < end:
                    i = todo[t]
                    if i < pos:
                        raise IndexError(i)
                    if i > pos:
                        out.append([v, i - pos])
                    out.append([changes[i](v), 1])
                    pos, t = i + 1, t + 1
                if end > pos:
                    out.append([v, end - pos])
            else:
                out.append([v, k])
            at = end
        if t < len(todo):
            raise IndexError(todo[t])
        self[:] = out


Column = Sequence[Any]  # a list (or tuple) of one value per record, or Runs


class Columns:
    """``n`` records as the 13 wire columns (COLUMNS order), each a list or Runs.

    ``chunks``: (first record, count, bytes) where the messages of records
    first..first+count-1 are bytes and the source still holds them joined by newlines
    as read (ranklog's chunk): the redactor searches those as they are instead of
    joining the lines again."""

    __slots__ = ("n", "cols", "chunks")

    def __init__(self, n: int, cols: list[Column], chunks: Sequence[tuple[int, int, bytes]] = ()) -> None:
        self.n, self.cols, self.chunks = n, cols, chunks

    def cut(self, lo: int, hi: int) -> Columns:
        return Columns(hi - lo, [c.cut(lo, hi) if type(c) is Runs else c[lo:hi] for c in self.cols])

    def rows(self) -> list[tuple]:
        """One tuple of the wire columns per record (for a consumer that takes rows),
        messages as str."""
        cols = [c.values() if type(c) is Runs else c for c in self.cols]
        cols[MESSAGE] = as_text(cols[MESSAGE])
        return list(zip(*cols))


def _merged(extra: dict) -> Callable[[dict], dict]:
    return lambda fields: {**fields, **extra}


def as_text(messages: list[str | bytes]) -> list[str]:
    """Every message as str (the bytes ones are UTF-8)."""
    return [m.decode() if type(m) is bytes else m for m in messages]


class ColumnsBuilder:
    """Collects records as columns: ``lines`` for a chunk's rank lines, ``row`` for any
    other record; ``build()`` the Columns."""

    def __init__(self) -> None:
        self.runs = [Runs() for _ in COLUMNS]
        self.message: list[str | bytes] = []
        self.runs[MESSAGE] = None  # type: ignore[call-overload]
        self._mixed = False  # str and bytes messages both added
        self.chunks: list[tuple[int, int, bytes]] = []  # Columns.chunks

    def __len__(self) -> int:
        return len(self.message)

    def lines(self, messages: list[str | bytes], observed_ns: int, job: str | None,
              rank: int | None, local_rank: int | None, fields: dict, joined: bytes | None = None) -> None:
        """``rank.line`` records (severity 6, no occurred time: the collector reads the
        line's own stamp) of one chunk of a rank's file; ``joined``: the messages (bytes)
        joined by newlines, as read (Columns.chunks)."""
        k = len(messages)
        if k and self.message and type(messages[0]) is not type(self.message[0]):
            self._mixed = True
        if joined is not None and k and type(messages[0]) is bytes:
            self.chunks.append((len(self.message), k, joined))
        self.message += messages
        if not k:
            return
        for col, value in zip(self.runs, (SOURCE_RANKLOG, KIND_RANK_LINE, None, None, observed_ns,
                                          None, None, job, rank, local_rank, None, 6, fields)):
            if col is not None:  # Runs.add inline: a chunk a file a wake, 12 columns each
                if col and col[-1][0] is value:
                    col[-1][1] += k
                else:
                    col.append([value, k])

    def row(self, row: tuple) -> None:
        """One record: a tuple of the wire columns."""
        if self.message and type(row[MESSAGE]) is not type(self.message[0]):
            self._mixed = True
        self.message.append(row[MESSAGE])
        for col, value in zip(self.runs, row):
            if col is not None:
                col.add(value)

    def add_fields(self, extra: Mapping[int, dict]) -> None:
        """Record i's fields become ``{**its fields, **extra[i]}``, for every i at once
        (one pass over the runs)."""
        self.runs[FIELDS].update({i: _merged(e) for i, e in extra.items()})

    def build(self) -> Columns:
        cols = list(self.runs)
        cols[MESSAGE] = as_text(self.message) if self._mixed else self.message
        # mixed: the messages turned to str, no chunk of bytes stands for them
        return Columns(len(self.message), cols, () if self._mixed else self.chunks)
