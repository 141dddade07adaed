"""Who wrote a rank log: a path's job, rank, local rank and fields, from the glob's named
parts, the launchers' layouts (firstfault/common/layouts.py) and the kubelet's pod log paths
(firstfault/common/crilog.py, the pod's owner from the pods source). The rules are the
ranklog source's (its package docstring, "Identity")."""

from __future__ import annotations

import logging
from collections.abc import Callable

from firstfault.agent.sources.base import printable
from firstfault.common.crilog import parse_pod_log_path
from firstfault.common.layouts import TORCHRUN, parse_log_path
from firstfault.wire import MAX_NAME_BYTES

log = logging.getLogger("firstfault.agent.sources.ranklog")

MAX_PATHS_KNOWN = 4096  # identities cached; the cache starts over beyond (paths come and go)


class PathIdentity:
    """``of(path)``: (job, rank, local_rank, fields) of a rank log path; ``cri``: the paths seen
    in the kubelet's layout (/var/log/pods). ``fields_of(path)``: the glob's named parts
    (Tailer.fields); ``pod_owner(pod_uid)``: the pod's job and rank, where known."""

    def __init__(self, fields_of: Callable[[str], dict], job_label: str | None = None,
                 pod_owner: Callable[[str], object | None] | None = None) -> None:
        self.fields_of, self.job_label, self.pod_owner = fields_of, job_label, pod_owner
        self.cri: set[str] = set()
        self._known: dict[str, tuple] = {}

    def of(self, path: str) -> tuple:
        """(job, rank, local_rank, fields) of a path, from the glob's named parts and the layout."""
        got = self._known.get(path)
        if got is not None:
            return got
        parts = dict(self.fields_of(path))
        lp = parse_log_path(path)
        fields: dict = {"path": printable(path)}
        named_job = parts.pop("job", None)
        job = named_job or (lp.run_id if lp and lp.layout == TORCHRUN else None) or self.job_label
        named = parts.pop("rank", None), parts.pop("local_rank", None)
        rank, local = map(_int, named)
        if (rank, local).count(None) > named.count(None):
            log.warning("ranklog: a rank part of path=%s is not a number %s: not used", path, named)
        pl = parse_pod_log_path(path) if lp is None else None
        known = True
        if pl is not None:  # the kubelet's layout: the pod says who; its rank comes from the pods source
            self.cri.add(path)
            fields.update(namespace=pl.namespace, pod=pl.pod, container=pl.container)
            fields.update((k, v) for k, v in (("pod_uid", pl.pod_uid), ("restart", pl.restart),
                                              ("container_id", pl.container_id)) if v is not None)
            owner = self.pod_owner(pl.pod_uid) if self.pod_owner and pl.pod_uid else None
            known = self.pod_owner is None or getattr(owner, "rank", None) is not None  # else asked again
            if owner is not None:
                job = named_job or owner.job or job
                rank = rank if rank is not None else owner.rank
        if lp is not None:
            rank = rank if rank is not None else lp.rank
            local = local if local is not None else lp.local_rank
            if lp.attempt is not None:
                fields["attempt"] = lp.attempt
        for k, v in parts.items():
            fields.setdefault(k, printable(v))
        got = (printable(job, MAX_NAME_BYTES) if job else None, rank, local, fields)
        if not known:
            return got
        if len(self._known) >= MAX_PATHS_KNOWN:
            self._known.clear()
        self._known[path] = got
        return got


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.isdigit() else None
