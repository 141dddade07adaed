"""Identify: which rank, node and pid each finding is, and the job's ranks and nodes. Pure.

The one stage that gives findings their identity; no later stage writes a rank, pid or node.
It returns new Findings (``findings.linked``), never edits the ones it was given. In order:

1. torchrun's failure summary: its "rank : N" line names the rank of the exit line below it;
   a launcher line that names the rank of the stream's next traceback (catalog ``names_rank_of``:
   mp.spawn's "-- Process N terminated with the following error:");
2. match groups (launcher lines, NCCL lines, error.json) name ranks, local ranks and pids, and
   teach the pid -> rank map; a line that names only a pid is that pid's rank's;
3. on one node a local rank (``[default1]:``, a torchrun worker folder) is the global rank; in a
   torchrun worker folder (``attempt_<k>/<local rank>/``) the rank the worker's own lines carry
   (``[rank2]:``) is the rank of the folder's other files (its error.json);
4. the agents' process records add pids; a node given for a folder (``NODE=PATH``) is the node of
   every rank whose lines it holds, torchrun's "host" line only where nothing else said;
5. kernel findings (OOM kill, Xid) are tied to ranks by pid, else an OOM kill to the one rank that
   died by SIGKILL on its node; one of another job (a pid of none of the ranks, from before the
   job's processes started, or when every rank's pid is known) becomes context;
4b. in a stream whose lines carry rank prefixes, a failure printed without one (a CUDA kernel's
   device-side assert, an NCCL WARN) takes the rank of the ranked failure that follows it within a
   few lines, when every unranked line of that run is one process's (``followed_by_rank``); its
   confidence is capped at medium: adjacency is the weakest evidence of a rank;
6. a kernel OOM kill of no rank yet that explains a SIGKILL the agent saw (deaths.link_oom_kills)
   is that rank's; the agents' exit records name the node of the ranks they saw end.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from firstfault.analysis.deaths import link_oom_kills
from firstfault.analysis.events import KIND_TRACEBACK, Event
from firstfault.analysis.exits import agent_exits
from firstfault.analysis.findings import Finding, exit_of, int_or_none, linked
from firstfault.analysis.ownership import EXCEPTION_LINE

WORKER_FILES = ("stdout.log", "stderr.log", "error.json")


@dataclass(frozen=True, slots=True)
class Identity:
    """The identify stage's output: the findings with their ranks, pids and nodes, and the job's."""

    findings: list[Finding]  # in the order given, identity filled
    rank_nodes: dict[int, str | None]  # every rank the inputs and the findings name -> its node
    pids: dict[int, int]  # pid -> rank, from the findings and the agents' process records
    single_node: bool  # the job ran on one node (a local rank is then the global rank)
    exits: dict[int, tuple[dict, str | None]]  # rank -> (exit, node) as the agents saw its process end

    @property
    def nodes(self) -> dict[int, str | None]:
        """rank_nodes with the ranks only the agents' exit records name."""
        out = dict(self.rank_nodes)
        for r, (_, node) in self.exits.items():
            out.setdefault(r, node)
        return out


def identify(findings: list[Finding], rank_nodes: Mapping[int, str | None],
             procs: Iterable[Event] = ()) -> Identity:
    """Ranks, pids and nodes for findings that lack them (rules 1-6 of the module)."""
    procs = list(procs)
    rank_nodes = dict(rank_nodes)
    nodes = {n for n in rank_nodes.values() if n} | {f.ev.node for f in findings if f.ev.node}
    # local ranks name global ranks only on one node: not when a global rank exceeds every local rank seen
    ranks_seen = {f.ev.rank for f in findings if f.ev.rank is not None} | set(rank_nodes)
    locals_seen = {f.ev.local_rank for f in findings if f.ev.local_rank is not None}
    locals_seen |= {int(v) for f in findings if (v := f.match.groups.get("local_rank")) and v.isdigit()}
    single = len(nodes) <= 1 and not (ranks_seen and locals_seen and max(ranks_seen) > max(locals_seen))
    findings = _announced_ranks(_failure_summary(findings))
    findings, pids = link_identity(findings, single_node=single)
    findings = [linked(f, rank=f.ev.local_rank, rank_from="local rank on a single node")
                if single and f.ev.rank is None and f.ev.local_rank is not None and f.ev.source != "kernel" else f
                for f in findings]
    findings = _worker_folders(findings)
    findings = followed_by_rank(findings)
    started: dict[str | None, int] = {}
    for ev in procs:
        if ev.pid and ev.rank is not None:
            pids.setdefault(ev.pid, ev.rank)
        if ev.fields.get("proc") == "start" and ev.occurred_ns is not None:
            started[ev.node] = min(started.get(ev.node, ev.occurred_ns), ev.occurred_ns)
    for f in findings:  # the folder's node first: a launcher's "host" field can only fill a gap
        if f.ev.rank is not None and f.ev.source != "kernel" \
                and not (f.has("failure-table-rank") or f.has("failure-table-host")):
            if f.ev.node:
                rank_nodes[f.ev.rank] = rank_nodes.get(f.ev.rank) or f.ev.node
            else:
                rank_nodes.setdefault(f.ev.rank, None)
    rank_nodes.update(_failure_hosts(findings, rank_nodes))
    findings = [linked(f, node=rank_nodes.get(f.ev.rank))
                if f.ev.rank is not None and f.ev.node is None and f.ev.source != "kernel" else f for f in findings]
    findings = link_kernel(findings, pids, rank_nodes, started)
    findings = link_oom_kills(procs, findings)
    return Identity(findings, rank_nodes, pids, single, agent_exits(procs, pids))


