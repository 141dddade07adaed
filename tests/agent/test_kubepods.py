"""Pods from cgroup paths and trees (tests/data/kubenode), ranks from the operators' variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from firstfault.agent.kubepods import PodCgroup, parse_pod_cgroup, pod_identity, pod_names, scan_pods

NODE = Path(__file__).resolve().parents[1] / "data" / "kubenode"
UID = "6a1d9e40-2c3b-4f8e-b7a6-51c0de9f3a24"
U_ = UID.replace("-", "_")
CID = "b2" * 32


@pytest.mark.parametrize("path, want", [
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/cri-containerd-{CID}.scope",
     PodCgroup(UID, "burstable", CID, "systemd",
               f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice")),
    (f"/kubepods.slice/kubepods-pod{U_}.slice/crio-{CID}.scope",
     PodCgroup(UID, "guaranteed", CID, "systemd", f"/kubepods.slice/kubepods-pod{U_}.slice")),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U_}.slice",
     PodCgroup(UID, "besteffort", None, "systemd",
               f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U_}.slice")),
    (f"/kubepods/burstable/pod{UID}/{CID}",
     PodCgroup(UID, "burstable", CID, "cgroupfs", f"/kubepods/burstable/pod{UID}")),
    (f"/kubepods/pod{UID}/{CID}", PodCgroup(UID, "guaranteed", CID, "cgroupfs", f"/kubepods/pod{UID}")),
    # kind: the node's kubelet runs inside a container's cgroup
    (f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
     f"kubelet-kubepods-burstable-pod{U_}.slice/cri-containerd-{CID}.scope",
     PodCgroup(UID, "burstable", CID, "systemd", f"/kubelet.slice/kubelet-kubepods.slice/"
               f"kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{U_}.slice")),
])
def test_a_pods_cgroup_path_under_either_driver(path, want):
    assert parse_pod_cgroup(path) == want


@pytest.mark.parametrize("path", ["/system.slice/containerd.service", "/user.slice/user-0.slice",
                                  "/kubepods.slice", "/kubepods.slice/kubepods-burstable.slice",
                                  "/kubepods/burstable/podnot-a-uid", "/ff-kcap-8289", ""])
def test_what_is_no_pods_cgroup(path):
    assert parse_pod_cgroup(path) is None


def test_the_node_tree_gives_each_pod_its_containers_processes_and_limit():
    pods = scan_pods(str(NODE / "sys/fs/cgroup"))
    assert len(pods) == 4
    w = pods[UID]
    assert (w.qos, w.memory_max_bytes) == ("burstable", None)
    assert w.cgroup == f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice"
    assert CID in w.containers and len(w.containers) == 2  # the training container and the sandbox
    assert sorted(w.pids) == [4110, 4200, 4250, 4290]  # the sandbox's pause, the launcher, the rank, its worker
    m = pods["0f3c6d2a-7b1e-4c55-9a0d-2e8f41b7c901"]
    assert (m.qos, m.memory_max_bytes) == ("guaranteed", 68719476736)


def test_every_pid_in_the_tree_names_its_pod_through_its_own_cgroup_file():
    pods = scan_pods(str(NODE / "sys/fs/cgroup"))
    for uid, pod in pods.items():
        for pid in pod.pids:
            f = NODE / "proc" / str(pid) / "cgroup"
            assert parse_pod_cgroup(f.read_text().split("::", 1)[1].strip()).pod_uid == uid


def env(path: Path) -> dict[str, str]:
    return dict(x.split("=", 1) for x in path.read_bytes().decode().split("\0") if x)


def envs_of(pod) -> list[dict[str, str]]:
    return [env(NODE / "proc" / str(pid) / "environ") for pid in pod.pids]


def test_pod_identity_from_the_operators_and_torchruns_variables():
    pods = scan_pods(str(NODE / "sys/fs/cgroup"))
    worker = pod_identity(envs_of(pods[UID]))
    assert (worker.job, worker.rank, worker.ranks, worker.node_rank, worker.world_size, worker.nproc_per_node,
            worker.rank_from) == ("llama", 1, (1,), 1, 2, 1, "RANK")
    master = pod_identity(envs_of(pods["0f3c6d2a-7b1e-4c55-9a0d-2e8f41b7c901"]))
    assert (master.rank, master.node_rank) == (0, 0)
    shard = pod_identity(envs_of(pods["c4e2b8d1-9a7f-4e36-8c15-7d0b3f6a2e98"]))
    assert (shard.rank, shard.node_rank, shard.rank_from) == (None, 2, None)  # processes per pod unknown
    assert pod_identity(envs_of(pods["9b7a5c3e-1d2f-4a6b-8e9c-0f1a2b3c4d5e"])) is None  # no training pod


def test_one_process_a_node_makes_the_node_rank_the_rank_and_several_ranks_none():
    one = pod_identity([{"JOB_COMPLETION_INDEX": "3", "PET_NPROC_PER_NODE": "1"}])
    assert (one.rank, one.rank_from) == (3, "JOB_COMPLETION_INDEX")
    many = pod_identity([{"RANK": str(r), "LOCAL_RANK": str(r - 8), "GROUP_RANK": "1"} for r in range(8, 12)])
    assert (many.rank, many.ranks, many.node_rank) == (None, (8, 9, 10, 11), 1)
    assert pod_identity([{"PATH": "/bin"}]) is None


def test_pod_names_come_from_the_kubelets_log_dirs():
    names = pod_names(str(NODE / "var/log/pods"))
    assert names[UID] == ("training", "llama-worker-0")
    assert pod_names(str(NODE / "nowhere")) == {}
