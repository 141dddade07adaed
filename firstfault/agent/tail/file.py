"""One followed file: ``TailedFile`` (one content of one inode: descriptor, offsets, partial
line, fingerprint), ``PathFiles`` (the contents a path has held, in stream order) and
``FileReader``, which reads a file's appended bytes and splits them into LineBatches
(firstfault/agent/tail/tailer.py's docstring is the specification: Lines, long-line cuts,
partial lines). Rotation and truncation are rotation.py's.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from firstfault.agent.tail.lines import FileKey, LineBatch, cut_line

OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


def _short_lines(buf: bytes, mx: int) -> bool:
    """True if no line in ``buf`` can be longer than ``mx``: a newline in every aligned
    window of mx/2 bytes (a longer line would cover one). False: look closer."""
    half = mx // 2
    if half < 4096:  # too many windows: cheaper to measure every line
        return False
    find = buf.find
    return all(find(b"\n", j, j + half) >= 0 for j in range(0, len(buf) - half + 1, half))


def fingerprint(head: bytes) -> str:
    return hashlib.blake2b(head, digest_size=16).hexdigest()


class TailedFile:
    """One content of one inode that a path held: descriptor, offsets, partial line."""

    __slots__ = ("key", "fd", "at_path", "restored", "gone", "read", "line_start", "committed",
                 "fp_len", "fp", "pending", "cut_head", "cut_total", "last_growth", "ahead", "head")

    def __init__(self, key: FileKey, fd: int | None, *, at_path: bool, offset: int = 0,
                 fp_len: int = 0, fp: str = fingerprint(b""), now: float = 0.0):
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


class PathFiles:
    __slots__ = ("path", "fields", "files", "more", "resolved", "error")

    def __init__(self, path: str, fields: Mapping[str, str]):
        self.path, self.fields = path, fields
        self.files: list[TailedFile] = []  # stream order; the last one may be at the path
        self.more = False
        self.resolved = True
        self.error = ""


class FileReader:
    """Reads and splits files with the Tailer's limits; ``on_error(paths, file, what, exc)``
    reports a read that failed (the Tailer's, once per path)."""

    SIZE_SLACK = 64 << 10  # read(size=): bytes asked for beyond the stat's size

    def __init__(self, *, max_line_bytes: int, read_chunk: int, fingerprint_bytes: int,
                 clock: Callable[[], float],
                 on_error: Callable[[PathFiles, TailedFile | None, str, OSError], None]) -> None:
        self.max_line_bytes, self.read_chunk = max_line_bytes, read_chunk
        self.fingerprint_bytes, self.clock, self.on_error = fingerprint_bytes, clock, on_error

    def check_fingerprint(self, f: TailedFile) -> bool:
        """Whether the first fp_len bytes are unchanged; extends the fingerprint as the file grows."""
        if f.fp_len >= self.fingerprint_bytes:  # every poll: the bytes compared, hashed once
            head = os.pread(f.fd, f.fp_len, 0)
            if f.head is not None and f.head[0] == f.fp:
                return head == f.head[1]
            same = len(head) == f.fp_len and fingerprint(head) == f.fp
            if same:
                f.head = f.fp, head
            return same
        head = os.pread(f.fd, self.fingerprint_bytes, 0)
        if len(head) < f.fp_len or (f.fp_len and fingerprint(head[:f.fp_len]) != f.fp):
            return False
        if len(head) > f.fp_len:
            f.fp_len, f.fp = len(head), fingerprint(head)
        return True


    def extend_fingerprint(self, f: TailedFile, data: bytes) -> None:
        """Take the first bytes just read at ``f.read`` into the fingerprint, so that a line
        is never returned from bytes the fingerprint does not cover yet (a file opened empty
        and then written). Only when the file's head still holds the known first bytes and
        the bytes read: a content rewritten meanwhile is rotation.py's ``recheck`` to find."""
        n = self.fingerprint_bytes
        try:
            head = (data[:n] if f.read == 0 else
                    os.pread(f.fd, n, 0)[:f.read + len(data)])
        except OSError:
            return
        if (len(head) > max(f.fp_len, f.read) and head[f.read:] == data[:len(head) - f.read]
                and (not f.fp_len or fingerprint(head[:f.fp_len]) == f.fp)):
            f.fp_len, f.fp = len(head), fingerprint(head)

    def read(self, ps: PathFiles, f: TailedFile, budget: int, now_ns: int,
             out: list[LineBatch], size: int | None = None) -> tuple[int, bool]:
        """Read and split up to ``budget`` bytes; (bytes read, reached the end). ``size``: the
        file's size as a stat just gave it: the first read asks for what is new plus
        SIZE_SLACK (what was written since the stat), not read_chunk bytes. Python allocates
        the whole request: 256 KiB, over glibc's mmap threshold, cost 15-17 us a read here
        for the few kB a steady wake finds; up to 128 KiB, under 1 us."""
        used = 0
        while True:
            want = min(self.read_chunk, budget - used)
            if size is not None:
                want = min(want, max(size - f.read, 0) + self.SIZE_SLACK)
                size = None  # a read that fills it: the file grew, read on in chunks
            if want <= 0:
                return used, False
            try:
                data = os.pread(f.fd, want, f.read)
            except OSError as exc:
                self.on_error(ps, f, "read", exc)
                return used, True
            if not data:
                return used, True
            used += len(data)
            f.last_growth = self.clock()
            if f.fp_len < self.fingerprint_bytes and f.read < self.fingerprint_bytes:
                self.extend_fingerprint(f, data)
            self.split(ps, f, data, now_ns, out)
            if len(data) < want:
                return used, True

    def split(self, ps: PathFiles, f: TailedFile, data: bytes, now_ns: int, out: list[LineBatch]) -> None:
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

    def flush(self, ps: PathFiles, f: TailedFile, now_ns: int, out: list[LineBatch]) -> None:
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