def link_identity(findings: list[Finding], single_node: bool) -> tuple[list[Finding], dict[int, int]]:
    """(the findings with ranks, local ranks and pids from their match groups, the pid -> rank map learnt)."""
    pids: dict[int, int] = {}
    out = []
    for f in findings:
        g = f.match.groups
        ev = f.ev
        change: dict = {}
        rank = ev.rank
        if rank is None:
            r = int_or_none(g.get("rank"))
            if r is None and single_node:
                r = int_or_none(g.get("local_rank"))
            if r is not None:
                rank = change["rank"] = r
                change["rank_from"] = "message" if f.role == "root" else "launcher or summary line"
            elif int_or_none(g.get("pg_rank")) is not None:
                # a process group's own rank (PyTorch 1.13-2.1's "[Rank r] NCCL watchdog ..."): the job's
                # rank for the default group, a subgroup's otherwise, and the line does not say which
                rank = change["rank"] = int_or_none(g.get("pg_rank"))
                change["rank_from"] = "message (a process group's rank)"
                f = replace(f, cap="medium" if f.cap in (None, "high") else f.cap)
        if ev.local_rank is None and int_or_none(g.get("local_rank")) is not None:
            change["local_rank"] = int_or_none(g.get("local_rank"))
        pid = int_or_none(g.get("pid")) or ev.pid
        if pid and ev.source != "kernel":
            if pid != ev.pid:
                change["pid"] = pid
            if rank is not None:
                pids.setdefault(pid, rank)
        out.append(linked(f, **change) if change else f)
    # lines that name only a pid ("Signal 9 (SIGKILL) received by PID 4242")
    out = [linked(f, rank=pids[f.ev.pid], rank_from=f"pid {f.ev.pid}")
           if f.ev.rank is None and f.ev.source != "kernel" and f.ev.pid in pids else f for f in out]
    return out, pids


def link_kernel(findings: list[Finding], pids: Mapping[int, int], rank_nodes: Mapping[int, str | None],
                started: Mapping[str | None, int] | None = None) -> list[Finding]:
    """Kernel findings tied to ranks by pid, else an OOM kill to the one SIGKILLed rank (rule 5).

    ``started``: per node, when the job's first process there started (the agents'
    process records). A kernel line naming a pid that is none of the job's ranks (an
    OOM kill, an Xid), from before that, was another job's (back-to-back jobs share a
    node's kernel log): it becomes context, never the job's failure. One that names
    no pid (a GPU fallen off the bus) may still be why the job failed: it stays. So is one
    naming a pid that is none of the ranks' when the launcher named every rank's pid. The kernel's
    OOM report (context, trait ``oom-report``) is linked too: judge.oom_reported reads it where its
    kill line is cut off."""
    killed: dict[str | None, set[int]] = defaultdict(set)
    for f in findings:
        ex = exit_of(f)
        if ex and ex["signal"] == "SIGKILL" and f.ev.rank is not None and f.ev.source != "kernel":
            killed[rank_nodes.get(f.ev.rank)].add(f.ev.rank)
    return [_kernel_linked(f, pids, rank_nodes, started or {}, killed)
            if f.ev.source == "kernel" and f.ev.rank is None and (f.role != "context" or f.has("oom-report"))
            else f for f in findings]


# how a kernel finding of a process outside the job ends its links (judge.oom_reported reads them)
ANOTHER_JOBS, ANOTHER_PROCESS = "another job's", "another process's"


