"""The tailer's pieces for one file: value types, the per-file record, reading and splitting.

Part of firstfault/agent/tail.py (its docstring is the specification: Lines, LineBatch,
positions, long-line cuts). Here: ``Line``, ``LineBatch``, ``FileKey``,
``Position``, ``Event``, ``to_text``, ``cut_line``; ``_File`` (one content of
one inode: descriptor, offsets, partial line) and ``_Reader``, the Tailer's
reading and splitting (a mixin: it needs the Tailer's limits and clock).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from itertools import accumulate, repeat
from types import MappingProxyType
from typing import Any, NamedTuple

CUT_MARKER = b" [line cut by firstfault: %d bytes dropped]"
MIN_LINE_BYTES = 128

ROTATED, DELETED, TRUNCATED, LOST, ERROR, STATE_RESET = (
    "rotated", "deleted", "truncated", "lost", "error", "state_reset")

_NO_FIELDS: Mapping[str, str] = MappingProxyType({})
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


class Event(NamedTuple):
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


def _short_lines(buf: bytes, mx: int) -> bool:
    """True if no line in ``buf`` can be longer than ``mx``: a newline in every aligned
    window of mx/2 bytes (a longer line would cover one). False: look closer."""
    half = mx // 2
    if half < 4096:  # too many windows: cheaper to measure every line
        return False
    find = buf.find
    return all(find(b"\n", j, j + half) >= 0 for j in range(0, len(buf) - half + 1, half))


def _fingerprint(head: bytes) -> str:
    return hashlib.blake2b(head, digest_size=16).hexdigest()


class _File:
    """One content of one inode that a path held: descriptor, offsets, partial line."""

    __slots__ = ("key", "fd", "at_path", "restored", "gone", "read", "line_start", "committed",
                 "fp_len", "fp", "pending", "cut_head", "cut_total", "last_growth", "ahead", "head")

    def __init__(self, key: FileKey, fd: int | None, *, at_path: bool, offset: int = 0,
                 fp_len: int = 0, fp: str = _fingerprint(b""), now: float = 0.0):
        self.key, self.fd, self.at_path, self.restored = key, fd, at_path, fd is None
        self.gone = False  # a content truncated away: kept only until its lines are confirmed
        self.read = self.line_start = self.committed = offset  # read >= line_start >= committed
        self.fp_len, self.fp = fp_len, fp
        self.pending = b""  # bytes [line_start, read) of an unfinished line
        self.cut_head: bytes | None = None  # first bytes of an over-long unfinished line
        self.cut_total = 0
        self.last_growth = now
        self.ahead: tuple[int, int, str] | None = None  # restored: (offset, fp_len, fp) to check
        self.head: tuple[str, bytes] | None = None  # (fp, the bytes it hashes): compared, not hashed

    def state(self, path: str) -> dict[str, Any]:
        return {"path": path, "dev": self.key.dev, "ino": self.key.ino, "fp_len": self.fp_len,
                "fp": self.fp, "offset": self.committed}

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _PathState:
    __slots__ = ("path", "fields", "files", "more", "resolved", "error")

    def __init__(self, path: str, fields: Mapping[str, str]):
        self.path, self.fields = path, fields
        self.files: list[_File] = []  # stream order; the last one may be at the path
        self.more = False
        self.resolved = True
        self.error = ""



class _Reader:
    """The Tailer's reading and splitting (mixed into Tailer: uses its limits, clock, _error)."""

    max_line_bytes: int
    read_chunk: int
    fingerprint_bytes: int

    def _check_fingerprint(self, f: _File) -> bool:
        """Whether the first fp_len bytes are unchanged; extends the fingerprint as the file grows."""
        if f.fp_len >= self.fingerprint_bytes:  # every poll: the bytes compared, hashed once
            head = os.pread(f.fd, f.fp_len, 0)
            if f.head is not None and f.head[0] == f.fp:
                return head == f.head[1]
            same = len(head) == f.fp_len and _fingerprint(head) == f.fp
            if same:
                f.head = f.fp, head
            return same
        head = os.pread(f.fd, self.fingerprint_bytes, 0)
        if len(head) < f.fp_len or (f.fp_len and _fingerprint(head[:f.fp_len]) != f.fp):
            return False
        if len(head) > f.fp_len:
            f.fp_len, f.fp = len(head), _fingerprint(head)
        return True


    def _extend_fingerprint(self, f: _File, data: bytes) -> None:
        """Take the first bytes just read at ``f.read`` into the fingerprint, so that a line
        is never returned from bytes the fingerprint does not cover yet (a file opened empty
        and then written). Only when the file's head still holds the known first bytes and
        the bytes read: a content rewritten meanwhile is ``_recheck``'s to find."""
        n = self.fingerprint_bytes
        try:
            head = (data[:n] if f.read == 0 else
                    os.pread(f.fd, n, 0)[:f.read + len(data)])
        except OSError:
            return
        if (len(head) > max(f.fp_len, f.read) and head[f.read:] == data[:len(head) - f.read]
                and (not f.fp_len or _fingerprint(head[:f.fp_len]) == f.fp)):
            f.fp_len, f.fp = len(head), _fingerprint(head)

    def _read(self, ps: _PathState, f: _File, budget: int, now_ns: int,
              out: list[LineBatch]) -> tuple[int, bool]:
        """Read and split up to ``budget`` bytes; (bytes read, reached the end)."""
        used = 0
        while True:
            want = min(self.read_chunk, budget - used)
            if want <= 0:
                return used, False
            try:
                data = os.pread(f.fd, want, f.read)
            except OSError as exc:
                self._error(ps, f, "read", exc)
                return used, True
            if not data:
                return used, True
            used += len(data)
            f.last_growth = self.clock()
            if f.fp_len < self.fingerprint_bytes and f.read < self.fingerprint_bytes:
                self._extend_fingerprint(f, data)
            self._split(ps, f, data, now_ns, out)
            if len(data) < want:
                return used, True

    def _split(self, ps: _PathState, f: _File, data: bytes, now_ns: int, out: list[LineBatch]) -> None:
        mx = self.max_line_bytes
        start = f.line_start
        if f.cut_head is not None:  # skipping the rest of an over-long line
            i = data.find(b"\n")
            if i < 0:
                f.cut_total += len(data)
                f.read += len(data)
                return
            total = f.cut_total + i
            end = start + total + 1
            out.append(LineBatch(ps.path, f.key, ps.fields, now_ns, start, end,
                                 [cut_line(f.cut_head, total, mx)], [end]))
            f.cut_head, f.cut_total = None, 0
            f.read += i + 1
            f.line_start = start = end
            data = data[i + 1:]
            if not data:
                return
        buf = f.pending + data if f.pending else data
        f.read += len(data)
        parts = buf.split(b"\n")
        tail = parts.pop()
        if parts:
            if len(buf) > mx and not _short_lines(buf, mx) and max(map(len, parts)) > mx:
                ends, lines, off = [], [], start
                for p in parts:
                    off += len(p) + 1
                    ends.append(off)
                    lines.append(p if len(p) <= mx else cut_line(p[:mx], len(p), mx))
                out.append(LineBatch(ps.path, f.key, ps.fields, now_ns, start, off, lines, ends))
            else:  # the lines as read: the buffer up to the last newline
                out.append(LineBatch(ps.path, f.key, ps.fields, now_ns, start,
                                     start + len(buf) - len(tail), parts,
                                     text=buf[:len(buf) - len(tail) - 1]))
            start += len(buf) - len(tail)
        f.line_start = start
        if len(tail) > mx:
            f.cut_head, f.cut_total, f.pending = tail[:mx], len(tail), b""
        else:
            f.pending = tail

    def _flush(self, ps: _PathState, f: _File, now_ns: int, out: list[LineBatch]) -> None:
        """Return the unfinished line as a line of its own (rotation, truncation, quiet)."""
        if f.cut_head is not None:
            end = f.line_start + f.cut_total
            data = cut_line(f.cut_head, f.cut_total, self.max_line_bytes)
            f.cut_head, f.cut_total = None, 0
        elif f.pending:
            end = f.line_start + len(f.pending)
            data, f.pending = f.pending, b""
        else:
            return
        out.append(LineBatch(ps.path, f.key, ps.fields, now_ns, f.line_start, end, [data], [end]))
        f.line_start = end

