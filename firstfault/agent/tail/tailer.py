"""Follow growing log files byte-exactly across rotation and restarts: the Tailer.

This docstring is the specification. The ranklog source wraps this module; it knows
nothing of sources, records or the wire. It reads per-rank log files such as
``/logs/12345/rank3.log`` whose lines look like::

    [2026-12-02 10:11:59,782] [INFO] [logging.py:123:log_dist] [Rank 0] step=10 loss=2.31

API
    ``Tailer(state_path, *, max_line_bytes=65536, read_chunk=256 KiB,
    fingerprint_bytes=1024, partial_flush_s=5.0, clock=time.monotonic, fsync=True)``
    follows a set of paths: ``add(path, fields=None)``, ``remove(path)``, ``fields(path)``.
    ``poll_file(path) -> list[Line]`` reads what was appended since the last poll
    (at most ``read_chunk`` bytes a call; ``more(path)`` says there is more to read)
    and returns the complete lines; ``poll_batches(path) -> list[LineBatch]`` is
    the same data in columns (one list of bytes per read chunk), for consumers
    that build columnar wire batches (no object per line: ~4x cheaper, see
    bench/tail.py). ``take_events() -> list[FileChange]`` returns what happened to the
    files; ``poll_path(path)`` is ``(poll_batches(path), take_events(), more(path))`` in
    one call. ``positions()``, ``commit(positions)``, ``commit_through(*lines)``
    confirm lines (below). ``next_deadline()`` / ``due_paths()`` tell when a poll
    would flush a quiet partial line. ``close()`` closes every file descriptor.
    ``fingerprint(path, file)`` and ``advance(path, dev, ino, offset, fp_len, fp)``
    (before ``add``), with ``committed_at_ns(state_path)``, let a consumer that
    keeps positions of its own (ranklog: in the spool) resume past the last commit;
    such a consumer commits everything it took at each commit.
    One Tailer per state file; a Tailer is thread-safe (one lock). firstfault/agent/tail/follow.py
    drives a Tailer from inotify events (``FollowLoop``, ``compile_glob``).

Modules (firstfault/agent/tail/): this one (the API, one poll of a path), lines.py (value
types), file.py (reading and splitting one file), rotation.py (rotation, truncation, restart
lookup), state.py (the state file).

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
    directory fsynced); with ``fsync=False`` it is only written and renamed: a
    process crash keeps it, an OS crash may bring back an older state file (or a
    corrupt one: ``state_reset``), so only a consumer that keeps positions of its
    own (``advance``) should turn it off. Positions only move forward; a stale one (an older
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
    growing with the file). ``committed_at_ns`` (optional): when a commit last wrote
    the offsets (the file's mtime then), in a file written for another reason;
    absent, the mtime says it. Written on each commit that changes it, and when the
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
      the fingerprint bytes changed. If a copy of the old content lies beside the
      path (a name starting with the path's, e.g. ``rank3.log.1``: its first
      ``fp_len`` bytes hash to ``fp``, it is at least the read offset long and holds
      the partial line in memory; ``find_copy`` in rotation.py), the old content
      is read on from the copy to its end (drained, as a rotated file); else the
      partial line in memory is flushed. Either way the file is then read again
      from 0 as a new content (new ``serial``). Event ``rotated`` (a copy: nothing
      lost) or ``truncated``. At a restart a saved file whose inode now holds other
      bytes is looked for the same way.
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

Changes ``FileChange(path, kind, file, offset, detail, observed_ns)``, kinds:
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
    * copytruncate without a copy beside the path (copied elsewhere, already
      compressed or deleted) loses what the writer wrote between our last read and
      the truncation; with one, only what was written between the copy and the
      truncation (inherent to copytruncate: it is in neither file). Lines read but
      not confirmed before a truncation, or in a deleted file when the agent
      restarts, cannot come again (the bytes are gone). A restart while a copy is
      being drained looks for it again by its first bytes (rotation.py).
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
"""


from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from firstfault.agent.tail.file import PathFiles, TailedFile
from firstfault.agent.tail.lines import (
    ERROR,
    MIN_LINE_BYTES,
    NO_FIELDS,
    FileChange,
    FileKey,
    Line,
    LineBatch,
    Position,
    StateError,
    TailError,
)
from firstfault.agent.tail.poll import PathPoller
from firstfault.agent.tail.state import StateFile


