"""The read side, shared by the CLI and the HTTP API: jobs, a job's report, its
timeline, and the bundle to attach to a bug report. Reads a Store; renders nothing
but JSON-able dicts (firstfault/collector/reports renders text and Markdown).

With a ``redactor`` (the collector's ``[redact]``, firstfault/common/redact.py) the report,
the timeline and the bundle have their secrets replaced, and the report's ``redaction``
counts what was, with what the agents had redacted from the records the report read
(their ``fields.redacted``; a report from marks reads only the records it needs, a
bundle every record of the job)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, replace

from firstfault.analysis.catalog import Catalog
from firstfault.analysis.checkpoint import DiskCheckpoint
from firstfault.analysis.context import CONFIG_NEEDLE
from firstfault.analysis.diskwire import disk_from_wire
from firstfault.analysis.membership import CONTEXT, JOB, Membership, learn
from firstfault.analysis.reads import ReportMarker
from firstfault.analysis.records import events_from_records, mark_of
from firstfault.analysis.report import Inputs, build_report, iso
from firstfault.analysis.timeline import NodeClock
from firstfault.collector.store.base import Selection, Store, needed_records
from firstfault.common import redact
from firstfault.common.redact import Redactor
from firstfault.reports import render
from firstfault.wire import KIND_AGENT_GAP, KIND_JOB_MARK, KIND_KERNEL_GAP, Record

GAP_KINDS = (KIND_AGENT_GAP, KIND_KERNEL_GAP)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+|\.{2,}")


def file_part(job: str) -> str:
    """``job`` as one harmless part of a file name (a bundle's folder, a download's name):
    letters, digits, ``_ . -`` only, no leading dot nor ``..``, at most 80 characters; when
    anything had to change, a short hash of the true id follows, so two ids never share a name. A job id
    comes from any process' environment on a node (``SLURM_JOB_ID='x/../../tmp'``)."""
    safe = _UNSAFE.sub("_", job).lstrip(".")[:80]
    if safe == job and job:
        return job
    return f"{safe or 'job'}-{hashlib.sha256(job.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


class QueryError(Exception):
    """A query that can not be answered (unknown job, bad selection)."""


def record_dict(r: Record) -> dict:
    """A record as JSON: its fields plus ``at`` (occurred, else observed, as ISO time)."""
    d = asdict(r)
    d["at"] = iso(r.occurred_ns if r.occurred_ns is not None else r.observed_ns)
    return d


def jobs(store: Store) -> list[dict]:
    return [{**asdict(j), "first_at": iso(j.first_ns), "last_at": iso(j.last_ns)} for j in store.jobs()]


def _gap(r: Record) -> dict:
    return {"node": r.node, "source": r.fields.get("source") or r.source, "at": iso(r.observed_ns),
            "reason": r.message or r.kind, **{k: v for k, v in r.fields.items() if k != "source"}}


def _noting(records: Iterator[Record], inputs: Inputs, first_ns: int,
            redacted: Counter) -> Iterator[Record]:
    """Pass records through, noting in ``inputs`` the gaps, the job's marks, which nodes sent
    records of the job and each rank's node, from its latest record (a rank that only
    logged plain lines is no finding, yet it was there). build_report reads them after it has read the records.
    A kernel gap noticed before the job's first record lost only what came before it."""
    for r in records:
        if "redacted" in r.fields:
            redacted.update(redact.parse_mark(r.fields["redacted"]))
        if r.rank is not None and r.job == inputs.job:
            inputs.rank_nodes[r.rank] = r.node  # the latest: a block's last of each rank is marked
        if r.kind in GAP_KINDS:
            if not (r.kind == KIND_KERNEL_GAP and r.observed_ns < first_ns):
                inputs.gaps.append(_gap(r))
        elif r.kind == KIND_JOB_MARK:
            if r.job == inputs.job:
                inputs.marks.append(mark_of(r))
        elif r.job == inputs.job:
            inputs.nodes_seen.add(r.node)
        yield r


