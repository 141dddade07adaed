"""The timeline a person looks at: swimlanes per node and rank, bounded. Pure.

``LaneWatcher`` watches the report's placed Events (report.watch) and keeps, per lane, a
decimated sample of the plain lines and progress lines (a stride that doubles each
time the lane's cap is reached, so what stays is spread evenly over the run);
``timeline_report`` adds every finding the verdict kept (each rank's first error,
cascades, kernel and Xid events, checkpoint marks), the agents' process exits, and
the checkpoint saves as spans, and returns the report's ``timeline`` object
(REPORT.md; built only when asked, for the HTML report).

Lanes: one per node (kernel, NVML, cgroup and launcher lines: whatever names no
rank) followed by one per rank of that node. A kernel event tied to a rank (an OOM
kill of its pid, an Xid on its GPU) stays on its node's lane and names the rank in
``link``. Times are the timeline's (corrected clock), with their uncertainty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from firstfault.analysis.events import KIND_RECORD, KIND_STACK, KIND_STREAM, Event
from firstfault.analysis.findings import Finding
from firstfault.analysis.memlines import NEEDLES as MEMORY_NEEDLES
from firstfault.analysis.sampling import Bounded

PLAIN_PER_LANE = 24
PROGRESS_PER_LANE = 64
TEXT_MAX = {"line": 300, "progress": 300}
FINDING_TEXT_MAX = 2000
PROGRESS_NEEDLE = "global_step="
CHECKPOINT_TRAITS = frozenset({"save-start", "save-file", "save-done", "load-start"})  # drawn as checkpoint marks
MAX_OOMS = 10_000


@dataclass(slots=True)
class LaneWatcher:
    """Keeps a bounded, evenly spread sample of each lane's lines."""

    plain_cap: int = PLAIN_PER_LANE
    progress_cap: int = PROGRESS_PER_LANE
    plain: dict[tuple, Bounded] = field(default_factory=dict)  # (node, rank) -> an even sample of its lines
    progress: dict[tuple, Bounded] = field(default_factory=dict)
    ooms: list[Event] = field(default_factory=list)  # the agents' cgroup.oom records (few: one per OOM)
    seen: int = 0

    def __call__(self, ev: Event) -> None:
        if ev.kind in (KIND_STREAM, KIND_STACK) or (ev.kind == KIND_RECORD and ev.fields.get("memory")):
            if ev.fields.get("memory") == "cgroup.oom" and len(self.ooms) < MAX_OOMS:
                self.ooms.append(replace(ev, frames=()))
            return
        if ev.kind == KIND_RECORD and "proc" in ev.fields:
            return  # exits come from the report's procs
        self.seen += 1
        key = (ev.node, ev.rank)
        if PROGRESS_NEEDLE in ev.text:
            box, cap = self.progress, self.progress_cap
        elif any(n in ev.text for n in MEMORY_NEEDLES):
            return  # memory lines are the memory view's
        else:
            box, cap = self.plain, self.plain_cap
        s = box.get(key)
        if s is None:
            s = box[key] = Bounded(0, 0, cap)
        s.add(replace(ev, frames=()))


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + " …"


