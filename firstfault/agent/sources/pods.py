"""pods: the Kubernetes pods on this node, each with its job and rank; kernel OOM kills named by pod.

Reads the cgroup tree (HostPaths.cgroup_root: the kubelet's kubepods.slice or kubepods
hierarchy) for pods and their processes, each process's ``/proc/<pid>/environ`` for who the
pod is, and the kubelet's /var/log/pods directory names for the pod's namespace and name
(all through firstfault/agent/kubepods.py, pure over root paths). A pod as the kubelet makes it
under the systemd cgroup driver (tests/data/kubenode)::

    /sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, _ for ->.slice/
        cri-containerd-<id>.scope/cgroup.procs                                 (one path, cut here)

Emits ``pod.start`` once a pod is first seen with an identity, or seen again with another
(job, rank as procs' Records carry them; fields ``pod_uid``, ``namespace``, ``pod``,
``qos``, ``cgroup``, ``memory_max_bytes``, ``node_rank``, ``ranks``, ``world_size``,
``nproc_per_node``, ``rank_from``), and ``pod.exit`` when its cgroup is gone.

``by_uid(pod_uid)`` (wired by the daemon into ranklog): the job and rank of a pod's container
logs. ``tag(draft)`` (wired by the daemon into the kmsg source): a kernel OOM kill's
``oom-kill:...,task_memcg=<cgroup>,...,pid=<pid>`` line whose cgroup is a known pod's gets
that pod's job and rank (fields ``pod_uid``, ``namespace``, ``pod``, ``rank_from`` =
``pod``), and so does the ``Killed process <pid>`` line the kernel prints right after it.
The pod is the victim's pod even when the victim was no rank process (a DataLoader worker).
Known issue: a pod that lived less than one poll (``interval_s``) is not known.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import NamedTuple

from firstfault.agent.kubepods import PodIdentity, parse_pod_cgroup, pod_identity, pod_names, scan_pods
from firstfault.agent.sources.base import Draft, PollingSource, printable, register
from firstfault.agent.sources.procs import parse_environ

log = logging.getLogger(__name__)

SOURCE_PODS = "pods"
KIND_POD_START, KIND_POD_EXIT = "pod.start", "pod.exit"  # not (yet) in wire.KINDS; new kinds decode as-is
DEFAULT_POD_LOGS = "/var/log/pods"
_OOM_KILL = re.compile(r"oom-kill:.*?task_memcg=(?P<memcg>[^,]+).*?,pid=(?P<pid>\d+)")
_KILLED = re.compile(r"(?:Memory cgroup out of memory|Out of memory): Kill(?:ed)? process (?P<pid>\d+)")
MAX_VICTIMS = 64  # pids of OOM kills remembered for the kernel's next line


class PodOwner(NamedTuple):
    """What a pod says of a record: job, rank and fields; from the pods source's last poll."""

    job: str | None
    rank: int | None  # the pod's one rank; None when it has none or several
    fields: dict  # pod_uid, namespace, pod


@register
class PodsSource(PollingSource):
    """Polls the node's pods; see the module docstring. Options = ``[sources.pods]``."""

    name = SOURCE_PODS
    interval_s = 5.0

    def __init__(self, *, pod_logs: str = DEFAULT_POD_LOGS, cgroup_root: str = "",
                 job_label: str | None = None, **kw) -> None:
        """``cgroup_root``: the host's cgroup tree ("": HostPaths.cgroup_root; in a container
        with a cgroup namespace of its own, where the host's is mounted, e.g. /host/sys/fs/cgroup)."""
        super().__init__(**kw)
        for name, value in (("pod_logs", pod_logs), ("cgroup_root", cgroup_root or "/")):
            if not isinstance(value, str) or not os.path.isabs(value):
                raise ValueError(f"pods: {name} must be an absolute path, got {value!r}")
        self.pod_logs, self.job_label = pod_logs, job_label
        self.cgroup_root = cgroup_root or self.paths.cgroup_root
        self._owners: dict[str, PodOwner] = {}  # pod uid -> owner, replaced whole each poll
        self._seen: dict[str, tuple] = {}  # pod uid -> what its pod.start said
        self._victims: dict[int, PodOwner] = {}
        self._lock = threading.Lock()


    def poll(self) -> list[Draft]:
        pods = scan_pods(self.cgroup_root)
        names = pod_names(self.pod_logs)
        out, owners = [], {}
        for uid, pod in pods.items():
            envs = []
            for pid in pod.pids:
                try:
                    with open(self.paths.pid(pid, "environ"), "rb") as f:
                        envs.append(parse_environ(f.read()))
                except OSError:  # gone, or not ours to read (CAP_SYS_PTRACE)
                    continue
            ident = pod_identity(envs)
            ns, name = names.get(uid, (None, None))
            fields = {"pod_uid": uid, "namespace": ns, "pod": printable(name) if name else None,
                      "qos": pod.qos, "cgroup": printable(pod.cgroup), "memory_max_bytes": pod.memory_max_bytes}
            job = (ident.job if ident else None) or self.job_label
            rank = ident.rank if ident else None
            if ident is not None:
                fields.update(_identity_fields(ident))
            owners[uid] = PodOwner(job, rank, {k: fields[k] for k in ("pod_uid", "namespace", "pod")})
            said = (job, rank, ident)
            if ident is not None and self._seen.get(uid) != said:
                self._seen[uid] = said
                out.append(self.draft(KIND_POD_START, message=f"pod {ns}/{name} ({uid})", job=job,
                                      rank=rank, fields=fields))
        for uid in [u for u in self._seen if u not in pods]:
            job, rank, _ = self._seen.pop(uid)
            out.append(self.draft(KIND_POD_EXIT, message=f"pod {uid} gone", job=job, rank=rank,
                                  fields={"pod_uid": uid}))
        with self._lock:
            self._owners = owners
        return out

    def by_uid(self, pod_uid: str) -> PodOwner | None:
        """The pod of a uid, as last polled (any thread): ranklog's identity of a pod's logs."""
        with self._lock:
            return self._owners.get(pod_uid)

    def owner(self, cgroup: str) -> PodOwner | None:
        """The pod of a cgroup path, as last polled (any thread)."""
        pc = parse_pod_cgroup(cgroup)
        if pc is None:
            return None
        with self._lock:
            return self._owners.get(pc.pod_uid)

    def tag(self, d: Draft) -> Draft:
        """A kernel line of an OOM kill in a known pod gets the pod's job and rank (in place)."""
        text = d.message
        if "oom-kill:" in text:
            m = _OOM_KILL.search(text)
            o = self.owner(m["memcg"]) if m else None
            if o is None:
                return d
            with self._lock:
                if len(self._victims) >= MAX_VICTIMS:
                    self._victims.clear()
                self._victims[int(m["pid"])] = o
        elif "process" in text and (m := _KILLED.search(text)) is not None:
            with self._lock:
                o = self._victims.pop(int(m["pid"]), None)
            if o is None:
                return d
        else:
            return d
        d.job = d.job or o.job
        d.rank = o.rank if d.rank is None else d.rank
        d.fields.update({k: v for k, v in o.fields.items() if v is not None}, rank_from="pod")
        return d


def _identity_fields(ident: PodIdentity) -> dict:
    return {"node_rank": ident.node_rank, "ranks": list(ident.ranks), "world_size": ident.world_size,
            "nproc_per_node": ident.nproc_per_node, "rank_from": ident.rank_from}
