"""What the tailer hands out (firstfault/agent/tail/tailer.py's docstring is the
specification: Lines, LineBatch, positions, long-line cuts, changes): ``Line``,
``LineBatch``, ``FileKey``, ``Position``, ``FileChange`` (what happened to a followed file:
rotated, deleted, truncated, lost, error, state_reset), ``to_text``, ``cut_line``; the
tailer's errors. Values only, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import accumulate, repeat
from types import MappingProxyType
from typing import NamedTuple

CUT_MARKER = b" [line cut by firstfault: %d bytes dropped]"
MIN_LINE_BYTES = 128

ROTATED, DELETED, TRUNCATED, LOST, ERROR, STATE_RESET = (
    "rotated", "deleted", "truncated", "lost", "error", "state_reset")

NO_FIELDS: Mapping[str, str] = MappingProxyType({})
_tuple_new = tuple.__new__
_plus_one = (1).__add__


class TailError(Exception):
    """A misuse of the tailer (unknown path, commit past what was returned, closed)."""


class StateError(TailError):
    """The state file cannot be used or written."""


class FileKey(NamedTuple):
    dev: int
    ino: int
    serial: int  # one content of one inode, within one Tailer


class Position(NamedTuple):
    path: str
    file: FileKey
    offset: int


class Line(NamedTuple):
    path: str
    offset: int
    data: bytes
    observed_ns: int
    end: int
    file: FileKey
    fields: Mapping[str, str]

    @property
    def text(self) -> str:
        return to_text(self.data)

    @property
    def position(self) -> Position:
        return Position(self.path, self.file, self.end)


class FileChange(NamedTuple):
    """What happened to a followed file (``kind``: ROTATED, DELETED, TRUNCATED, LOST, ERROR,
    STATE_RESET), for the consumer to log or turn into a gap record."""

    path: str
    kind: str
    file: FileKey | None
    offset: int
    detail: str
    observed_ns: int


def to_text(data: bytes) -> str:
    """The consumer's decoding: UTF-8, invalid bytes as ``\\xNN`` (lossless for valid text)."""
    return data.decode("utf-8", "backslashreplace")


def cut_line(head: bytes, total: int, max_line_bytes: int) -> bytes:
    """The cut form of a line of ``total`` bytes whose first bytes are ``head``."""
    keep = max(0, max_line_bytes - len(CUT_MARKER % total))
    k = keep
    # Do not end inside a UTF-8 character: back off over continuation bytes.
    while k > 0 and keep - k < 3 and k < len(head) and head[k] & 0xC0 == 0x80:
        k -= 1
    if k < len(head) and head[k] & 0xC0 == 0x80:
        k = keep  # not UTF-8 anyway
    return head[:k] + CUT_MARKER % (total - k)


class LineBatch:
    """Consecutive lines of one file read in one chunk, in columns.

    ``data[i]`` starts at ``offsets[i]`` and ends before ``ends[i]``; iterating
    yields Line objects. ``stop`` is ``ends[-1]``; ``position`` confirms the batch.
    ``text``: the lines joined by newlines (as read, when they were read whole).
    """

    __slots__ = ("path", "file", "fields", "observed_ns", "start", "stop", "data", "_ends", "_text")

    def __init__(self, path: str, file: FileKey, fields: Mapping[str, str], observed_ns: int,
                 start: int, stop: int, data: list[bytes], ends: list[int] | None = None,
                 text: bytes | None = None):
        self.path, self.file, self.fields, self.observed_ns = path, file, fields, observed_ns
        self.start, self.stop, self.data, self._ends, self._text = start, stop, data, ends, text

    @property
    def text(self) -> bytes:
        if self._text is None:
            self._text = b"\n".join(self.data)
        return self._text

    def __len__(self) -> int:
        return len(self.data)

    @property
    def ends(self) -> list[int]:
        if self._ends is None:  # plain lines: each ends one byte after its data
            self._ends = list(accumulate(map(_plus_one, map(len, self.data)), initial=self.start))[1:]
        return self._ends

    @property
    def offsets(self) -> list[int]:
        return [self.start, *self.ends[:-1]]

    @property
    def position(self) -> Position:
        return Position(self.path, self.file, self.stop)

    def lines(self) -> list[Line]:
        ends = self.ends
        return list(map(_tuple_new, repeat(Line), zip(
            repeat(self.path), [self.start, *ends], self.data, repeat(self.observed_ns),
            ends, repeat(self.file), repeat(self.fields))))

    def __iter__(self) -> Iterator[Line]:
        return iter(self.lines())
