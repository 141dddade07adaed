"""procs: the node's rank processes (by their environment), their RSS and their exits.

Reads, with psutil, the pids, command lines and RSS (``psutil.pids()``,
``Process.cmdline()``, ``memory_info()``), and directly (pure parsers here)
``/proc/<pid>/environ``, ``/proc/<pid>/stat`` (state, ppid, start ticks and, for
a zombie, the exit status) and ``/proc/<pid>/cgroup``. A rank process is
one whose ``/proc/<pid>/environ`` holds ``RANK`` or ``LOCAL_RANK`` (``match_env``),
as torchrun, the DeepSpeed launcher and Accelerate set them, and whose parent is
neither a rank nor a helper of one: the launcher's direct worker. A descendant of a
rank (DataLoader workers, DeepSpeed's and ``torch.compile``'s compile workers,
``multiprocessing`` children and their own children) inherits ``RANK`` but is a
helper of that rank, never a rank: its RSS counts toward the rank's memory
(``children_rss_bytes``), its exit is not the rank's. Only a descendant whose
environment names another rank identity (a launcher that was itself started with
``RANK`` set) is a rank of its own. Identity (pure ``rank_identity``):

- job: ``SLURM_JOB_ID``, else ``TORCHELASTIC_RUN_ID`` (except torchrun's
  placeholder ``none``), else the configured ``job_label``, else nil;
- rank: ``RANK``, else ``SLURM_PROCID``; local_rank: ``LOCAL_RANK``, else ``SLURM_LOCALID``.

Emits (Record job, rank, local_rank, pid set):

- ``proc.start``: occurred_ns = the process start (stat ticks on the boot clock,
  10 ms resolution); message = the command line, cut to 1 KiB; fields ``ppid``,
  ``comm``, ``cmdline``, ``start_ns``, ``rss_bytes``, ``cgroup`` (the memory cgroup:
  v1 memory path, else the v2 path) and ``cgroup_version``, and the launcher's
  variables present (CONTEXT_ENV), lower-cased, raw strings: ``world_size``,
  ``local_world_size`` (DeepSpeed: ``local_size``), ``group_rank``,
  ``master_addr``, ``master_port``, ``slurm_job_id``, ``slurm_procid``,
  ``torchelastic_run_id``, ``torchelastic_restart_count``,
  ``torchelastic_error_file`` (where torchrun's ``@record`` writes error.json), ...;
  in a Kubernetes pod's cgroup also ``pod_uid`` and ``container_id``.
  Real environments: tests/data/proc/torchrun, tests/data/proc/deepspeed.
- ``proc.exit``: the agent is not the parent, so it cannot wait(): if the process
  was seen as a zombie, ``/proc/<pid>/stat`` field 52 holds its wait status:
  fields ``wait_status``, ``code`` (exit code, or -signal as Python's
  ``returncode``), ``signal`` (``SIGKILL``), ``core_dumped``; otherwise those are
  absent. Always ``last_seen_ns`` (last time seen alive), ``rss_bytes`` (last
  sample before it began to die), ``peak_rss_bytes`` (largest sample: samples are
  ``interval_s`` apart, so a fast final climb is missed; the kernel's OOM line has
  the RSS at the kill), ``start_ns``, ``uptime_s``.
  occurred_ns = when the kernel said it ended (a pidfd became readable, Linux
  5.3+, own /proc only), else nil: then it ended in (last_seen_ns, observed_ns].
  The zombie's status is read as soon as its pidfd fires (a launcher that polls its
  workers reaps them within ~0.1 s), and again at the poll.
  (Reading field 52 needs the ptrace access that reading the environ needed.)
- ``proc.memory`` every ``rss_interval_s``: ``rss_bytes`` of each rank, and
  ``children_rss_bytes`` / ``children`` (the sum of its live helpers' RSS and how
  many there are) when it has helpers.

``pids()`` / ``ranks()`` give, from any thread, a snapshot of the pid map (the
cgroup source follows ``pids``).

Known issues: environ is the one the process was exec'd with; it is re-read while
a process is younger than ``young_s`` (10 s: a fork about to exec), then a
non-rank is not looked at again. A rank that runs through a wrapper (``bash -c
"python ..."``) is the wrapper. ``psutil.PROCFS_PATH`` is process-wide: a
HostPaths.proc other than /proc sets it for the whole agent.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

import psutil

from firstfault.agent.clock import boot_wall
from firstfault.agent.kubepods import parse_pod_cgroup
from firstfault.agent.sources.base import Draft, PollingSource, StopEvent, printable, read_text, register, stop_slice
from firstfault.agent.sources.cgroup import parse_proc_cgroup
from firstfault.wire import KIND_PROC_EXIT, KIND_PROC_START, SOURCE_PROCS

log = logging.getLogger(__name__)

KIND_PROC_MEMORY = "proc.memory"  # not (yet) in wire.KINDS; new kinds decode as-is
MATCH_ENV = ("RANK", "LOCAL_RANK")
# Shipped as fields when present (torchrun, DeepSpeed launcher, Slurm); 19 at most.
CONTEXT_ENV = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "ROLE_RANK", "CROSS_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
               "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
               "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
               "TORCHELASTIC_ERROR_FILE")
CLK_TCK = os.sysconf("SC_CLK_TCK")
STOP_SLICE_S = 0.25


class Identity(NamedTuple):
    job: str | None
    rank: int | None
    local_rank: int | None
    env: dict[str, str]  # the CONTEXT_ENV variables present


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def parse_environ(data: bytes) -> dict[str, str]:
    """``/proc/<pid>/environ`` (NUL-separated ``KEY=value``) -> dict."""
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "backslashreplace")
    return env


def rank_identity(env: dict[str, str], job_label: str | None = None,
                  match_env: tuple[str, ...] = MATCH_ENV) -> Identity | None:
    """The rank identity of a process environment, or None if it is not a rank. Pure."""
    if not any(k in env for k in match_env):
        return None
    run_id = env.get("TORCHELASTIC_RUN_ID")
    job = env.get("SLURM_JOB_ID") or (run_id if run_id and run_id != "none" else None) or job_label
    rank = _int(env.get("RANK")) if "RANK" in env else _int(env.get("SLURM_PROCID"))
    local = _int(env.get("LOCAL_RANK")) if "LOCAL_RANK" in env else _int(env.get("SLURM_LOCALID"))
    kept = {k: env[k] for k in CONTEXT_ENV if k in env}
    return Identity(job, rank, local, kept)


class Stat(NamedTuple):
    comm: str
    state: str
    ppid: int
    start_ticks: int  # since boot, in 1/CLK_TCK s
    exit_status: int  # waitpid() status; meaningful for a zombie


def parse_stat(text: str) -> Stat:
    """``/proc/<pid>/stat``: fields 2 (comm), 3, 4, 22 and 52 (Linux 3.5+; 0 if absent)."""
    left, right = text.index("("), text.rindex(")")
    rest = text[right + 2:].split()
    return Stat(text[left + 1:right], rest[0], int(rest[1]), int(rest[19]),
                int(rest[49]) if len(rest) > 49 else 0)


def exit_fields(status: int) -> dict:
    """Fields of a waitpid() status: code (-signal if killed), signal name, core_dumped."""
    out: dict = {"wait_status": status}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"SIG{sig}"
        out.update(code=-sig, signal=name, core_dumped=os.WCOREDUMP(status))
    elif os.WIFEXITED(status):
        out.update(code=os.WEXITSTATUS(status), signal=None, core_dumped=False)
    return out


@dataclass
class Rank:
    pid: int
    ident: Identity
    start_ticks: int
    start_ns: int
    last_seen_ns: int
    rss_bytes: int | None = None
    peak_rss_bytes: int | None = None
    pidfd: int | None = None
    ended_ns: int | None = None  # when the pidfd said it ended
    exit_status: int | None = None  # its wait status, read from its zombie as the pidfd fired


class Helper(NamedTuple):
    """A descendant of a rank: counted toward its memory, never a rank itself."""
    rank_pid: int
    ino: int  # of /proc/PID: a reused pid gets a new one


@register
class ProcsSource(PollingSource):
    """Finds rank processes and follows them; see the module docstring."""

    name = SOURCE_PROCS
    interval_s = 2.0

    def __init__(self, *, job_label: str | None = None, match_env: tuple[str, ...] = MATCH_ENV,
                 rss_interval_s: float = 10.0, young_s: float = 10.0, **kw) -> None:
        super().__init__(**kw)
        self.job_label, self.match_env = job_label, tuple(match_env)
        self.rss_interval_s, self.young_s = rss_interval_s, young_s
        if not self.paths.is_default_proc and psutil.PROCFS_PATH != self.paths.proc:
            log.info("psutil reads %s for the whole agent", self.paths.proc)
            psutil.PROCFS_PATH = self.paths.proc
        self.use_pidfd = self.paths.is_default_proc and hasattr(os, "pidfd_open")
        self._ranks: dict[int, Rank] = {}
        self._published: dict[int, Identity] = {}
        self._helpers: dict[int, Helper] = {}  # pid -> the rank it descends from
        # pid -> (start ticks, inode of /proc/PID) of a process found not a rank: while the
        # inode stays, it is that process (a reused pid gets a new one) and is not read again
        self._seen: dict[int, tuple[int, int]] = {}
        self._poller = select.poll()
        self._next_rss = 0.0

    # --- the map, for other threads ------------------------------------------------

    def ranks(self) -> dict[int, Identity]:
        """pid -> Identity of the ranks alive at the last poll (a snapshot)."""
        return dict(self._published)

    def pids(self) -> tuple[int, ...]:
        return tuple(self._published)

    # --- polling ---------------------------------------------------------------------

    def _stat(self, pid: int) -> Stat | None:
        try:
            with open(self.paths.pid(pid, "stat"), encoding="utf-8", errors="replace") as f:
                return parse_stat(f.read())
        except (OSError, ValueError, IndexError):
            return None

    def _pids(self) -> dict[int, int]:
        """pid -> inode of /proc/PID of every process, from one read of /proc (the
        inodes come with the directory entries: no stat per process)."""
        with os.scandir(self.paths.proc) as entries:
            return {int(e.name): e.inode() for e in entries if e.name.isdigit()}

    def poll(self) -> list[Draft]:
        out: list[Draft] = []
        now_ns, boot = time.time_ns(), boot_wall()
        uptime_ticks = (boot.at_boottime_ns * CLK_TCK) // 1_000_000_000
        alive = self._pids()
        for pid, r in list(self._ranks.items()):
            st = self._stat(pid) if pid in alive else None
            if st is not None and st.start_ticks == r.start_ticks and st.state not in "ZX":
                r.last_seen_ns = now_ns
                continue
            status = st.exit_status if st is not None and st.start_ticks == r.start_ticks else r.exit_status
            out.append(self._exit(r, status, now_ns))
        new = []
        self._prune_helpers(alive)
        for pid in alive.keys() - self._ranks.keys() - self._helpers.keys():
            ino, seen = alive[pid], self._seen.get(pid)
            if seen is not None and ino == seen[1]:
                continue
            st = self._stat(pid)
            if st is None or st.state in "ZX":
                continue
            if seen is not None and seen[0] == st.start_ticks:
                self._seen[pid] = st.start_ticks, ino
                continue
            new.append((st.start_ticks, pid, st, ino))
        for _, pid, st, ino in sorted(new):  # parents before their children
            ident = self._identify(pid)
            root = self._rank_above(st.ppid)
            if root is not None and (ident is None or root.ident[:3] == ident[:3]):
                self._helpers[pid] = Helper(root.pid, ino)  # a helper of that rank
                continue
            if ident is None:
                if (uptime_ticks - st.start_ticks) / CLK_TCK >= self.young_s:
                    self._seen[pid] = st.start_ticks, ino
                continue
            out.append(self._start(pid, st, ident, boot.ns, now_ns))
        for pid in [p for p in self._seen if p not in alive]:
            del self._seen[pid]
        rss_due = time.monotonic() >= self._next_rss
        if rss_due:
            self._next_rss = time.monotonic() + self.rss_interval_s
        children = self._children_rss() if rss_due else {}
        for r in self._ranks.values():
            self._sample_rss(r)
            if rss_due and r.rss_bytes is not None:
                fields = {"rss_bytes": r.rss_bytes}
                if r.pid in children:
                    fields["children_rss_bytes"], fields["children"] = children[r.pid]
                out.append(self.draft(KIND_PROC_MEMORY, job=r.ident.job, rank=r.ident.rank,
                                      local_rank=r.ident.local_rank, pid=r.pid, fields=fields))
        self._published = {pid: r.ident for pid, r in self._ranks.items()}
        return out

    def _rank_above(self, ppid: int) -> Rank | None:
        """The rank a process whose parent is ``ppid`` descends from, if any."""
        rank = self._ranks.get(ppid)
        if rank is None and ppid in self._helpers:
            rank = self._ranks.get(self._helpers[ppid].rank_pid)
        return rank

    def _prune_helpers(self, alive: dict[int, int]) -> None:
        """Forget helpers that ended (or whose pid now holds another process)."""
        for pid in [p for p, h in self._helpers.items() if alive.get(p) != h.ino]:
            del self._helpers[pid]

    def _children_rss(self) -> dict[int, tuple[int, int]]:
        """rank pid -> (RSS of its live helpers summed, how many)."""
        out: dict[int, tuple[int, int]] = {}
        for pid, h in self._helpers.items():
            try:
                rss = psutil.Process(pid).memory_info().rss
            except (psutil.Error, OSError):
                continue
            total, n = out.get(h.rank_pid, (0, 0))
            out[h.rank_pid] = total + rss, n + 1
        return out

    def _identify(self, pid: int) -> Identity | None:
        try:
            with open(self.paths.pid(pid, "environ"), "rb") as f:
                env = parse_environ(f.read())
        except OSError:  # gone, or not ours to read (needs ptrace access: root here)
            return None
        return rank_identity(env, self.job_label, self.match_env)

    def _sample_rss(self, r: Rank) -> None:
        try:
            rss = psutil.Process(r.pid).memory_info().rss
        except (psutil.Error, OSError):
            return
        if rss:  # 0: already dying (its memory torn down); keep the last real sample
            r.rss_bytes, r.peak_rss_bytes = rss, max(r.peak_rss_bytes or 0, rss)

    def _start(self, pid: int, st: Stat, ident: Identity, boot_ns: int, now_ns: int) -> Draft:
        start_ns = boot_ns + st.start_ticks * 1_000_000_000 // CLK_TCK
        r = Rank(pid, ident, st.start_ticks, start_ns, now_ns)
        self._ranks[pid] = r
        self._sample_rss(r)
        try:
            cmdline = " ".join(psutil.Process(pid).cmdline())
        except (psutil.Error, OSError):
            cmdline = ""
        v1, v2 = parse_proc_cgroup(read_text(self.paths.pid(pid, "cgroup")) or "")
        cg_path, cg_version = (v1, 1) if v1 is not None else (v2, 2) if v2 is not None else (None, None)
        if self.use_pidfd:
            self._open_pidfd(r)
        fields = {"ppid": st.ppid, "comm": printable(st.comm), "cmdline": printable(cmdline),
                  "start_ns": start_ns, "rss_bytes": r.rss_bytes,
                  "cgroup": printable(cg_path) if cg_path else None, "cgroup_version": cg_version}
        fields.update((k.lower(), printable(v)) for k, v in ident.env.items())
        pod = parse_pod_cgroup(cg_path) if cg_path else None
        if pod is not None:  # a Kubernetes pod's process (firstfault/agent/kubepods.py)
            fields.update(pod_uid=pod.pod_uid, container_id=pod.container_id)
        return self.draft(KIND_PROC_START, message=printable(cmdline), occurred_ns=start_ns,
                          observed_ns=now_ns, job=ident.job, rank=ident.rank,
                          local_rank=ident.local_rank, pid=pid, fields=fields)

    def _open_pidfd(self, r: Rank) -> None:
        try:
            fd = os.pidfd_open(r.pid)
        except OSError:
            return
        st = self._stat(r.pid)  # the pid may have been reused since it was read
        if st is None or st.start_ticks != r.start_ticks:
            os.close(fd)
            return
        r.pidfd = fd
        self._poller.register(fd, select.POLLIN)

    def _close_pidfd(self, r: Rank) -> None:
        if r.pidfd is not None:
            if r.ended_ns is None:  # wait() unregistered it when it fired
                self._poller.unregister(r.pidfd)
            os.close(r.pidfd)
            r.pidfd = None

    def _exit(self, r: Rank, status: int | None, now_ns: int) -> Draft:
        del self._ranks[r.pid]
        self._close_pidfd(r)
        fields = exit_fields(status) if status is not None else {}
        end_ns = r.ended_ns or now_ns
        fields.update(last_seen_ns=r.last_seen_ns, rss_bytes=r.rss_bytes,
                      peak_rss_bytes=r.peak_rss_bytes, start_ns=r.start_ns,
                      uptime_s=round((end_ns - r.start_ns) / 1e9, 3))
        how = ("status unknown" if "code" not in fields else
               f"signal {-fields['code']} ({fields['signal']})" if fields["signal"] else
               f"code {fields['code']}")
        sev = 5 if "code" not in fields else 6 if fields["code"] == 0 else 4
        return self.draft(KIND_PROC_EXIT, message=f"pid {r.pid} exited: {how}",
                          occurred_ns=r.ended_ns, observed_ns=now_ns, job=r.ident.job,
                          rank=r.ident.rank, local_rank=r.ident.local_rank, pid=r.pid,
                          severity=sev, fields=fields)

    def wait(self, stop: threading.Event, timeout: float) -> None:
        """Until the next poll, or at once when a rank's pidfd says it ended."""
        deadline = time.monotonic() + timeout
        by_fd = {r.pidfd: r for r in self._ranks.values() if r.pidfd is not None}
        slice_s = stop_slice(stop, STOP_SLICE_S)
        if by_fd and isinstance(stop, StopEvent):
            self._poller.register(stop, select.POLLIN)
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if not by_fd:
                stop.wait(left)
                continue
            events = self._poller.poll(1000 * (left if slice_s is None else min(left, slice_s)))
            if events:
                now_ns = time.time_ns()
                for fd, _ in events:
                    r = by_fd.get(fd)
                    if r is not None and r.ended_ns is None:
                        r.ended_ns = now_ns
                        # its parent may reap it within milliseconds (a launcher's poll): read
                        # the zombie's status now rather than at the next poll
                        st = self._stat(r.pid)
                        if st is not None and st.start_ticks == r.start_ticks and st.state in "ZX":
                            r.exit_status = st.exit_status
                        self._poller.unregister(fd)  # readable until closed: stop polling it
                return

    def close(self) -> None:
        for r in self._ranks.values():
            self._close_pidfd(r)
        self._ranks.clear()
        self._helpers.clear()
        self._published = {}