def _kernel_linked(f: Finding, pids: Mapping[int, int], rank_nodes: Mapping[int, str | None],
                   started: Mapping[str | None, int], killed: Mapping[str | None, set[int]]) -> Finding:
    ev = f.ev
    pid = int_or_none(f.match.groups.get("pid"))
    if pid is not None and pid != ev.pid:
        f = linked(f, pid=pid)
        ev = f.ev
    pid = ev.pid  # NVML's Xid names no pid in its text: the GPU's one process
    first = started.get(ev.node)
    if (pid is not None and pid not in pids and first is not None
            and ev.occurred_ns is not None and ev.occurred_ns + ev.uncertainty_ns < first):
        return replace(f, match=replace(f.match, role="context"),
                       links=[*f.links, f"pid {pid} is no rank of this job, and this came before its processes "
                                        f"started on {ev.node}: {ANOTHER_JOBS}"])
    if pid is not None and pid not in pids and rank_nodes and set(rank_nodes) <= set(pids.values()):
        return replace(f, match=replace(f.match, role="context"),  # every rank's pid is known, and this is none of them
                       links=[*f.links, f"pid {pid} is none of the job's ranks (the launcher named every rank's pid): "
                                        f"{ANOTHER_PROCESS}"])
    if pid in pids:
        f = linked(f, f"pid {pid} is rank {pids[pid]}", rank=pids[pid], rank_from=f"pid {pid}")
    elif f.category == "host-memory":
        cands = killed.get(ev.node) or (killed.get(None) if ev.node is None else None)
        if not cands and len(killed) == 1:
            cands = next(iter(killed.values()))
        if cands and len(cands) == 1:
            rank = next(iter(cands))
            f = linked(f, f"rank {rank} is the only rank that died by SIGKILL on this node", rank=rank,
                       rank_from="the only rank that died by SIGKILL on the node")
    if f.ev.rank is not None and f.ev.node is None:
        f = linked(f, node=rank_nodes.get(f.ev.rank))
    return f


def _folder(stream: str) -> str | None:
    """The torchrun worker folder (``.../attempt_<k>/<local rank>``) a stream's file is in, else None."""
    path = stream.split("#", 1)[0].replace("\\", "/")
    folder, _, name = path.rpartition("/")
    if name not in WORKER_FILES or not folder.rpartition("/")[2].isdigit():
        return None
    return folder


def _worker_folders(findings: list[Finding]) -> list[Finding]:
    """A torchrun worker folder is one rank's: the rank its own lines carry names its other files'."""
    ranks: dict[str, set[int]] = {}
    for f in findings:
        folder = _folder(f.ev.stream)
        if folder and f.ev.rank is not None:
            ranks.setdefault(folder, set()).add(f.ev.rank)
    out = []
    for f in findings:
        folder = _folder(f.ev.stream)
        if f.ev.rank is None and folder and len(ranks.get(folder, ())) == 1:
            f = linked(f, rank=next(iter(ranks[folder])), rank_from="the rank its torchrun worker folder's lines carry")
        out.append(f)
    return out


FOLLOW_GAP = 12  # lines from an unranked failure to the ranked one that follows it
FOLLOW_RUN = 40  # lines a run of unranked failures may span before the ranked one
_NCCL_ORIGIN = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[\d+\] ")  # NCCL's "host:pid:tid [cudaDev] "
_CAPS = ("low", "medium", "high")


def _pid_of(f: Finding) -> int | None:
    """The process that printed a finding: its pid, else the pid of NCCL's "host:pid:tid [dev]" origin."""
    if f.ev.pid is not None:
        return f.ev.pid
    m = _NCCL_ORIGIN.search(f.ev.text)
    return int(m.group("pid")) if m else None


def _own_rank(f: Finding) -> bool:
    """The rank is the line's own (its prefix or its file), not one linked from elsewhere."""
    return f.ev.rank is not None and f.ev.fields.get("rank_from") in (None, "line prefix") and f.ev.source != "kernel"


def _printed_by_rank(g: Finding, f: Finding) -> bool:
    """``g`` (unranked) is a line the rank's process itself prints without the rank's prefix: an NCCL
    line (its "host:pid:tid [dev]" origin), a CUDA kernel's device-side output, or the same error
    as ``f``'s; or an exception's line above a traceback of the rank whose own exception line is
    missing (a cut traceback: a paste that puts the error first, then the frames it came from).
    Another printer's (Ray's raylet, a NIC provider library) says nothing of the rank."""
    return (g.sig == f.sig or g.sig.startswith("cuda.") or _NCCL_ORIGIN.search(g.ev.text) is not None
            or (f.has("cut-traceback") and EXCEPTION_LINE.match(g.ev.text.lstrip()) is not None))