class Tailer:
    """Follows files by path; see the module docstring for the contract. Composed of a
    PathPoller (poll.py: one poll of a path, over file.py's FileReader and rotation.py's
    Rotation) and a StateFile (state.py: the saved offsets)."""

    def __init__(self, state_path: str | os.PathLike[str] | None, *, max_line_bytes: int = 64 * 1024,
                 read_chunk: int = 256 << 10, fingerprint_bytes: int = 1024,
                 partial_flush_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 max_events: int = 10_000, fsync: bool = True):
        if max_line_bytes < MIN_LINE_BYTES:
            raise ValueError(f"max_line_bytes must be >= {MIN_LINE_BYTES}, got {max_line_bytes}")
        if read_chunk < 1 or fingerprint_bytes < 1:
            raise ValueError("read_chunk and fingerprint_bytes must be >= 1")
        self.state_path = os.fspath(state_path) if state_path is not None else None
        self.max_line_bytes, self.read_chunk = max_line_bytes, read_chunk
        self.fingerprint_bytes, self.partial_flush_s = fingerprint_bytes, partial_flush_s
        self.clock, self.fsync = clock, fsync
        self._lock = threading.RLock()
        self._paths: dict[str, PathFiles] = {}
        self._closed = False
        self._ahead: dict[str, tuple[int, int, int, int, str]] = {}  # path -> advance()'s
        self._poller = PathPoller(max_line_bytes=max_line_bytes, read_chunk=read_chunk,
                                  fingerprint_bytes=fingerprint_bytes, partial_flush_s=partial_flush_s,
                                  clock=clock, max_events=max_events)
        self._events = self._poller.events
        self._state = StateFile(self.state_path, fsync=fsync, on_change=self._events.append)
        self._saved = self._state.load()  # path -> state entries not yet added

    # -- following ---------------------------------------------------------------

    def add(self, path: str, fields: Mapping[str, str] | None = None) -> None:
        """Follow ``path`` (resuming its saved files); ``fields`` ride on every Line."""
        with self._lock:
            if path in self._paths:
                return
            ps = PathFiles(path, MappingProxyType(dict(fields)) if fields else NO_FIELDS)
            ahead = self._ahead.pop(path, None)
            for e in self._saved.pop(path, ()):
                f = TailedFile(self._poller.key(e["dev"], e["ino"]), None, at_path=False,
                          offset=e["offset"], fp_len=e["fp_len"], fp=e["fp"])
                if ahead is not None and ahead[:2] == (e["dev"], e["ino"]):
                    f.ahead = ahead[2:]
                ps.files.append(f)
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

    def fields(self, path: str) -> Mapping[str, str]:
        """The ``fields`` given to ``add(path)`` (empty if it is not followed)."""
        with self._lock:
            ps = self._paths.get(path)
            return ps.fields if ps is not None else NO_FIELDS

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
            return self._poll(path, max_bytes)[0]

    def poll_path(self, path: str, max_bytes: int | None = None) -> tuple[list[LineBatch], list[FileChange], bool]:
        """``poll_batches(path)``, then ``take_events()`` and ``more(path)``, under one lock
        (a FollowLoop's poll: one call instead of three)."""
        with self._lock:
            out, ps = self._poll(path, max_bytes)
            return out, self._take_events(), ps.more

    def _poll(self, path: str, max_bytes: int | None) -> tuple[list[LineBatch], PathFiles]:
        if self._closed:
            raise TailError("poll of a closed Tailer")
        ps = self._paths.get(path)
        if ps is None:
            raise TailError(f"path={path!r} is not followed: add() it first")
        out: list[LineBatch] = []
        if self._poller.poll(ps, max_bytes or self.read_chunk, time.time_ns(), out):
            try:  # only the set of files changed: the lines read must still be returned
                self._save()
            except StateError as exc:
                self._poller.event(ps, ERROR, None, 0, f"{exc}; retried at the next change")
        return out, ps

    def take_events(self) -> list[FileChange]:
        with self._lock:
            return self._take_events()

    def _take_events(self) -> list[FileChange]:
        if not self._events:  # most polls: nothing happened to the files
            return []
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
                self._save(committed=True)

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

    # -- catching up -------------------------------------------------------------

    def fingerprint(self, path: str, file: FileKey) -> tuple[int, str] | None:
        """(fp_len, fp) of a content of ``path`` that lines were returned from (None: not
        known): with the file's (dev, ino) it names that content across restarts."""
        with self._lock:
            ps = self._paths.get(path)
            for f in ps.files if ps is not None else ():
                if f.key == file:
                    return f.fp_len, f.fp
            return None

    def advance(self, path: str, dev: int, ino: int, offset: int, fp_len: int, fp: str) -> bool:
        """Before ``add(path)``: the consumer durably took ``path``'s stream up to ``offset``
        of the file (dev, ino) whose first ``fp_len`` bytes hash to ``fp`` (a position it
        kept itself after the last commit, e.g. in its spool). The saved files before that
        one are forgotten (a stream is taken in order); its committed offset moves there
        when the restart finds it (as ``_resolve`` does) with those first bytes, at least
        ``offset`` long; otherwise nothing moves. Only forward. False: no saved file of
        the path has that (dev, ino) (stale, unknown): nothing changes."""
        with self._lock:
            if path in self._paths:
                raise TailError(f"advance of path={path!r} after add()")
            entries = self._saved.get(path, [])
            i = next((i for i, e in enumerate(entries) if (e["dev"], e["ino"]) == (dev, ino)), -1)
            if i < 0:
                return False
            del entries[:i]
            if offset > entries[0]["offset"]:
                self._ahead[path] = (dev, ino, offset, fp_len, fp)
            return True

    def _save(self, committed: bool = False) -> None:
        """Write the state of every followed file and every saved one not yet added."""
        files = [f.state(ps.path) for ps in self._paths.values() for f in ps.files if not f.gone]
        files += [e for entries in self._saved.values() for e in entries]
        self._state.save(files, committed)
