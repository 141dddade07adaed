"""Follow every file matching globs with a Tailer (firstfault/agent/tail/tailer.py), woken by inotify.

``FollowLoop(tailer, globs, on_lines, stop_event)`` drives a Tailer from inotify
events (firstfault/agent/tail/inotify.py: read in the loop's own thread, every pending event in one
read a wake); ``compile_glob`` turns ``/logs/{job}/rank{rank}.log`` into a glob and
a regex with named parts. A FollowLoop runs in the thread that calls run(). Idle
cost (bench/tail.py): ~0.06% CPU.

An overflow of the kernel's inotify queue (IN_Q_OVERFLOW) globs again and polls
every followed file, as the safety poll (every ``safety_poll_s``) does.
"""

from __future__ import annotations

import logging
import os
import re
import select
import stat as _stat
import threading
import time
from collections.abc import Callable, Iterable
from glob import glob as _glob

from firstfault.agent.tail.inotify import (
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Inotify,
)
from firstfault.agent.tail.lines import FileChange, Line, LineBatch, StateError
from firstfault.agent.tail.tailer import Tailer

log = logging.getLogger(__name__)

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

# Only what can change a followed file: our own reads (open, access, close-nowrite)
# must not come back as events.
WATCH_MASK = (IN_MODIFY | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF
              | IN_MOVE_SELF | IN_ONLYDIR)
_RESCAN = IN_Q_OVERFLOW | IN_IGNORED | IN_ISDIR | IN_DELETE_SELF | IN_MOVE_SELF


def _dir_stat(path: str) -> os.stat_result | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if _stat.S_ISDIR(st.st_mode) else None


