"""cgroup: memory counters of the cgroups that hold the job's processes; OOM at once.

Reads, for every pid it is given (``pids``: the procs source's rank pids) the
line of ``/proc/<pid>/cgroup`` that names its memory cgroup, and cgroups named
in ``cgroups`` (paths inside the hierarchy, e.g. ``/slurm/uid_0/job_12``):

- v1 (``<sys>/fs/cgroup/memory``): ``4:memory:/slurm/uid_0/job_12/step_0``;
  files ``memory.usage_in_bytes``, ``memory.limit_in_bytes``,
  ``memory.max_usage_in_bytes``, ``memory.failcnt``, ``memory.stat``
  (``total_rss``, ``total_cache``, ``hierarchical_memory_limit``) and
  ``memory.oom_control`` (real, after a kill: tests/data/cgroup/v1/oom-after)::

      oom_kill_disable 0
      under_oom 0
      oom_kill 1

- v2 (``<sys>/fs/cgroup``, or ``<sys>/fs/cgroup/unified`` on a hybrid host):
  ``0::/system.slice/slurmstepd.scope/job_12/step_0/user/task_0``; files
  ``memory.current``, ``memory.max`` / ``memory.high`` (``max`` = no limit),
  ``memory.peak`` (Linux 5.19+), ``memory.stat`` (``anon``, ``file``) and
  ``memory.events`` (``low high max oom oom_kill oom_group_kill``, hierarchical).
  A cgroup without ``memory.current`` has no memory controller and is skipped.

Emits (``cgroup`` = path inside the hierarchy, ``version`` = 1 | 2, ``pids`` =
the given pids in it, comma-separated; absent files give nil):

- ``cgroup.memory`` when a cgroup is first found, then every ``interval_s``
  (pids are re-resolved every second), and once more before it is dropped:
  ``usage_bytes``,
  ``limit_bytes``, ``peak_bytes``, ``hierarchical_limit_bytes`` (the smallest
  limit on the way to the root), v1 ``failcnt``, ``rss_bytes``, ``cache_bytes``,
  ``oom_kill``, ``under_oom``, ``oom_kill_disable``; v2 ``high_bytes``,
  ``anon_bytes``, ``file_bytes``, ``oom``, ``oom_kill``, ``oom_group_kill``,
  ``low_events``, ``high_events``, ``max_events``. Limits are shipped raw (v1's
  "unlimited" is 9223372036854771712).
- ``cgroup.oom`` at once when ``oom``, ``oom_kill`` or ``oom_group_kill`` rises
  (or is non-zero on the first sample: ``first_sample`` true): the same fields
  plus ``delta_oom``/``delta_oom_kill``, ``notified`` (the kernel woke us), and
  message = the raw ``memory.oom_control`` / ``memory.events`` text.
  ``occurred_ns`` = when the kernel's notification woke the agent (nil if
  polled; seen 5 ms after the kernel's own ``oom-kill:`` stamp on a busy 2-core VM).
  v1 only: a notification whose counters do not move within ``hot_window_s``
  (an OOM with ``oom_kill_disable`` 1, the task now stuck) also gives one,
  with deltas 0.

"At once": v1 registers an eventfd for ``memory.oom_control`` through
``cgroup.event_control``; the kernel signals it when the cgroup (or an
ancestor) goes OOM, *before* it picks a victim, so the cgroup is then re-read
every 20 ms for ``hot_window_s`` until ``oom_kill`` moves. It signals it too
when the cgroup is removed. v2 polls ``memory.events`` for POLLPRI (the
kernfs "file modified" event; a regular file in a fixture never raises it).
Without either, counters are polled every ``interval_s``.

Known issues: a cgroup is dropped ``2 * interval_s`` after its last given pid
is gone (or at once when removed); v1 ``oom_kill`` counts only the cgroup's own
tasks, v2 ``memory.events`` counts the subtree. Paths in /proc/<pid>/cgroup are
relative to the reader's cgroup namespace: in a container the agent needs the
host's (``--cgroupns=host``), as cAdvisor does. The hierarchy roots are the
standard mount points under HostPaths.sys (``v1_root``/``v2_root`` override).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from firstfault.agent.hostpaths import HostPaths
from firstfault.agent.sources.base import (
    Draft,
    PollingSource,
    StopEvent,
    clip,
    printable,
    read_text,
    register,
    stop_slice,
)
from firstfault.wire import KIND_CGROUP_MEMORY, KIND_CGROUP_OOM, SOURCE_CGROUP

log = logging.getLogger(__name__)

OOM_COUNTERS = ("oom", "oom_kill", "oom_group_kill")
HOT_POLL_S = 0.02
STOP_SLICE_S = 0.25


def parse_proc_cgroup(text: str) -> tuple[str | None, str | None]:
    """(v1 memory path, v2 path) from ``/proc/<pid>/cgroup``; None where absent."""
    v1 = v2 = None
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v1, v2


def parse_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (memory.oom_control, memory.events, memory.stat) -> ints."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            continue
    return out


def parse_value(text: str) -> int | None:
    """One number (``memory.current``), or None for ``max``."""
    text = text.strip()
    return None if text == "max" else int(text)


def _number(directory: str, name: str) -> int | None:
    text = read_text(os.path.join(directory, name))
    try:
        return None if text is None else parse_value(text)
    except ValueError:
        return None


@dataclass
class Watch:
    """One cgroup being sampled."""

    version: int
    path: str  # inside the hierarchy, "/" + ...
    dir: str
    root: str
    explicit: bool = False
    pids: set[int] = field(default_factory=set)
    pids_seen: float = 0.0  # monotonic time a given pid was last in it
    fd: int | None = None  # v1 eventfd / v2 memory.events, registered with the poller
    counters: dict[str, int] | None = None
    notified_ns: int | None = None
    hot_until: float = 0.0
    pending: bool = False  # sample at the next poll
    dropping: bool = False  # no given pid in it for 2 intervals: sample once more, drop


def sample(w: Watch) -> tuple[dict, str] | None:
    """(fields, raw events text) of one cgroup; None if it is gone."""
    d = w.dir
    if w.version == 1:
        usage = _number(d, "memory.usage_in_bytes")
        events = read_text(os.path.join(d, "memory.oom_control"))
        if usage is None or events is None:
            return None
        stat = parse_keyed(read_text(os.path.join(d, "memory.stat")) or "")
        ev = parse_keyed(events)
        fields = {
            "usage_bytes": usage, "limit_bytes": _number(d, "memory.limit_in_bytes"),
            "peak_bytes": _number(d, "memory.max_usage_in_bytes"),
            "hierarchical_limit_bytes": stat.get("hierarchical_memory_limit"),
            "failcnt": _number(d, "memory.failcnt"), "rss_bytes": stat.get("total_rss"),
            "cache_bytes": stat.get("total_cache"), "oom_kill": ev.get("oom_kill"),
            "under_oom": ev.get("under_oom"), "oom_kill_disable": ev.get("oom_kill_disable")}
        return fields, events
    usage = _number(d, "memory.current")
    if w.fd is not None:  # read through the polled fd: that re-arms POLLPRI
        try:
            events = os.pread(w.fd, 4096, 0).decode("ascii", "replace")
        except OSError:
            events = None
    else:
        events = read_text(os.path.join(d, "memory.events"))
    if usage is None or events is None:
        return None
    stat = parse_keyed(read_text(os.path.join(d, "memory.stat")) or "")
    ev = parse_keyed(events)
    limits, up = [], d
    while True:  # the smallest memory.max from here to the root
        if (m := _number(up, "memory.max")) is not None:
            limits.append(m)
        if os.path.normpath(up) == os.path.normpath(w.root) or len(up) <= len(w.root):
            break
        up = os.path.dirname(up)
    fields = {
        "usage_bytes": usage, "limit_bytes": _number(d, "memory.max"),
        "high_bytes": _number(d, "memory.high"), "peak_bytes": _number(d, "memory.peak"),
        "hierarchical_limit_bytes": min(limits) if limits else None,
        "anon_bytes": stat.get("anon"), "file_bytes": stat.get("file"),
        "oom": ev.get("oom"), "oom_kill": ev.get("oom_kill"),
        "oom_group_kill": ev.get("oom_group_kill"), "low_events": ev.get("low"),
        "high_events": ev.get("high"), "max_events": ev.get("max")}
    return fields, events


@register
class CgroupSource(PollingSource):
    """Samples memory cgroups of given pids / paths; see the module docstring."""

    name = SOURCE_CGROUP
    interval_s = 5.0

    @classmethod
    def unavailable(cls, paths: HostPaths) -> str | None:
        root = paths.cgroup_root
        if not (os.path.isdir(os.path.join(root, "memory"))
                or os.path.exists(os.path.join(root, "cgroup.controllers"))
                or os.path.exists(os.path.join(root, "unified", "cgroup.controllers"))):
            return f"no memory cgroup hierarchy under {root}"
        return None

    def __init__(self, *, pids: Callable[[], Iterable[int]] | Iterable[int] = (),
                 cgroups: Iterable[str] = (), v1_root: str | None = None,
                 v2_root: str | None = None, notify: bool = True,
                 hot_window_s: float = 1.0, **kw) -> None:
        super().__init__(**kw)
        self._pids = pids if callable(pids) else (lambda fixed=tuple(pids): fixed)
        self.cgroups = tuple(cgroups)
        base = self.paths.cgroup_root
        self.v1_root = v1_root if v1_root is not None else os.path.join(base, "memory")
        if v2_root is None:
            v2_root = base if os.path.exists(os.path.join(base, "cgroup.controllers")) else (
                os.path.join(base, "unified"))
        self.v2_root = v2_root
        self.notify, self.hot_window_s = notify, hot_window_s
        self.watches: dict[tuple[int, str], Watch] = {}
        self._by_fd: dict[int, Watch] = {}
        self._poller = select.poll()
        self._next_full = self._next_resolve = 0.0

    # --- which cgroups ---------------------------------------------------------------

    def locate(self, v1: str | None, v2: str | None) -> tuple[int, str, str, str] | None:
        """(version, path, dir, root) of the memory cgroup for /proc/<pid>/cgroup paths."""
        if v1 is not None:
            d = self.v1_root + v1.rstrip("/")
            if os.path.exists(os.path.join(d, "memory.usage_in_bytes")):
                return 1, v1, d, self.v1_root
        if v2 is not None:
            d = self.v2_root + v2.rstrip("/")
            if os.path.exists(os.path.join(d, "memory.current")):
                return 2, v2, d, self.v2_root
        return None

    def _resolve(self, now: float) -> None:
        found: dict[tuple[int, str], tuple[tuple[int, str, str, str], set[int]]] = {}
        for path in self.cgroups:
            loc = self.locate(path, None) or self.locate(None, path)
            if loc:
                found.setdefault(loc[:2], (loc, set()))
        for pid in list(self._pids()):
            text = read_text(self.paths.pid(pid, "cgroup"))
            loc = self.locate(*parse_proc_cgroup(text)) if text else None
            if loc:
                found.setdefault(loc[:2], (loc, set()))[1].add(pid)
        for key, (loc, pids) in found.items():
            w = self.watches.get(key)
            if w is None:
                w = self.watches[key] = Watch(*loc, explicit=loc[1] in self.cgroups)
                w.pending = True  # first sample at once, not at the next interval
                self._arm(w)
            w.pids = pids
            if pids:
                w.pids_seen, w.dropping = now, False
        for key, w in list(self.watches.items()):
            if key not in found:
                w.pids = set()
                if not w.explicit and now - w.pids_seen > 2 * self.interval_s:
                    w.pending = w.dropping = True

    def _arm(self, w: Watch) -> None:
        if not self.notify:
            return
        try:
            if w.version == 1:
                efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
                try:
                    ofd = os.open(os.path.join(w.dir, "memory.oom_control"), os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        with open(os.path.join(w.dir, "cgroup.event_control"), "w") as f:
                            f.write(f"{efd} {ofd}")
                    finally:
                        os.close(ofd)
                except OSError:
                    os.close(efd)
                    raise
                w.fd = efd
                self._poller.register(efd, select.POLLIN)
            else:
                w.fd = os.open(os.path.join(w.dir, "memory.events"), os.O_RDONLY | os.O_CLOEXEC)
                self._poller.register(w.fd, select.POLLPRI)
            self._by_fd[w.fd] = w
        except OSError as e:  # no notification: polling still samples it
            log.info("cgroup notification unavailable cgroup=%s error=%s", w.path, e)

    def _drop(self, key: tuple[int, str]) -> None:
        w = self.watches.pop(key)
        if w.fd is not None:
            self._poller.unregister(w.fd)
            del self._by_fd[w.fd]
            os.close(w.fd)
            w.fd = None

    def close(self) -> None:
        for key in list(self.watches):
            self._drop(key)

    # --- sampling ---------------------------------------------------------------------

    def poll(self) -> list[Draft]:
        now = time.monotonic()
        full = now >= self._next_full
        if full:
            self._next_full = now + self.interval_s
        if now >= self._next_resolve:  # not during the 20 ms re-reads of a hot window
            self._next_resolve = now + min(1.0, self.interval_s)
            self._resolve(now)
        out: list[Draft] = []
        for key, w in list(self.watches.items()):
            if not (full or w.pending or w.hot_until):
                continue
            gone, w.pending = w.dropping, False
            got = sample(w)
            if got is None:  # removed: nothing left to read
                self._drop(key)
                continue
            fields, events = got
            base = {"cgroup": printable(w.path), "version": w.version,
                    "pids": clip(",".join(map(str, sorted(w.pids))))}
            first = w.counters is None
            out.extend(self._oom(w, fields, events, base, now))
            if full or gone or first:
                out.append(self.draft(KIND_CGROUP_MEMORY, fields={**base, **fields}))
            if gone:
                self._drop(key)
        return out

    def _oom(self, w: Watch, fields: dict, events: str, base: dict, now: float) -> list[Draft]:
        counters = {k: fields[k] for k in OOM_COUNTERS if fields.get(k) is not None}
        first, prev = w.counters is None, w.counters or {}
        w.counters = counters
        delta = {k: v - prev.get(k, 0) for k, v in counters.items()}
        moved = any(d > 0 for d in delta.values())
        expired = bool(w.hot_until) and w.hot_until <= now
        if not moved and not expired:
            return []
        notified = w.notified_ns
        w.notified_ns, w.hot_until = None, 0.0
        if not moved and notified is None:
            return []
        kill = delta.get("oom_kill", 0) > 0 or delta.get("oom_group_kill", 0) > 0
        extra = {"delta_oom_kill": delta.get("oom_kill", 0), "notified": notified is not None,
                 "first_sample": first}
        if w.version == 2:
            extra["delta_oom"] = delta.get("oom", 0)
        return [self.draft(KIND_CGROUP_OOM, message=clip(events, 4096), occurred_ns=notified,
                           severity=3 if kill else 4, fields={**base, **fields, **extra})]

    def wait(self, stop: threading.Event, timeout: float) -> None:
        """Until the next sample, a kernel notification, or stop (``timeout`` unused:
        the schedule is the source's own)."""
        slice_s = stop_slice(stop, STOP_SLICE_S)
        if isinstance(stop, StopEvent):
            self._poller.register(stop, select.POLLIN)
        while not stop.is_set():
            now = time.monotonic()
            if any(w.pending or (w.hot_until and w.hot_until <= now)
                   for w in self.watches.values()):
                return
            hot = any(w.hot_until for w in self.watches.values())
            left = HOT_POLL_S if hot else min(self._next_full, self._next_resolve) - now
            if left <= 0:
                return
            events = self._poller.poll(1000 * (left if slice_s is None else min(left, slice_s)))
            for fd, _ in events:
                if (w := self._by_fd.get(fd)) is None:
                    continue
                if w.version == 1:
                    try:
                        os.read(fd, 8)  # clear the eventfd counter
                    except BlockingIOError:
                        pass
                    if w.notified_ns is None:
                        w.notified_ns = time.time_ns()
                    w.hot_until = time.monotonic() + self.hot_window_s
                w.pending = True
            if events or hot:
                return
