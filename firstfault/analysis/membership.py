"""Which of the records a job's selection holds are the job's own. Pure.

A collector's store gives a job its own records plus the jobless records of its
nodes around its window (kernel, cgroup, GPU; firstfault/collector/store/shared.py).
On a shared node that is too much: another job's OOM kills, the kernel's boot log, a
process with ``RANK=0`` in its environment that belongs to no job, or one the agent's
job label named although it ended before the job began. ``learn`` reads the records
once and ``Membership.place`` then says of each record:

- ``job``: the job's own. A process record (procs) only of a *member*: a rank
  process of the job whose life [start, exit] overlaps the job's own records other
  than process records (its rank logs), widened by ``slack_ns``; when the job has no
  such records, every rank process of the job is a member. A jobless kernel line, GPU
  record or cgroup record is the job's when it names one of the members' pids (``pid=N``,
  ``Killed process N``, ``comm[N]:``, ``PID: N``, the ``pids`` of a cgroup sample or an
  Xid) at a time that member lived (widened as the lifetime is: a pid is reused once its
  process ends, and a node whose ``pid_max`` is 32768 wraps it within hours), or the memory
  cgroup of a member (``task_memcg=``; not the root ``/``), or, for a
  GPU error that names no process at all (an ``NVRM: Xid`` line, an NVML Xid), when it
  lies in the job's lifetime: the node's GPU is the job's.
- ``context``: a jobless kernel, GPU or cgroup record on a node of the job, in the job's
  lifetime, that names none of its processes or cgroups: node context, shown apart
  from the job's events (another job's OOM kill, a NIC flap).
- ``other``: none of the job's business: outside the lifetime, a rank process of no
  job (or of this job but outside its life), another job's record.

The lifetime is [first, last] of the job's own records and of its members' lives,
widened by ``slack_ns`` plus the largest clock uncertainty of its nodes, and open at
its end while a member's exit was not seen; a job's start/end marks (a scheduler's
prolog/epilog) widen it to themselves. Record times
are the nodes' own clocks, as the store's windows are.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from firstfault.wire import (
    KIND_AGENT_GAP,
    KIND_GPU_XID,
    KIND_JOB_MARK,
    KIND_KERNEL_GAP,
    KIND_PROC_EXIT,
    KIND_PROC_START,
    SOURCE_CGROUP,
    SOURCE_JOURNAL,
    SOURCE_KMSG,
    SOURCE_NVML,
    SOURCE_PROCS,
    Record,
)

JOB, CONTEXT, OTHER = "job", "context", "other"
SLACK_NS = 2_000_000_000  # the procs source polls every 2 s: an exit is seen up to then
_NODE_SOURCES = (SOURCE_KMSG, SOURCE_JOURNAL, SOURCE_NVML, SOURCE_CGROUP)
_PIDS = re.compile(r"(?:\bpid=|Killed process |\bPID: |(?<=\w)\[)(\d+)\b")
OPEN_NS = 2**63 - 1
_MEMCG = re.compile(r"\btask_memcg=(\S+?),")
_GPU_ERROR = re.compile(r"NVRM: Xid \(")


def _at(r: Record) -> int:
    return r.occurred_ns if r.occurred_ns is not None else r.observed_ns


def named_pids(text: str) -> set[int]:
    """The pids a kernel line names (``pid=N``, ``Killed process N``, ``PID: N``, ``comm[N]:``)."""
    return {int(m.group(1)) for m in _PIDS.finditer(text)}


@dataclass(frozen=True, slots=True)
class Life:
    """One rank process as the procs source saw it."""

    node: str
    pid: int
    rank: int
    start_ns: int
    end_ns: int | None
    cgroup: str | None


@dataclass(frozen=True, slots=True)
class Membership:
    job: str
    lives: Mapping[tuple[str, int], tuple[tuple[int, int], ...]]  # (node, pid) -> when a member held it, widened
    cgroups: frozenset[tuple[str, str]]  # (node, memory cgroup) of its members, not "/"
    lifetime: tuple[int, int] | None  # [lo, hi] on the nodes' clocks, widened

    @property
    def members(self) -> frozenset[tuple[str, int]]:
        """(node, pid) of the job's rank processes."""
        return frozenset(self.lives)

    def place(self, r: Record) -> str:
        """``job`` | ``context`` | ``other`` (the module docstring says when)."""
        if r.kind in (KIND_AGENT_GAP, KIND_KERNEL_GAP, KIND_JOB_MARK):
            return JOB if r.job in (None, self.job) else OTHER  # read as before: gaps, marks
        if r.job is not None:
            if r.job != self.job:
                return OTHER
            if r.source == SOURCE_PROCS and r.pid is not None:
                return JOB if (r.node, r.pid) in self.lives else OTHER
            return JOB
        if self.lifetime is None or not self.lifetime[0] <= _at(r) <= self.lifetime[1]:
            return OTHER
        if r.source not in _NODE_SOURCES:
            return OTHER  # a rank process, log or dump of no job: not this job's
        pids, cgroup = self._names(r)
        if any(self._held(r.node, p, _at(r)) for p in pids) or (r.node, cgroup) in self.cgroups:
            return JOB
        if not pids and cgroup is None and (r.kind == KIND_GPU_XID or _GPU_ERROR.search(r.message)):
            return JOB
        return CONTEXT

    def _held(self, node: str, pid: int, at: int) -> bool:
        """Whether a member held ``pid`` on ``node`` at ``at``."""
        return any(lo <= at <= hi for lo, hi in self.lives.get((node, pid), ()))

    @staticmethod
    def _names(r: Record) -> tuple[set[int], str | None]:
        if r.source == SOURCE_CGROUP:
            raw = r.fields.get("pids")
            pids = {int(p) for p in str(raw).split(",") if p.strip().isdigit()} if raw else set()
            cg = r.fields.get("cgroup")
            return pids, cg if isinstance(cg, str) else None
        pids = named_pids(r.message)
        if r.pid is not None:
            pids.add(r.pid)
        if r.source == SOURCE_NVML and isinstance(r.fields.get("pids"), str):
            pids |= {int(p) for p in r.fields["pids"].split(",") if p.strip().isdigit()}
        m = _MEMCG.search(r.message)
        return pids, m.group(1) if m else None


