"""Kubernetes pods on this node: process -> pod by cgroup, pod -> job and rank by environment. Pure
parsers, and readers over a root path (``scan_pods(cgroup_root, proc_root)``), so tests run on
captured trees (tests/data/kubenode) and a container sees the host at /host.

Where a pod lives in the cgroup tree (the kubelet's cgroup manager names it; the runtime
names the container's cgroup). With the systemd cgroup driver a pod uid's ``-`` become ``_``
(``-`` separates a slice's parents in systemd's names), e.g.::

    /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5b1c7a2e_3f4d_4e6a_9b8c_0d1e2f3a4b5c.slice/
        cri-containerd-<64 hex>.scope                                       (one path, cut here)
    /kubepods.slice/kubepods-pod<uid>.slice/crio-<64 hex>.scope                       (Guaranteed QoS: no QoS slice)

and with the cgroupfs driver::

    /kubepods/burstable/pod5b1c7a2e-3f4d-4e6a-9b8c-0d1e2f3a4b5c/<64 hex>
    /kubepods/pod<uid>/<64 hex>

The path may sit under another (kind, a nested kubelet): only its kubepods part is read.
A kernel memcg OOM kill names the victim's cgroup in ``task_memcg=``: ``parse_pod_cgroup`` of
it is the pod (and container) it killed in.

Who a pod is (``pod_identity``): the environments of its processes, as the training
operators set them: the rank process's ``RANK`` (torchrun, the DeepSpeed launcher, PyTorchJob
without torchrun), else a node rank: ``PET_NODE_RANK`` (Kubeflow PyTorchJob / Trainer's
torchrun variables, with ``PET_NNODES``, ``PET_NPROC_PER_NODE``), ``JOB_COMPLETION_INDEX``
(Indexed Job, JobSet), ``GROUP_RANK`` (torchrun). A pod with one rank process, or one
process a node (nproc_per_node 1), is that rank; a pod with several ranks has ``ranks``
and no single ``rank``. Labels need the API server and are not read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import NamedTuple

QOS = ("guaranteed", "burstable", "besteffort")
_SYSTEMD = re.compile(r"kubepods(?:-(?P<qos>burstable|besteffort))?-pod(?P<uid>[0-9a-f_]{36})\.slice"
                      r"(?:/(?:cri-containerd|crio|docker)-(?P<cid>[0-9a-f]{64})\.scope)?(?:/|$)")
_CGROUPFS = re.compile(r"(?:^|/)kubepods(?:/(?P<qos>burstable|besteffort))?/pod(?P<uid>[0-9a-f-]{36})"
                       r"(?:/(?P<cid>[0-9a-f]{64}))?(?:/|$)")
MAX_PODS = 1024  # a node runs at most ~110 pods by default; more dirs are not scanned
MAX_PIDS_PER_POD = 256


class PodCgroup(NamedTuple):
    """What a cgroup path says of its pod."""

    pod_uid: str
    qos: str  # guaranteed | burstable | besteffort
    container_id: str | None  # None: the pod's own cgroup
    driver: str  # systemd | cgroupfs
    pod_path: str  # the pod's cgroup (up to its pod part), as given


def parse_pod_cgroup(path: str) -> PodCgroup | None:
    """The pod of a cgroup path (``/proc/<pid>/cgroup``'s, ``task_memcg=``'s); None if no pod's."""
    m = _SYSTEMD.search(path)
    driver = "systemd"
    if m is None:
        m, driver = _CGROUPFS.search(path), "cgroupfs"
        if m is None:
            return None
    uid = m["uid"].replace("_", "-")
    if uid.count("-") != 4:
        return None
    end = m.end("uid") + (len(".slice") if driver == "systemd" else 0)
    return PodCgroup(uid, m["qos"] or "guaranteed", m["cid"], driver, path[:end])


class PodIdentity(NamedTuple):
    """A pod's place in its job, from its processes' environments."""

    job: str | None
    rank: int | None  # the global rank, when the pod holds exactly one
    ranks: tuple[int, ...]  # every global rank of its rank processes
    node_rank: int | None  # PET_NODE_RANK, JOB_COMPLETION_INDEX, GROUP_RANK
    world_size: int | None
    nproc_per_node: int | None
    rank_from: str | None  # which variable said the rank


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.isdigit() else None


