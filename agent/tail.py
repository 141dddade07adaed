"""Follow growing log files byte-exactly across rotation and restarts: the tailer core.

This docstring is the specification. The ranklog source wraps this module; it knows
nothing of sources, records or the wire. It reads per-rank log files such as
``/logs/12345/rank3.log`` whose lines look like::

    [2026-12-02 10:11:59,782] [INFO] [logging.py:123:log_dist] [Rank 0] step=10 loss=2.31

API
    ``Tailer(state_path, *, max_line_bytes=65536, read_chunk=256 KiB,
    fingerprint_bytes=1024, partial_flush_s=5.0, clock=time.monotonic)``
    follows a set of paths: ``add(path, fields=None)``, ``remove(path)``.
    ``poll_file(path) -> list[Line]`` reads what was appended since the last poll
    (at most ``read_chunk`` bytes a call; ``more(path)`` says there is more to read)
    and returns the complete lines; ``poll_batches(path) -> list[LineBatch]`` is
    the same data in columns (one list of bytes per read chunk), for consumers
    that build columnar wire batches (no object per line: ~4x cheaper, see
    bench/tail.py). ``take_events() -> list[Event]`` returns what happened to the
    files. ``positions()``, ``commit(positions)``, ``commit_through(*lines)``
    confirm lines (below). ``next_deadline()`` / ``due_paths()`` tell when a poll
    would flush a quiet partial line. ``close()`` closes every file descriptor.
    ``FollowLoop(tailer, globs, on_lines, stop_event)`` drives a Tailer from
    watchdog (inotify) events; ``compile_glob`` turns ``/logs/{job}/rank{rank}.log``
    into a glob and a regex with named parts. One Tailer per state file; a Tailer
    is thread-safe (one lock), a FollowLoop runs in the thread that calls run().

Lines
    ``Line(path, offset, data, observed_ns, end, file, fields)``: ``data`` is the
    line's bytes without its ``\\n`` (a ``\\r`` before it is kept), never decoded.
    The consumer decodes where it needs text (the wire's ``message`` is str),
    with ``to_text(data)``: UTF-8, each invalid byte as ``\\xNN``
    (backslashreplace), so nothing is dropped or replaced by U+FFFD; the text is
    not reversible where a line itself holds a literal ``\\xNN``. ``offset`` is where
    the line starts in its file, ``end`` where the next one starts (``offset +
    len + 1`` for a plain line). ``file`` is a ``FileKey(dev, ino, serial)``:
    ``serial`` tells apart two contents of one inode (before/after a truncation)
    and is valid within one Tailer only. ``fields`` is the read-only mapping given
    to ``add`` (the named parts of the glob). ``observed_ns``: wall clock when the
    chunk holding the line was read.

    A partial last line (no ``\\n`` yet) waits. It is returned as a line (whose
    ``end`` has no newline) when the file has not grown for ``partial_flush_s``
    (the next poll after that), when its file is rotated away, deleted or
    truncated; a flush ends the line: bytes appended later start a new line.
    A line longer than ``max_line_bytes`` is cut: ``data`` is its first bytes
    (backed off to a UTF-8 character start) + ``b" [line cut by firstfault: N
    bytes dropped]"``, at most ``max_line_bytes`` in all; the rest of the line is
    skipped without being held in memory; ``end`` is still the real end.

Positions and the commit contract (exactly once across restarts)
    Per path the lines form one stream: the files the path has held, oldest first,
    each in offset order. ``positions()`` gives per path a ``Position(path, file,
    offset)`` just after the last line returned; ``commit_through(line)`` is
    ``commit([Position(line.path, line.file, line.end)])``. A commit says "the
    consumer has durably taken every line of this path's stream up to here"; it
    returns after the state file is written and fsynced (and renamed, and its
    directory fsynced). Positions only move forward; a stale one (an older
    content of a truncated file, a removed path) is ignored; one past what was
    returned raises TailError. Nothing but a commit moves a saved offset, so
    after a restart a new Tailer returns exactly the lines after the last commit:
    confirmed lines never again, unconfirmed ones again (at-least-once
    delivery is not the contract; exactly-once of confirmed lines is), except
    the losses listed under known issues, which are reported as events.

State file (JSON, replaced atomically: write ``<state>.tmp``, fsync, rename, fsync dir)
    ``{"format": "firstfault.tail", "version": 1, "files": [{"path": str,
    "dev": int, "ino": int, "fp_len": int, "fp": str, "offset": int}, ...]}``
    One entry per file a path still needs: the files of one path in stream order
    (rotated ones still unconfirmed first, the file at the path last). ``offset``
    is the committed offset (a line start); ``fp`` is the hex BLAKE2b-128 of the
    file's first ``fp_len`` bytes (``fp_len = min(fingerprint_bytes, size)``,
    growing with the file). Written on each commit that changes it, and when the
    set of files changes (a file opened, truncated or dropped, or its first bytes
    seen for the first time), so a file the tailer has opened is found again after
    a restart. Nothing else is in it: read offsets beyond the committed ones live
    in memory only. Unknown format or version:
    StateError. Unparsable: renamed to ``<state>.corrupt``, a ``state_reset`` event,
    every file read again from 0 (duplicates rather than losses).

Rotation rules (checked at every poll of a path: stat(path), fstat(fd), pread of
the fingerprint bytes)
    * rename (logrotate create), delete-recreate: the inode at the path changed or
      is gone. The old file, whose descriptor stays open, is read to its end, its
      partial line flushed, then closed ("drained then dropped"); only then is the
      new file at the path opened and read from offset 0. Events ``rotated`` /
      ``deleted``.
    * copytruncate, truncate then rewrite: same inode, but size < read offset or
      the fingerprint bytes changed. The partial line in memory is flushed, the
      file is read again from 0 as a new content (new ``serial``). Event
      ``truncated``.
    * restart: each saved file is looked up by inode at the path, then in the
      path's directory (a file rotated while the agent was down, e.g.
      ``rank3.log.1``), and accepted only if its first ``fp_len`` bytes still hash
      to ``fp`` and it is at least ``offset`` long; it is then read from
      ``offset`` (drained if not at the path). A file saved while empty
      (``fp_len`` 0) is recognised at its path only. The device number is not
      required to match (it can change across reboots). A saved file not found
      or not recognised: event ``lost``. A file at the path matching no saved
      file is new: read from 0.
    * a content truncated away stays in memory (not in the state file) until its
      returned lines are confirmed, so commits of its lines still count.
    * a path that does not exist yet is followed from its creation, from 0.

Events ``Event(path, kind, file, offset, detail, observed_ns)``, kinds:
    rotated, deleted, truncated, lost, error (an open/read failure; repeated
    identical errors of a path are reported once), state_reset. They are kept
    (at most max_events, oldest dropped) until ``take_events()``; a consumer turns
    ``lost``/``truncated`` into gap records. The FollowLoop hands over a poll's
    events before its lines.

Invariants
    Within one Tailer, every byte of a followed file from where following started
    is covered by exactly one returned line (a cut line covers its dropped bytes)
    or reported lost by an event; across restarts the same holds for confirmed
    lines. Per path, lines come in stream order; ``offset <= end`` and the lines of
    one file tile it. At most one descriptor per inode; memory per file is bounded
    by ``max_line_bytes`` plus one read chunk.

Cost (bench/tail.py, bench/RESULTS.md)
    ``read_chunk`` is 256 KiB, not 1 MiB: glibc serves 1 MiB buffers from fresh
    mmap()ed pages until its dynamic mmap threshold has grown (hundreds of page
    faults per MiB read), which cost 2.7x the CPU per line here; 256 KiB buffers
    are reused. Reading and splitting: ~0.2 µs/line in columns, ~0.8 with a Line
    per line; idle FollowLoop ~0.06% CPU.

Known issues
    * copytruncate loses what the writer wrote between our last read and the
      truncation (inherent to copytruncate: the copy is not followed). Lines read
      but not confirmed before a truncation, or in a deleted file when the agent
      restarts, cannot come again (the bytes are gone).
    * A rotated file is closed as soon as it is drained: a writer that still
      appends to the old inode after that (before reopening) loses those lines.
    * A file created and rotated away between two polls is never seen; so is a
      rotated file the agent had only seen empty if it restarts before draining it.
    * Identity is inode + fingerprint: a truncate-and-rewrite to at least the old
      size whose first ``fp_len`` bytes are unchanged goes unnoticed (the tail
      is then read from the old offset); so does an inode reused by a file with
      the same first bytes. A file renamed back to a path it left is read again.
    * Rotated files are searched only in the path's own directory.
    * ``to_text`` of a line with invalid bytes is up to 4x longer than ``data``
      (``\\xNN``): a consumer bound by the wire's 64 KiB message limit must cut
      again after decoding.
    * The kernel's inotify queue can overflow; watchdog then only logs it: the
      FollowLoop's safety poll (every ``safety_poll_s``) catches up.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat as _stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from glob import glob as _glob
from itertools import accumulate, repeat
from types import MappingProxyType
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

STATE_FORMAT = "firstfault.tail"
STATE_VERSION = 1
CUT_MARKER = b" [line cut by firstfault: %d bytes dropped]"
MIN_LINE_BYTES = 128

ROTATED, DELETED, TRUNCATED, LOST, ERROR, STATE_RESET = (
    "rotated", "deleted", "truncated", "lost", "error", "state_reset")

_NO_FIELDS: Mapping[str, str] = MappingProxyType({})
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
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
    """

    __slots__ = ("path", "file", "fields", "observed_ns", "start", "stop", "data", "_ends")

    def __init__(self, path: str, file: FileKey, fields: Mapping[str, str], observed_ns: int,
                 start: int, stop: int, data: list[bytes], ends: list[int] | None = None):
        self.path, self.file, self.fields, self.observed_ns = path, file, fields, observed_ns
        self.start, self.stop, self.data, self._ends = start, stop, data, ends

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
                 "fp_len", "fp", "pending", "cut_head", "cut_total", "last_growth")

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