def followed_by_rank(findings: list[Finding]) -> list[Finding]:
    """Rule 4b: an unranked failure takes the rank of the failure its own process prints next (not a
    person's caption or heading over the paste: those are marked prose, no process printed them).

    A CUDA kernel's device-side assert and NCCL's WARN lines carry no rank prefix even where the
    launcher or the program prefixes every Python line (``[rank0]:``); the rank's own exception
    (its traceback, ProcessGroupNCCL's error) follows them. The unranked run must name at most one
    pid (NCCL's origin), which the ranked finding must not contradict, and lie within FOLLOW_GAP
    lines of it, with no other rank's line between; the rank so given is capped at medium confidence
    (unless it is the same error, repeated with the rank's prefix)."""
    by_stream: dict[str, list[int]] = defaultdict(list)
    for i, f in enumerate(findings):
        by_stream[f.ev.stream].append(i)
    named: dict[int, Finding] = {}
    for idx in by_stream.values():
        run: list[int] = []
        between: set[int] = set()  # ranks whose own context lines lie between the run and now
        for i in sorted(idx, key=lambda i: findings[i].ev.seq):
            f = findings[i]
            if f.ev.rank is None:
                if f.ev.source == "kernel" or f.ev.local_rank is not None or f.has("failure-table-rank"):
                    run = []  # another printer's line (a launcher's, the kernel's) between: no adjacency
                    continue
                if f.role not in ("root", "cascade") or f.ev.fields.get("prose"):
                    continue  # a person's words over the paste (a caption, a heading) are no process's line
                if run and f.ev.seq - findings[run[-1]].ev.seq > FOLLOW_GAP:
                    run = []
                if not run:
                    between = set()
                run.append(i)
                continue
            if not _own_rank(f):
                run = []  # a launcher's or a summary's line about a rank: another printer between
                continue
            if not run:
                continue
            if f.role == "context":
                between.add(f.ev.rank)
                continue
            first, last = findings[run[0]], findings[run[-1]]
            pids = {p for j in run if (p := _pid_of(findings[j])) is not None}
            fpid = _pid_of(f)
            if (_own_rank(f) and f.ev.seq - last.ev.seq <= FOLLOW_GAP and f.ev.seq - first.ev.seq <= FOLLOW_RUN
                    and len(pids) <= 1 and (fpid is None or not pids or pids == {fpid}) and between <= {f.ev.rank}
                    and all(_printed_by_rank(findings[j], f) for j in run)):
                for j in run:
                    g = findings[j]
                    cap = g.cap
                    if g.sig != f.sig and (cap is None or _CAPS.index(cap) > 1):
                        cap = "medium"  # adjacency alone; the same error repeated is the rank's own word
                    named[j] = replace(linked(g, f"rank {f.ev.rank}'s own error follows it (line {f.ev.seq})",
                                              rank=f.ev.rank, rank_from="the ranked error that follows it"), cap=cap)
            run = []
    return [named.get(i, f) for i, f in enumerate(findings)]


def _failure_summary(findings: list[Finding]) -> list[Finding]:
    """torchrun's failure summary, line by line: "host : H", "rank : N (local_rank: M)",
    "exitcode : X (pid: P)". The rank line names the rank of the exit below it."""
    at = {(f.ev.stream, f.ev.seq): f for f in findings if f.has("failure-table-rank")}
    out = []
    for f in findings:
        above = at.get((f.ev.stream, f.ev.seq - 1))
        if above is not None and f.ev.rank is None:
            f = linked(f, rank=int(above.match.groups["rank"]), rank_from="launcher summary (torchrun's failure table)")
        out.append(f)
    return out


def _announced_ranks(findings: list[Finding]) -> list[Finding]:
    """A line that names the rank of the stream's next traceback (catalog ``names_rank_of``):
    mp.spawn's "-- Process N terminated with the following error:" above the child's traceback."""
    told: dict[str, tuple[int, int]] = {}  # stream -> (seq of the line, rank it named)
    named: dict[int, Finding] = {}  # index -> the finding with its rank
    for i in sorted(range(len(findings)), key=lambda i: (findings[i].ev.stream, findings[i].ev.seq)):
        f = findings[i]
        rank = f.match.groups.get("rank")
        if f.match.signature.names_rank_of == "next-traceback" and rank is not None and rank.isdigit():
            told[f.ev.stream] = (f.ev.seq, int(rank))
        elif f.ev.kind == KIND_TRACEBACK and f.ev.stream in told and f.ev.seq > told[f.ev.stream][0]:
            if f.ev.rank is None:
                r = told[f.ev.stream][1]
                named[i] = linked(f, f"the launcher named rank {r} for the traceback below its line", rank=r,
                                  rank_from="launcher line above the traceback")
            del told[f.ev.stream]
    return [named.get(i, f) for i, f in enumerate(findings)]


def _failure_hosts(findings: list[Finding], rank_nodes: Mapping[int, str | None]) -> dict[int, str | None]:
    """The nodes the summary's host line names for the rank below it, where nothing else did."""
    at = {(f.ev.stream, f.ev.seq): f for f in findings if f.has("failure-table-host")}
    out: dict[int, str | None] = {}
    for f in findings:
        host = at.get((f.ev.stream, f.ev.seq - 1))
        if f.has("failure-table-rank") and host is not None:
            rank = int(f.match.groups["rank"])
            if not rank_nodes.get(rank) and not out.get(rank):
                out[rank] = host.ev.node or host.match.groups["host"]
    return out