def pod_identity(envs: list[dict[str, str]]) -> PodIdentity | None:
    """Who a pod is from the environments of its processes; None if none says."""
    ranks = sorted({r for e in envs if (r := _int(e.get("RANK"))) is not None and "LOCAL_RANK" in e})
    if not ranks:  # no torchrun-style worker: the operator's RANK (PyTorchJob) is the pod's rank
        ranks = sorted({r for e in envs if (r := _int(e.get("RANK"))) is not None})
    node_rank = nproc = world = None
    node_from = None
    job = None
    for e in envs:
        for key in ("PET_NODE_RANK", "JOB_COMPLETION_INDEX", "GROUP_RANK"):
            if node_rank is None and _int(e.get(key)) is not None:
                node_rank, node_from = _int(e.get(key)), key
        nproc = nproc if nproc is not None else _int(e.get("PET_NPROC_PER_NODE") or e.get("LOCAL_WORLD_SIZE"))
        world = world if world is not None else _int(e.get("WORLD_SIZE"))
        run_id = e.get("TORCHELASTIC_RUN_ID")
        job = job or e.get("SLURM_JOB_ID") or (run_id if run_id and run_id != "none" else None)
    if not ranks and node_rank is None:
        return None
    rank, rank_from = (ranks[0], "RANK") if len(ranks) == 1 else (None, None)
    if rank is None and not ranks and node_rank is not None and nproc == 1:
        rank, rank_from = node_rank, node_from  # one process a node: the node rank is the rank
    return PodIdentity(job, rank, tuple(ranks), node_rank, world, nproc, rank_from)


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod found in the cgroup tree."""

    uid: str
    qos: str
    cgroup: str  # its cgroup path from the root ("/kubepods.slice/...")
    containers: tuple[str, ...]  # container ids with a cgroup of their own
    pids: tuple[int, ...]  # the processes in it (all its containers')
    memory_max_bytes: int | None  # the pod's memory.max (None: "max" or unreadable)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _pids(cg_dir: str) -> list[int]:
    text = _read(os.path.join(cg_dir, "cgroup.procs")) or ""
    return [int(x) for x in text.split() if x.isdigit()]


def scan_pods(cgroup_root: str) -> dict[str, Pod]:
    """Every pod under a cgroup v2 (or v1 memory) root, by uid: its containers and processes."""
    pods: dict[str, Pod] = {}
    for top, dirs, _ in os.walk(cgroup_root):
        rel = "/" + os.path.relpath(top, cgroup_root).replace(os.sep, "/").lstrip("./")
        pc = parse_pod_cgroup(rel) if "pod" in rel else None
        if pc is None:
            if "kubepods" not in rel and rel.count("/") > 2:
                dirs.clear()  # not on the way to a pod: stop descending
            continue
        dirs.clear()
        if pc.container_id is not None or len(pods) >= MAX_PODS:
            continue
        containers, pids = [], _pids(top)
        for name in sorted(os.listdir(top)):
            child = parse_pod_cgroup(f"{rel}/{name}")
            if child is not None and child.container_id and os.path.isdir(os.path.join(top, name)):
                containers.append(child.container_id)
                pids += _pids(os.path.join(top, name))
        limit = (_read(os.path.join(top, "memory.max")) or "").strip()
        pods[pc.pod_uid] = Pod(pc.pod_uid, pc.qos, rel, tuple(containers), tuple(pids[:MAX_PIDS_PER_POD]),
                               int(limit) if limit.isdigit() else None)
    return pods


def pod_names(pods_log_dir: str) -> dict[str, tuple[str, str]]:
    """pod uid -> (namespace, pod name), from the kubelet's /var/log/pods directory names."""
    out: dict[str, tuple[str, str]] = {}
    try:
        names = os.listdir(pods_log_dir)
    except OSError:
        return out
    for name in names:
        parts = name.split("_")
        if len(parts) == 3 and parts[2].count("-") == 4:
            out[parts[2]] = (parts[0], parts[1])
    return out