class Tailer:
    """Follows files by path; see the module docstring for the contract."""

    def __init__(self, state_path: str | os.PathLike[str] | None, *, max_line_bytes: int = 64 * 1024,
                 read_chunk: int = 256 << 10, fingerprint_bytes: int = 1024,
                 partial_flush_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 max_events: int = 10_000):
        if max_line_bytes < MIN_LINE_BYTES:
            raise ValueError(f"max_line_bytes must be >= {MIN_LINE_BYTES}, got {max_line_bytes}")
        if read_chunk < 1 or fingerprint_bytes < 1:
            raise ValueError("read_chunk and fingerprint_bytes must be >= 1")
        self.state_path = os.fspath(state_path) if state_path is not None else None
        self.max_line_bytes, self.read_chunk = max_line_bytes, read_chunk
        self.fingerprint_bytes, self.partial_flush_s = fingerprint_bytes, partial_flush_s
        self.clock = clock
        self._lock = threading.RLock()
        self._paths: dict[str, _PathState] = {}
        self._events: deque[Event] = deque(maxlen=max_events)
        self._serial = 0
        self._closed = False
        self._last_saved = b""
        self._saved = self._load()  # path -> state entries not yet added

    # -- following ---------------------------------------------------------------

    def add(self, path: str, fields: Mapping[str, str] | None = None) -> None:
        """Follow ``path`` (resuming its saved files); ``fields`` ride on every Line."""
        with self._lock:
            if path in self._paths:
                return
            ps = _PathState(path, MappingProxyType(dict(fields)) if fields else _NO_FIELDS)
            for e in self._saved.pop(path, ()):
                ps.files.append(_File(self._key(e["dev"], e["ino"]), None, at_path=False,
                                      offset=e["offset"], fp_len=e["fp_len"], fp=e["fp"]))
            ps.resolved = not ps.files
            self._paths[path] = ps

    def remove(self, path: str) -> None:
        """Stop following ``path`` and forget its positions."""
        with self._lock:
            ps = self._paths.pop(path, None)
            dropped = self._saved.pop(path, None)
            if ps is not None:
                for f in ps.files:
                    f.close()
            if ps is not None or dropped is not None:
                self._save()

    def paths(self) -> list[str]:
        with self._lock:
            return list(self._paths)

    def saved_paths(self) -> list[str]:
        """Paths in the state file that have not been added (yet)."""
        with self._lock:
            return list(self._saved)

    def more(self, path: str) -> bool:
        """Whether the last poll of ``path`` stopped before the end of its data."""
        with self._lock:
            ps = self._paths.get(path)
            return ps is not None and ps.more

    def settled(self, path: str) -> bool:
        """Nothing is at ``path``, nothing is open, every line of it was confirmed."""
        with self._lock:
            ps = self._paths.get(path)
            return ps is None or all(
                f.fd is None and not f.restored and not f.at_path and f.committed >= f.line_start
                for f in ps.files)

    def poll_file(self, path: str, max_bytes: int | None = None) -> list[Line]:
        """The complete lines appended to ``path`` since the last poll (see poll_batches)."""
        out: list[Line] = []
        for batch in self.poll_batches(path, max_bytes):
            out += batch.lines()
        return out

    def poll_batches(self, path: str, max_bytes: int | None = None) -> list[LineBatch]:
        """Read at most ``max_bytes`` (default ``read_chunk``) of ``path``'s stream."""
        with self._lock:
            if self._closed:
                raise TailError("poll of a closed Tailer")
            ps = self._paths.get(path)
            if ps is None:
                raise TailError(f"path={path!r} is not followed: add() it first")
            out: list[LineBatch] = []
            if self._poll(ps, max_bytes or self.read_chunk, time.time_ns(), out):
                try:  # only the set of files changed: the lines read must still be returned
                    self._save()
                except StateError as exc:
                    self._event(ps, ERROR, None, 0, f"{exc}; retried at the next change")
            return out

    def take_events(self) -> list[Event]:
        with self._lock:
            events = list(self._events)
            self._events.clear()
            return events

    def next_deadline(self) -> float | None:
        """The clock time at which a poll would flush a quiet partial line, if any."""
        with self._lock:
            return min((f.last_growth + self.partial_flush_s for ps in self._paths.values()
                        for f in ps.files if f.fd is not None and (f.pending or f.cut_head)),
                       default=None)

    def due_paths(self, now: float | None = None) -> list[str]:
        now = self.clock() if now is None else now
        with self._lock:
            return [ps.path for ps in self._paths.values() if any(
                f.fd is not None and (f.pending or f.cut_head)
                and f.last_growth + self.partial_flush_s <= now for f in ps.files)]

    # -- confirming --------------------------------------------------------------

    def positions(self) -> dict[str, Position]:
        """Per path, the position just after the last line returned."""
        with self._lock:
            out = {}
            for ps in self._paths.values():
                f = next((f for f in ps.files if f.fd is not None or f.restored), None)
                f = f or (ps.files[-1] if ps.files else None)
                if f is not None:
                    out[ps.path] = Position(ps.path, f.key, f.line_start)
            return out

    def commit_through(self, *lines: Line | LineBatch) -> None:
        """Confirm every line of each one's path up to and including it (one write)."""
        self.commit([ln.position for ln in lines])

    def commit(self, positions: Iterable[Position] | Mapping[str, Position]) -> None:
        """Record durably that the consumer took each path's stream up to its position."""
        if isinstance(positions, Mapping):
            positions = positions.values()
        with self._lock:
            changed = False
            for pos in positions:
                ps = self._paths.get(pos.path)
                i = next((i for i, f in enumerate(ps.files) if f.key == pos.file), -1) if ps else -1
                if i < 0:
                    continue  # stale: an older content, a removed path
                f = ps.files[i]
                if pos.offset > f.line_start:
                    raise TailError(f"commit past the returned lines: path={pos.path!r} "
                                    f"offset={pos.offset} returned_to={f.line_start}")
                if pos.offset > f.committed:
                    f.committed, changed = pos.offset, True
                if i:  # the earlier files of the stream were drained, closed and taken
                    for g in ps.files[:i]:
                        g.close()
                    del ps.files[:i]
                    changed = True
                if f.fd is None and not f.restored and not f.at_path and f.committed >= f.line_start:
                    ps.files.remove(f)
                    changed = True
            if changed:
                self._save()

    def close(self) -> None:
        """Close every descriptor; commits still work, polls do not."""
        with self._lock:
            self._closed = True
            for ps in self._paths.values():
                for f in ps.files:
                    f.close()

    def __enter__(self) -> Tailer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------------

    def _key(self, dev: int, ino: int) -> FileKey:
        self._serial += 1
        return FileKey(dev, ino, self._serial)

    def _event(self, ps: _PathState, kind: str, f: _File | None, offset: int, detail: str) -> None:
        level = logging.INFO if kind in (ROTATED, DELETED, TRUNCATED) else logging.WARNING
        log.log(level, "tail %s path=%s file=%s offset=%d %s", kind, ps.path,
                f and f"{f.key.dev}:{f.key.ino}", offset, detail)
        self._events.append(Event(ps.path, kind, f.key if f else None, offset, detail, time.time_ns()))

    def _error(self, ps: _PathState, f: _File | None, what: str, exc: OSError) -> None:
        detail = f"{what}: {exc.strerror or exc}"
        if detail != ps.error:  # the same failure is reported once per path
            ps.error = detail
            self._event(ps, ERROR, f, f.read if f else 0, detail)

    def _poll(self, ps: _PathState, budget: int, now_ns: int, out: list[LineBatch]) -> bool:
        """One poll of a path; True if the set of files changed (save the state)."""
        changed = False
        try:
            st: os.stat_result | None = os.stat(ps.path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            self._error(ps, None, "stat", exc)
            return False
        if not ps.resolved:
            changed = self._resolve(ps, st)
        files = ps.files
        cur = files[-1] if files and files[-1].at_path else None
        if cur is not None and (st is None or (st.st_ino, st.st_dev) != (cur.key.ino, cur.key.dev)):
            cur.at_path = False
            self._event(ps, DELETED if st is None else ROTATED, cur, cur.read,
                        "the file at the path is gone" if st is None else
                        f"a new file (inode {st.st_ino}) is at the path; draining the old one")
            cur = None
        ps.more = False
        i = -1
        while (i := i + 1) < len(files):  # drain rotated files first, in stream order
            f = files[i]
            if f.at_path or f.fd is None:
                continue
            f, truncated = self._recheck(ps, i, now_ns, out)
            if f is None:
                files[i].close()
                continue
            changed |= truncated
            i += files[i] is not f  # truncated: the new content comes right after the old one
            used, eof = self._read(ps, f, budget, now_ns, out)
            budget -= used
            if not eof:
                ps.more = True
                return changed
            self._flush(ps, f, now_ns, out)
            f.close()
        done = [f for f in files if f.fd is None and not f.restored and not f.at_path
                and f.committed >= f.line_start]
        for f in done:
            files.remove(f)
            changed = True
        if cur is None and st is not None:
            if not _stat.S_ISREG(st.st_mode):
                self._error(ps, None, "open", OSError(0, "not a regular file"))
                return changed
            cur = self._open(ps)
            if cur is None:
                return changed
            files.append(cur)
            changed = True
        if cur is None:
            return changed
        if budget <= 0:
            ps.more = True
            return changed
        cur, truncated = self._recheck(ps, len(files) - 1, now_ns, out)
        changed |= truncated
        if cur is None:
            return changed
        used, eof = self._read(ps, cur, budget, now_ns, out)
        if not eof:
            ps.more = True
        elif (cur.pending or cur.cut_head) and self.clock() - cur.last_growth >= self.partial_flush_s:
            self._flush(ps, cur, now_ns, out)
        return changed

    def _recheck(self, ps: _PathState, i: int, now_ns: int,
                 out: list[LineBatch]) -> tuple[_File | None, bool]:
        """(file, truncated): ps.files[i] if it still holds the content being read, else
        (truncated, or rewritten in place) its new content, read from 0; None: unknown."""
        f = ps.files[i]
        known = f.fp_len
        try:
            size = os.fstat(f.fd).st_size
            if size >= f.read and self._check_fingerprint(f):
                return f, not known and f.fp_len > 0  # first bytes seen: save them
        except OSError as exc:
            self._error(ps, f, "fstat", exc)
            return None, False
        self._flush(ps, f, now_ns, out)  # the partial line held in memory is all that is left
        self._event(ps, TRUNCATED, f, f.read,
                    f"size {size} < offset {f.read} or first bytes changed: reading from 0")
        new = _File(self._key(f.key.dev, f.key.ino), f.fd, at_path=f.at_path, now=self.clock())
        f.fd, f.at_path, f.gone = None, False, True  # the descriptor now reads the new content
        ps.files.insert(i + 1, new)
        try:
            self._check_fingerprint(new)
        except OSError as exc:
            self._error(ps, new, "read", exc)
        return new, True

    def _open(self, ps: _PathState) -> _File | None:
        try:
            fd = os.open(ps.path, _OPEN_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._error(ps, None, "open", exc)
            return None
        try:
            st = os.fstat(fd)
            f = _File(self._key(st.st_dev, st.st_ino), fd, at_path=True, now=self.clock())
            f.restored = False
            self._check_fingerprint(f)
        except OSError as exc:
            os.close(fd)
            self._error(ps, None, "open", exc)
            return None
        ps.error = ""
        return f

    def _check_fingerprint(self, f: _File) -> bool:
        """Whether the first fp_len bytes are unchanged; extends the fingerprint as the file grows."""
        if f.fp_len >= self.fingerprint_bytes:
            head = os.pread(f.fd, f.fp_len, 0)
            return len(head) == f.fp_len and _fingerprint(head) == f.fp
        head = os.pread(f.fd, self.fingerprint_bytes, 0)
        if len(head) < f.fp_len or (f.fp_len and _fingerprint(head[:f.fp_len]) != f.fp):
            return False
        if len(head) > f.fp_len:
            f.fp_len, f.fp = len(head), _fingerprint(head)
        return True

    def _resolve(self, ps: _PathState, st: os.stat_result | None) -> bool:
        """After a restart: find the saved files of a path (at it, or rotated beside it)."""
        ps.resolved = True
        found: dict[int, str] = {}
        if st is not None:
            found[st.st_ino] = ps.path
        wanted = {f.key.ino for f in ps.files if f.restored} - set(found)
        if wanted:
            try:
                with os.scandir(os.path.dirname(ps.path) or ".") as it:
                    for entry in it:
                        ino = entry.inode()
                        if ino in wanted and ino not in found:
                            found[ino] = entry.path
            except OSError as exc:
                log.warning("tail cannot scan for rotated files path=%s: %s", ps.path, exc)
        keep = []
        for f in ps.files:
            if not f.restored:
                keep.append(f)
                continue
            where = found.get(f.key.ino)
            if where is None:
                why = "not found at the path or beside it"
            elif not f.fp_len and where != ps.path:  # no first bytes to tell it from a stranger
                why = f"was empty when last seen, so {where} may be another file"
            else:
                why = self._reopen(f, where)
            if why:
                self._event(ps, LOST, f, f.committed,
                            f"saved file {f.key.dev}:{f.key.ino} {why}: its bytes after the "
                            f"committed offset {f.committed} are lost")
                continue
            f.at_path = where == ps.path
            keep.append(f)
            if not f.at_path:
                self._event(ps, ROTATED, f, f.committed,
                            f"rotated while stopped, now {where}: draining from the committed offset")
        for f in keep[:-1]:  # only the newest file of a stream can be the one at the path
            f.at_path = False
        ps.files = keep
        return True

    def _reopen(self, f: _File, where: str) -> str:
        try:
            fd = os.open(where, _OPEN_FLAGS)
        except OSError as exc:
            return f"cannot be opened ({exc.strerror})"
        try:
            st = os.fstat(fd)
            head = os.pread(fd, f.fp_len, 0) if f.fp_len else b""
        except OSError as exc:
            os.close(fd)
            return f"cannot be read ({exc.strerror})"
        if st.st_ino != f.key.ino:
            why = "was replaced"
        elif len(head) < f.fp_len or _fingerprint(head) != f.fp:
            why = "has other first bytes (truncated, rewritten or a reused inode)"
        elif st.st_size < f.committed:
            why = f"is shorter ({st.st_size}) than the committed offset"
        else:
            f.fd, f.restored, f.last_growth = fd, False, self.clock()
            if st.st_dev != f.key.dev:  # device numbers can change across reboots
                f.key = FileKey(st.st_dev, f.key.ino, f.key.serial)
            return ""
        os.close(fd)
        return why

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
            else:
                out.append(LineBatch(ps.path, f.key, ps.fields, now_ns, start,
                                     start + len(buf) - len(tail), parts))
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

    # -- state file --------------------------------------------------------------

    def _load(self) -> dict[str, list[dict[str, Any]]]:
        if self.state_path is None:
            return {}
        try:
            with open(self.state_path, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
                raise ValueError("not a firstfault.tail state file")
        except ValueError as exc:
            bad = self.state_path + ".corrupt"
            os.replace(self.state_path, bad)
            log.error("tail state unreadable path=%s (%s): moved to %s; every file is read "
                      "again from offset 0", self.state_path, exc, bad)
            self._events.append(Event("", STATE_RESET, None, 0, f"{exc}; moved to {bad}",
                                      time.time_ns()))
            return {}
        if doc.get("version") != STATE_VERSION:
            raise StateError(f"{self.state_path}: state version {doc.get('version')!r}, this "
                             f"agent reads {STATE_VERSION}: upgrade the agent or move the file away")
        saved: dict[str, list[dict[str, Any]]] = {}
        types = {"path": str, "dev": int, "ino": int, "fp_len": int, "fp": str, "offset": int}
        for e in doc.get("files", ()):
            if isinstance(e, dict) and all(type(e.get(k)) is t for k, t in types.items()):
                saved.setdefault(e["path"], []).append({k: e[k] for k in types})
            else:
                log.warning("tail state: malformed entry skipped path=%s entry=%r",
                            self.state_path, e)
        self._last_saved = raw
        return saved

    def _save(self) -> None:
        if self.state_path is None:
            return
        files = [f.state(ps.path) for ps in self._paths.values() for f in ps.files if not f.gone]
        files += [e for entries in self._saved.values() for e in entries]
        raw = json.dumps({"format": STATE_FORMAT, "version": STATE_VERSION, "files": files},
                         separators=(",", ":")).encode()
        if raw == self._last_saved:
            return
        tmp = self.state_path + ".tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(raw)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.state_path)
            dfd = os.open(os.path.dirname(self.state_path) or ".", os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            raise StateError(f"cannot write the tail state {self.state_path}: {exc}") from exc
        self._last_saved = raw


# -- globs with named parts ----------------------------------------------------------

_PART = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::([^{}/]*))?\}")


def compile_glob(pattern: str) -> tuple[str, re.Pattern[str]]:
    """``/logs/{job}/rank{rank:\\d+}.log`` -> (``/logs/*/rank*.log``, regex with groups job, rank).

    ``{name}`` matches one or more characters but ``/``; ``{name:regex}`` a regex
    without ``/`` or braces; ``*``, ``?`` and ``[...]`` (``[!...]`` negated) as in
    glob, never across ``/``; ``**`` is not special. Match with ``regex.fullmatch``;
    the named parts are ``match.groupdict()`` (strings: the consumer converts).
    """
    globs: list[str] = []
    rx: list[str] = []
    names: set[str] = set()
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "{":
            m = _PART.match(pattern, i)
            if m is None:
                raise ValueError(f"bad named part at {i} in {pattern!r}: write {{name}} or {{name:regex}}")
            name, part = m.group(1), m.group(2)
            if name in names:
                raise ValueError(f"named part {name!r} twice in {pattern!r}")
            if part is not None:
                re.compile(part)  # fails early with re.error
            names.add(name)
            globs.append("*")
            rx.append(f"(?P<{name}>{part or '[^/]+'})")
            i = m.end()
            continue
        if c == "}":
            raise ValueError(f"unmatched '}}' at {i} in {pattern!r}")
        if c == "*":
            globs.append("*")
            rx.append("[^/]*")
        elif c == "?":
            globs.append("?")
            rx.append("[^/]")
        elif c == "[" and (j := pattern.find("]", i + 2)) > 0 and "/" not in pattern[i:j]:
            body = pattern[i + 1:j]
            neg = body.startswith("!")
            body = (body[1:] if neg else body).replace("\\", "\\\\").replace("^", "\\^")
            globs.append(pattern[i:j + 1])
            rx.append(f"[{'^/' if neg else ''}{body}]")
            i = j + 1
            continue
        else:
            globs.append("[[]" if c == "[" else c)
            rx.append(re.escape(c))
        i += 1
    return "".join(globs), re.compile("".join(rx))


def _watch_base(glob_pattern: str) -> tuple[str, bool]:
    """The directory to watch for a glob, and whether it must be watched recursively."""
    parts = glob_pattern.split("/")
    for i, part in enumerate(parts):
        if any(ch in part for ch in "*?["):
            return "/".join(parts[:i]) or "/", i < len(parts) - 1
    return os.path.dirname(glob_pattern) or "/", False


# -- the event loop --------------------------------------------------------------------

def _dir_stat(path: str) -> os.stat_result | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if _stat.S_ISDIR(st.st_mode) else None


def _handler(loop: FollowLoop) -> Any:
    from watchdog.events import FileSystemEventHandler, FileSystemMovedEvent

    class Handler(FileSystemEventHandler):  # runs in watchdog's observer thread
        def dispatch(self, event: Any) -> None:
            if event.is_directory:  # a new or moved directory may hold files; a gone one a watch
                loop._notify(None)
                return
            loop._notify(event.src_path)
            if isinstance(event, FileSystemMovedEvent) and event.dest_path:
                loop._notify(event.dest_path)

    return Handler()


class FollowLoop:
    """Follow every file matching ``globs`` with a Tailer, woken by inotify.

    ``run()`` blocks until ``stop_event`` is set (checked at least every
    STOP_CHECK_S; ``stop()`` sets it and wakes the loop at once), then stops and
    joins the watchdog observer and closes the tailer. Each poll's lines go to
    ``on_lines(list[Line])`` (or ``on_batches(list[LineBatch])``), its events to
    ``on_events(list[Event])`` first (otherwise they are only logged); all three
    run in the loop's thread and their exceptions end ``run()``.

    Events queue the paths to poll (deduplicated; a path with more to read goes
    to the back, so big files take turns chunk by chunk); nothing polls on a
    timer but the safety poll every ``safety_poll_s``, which globs again, polls
    every followed path (a missed event, an inotify overflow) and forgets paths
    that are gone and fully confirmed. Watched: the glob's directory up to its
    first wildcard (recursively when a directory part has one); while that
    directory does not exist, its nearest existing ancestor, so its creation is
    seen. At start, saved paths matching a glob are followed even when gone, to
    drain what was rotated while the agent was stopped.
    """

    STOP_CHECK_S = 0.5

    def __init__(self, tailer: Tailer, globs: str | Iterable[str],
                 on_lines: Callable[[list[Line]], object] | None, stop_event: threading.Event, *,
                 on_batches: Callable[[list[LineBatch]], object] | None = None,
                 on_events: Callable[[list[Event]], object] | None = None,
                 safety_poll_s: float = 5.0):
        if (on_lines is None) == (on_batches is None):
            raise ValueError("give exactly one of on_lines and on_batches")
        self.tailer, self.stop_event, self.safety_poll_s = tailer, stop_event, safety_poll_s
        self._on_lines, self._on_batches, self._on_events = on_lines, on_batches, on_events
        self._specs = []
        for pattern in [globs] if isinstance(globs, str) else globs:
            g, rx = compile_glob(os.path.abspath(pattern))
            self._specs.append((g, rx, *_watch_base(g)))
        self._qlock = threading.Lock()
        self._queue: dict[str, None] = {}
        self._rescan = False
        self._wake = threading.Event()
        self._followed: set[str] = set()
        self._watches: dict[tuple[str, bool, int], Any] = {}

    def stop(self) -> None:
        self.stop_event.set()
        self._wake.set()

    def _notify(self, path: str | None) -> None:
        with self._qlock:
            if path is None:
                self._rescan = True
            else:
                self._queue[path] = None
        self._wake.set()

    def run(self) -> None:
        try:
            from watchdog.events import (DirCreatedEvent, DirDeletedEvent, DirMovedEvent,
                                         FileCreatedEvent, FileDeletedEvent, FileModifiedEvent,
                                         FileMovedEvent)
            from watchdog.observers.inotify import InotifyObserver
        except ImportError as exc:
            raise TailError("FollowLoop needs watchdog 7: pip install 'watchdog>=7,<8'") from exc
        # Only what can change a followed file: our own reads (open, access,
        # close-nowrite) must not come back as events.
        self._filter = [FileCreatedEvent, FileModifiedEvent, FileMovedEvent, FileDeletedEvent,
                        DirCreatedEvent, DirMovedEvent, DirDeletedEvent]
        observer = InotifyObserver()
        handler = _handler(self)
        try:
            self._sync_watches(observer, handler)
            observer.start()
            self._scan(first=True)
            next_safety = time.monotonic() + self.safety_poll_s
            while not self.stop_event.is_set():
                timeout = min(next_safety - time.monotonic(), self.STOP_CHECK_S)
                deadline = self.tailer.next_deadline()
                if deadline is not None:  # a quiet partial line to flush (at most 20/s)
                    timeout = min(timeout, max(deadline - self.tailer.clock(), 0.05))
                if timeout > 0:
                    self._wake.wait(timeout)
                self._wake.clear()
                if self.stop_event.is_set():
                    break
                with self._qlock:
                    queue, self._queue = self._queue, {}
                    rescan, self._rescan = self._rescan, False
                safety = time.monotonic() >= next_safety
                if rescan or safety:
                    self._sync_watches(observer, handler)
                    self._scan(poll_all=safety)
                    if safety:
                        next_safety = time.monotonic() + self.safety_poll_s
                for path in queue:
                    self._poll(path)
                for path in self.tailer.due_paths():
                    self._poll(path)
        finally:
            observer.stop()
            if observer.is_alive():
                observer.join()
            self._watches.clear()
            self.tailer.close()

    def _sync_watches(self, observer: Any, handler: Any) -> None:
        want: dict[tuple[str, bool, int], None] = {}
        for _, _, base, recursive in self._specs:
            d = base
            while (st := _dir_stat(d)) is None and d != os.path.dirname(d):
                d, recursive = os.path.dirname(d), False  # watch for its creation
            if st is None:
                continue
            want[(d, recursive, st.st_ino)] = None
        for key in [k for k in self._watches if k not in want]:  # gone or replaced directories
            try:
                observer.unschedule(self._watches.pop(key))
            except (KeyError, OSError):
                pass
        for key in want:
            d, recursive, _ = key
            if key in self._watches or (not recursive and (d, True, key[2]) in want):
                continue
            try:
                self._watches[key] = observer.schedule(handler, d, recursive=recursive,
                                                       event_filter=self._filter)
            except OSError as exc:
                log.warning("tail cannot watch dir=%s: %s; the safety poll still reads it", d, exc)

    def _scan(self, *, first: bool = False, poll_all: bool = False) -> None:
        new = []
        candidates = [p for g, *_ in self._specs for p in sorted(_glob(g))]
        if first:
            candidates += self.tailer.saved_paths() + self.tailer.paths()
        for path in candidates:
            if path not in self._followed and self._follow(path):
                new.append(path)
        for path in (sorted(self._followed) if poll_all else new):
            self._poll(path)
        if poll_all:
            for path in [p for p in self._followed if not os.path.lexists(p)]:
                if self.tailer.settled(path):
                    try:
                        self.tailer.remove(path)
                    except StateError as exc:
                        log.warning("tail cannot forget path=%s: %s", path, exc)
                        continue
                    self._followed.discard(path)

    def _follow(self, path: str) -> bool:
        for _, rx, _, _ in self._specs:
            m = rx.fullmatch(path)
            if m is not None:
                self.tailer.add(path, m.groupdict())
                self._followed.add(path)
                return True
        return False

    def _poll(self, path: str) -> None:
        if path not in self._followed and not self._follow(path):
            return
        batches = self.tailer.poll_batches(path)
        events = self.tailer.take_events()
        if events and self._on_events is not None:
            self._on_events(events)
        if batches:
            if self._on_batches is not None:
                self._on_batches(batches)
            else:
                lines: list[Line] = []
                for b in batches:
                    lines += b.lines()
                self._on_lines(lines)
        if self.tailer.more(path):
            self._notify(path)
