"""The names a store caches: streams and jobs by id, and what it knows is stored of a
job's nodes and ranks. Cleared and reloaded in place (running read iterators hold
these dicts) whenever the dialect says another connection may have changed them or
a write transaction rolled back."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(slots=True)
class Names:
    streams: dict[int, tuple[str, str]] = field(default_factory=dict)  # sid -> (node, stream)
    sids: dict[tuple[str, str], int] = field(default_factory=dict)
    node_sids: defaultdict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    jobs: dict[int, str] = field(default_factory=dict)  # jid -> job
    jids: dict[str, int] = field(default_factory=dict)
    job_nodes: set[tuple[int, str]] = field(default_factory=set)  # rows known in job_nodes
    job_ranks: set[tuple[int, int]] = field(default_factory=set)  # rows known in job_ranks

    def clear(self) -> None:
        for names in (self.streams, self.sids, self.node_sids, self.jobs, self.jids,
                      self.job_nodes, self.job_ranks):
            names.clear()

    def add_stream(self, sid: int, node: str, stream: str) -> None:
        if sid not in self.streams:
            self.streams[sid] = (node, stream)
            self.sids[(node, stream)] = sid
            self.node_sids[node].append(sid)

    def add_job(self, jid: int, job: str) -> None:
        self.jobs[jid], self.jids[job] = job, jid

    def drop_job(self, jid: int) -> None:
        self.jids.pop(self.jobs.pop(jid, None), None)