def _lives(procs: Iterable[Record]) -> list[Life]:
    start: dict[tuple[str, int], Record] = {}
    end: dict[tuple[str, int], Record] = {}
    ranks: dict[tuple[str, int], int] = {}
    for r in procs:
        key = (r.node, r.pid)
        ranks.setdefault(key, r.rank)
        if r.kind == KIND_PROC_START:
            start[key] = r
        elif r.kind == KIND_PROC_EXIT:
            end[key] = r
    out = []
    for key, rank in ranks.items():
        s, e = start.get(key), end.get(key)
        first = s.fields.get("start_ns") if s is not None else (e.fields.get("start_ns") if e is not None else None)
        if not isinstance(first, int):
            first = _at(s) if s is not None else None
        cg = s.fields.get("cgroup") if s is not None else None
        out.append(Life(key[0], key[1], rank, first if first is not None else 0,
                        _at(e) if e is not None else None, cg if isinstance(cg, str) and cg != "/" else None))
    return out


def learn(records: Iterable[Record], job: str, *, uncertainty_ns: Mapping[str, int] | None = None,
          slack_ns: int = SLACK_NS, span: tuple[int, int] | None = None) -> Membership:
    """The job's members and lifetime from the records of its selection (read once); ``span``: the
    first and last time of all the job's records (the store's), when ``records`` are only some."""
    procs: list[Record] = []
    lo = hi = None
    marks: list[int] = []
    for r in records:
        if r.job != job:
            continue
        if r.kind == KIND_JOB_MARK:
            marks.append(_at(r))
        elif r.source == SOURCE_PROCS:
            if r.pid is not None and r.rank is not None:
                procs.append(r)
        elif r.kind not in (KIND_AGENT_GAP, KIND_KERNEL_GAP):
            at = _at(r)
            lo, hi = (at, at) if lo is None else (min(lo, at), max(hi, at))
    pad = slack_ns + max((uncertainty_ns or {}).values(), default=0)
    lives = _lives(procs)
    if lo is not None:
        lives = [x for x in lives if x.start_ns <= hi + pad and (x.end_ns is None or x.end_ns >= lo - pad)]
    ends = [x.end_ns for x in lives if x.end_ns is not None]
    bounds = [b for b in (lo, hi, *(span or ()), *marks, *(x.start_ns for x in lives if x.start_ns), *ends)
              if b is not None]
    lifetime = (min(bounds) - pad, max(bounds) + pad) if bounds else None
    if lifetime is not None and any(x.end_ns is None for x in lives):
        lifetime = (lifetime[0], OPEN_NS)  # a member still runs (or its exit was not seen)
    held: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for x in lives:
        held[(x.node, x.pid)].append((x.start_ns - pad if x.start_ns else 0,
                                      x.end_ns + pad if x.end_ns is not None else OPEN_NS))
    return Membership(job, {k: tuple(v) for k, v in held.items()},
                      frozenset((x.node, x.cgroup) for x in lives if x.cgroup), lifetime)