class FollowLoop:
    """Follow every file matching ``globs`` with a Tailer, woken by inotify.

    ``run()`` blocks until ``stop_event`` is set (checked at least every
    STOP_CHECK_S, or at once when it has a ``fileno()`` that turns readable when set,
    as a StopEvent does; ``stop()`` sets it and wakes the loop at once), then closes its
    inotify descriptor and the tailer. A wake's lines (all its
    polls) go to ``on_lines(list[Line])`` (or ``on_batches(list[LineBatch])``) in
    one call, a poll's events to ``on_events(list[FileChange])`` after the lines read
    before them (otherwise they are only logged); wakes are ``min_wake_s`` apart
    (events within it wait for the next: a poll, an append and a commit per wake,
    not per write; bench/agent.py measures the CPU it saves and the latency it adds);
    ``on_tick()`` after every wake, returning the ``tailer.clock`` time it wants to
    be called again (None: no need), for a consumer that holds lines for a while.
    Polls are budgeted: a wake that polled N files waits at least N / ``max_polls_per_s``
    before the next (at most MAX_WAKE_S), so when many files change at once each poll
    reads more lines instead of the polls taking a core (a poll costs a stat, two
    preads and the consumer's work per batch whether it reads one line or a hundred;
    bench/agent.py --files 8,64,256 measures it). Few changed files wake at
    ``min_wake_s``.
    All of them run in the loop's thread and their exceptions end ``run()``.

    Events queue the paths to poll (deduplicated; a path with more to read goes
    to the back, so big files take turns chunk by chunk); nothing polls on a
    timer but the safety poll every ``safety_poll_s``, which globs again, polls
    every followed path (a missed event; an inotify overflow does the same at once)
    and forgets paths that are gone and fully confirmed. Watched (one inotify watch
    a directory): the glob's directory up to its first wildcard (and every
    directory below it when a directory part has one); while that directory does
    not exist, its nearest existing ancestor, so its creation is seen; an event on
    a directory (created, moved, deleted: its watch ignored) syncs the watches and
    globs again. At start, saved paths matching a glob are followed even when gone,
    to drain what was rotated while the agent was stopped.
    """

    STOP_CHECK_S = 0.5
    MAX_WAKE_S = 0.25  # the budget never holds a line back longer than this
    DELIVER_LINES = 4096  # a wake's lines are handed over in parts of about this many

    def __init__(self, tailer: Tailer, globs: str | Iterable[str],
                 on_lines: Callable[[list[Line]], object] | None, stop_event: threading.Event, *,
                 on_batches: Callable[[list[LineBatch]], object] | None = None,
                 on_events: Callable[[list[FileChange]], object] | None = None,
                 on_tick: Callable[[], float | None] | None = None,
                 safety_poll_s: float = 5.0, min_wake_s: float = 0.025,
                 max_polls_per_s: float = 2500.0):
        if (on_lines is None) == (on_batches is None):
            raise ValueError("give exactly one of on_lines and on_batches")
        self.tailer, self.stop_event, self.safety_poll_s = tailer, stop_event, safety_poll_s
        self.min_wake_s, self.max_polls_per_s = min_wake_s, max_polls_per_s
        self._polls = 0  # files polled this wake
        self._on_lines, self._on_batches, self._on_events = on_lines, on_batches, on_events
        self._on_tick, self._tick_at = on_tick, None
        self._specs = []
        for pattern in [globs] if isinstance(globs, str) else globs:
            g, rx = compile_glob(os.path.abspath(pattern))
            self._specs.append((g, rx, *_watch_base(g)))
        self._queue: dict[str, None] = {}
        self._pending: list[LineBatch] = []  # polled this wake, not yet handed over
        self._pending_lines = 0  # their lines (kept as they come: a sum per poll grew with the files)
        self._rescan = self._poll_all = False
        self._followed: set[str] = set()
        self._watches: dict[str, tuple[int, int]] = {}  # directory -> (wd, its inode)
        self._dirs: dict[int, str] = {}  # wd -> directory
        self._inotify: Inotify | None = None
        self._wake_lock = threading.Lock()
        self._wake_w: int | None = None  # a pipe that stop() writes to while run() waits

    def stop(self) -> None:
        self.stop_event.set()
        with self._wake_lock:
            if self._wake_w is not None:
                try:
                    os.write(self._wake_w, b"x")
                except BlockingIOError:  # full: woken already
                    pass

    def run(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with self._wake_lock:
            self._wake_w = wake_w
        try:
            self._inotify = ino = Inotify()
        except BaseException:
            self._close_wake(wake_r)
            self.tailer.close()
            raise
        try:
            self._sync_watches()
            self._scan(first=True)
            next_safety = time.monotonic() + self.safety_poll_s
            woke, wake_gap = 0.0, self.min_wake_s
            waited, stopping = [ino.fd, wake_r], [wake_r]
            check_s = self.STOP_CHECK_S
            if hasattr(self.stop_event, "fileno"):  # a StopEvent (firstfault/agent/sources/base.py)
                waited.append(self.stop_event)
                stopping.append(self.stop_event)
                check_s = float("inf")
            while not self.stop_event.is_set():
                gap = woke + wake_gap - time.monotonic()
                if gap > 0:  # reads at least min_wake_s apart, more after many polls
                    if len(stopping) > 1:
                        select.select(stopping, [], [], gap)
                    else:
                        self.stop_event.wait(gap)
                    if self.stop_event.is_set():
                        break
                events = ino.read()  # what came meanwhile: most wakes under load need no wait
                if not events and not self._queue:
                    timeout = min(next_safety - time.monotonic(), check_s)
                    deadline = self.tailer.next_deadline()
                    if self._tick_at is not None:
                        deadline = self._tick_at if deadline is None else min(deadline, self._tick_at)
                    if deadline is not None:  # a quiet partial line to flush (at most 20/s)
                        timeout = min(timeout, max(deadline - self.tailer.clock(), 0.05))
                    if timeout > 0:
                        select.select(waited, [], [], timeout)
                        if self.stop_event.is_set():
                            break
                        events = ino.read()
                woke, self._polls = time.monotonic(), 0
                self._take_events(events)
                queue, self._queue = self._queue, {}
                rescan, self._rescan = self._rescan, False
                poll_all, self._poll_all = self._poll_all, False
                safety = time.monotonic() >= next_safety
                if rescan or poll_all or safety:
                    self._sync_watches()
                    self._scan(poll_all=poll_all or safety)
                    if safety:
                        next_safety = time.monotonic() + self.safety_poll_s
                for path in queue:
                    self._poll(path)
                for path in self.tailer.due_paths():
                    self._poll(path)
                self._deliver()
                wake_gap = min(max(self.min_wake_s, self._polls / self.max_polls_per_s),
                               max(self.min_wake_s, self.MAX_WAKE_S))
                if self._on_tick is not None:
                    self._tick_at = self._on_tick()
        finally:
            ino.close()
            self._inotify = None
            self._watches.clear()
            self._dirs.clear()
            self._close_wake(wake_r)
            self.tailer.close()

    def _close_wake(self, wake_r: int) -> None:
        with self._wake_lock:
            os.close(self._wake_w)
            self._wake_w = None
        os.close(wake_r)

    def _take_events(self, events: list) -> None:
        """Queue the paths the events name; an event on a directory (or an overflow, or
        a watch the kernel dropped) asks for a rescan."""
        for ev in events:
            if ev.mask & _RESCAN:
                self._rescan = True
                if ev.mask & IN_Q_OVERFLOW:
                    log.warning("tail: the inotify queue overflowed; polling every file")
                    self._poll_all = True
                if ev.mask & IN_IGNORED:
                    d = self._dirs.pop(ev.wd, None)
                    if d is not None and self._watches.get(d, (None,))[0] == ev.wd:
                        del self._watches[d]
                continue
            d = self._dirs.get(ev.wd)
            if d is not None and ev.name:  # os.path.join's result: a name holds no "/"
                self._queue[(d if d.endswith("/") else d + "/") + ev.name] = None

    def _sync_watches(self) -> None:
        """Watch the directories the globs need, again until no new one is added: a
        directory created before its parent's watch existed sends no event."""
        while self._sync_watches_once():
            pass

    def _sync_watches_once(self) -> bool:
        """True if a watch was added."""
        want: dict[str, int] = {}  # directory -> inode
        for _, _, base, recursive in self._specs:
            d = base
            while (st := _dir_stat(d)) is None and d != os.path.dirname(d):
                d, recursive = os.path.dirname(d), False  # watch for its creation
            if st is None:
                continue
            want[d] = st.st_ino
            if recursive:
                for top, subdirs, _ in os.walk(d):
                    for sub in subdirs:
                        path = os.path.join(top, sub)
                        if (st := _dir_stat(path)) is not None:
                            want[path] = st.st_ino
        for d in [d for d, (_, ino) in self._watches.items() if want.get(d) != ino]:
            wd, _ = self._watches.pop(d)  # gone or replaced directories
            if self._dirs.get(wd) == d and wd not in (w for w, _ in self._watches.values()):
                del self._dirs[wd]
                self._inotify.rm_watch(wd)
        added = False
        for d, ino in want.items():
            if d in self._watches:
                continue
            try:
                wd = self._inotify.add_watch(d, WATCH_MASK)
            except OSError as exc:
                log.warning("tail cannot watch dir=%s: %s; the safety poll still reads it", d, exc)
                continue
            self._watches[d] = wd, ino
            self._dirs[wd] = d
            added = True
        return added

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
        self._deliver()
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
        self._polls += 1
        batches, events, more = self.tailer.poll_path(path)
        if events and self._on_events is not None:
            self._deliver()  # the lines read before these events go first
            self._on_events(events)
        if batches:
            self._pending += batches
            self._pending_lines += sum(map(len, batches))
        if self._pending_lines >= self.DELIVER_LINES:
            self._deliver()  # a backlog: memory stays bounded
        if more:
            self._queue[path] = None

    def _deliver(self) -> None:
        """Hand over the batches of a wake's polls at once (one spool append a wake)."""
        batches, self._pending, self._pending_lines = self._pending, [], 0
        if batches:
            if self._on_batches is not None:
                self._on_batches(batches)
            else:
                lines: list[Line] = []
                for b in batches:
                    lines += b.lines()
                self._on_lines(lines)