NO_LOG = "no log of this rank was given"
NO_RECORD = "no record of this rank reached the collector (its node's agent sent none)"
NODE_CONTEXT_MAX = 20  # node-context records a report lists (all are counted)


def _notable(r: Record) -> bool:
    """A node-context record worth listing: an error or worse, or an OOM kill."""
    return r.severity <= 3 or r.kind == "cgroup.oom" or "Killed process" in r.message


def _members_only(records: list[Record], m: Membership, context: list[Record]) -> Iterator[Record]:
    """The job's own records (analysis/membership.py); node context goes to ``context``."""
    for r in records:
        where = m.place(r)
        if where == JOB:
            yield r
        elif where == CONTEXT:
            context.append(r)


def _node_context(context: list[Record]) -> dict:
    shown = [r for r in context if _notable(r)]
    return {"count": len(context), "notable": len(shown),
            "events": [{"node": r.node, "source": r.source, "at": iso(r.occurred_ns if r.occurred_ns is not None
                                                                       else r.observed_ns),
                        "pid": r.pid, "text": r.message} for r in shown[:NODE_CONTEXT_MAX]]}


CHECKPOINT_INSPECTION = "checkpoint.inspection"  # the agent's checkpoints source


def _disk(records: list[Record], job: str, gaps: list[dict]) -> DiskCheckpoint | None:
    """The job's checkpoint as its agents last inspected it on disk (agent/sources/checkpoints.py):
    the newest inspection holding a tag, else the newest; an unreadable one is a gap."""
    found = sorted((r for r in records if r.kind == CHECKPOINT_INSPECTION and r.job == job),
                   key=lambda r: r.observed_ns, reverse=True)
    disks = []
    for r in found:
        try:
            disks.append(disk_from_wire(json.loads(r.message)))
        except ValueError as e:  # DiskWireError, JSONDecodeError
            gaps.append({"node": r.node, "source": "checkpoints", "reason": f"unreadable inspection: {e}"})
    return next((d for d in disks if d.tags), disks[0] if disks else None)


_MARKER_NAMES: dict[int, tuple[Catalog, str]] = {}


def marker_name(catalog: Catalog) -> str:
    """ReportMarker(catalog).name, made once per catalog: a marker builds its needles'
    automaton (a fifth of a second, holding the GIL), which a report needs only the name of."""
    got = _MARKER_NAMES.get(id(catalog))
    if got is None or got[0] is not catalog:
        got = _MARKER_NAMES[id(catalog)] = (catalog, ReportMarker(catalog).name)
    return got[1]


def report(store: Store, job: str, catalog: Catalog, sel: Selection | None = None,
           redactor: Redactor | None = None, *, timeline: bool = False, disk: DiskCheckpoint | None = None) -> dict:
    """The report (REPORT.md) of one job over every node that sent its records, redacted by
    ``redactor``; ``timeline`` adds the swimlanes' ``timeline`` object (for HTML); ``disk``: a
    checkpoint folder inspected here (``report --checkpoint-dir``), else what the agents shipped. Only the
    job's own records are read (analysis/membership.py); the kernel and cgroup records of its
    nodes in its lifetime that name none of its processes are the report's ``node_context``."""
    info = store.job(job)
    if info is None:
        raise QueryError(f"no job {job!r} in the store (firstfault jobs lists them)")
    stored = store.clocks()
    clocks = {n: NodeClock(c.offset_ns, c.uncertainty_ns) for n, c in stored.items()}
    inputs = Inputs(job=job, clocks=clocks, generated_ns=time.time_ns(), rank_nodes={}, timeline=timeline)
    sel = sel or Selection(job=job)
    # only the records the report reads (analysis/reads.py), where the store kept marks
    needed = list(needed_records(store, sel, marker_name(catalog)))
    membership = learn(needed, job, uncertainty_ns={n: c.uncertainty_ns for n, c in stored.items()},
                       span=(info.first_ns, info.last_ns))
    agents: Counter = Counter()
    context: list[Record] = []
    inputs.disk = disk or _disk(needed, job, inputs.gaps)
    events = events_from_records(_noting(_members_only(needed, membership, context), inputs, info.first_ns, agents))
    mine: Counter = Counter()  # what this redactor finds before the analysis reads it
    rep = build_report(redact.events(events, redactor, mine), catalog, inputs)
    for g in rep["gaps"]:  # the analysis words a missing rank for files given to analyze
        if g.get("rank") is not None and g.get("reason") == NO_LOG:
            g["reason"] = NO_RECORD
    rep["node_context"] = _node_context(context)
    return redact.report(rep, redactor, agents + mine)


