"""Turn the records agents ship (firstfault/wire.py) into the analysis' Events. Pure.

The collector's ``report`` runs the same analysis as ``analyze`` on files; only
the reading differs. A rank-log record is one line (``rank.line``) or one whole
traceback (``rank.traceback``) as the agent read it: launcher prefixes are
stripped and the line's own timestamp read here exactly as for files (read once:
the agent ships a rank log's bytes as read and parses neither; what it did parse, a
CRI record's time and stream, comes as ``occurred_ns`` and field ``stream`` and is
used as it is). Time: the
line's own stamp when it has one (clock "line", read in the node's zone, UTC
unless told), else the agent's receipt time (clock "agent": the agent tails
live, so receipt follows writing by milliseconds). Kernel records carry the
kmsg time the agent converted (clock "kmsg"); journal records the journal's.

Records that are samples, not text (``cgroup.memory``, ``cgroup.oom``,
``proc.memory``, ``gpu.memory``) give a KIND_RECORD Event with no text (a
``cgroup.oom`` keeps its counters text) and fields
``memory`` (the record's kind) plus the record's own fields (analysis/memory.py).
A process start or exit (procs) gives a KIND_RECORD Event with its pid and rank
(fields ``proc``: start | exit, and ``exit`` holding the exit; ``memory`` and
``rss_bytes``/``peak_rss_bytes`` where the agent sampled them), which teaches the
pid -> rank map. An Xid that NVML delivered (nvml ``gpu.xid``) is a kernel Event
like the driver's ``NVRM: Xid`` line (clock "agent": stamped on receipt), with
the agent's message as its text and fields ``gpu``, ``uuid``, ``pci_bus_id``,
``pids``; its pid is the GPU's one compute process, if it had one.
Job marks (``job.mark``, from a scheduler's prolog/epilog) give no Event:
``mark_of`` turns one into the report's ``Inputs.marks`` entry.
A rank's stacks (``rank.stacks``: a py-spy dump the stacks source took, or a
faulthandler dump ranklog grouped) give a KIND_STACK Event with its frames
(firstfault/analysis/stacks.py), at the capture time (clock "agent"). A Flight Recorder
dump (``rank.flight_recorder``) gives a KIND_FLIGHT_RECORDER Event, the parsed dump in
``fields["dump"]`` (an unreadable one: ``fields["error"]``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timezone, tzinfo

from firstfault.analysis import stacks
from firstfault.analysis import traceback as tb
from firstfault.analysis.events import (
    KIND_FLIGHT_RECORDER,
    KIND_KERNEL,
    KIND_LINE,
    KIND_RECORD,
    KIND_STACK,
    KIND_TRACEBACK,
    Event,
)
from firstfault.analysis.frdump import FRFormatError, from_message
from firstfault.analysis.kernel import unescape_kmsg
from firstfault.analysis.parse import Prefixes, parse_nccl_origin, parse_stamp, strip_prefixes
from firstfault.wire import KIND_JOB_MARK, KIND_RANK_FLIGHT_RECORDER, KIND_RANK_STACKS, KIND_RANK_TRACEBACK, Record

AGENT_UNCERTAINTY_NS = 50_000_000  # receipt after writing, while tailing live (bench/tail.py)
_KERNEL_SOURCES = ("kmsg", "journal")


def _origin(r: Record) -> str:
    return f"{r.node}/{r.stream}/{r.seq}"


def rank_text(message: str) -> tuple[Prefixes, str]:
    """A rank record's first line with its launcher prefixes read, and the Event's text."""
    first, _, rest = message.partition("\n")
    pre = strip_prefixes(first)
    return pre, pre.text + ("\n" + rest if rest else "")


def _rank_event(r: Record, tz: tzinfo) -> Event:
    pre, text = rank_text(r.message)
    year = datetime.fromtimestamp(r.observed_ns / 1e9, tz=timezone.utc).year
    st = parse_stamp(pre.text, year=year, tz=tz)
    level = None
    if r.occurred_ns is not None:
        occurred, clock, uncertainty = r.occurred_ns, "line", st.uncertainty_ns if st else 0
    elif st is not None:
        occurred, clock, uncertainty, level = st.ns, "line", st.uncertainty_ns, st.level
    else:
        occurred, clock, uncertainty = r.observed_ns, "agent", AGENT_UNCERTAINTY_NS
    pid = r.pid
    nccl = parse_nccl_origin(pre.text)
    if nccl and pid is None:
        pid = nccl.pid
    kind, frames, exc_type, fields = KIND_LINE, (), None, {}
    escaped = tb.ESCAPED_HEADER in r.message  # a traceback held in one JSON string of the line
    lines = tb.escaped_lines(r.message) if escaped else r.message.split("\n")
    res = tb.assemble([tb.split_prefix(ln)[1] for ln in lines]) if (
        r.kind == KIND_RANK_TRACEBACK or escaped or tb.is_start(pre.text)) else None
    if res is not None:  # a traceback as the agent grouped it (its first line may be glued to other output)
        kind, text, frames, exc_type, fields = KIND_TRACEBACK, res.text, res.frames, res.exc_type, {"message": res.message}
    return Event(
        text=text, source="ranklog", kind=kind, node=r.node,
        rank=r.rank if r.rank is not None else pre.rank,
        local_rank=r.local_rank if r.local_rank is not None else pre.local_rank,
        pid=pid, job=r.job, occurred_ns=occurred, observed_ns=r.observed_ns, clock=clock,
        uncertainty_ns=uncertainty, origin=_origin(r),
        stream=f"{r.node}:{r.fields.get('path') or r.stream}", seq=r.seq, level=level,
        frames=frames, exc_type=exc_type, fields=fields,
    )


def _stacks_event(r: Record) -> Event:
    lines = [strip_prefixes(ln).text for ln in r.message.split("\n")]
    frames, pid = (), r.pid
    first = next((i for i, ln in enumerate(lines) if stacks.is_start(ln)), None)
    if first is not None:
        asm = stacks.Assembler(lines[first])
        for ln in lines[first + 1:]:
            if not asm.feed(ln):
                break
        frames = asm.result().frames
        pid = pid or asm.pid
    return Event(text="\n".join(lines), source="agent" if r.source != "ranklog" else "ranklog", kind=KIND_STACK,
                 node=r.node, rank=r.rank, local_rank=r.local_rank, pid=pid, job=r.job,
                 occurred_ns=r.occurred_ns or r.observed_ns, observed_ns=r.observed_ns, clock="agent",
                 uncertainty_ns=AGENT_UNCERTAINTY_NS, origin=_origin(r),
                 stream=f"{r.node}:stacks:{r.pid or r.rank}:{r.fields.get('trigger')}",
                 seq=r.seq, frames=frames, fields={k: r.fields[k] for k in ("tool", "trigger") if k in r.fields})


def _flight_recorder_event(r: Record) -> Event:
    fields: dict = {"path": r.fields.get("path")}
    try:
        fields["dump"] = from_message(r.message)
    except FRFormatError as e:
        fields["error"] = str(e)
    return Event(text="", source="agent", kind=KIND_FLIGHT_RECORDER, node=r.node, rank=r.rank,
                 local_rank=r.local_rank, pid=r.pid, job=r.job, occurred_ns=r.occurred_ns or r.observed_ns,
                 observed_ns=r.observed_ns, clock="agent" if r.occurred_ns is None else "file-mtime",
                 uncertainty_ns=AGENT_UNCERTAINTY_NS, origin=_origin(r), stream=f"{r.node}:flightrec",
                 seq=r.seq, fields=fields)


def _kernel_event(r: Record) -> Event:
    fields = {k: v for k, v in (("mono_ns", r.mono_ns), ("boot_id", r.boot_id)) if v is not None}
    rank = None
    if r.rank is not None and r.fields.get("rank_from") == "pod":  # an OOM kill in a rank's pod (agent's pods source)
        rank = r.rank
        fields["rank_from"] = f"pod {r.fields.get('namespace')}/{r.fields.get('pod')}"
    return Event(
        text=unescape_kmsg(r.message) if r.source == "kmsg" else r.message, source="kernel", kind=KIND_KERNEL,
        node=r.node, rank=rank, pid=None, job=r.job,
        occurred_ns=r.occurred_ns if r.occurred_ns is not None else r.observed_ns,
        observed_ns=r.observed_ns, clock=("journal" if r.source == "journal" else "kmsg")
        if r.occurred_ns is not None else "agent",
        uncertainty_ns=int(r.fields.get("clock_error_ns") or 0) if r.occurred_ns is not None else AGENT_UNCERTAINTY_NS,
        origin=_origin(r), stream=f"{r.node}:kernel", seq=r.seq, fields=fields,
    )


def _proc_event(r: Record) -> Event:
    fields: dict = {"proc": r.kind.removeprefix("proc.")}
    ws = r.fields.get("world_size")
    if isinstance(ws, str) and ws.isdigit():  # the launcher's WORLD_SIZE, as the rank saw it
        fields["world_size"] = int(ws)
    if r.kind == "proc.exit":
        fields["exit"] = {k: r.fields.get(k) for k in ("code", "signal") if k in r.fields}
    if r.fields.get("rss_bytes"):
        fields.update(memory=r.kind, rss_bytes=r.fields["rss_bytes"], peak_rss_bytes=r.fields.get("peak_rss_bytes"))
    return Event(
        text="", source="agent", kind=KIND_RECORD, node=r.node, rank=r.rank, local_rank=r.local_rank, pid=r.pid,
        job=r.job, occurred_ns=r.occurred_ns or r.observed_ns, observed_ns=r.observed_ns,
        clock="agent", uncertainty_ns=AGENT_UNCERTAINTY_NS, origin=_origin(r), stream=f"{r.node}:procs",
        seq=r.seq, fields=fields,
    )


def _nvml_xid_event(r: Record) -> Event:
    return Event(
        text=r.message, source="kernel", kind=KIND_KERNEL, node=r.node, pid=r.pid, job=r.job,
        occurred_ns=r.occurred_ns if r.occurred_ns is not None else r.observed_ns, observed_ns=r.observed_ns,
        clock="agent", uncertainty_ns=AGENT_UNCERTAINTY_NS, origin=_origin(r), stream=f"{r.node}:nvml",
        seq=r.seq, fields={k: r.fields[k] for k in ("gpu", "uuid", "pci_bus_id", "xid", "pids") if k in r.fields},
    )


_SAMPLE_KINDS = ("cgroup.memory", "cgroup.oom", "proc.memory", "gpu.memory")


def _sample_event(r: Record) -> Event:
    return Event(  # a cgroup.oom keeps its raw counters text (memory.oom_control / memory.events)
        text=r.message if r.kind == "cgroup.oom" else "", source="agent", kind=KIND_RECORD, node=r.node, rank=r.rank, local_rank=r.local_rank, pid=r.pid,
        job=r.job, occurred_ns=r.occurred_ns if r.occurred_ns is not None else r.observed_ns,
        observed_ns=r.observed_ns, clock="agent", uncertainty_ns=AGENT_UNCERTAINTY_NS, origin=_origin(r),
        stream=f"{r.node}:{r.source}", seq=r.seq, fields={**r.fields, "memory": r.kind},
    )


def mark_of(r: Record) -> dict | None:
    """A job.mark record as {node, event, step, nodes, at}; None for any other record."""
    if r.kind != KIND_JOB_MARK:
        return None
    f = r.fields
    return {"node": r.node, "event": f.get("event"), "step": f.get("step"), "nodes": f.get("nodes"),
            "at": r.occurred_ns if r.occurred_ns is not None else r.observed_ns}


def events_from_records(records: Iterable[Record], *, zones: dict[str, tzinfo] | None = None) -> Iterator[Event]:
    """Events for the analysis, in the records' order; ``zones``: node -> zone of its log stamps."""
    zones = zones or {}
    for r in records:
        if r.kind == KIND_RANK_STACKS:
            yield _stacks_event(r)
        elif r.kind == KIND_RANK_FLIGHT_RECORDER:
            yield _flight_recorder_event(r)
        elif r.source == "ranklog":
            yield _rank_event(r, zones.get(r.node, timezone.utc))
        elif r.source in _KERNEL_SOURCES and r.kind == "kernel.line":
            yield _kernel_event(r)
        elif r.kind in ("proc.start", "proc.exit"):
            yield _proc_event(r)
        elif r.kind == "gpu.xid" and r.source == "nvml":
            yield _nvml_xid_event(r)
        elif r.kind in _SAMPLE_KINDS:
            yield _sample_event(r)