def _ms(ns: int | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def timeline_report(w: LaneWatcher, findings: Iterable[Finding], *, rank_nodes: Mapping[int, str | None], firsts: Mapping[int, Finding], first: Finding | None,
                    procs: Iterable[Event], checkpoint: dict, pids: Mapping[int, int]) -> dict:
    """The report's ``timeline`` object (REPORT.md): lanes, events as parallel arrays, spans."""
    lanes: dict[tuple, int] = {}  # (node, rank) -> index, set once all are known
    lane_list: list[dict] = []
    cols: dict[str, list] = {k: [] for k in ("key", "t_ms", "unc_ms", "kind", "sig", "role", "text", "origin",
                                             "link", "clock")}

    def add(key: tuple, t: int | None, unc: int, kind: str, sig: str | None, role: str | None, text: str,
            origin: str, link: int | None, clock: str | None) -> None:
        if t is None:
            return
        if key[0] is None:
            key = ((rank_nodes.get(key[1]) if key[1] is not None else None) or only, key[1])
        lanes.setdefault(key, -1)
        for k, v in (("key", key), ("t_ms", _ms(t)), ("unc_ms", _ms(unc)), ("kind", kind), ("sig", sig),
                     ("role", role), ("text", text), ("origin", origin), ("link", link), ("clock", clock)):
            cols[k].append(v)

    known = {n for n in rank_nodes.values() if n}
    only = next(iter(known)) if len(known) == 1 else None  # one node: what names none is that node's

    first_ids = {id(f.ev) for f in firsts.values()}
    kept = set()
    spans: dict[str, dict] = {}
    for f in findings:
        ev = f.ev
        kept.add(ev.origin)
        on_node = ev.source == "kernel" or ev.rank is None
        key = (ev.node or rank_nodes.get(ev.rank), None) if on_node else (ev.node or rank_nodes.get(ev.rank), ev.rank)
        kind = ("first" if f is first else "kernel" if ev.source == "kernel" else
                "rank-first" if id(ev) in first_ids else f.role)
        if f.role == "context" and kind == "context":
            kind = "progress" if PROGRESS_NEEDLE in ev.text or f.has("progress") else \
                "checkpoint" if f.match.signature.traits & CHECKPOINT_TRAITS else "context"
        add(key, ev.occurred_ns, ev.uncertainty_ns, kind, f.sig, f.role, _cut(ev.text, FINDING_TEXT_MAX), ev.origin,
            ev.rank if on_node and ev.source == "kernel" else None, ev.clock)
        if f.has("save-start") and (tag := f.match.groups.get("tag")) and ev.occurred_ns is not None:
            spans.setdefault(tag, {"tag": tag, "start_ns": ev.occurred_ns})
    for ev in procs:
        ex = ev.fields.get("exit")
        if ex:
            what = "exit " + " ".join(str(x) for x in (ex.get("code"), ex.get("signal")) if x is not None)
            add((ev.node, ev.rank), ev.occurred_ns, ev.uncertainty_ns, "exit", None, None,
                f"process {ev.pid} {what} (agent)", ev.origin, None, ev.clock)
    for oom in w.ooms:
        f = oom.fields
        t, unc, clock = oom.occurred_ns, oom.uncertainty_ns, oom.clock
        hit = [pids[int(p)] for p in str(f.get("pids") or "").split(",") if p.strip().isdigit() and int(p) in pids]
        what = ", ".join(f"{k} +{f[k]}" for k in ("delta_oom_kill", "delta_oom") if f.get(k)) or "OOM notified"
        add((oom.node, None), t, unc, "cgroup-oom", None, None,
            f"memory cgroup {f.get('cgroup')}: {what} (agent)\n{oom.text}".rstrip(), oom.origin,
            hit[0] if len(hit) == 1 else None, clock)
    progress_ns: list[int] = []
    for box, kind in ((w.progress, "progress"), (w.plain, "line")):
        for key, s in box.items():
            for line in s.items():
                if line.origin in kept:
                    continue
                t, unc, clock = line.occurred_ns, line.uncertainty_ns, line.clock
                if kind == "progress" and t is not None:
                    progress_ns.append(t)
                add(key, t, unc, kind, None, None, _cut(line.text, TEXT_MAX[kind]), line.origin, None, clock)
    progress_ns += [int(t * 1e6) for t, k in zip(cols["t_ms"], cols["kind"]) if k == "progress"]
    progress_ns.sort()
    verdicts = {t["tag"]: t for t in checkpoint.get("tags", [])}
    fail_ns = first.ev.occurred_ns if first is not None else None
    span_out = []
    for tag, sp in sorted(spans.items(), key=lambda kv: kv[1]["start_ns"]):
        end = next((t for t in progress_ns if t > sp["start_ns"]), None)
        if end is None and fail_ns is not None and fail_ns > sp["start_ns"]:
            end = fail_ns
        v = verdicts.get(tag, {})
        span_out.append({"kind": "checkpoint-save", "tag": tag, "start_ms": _ms(sp["start_ns"]), "end_ms": _ms(end),
                         "verdict": v.get("verdict", "unknown"), "problems": v.get("problems", [])})
    # lanes in order: each node's own lane, then its ranks; nodes by name, unknown last
    order = sorted(lanes, key=lambda k: (k[0] is None, str(k[0]), k[1] is not None, k[1] if k[1] is not None else -1))
    for i, k in enumerate(order):
        lanes[k] = i
        node, rank = k
        lane_list.append({"node": node, "rank": rank,
                          "label": f"rank {rank}" if rank is not None else node or "no node named"})
    cols["lane"] = [lanes[k] for k in cols.pop("key")]
    ts = [t for t in cols["t_ms"] if t is not None]
    return {
        "start_ms": min(ts) if ts else None,
        "end_ms": max(ts) if ts else None,
        "lanes": lane_list,
        "events": cols,
        "spans": span_out,
        "first_failure": None if first is None or first.ev.occurred_ns is None else {
            "t_ms": _ms(first.ev.occurred_ns), "unc_ms": _ms(first.ev.uncertainty_ns)},
        "kept": len(cols["lane"]),
        "seen": w.seen,
    }