def membership(store: Store, job: str, catalog: Catalog | None = None) -> Membership:
    """Who and when the job is (for a timeline): from the records a report reads when the store
    kept marks for ``catalog``, else from one read of its whole selection."""
    info = store.job(job)
    sel = Selection(job=job)
    records = needed_records(store, sel, ReportMarker(catalog).name) if catalog is not None else store.records(sel)
    return learn(records, job, uncertainty_ns={n: c.uncertainty_ns for n, c in store.clocks().items()},
                 span=(info.first_ns, info.last_ns) if info is not None else None)


def timeline(store: Store, sel: Selection, redactor: Redactor | None = None, *,
             context: bool = False, catalog: Catalog | None = None) -> Iterator[dict]:
    """Every matching record of the job's own, in timeline order, as dicts (nothing cut unless
    sel.limit); ``context`` adds its nodes' kernel and cgroup records of its lifetime that name
    none of its processes, each with ``node_context`` true (analysis/membership.py)."""
    m = membership(store, sel.job, catalog) if sel.job is not None else None
    limit = sel.limit
    n = 0
    for r in store.records(replace(sel, limit=None) if m is not None else sel):
        if limit is not None and n >= limit:
            return
        where = m.place(r) if m is not None else JOB
        if where != JOB and not (context and where == CONTEXT):
            continue
        d = record_dict(r)
        if where == CONTEXT:
            d["node_context"] = True
        if redactor is not None:
            d["message"] = redactor.text(d["message"], Counter())
            d["fields"] = {k: v if k == "redacted" else redactor.walk(v, Counter())
                           for k, v in d["fields"].items()}
        n += 1
        yield d


def bundle(store: Store, job: str, catalog: Catalog, redactor: Redactor | None = None) -> bytes:
    """A .tar.gz for a bug report: report.md, report.json, report.html, timeline.jsonl, config.txt,
    README.txt, every one redacted by ``redactor``."""
    rep = report(store, job, catalog, redactor=redactor, timeline=True)
    page = render(rep, "html")
    rep = {k: v for k, v in rep.items() if k != "timeline"}
    lines = [json.dumps(d, ensure_ascii=False)
             for d in timeline(store, Selection(job=job), redactor, context=True, catalog=catalog)]
    config = [d["message"] for d in map(json.loads, lines) if CONFIG_NEEDLE in d["message"]]
    files = {
        "report.md": render(rep, "md"),
        "report.json": render(rep, "json"),
        "report.html": page,
        "timeline.jsonl": "\n".join(lines) + "\n",
        "config.txt": "\n".join(config) + ("\n" if config else "(DeepSpeed printed no resolved config)\n"),
        "README.txt": (f"firstfault bundle of job {job}, made {iso(time.time_ns())}.\n"
                       "report.md pastes into an issue; report.json is firstfault.report/1; report.html opens in a "
                       "browser with no network (swimlanes, memory by phase); timeline.jsonl holds "
                       "every record of the job and of its nodes' kernel in its lifetime (those that name none of "
                       "its processes marked node_context), one JSON object a line, in time order; config.txt is the resolved DeepSpeed config as printed at initialize.\n"),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            ti = tarfile.TarInfo(f"firstfault-{file_part(job)}/{name}")
            ti.size, ti.mtime, ti.mode = len(data), int(time.time()), 0o644
            tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()
