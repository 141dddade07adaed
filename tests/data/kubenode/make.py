"""Write the kubenode fixture: one Kubernetes GPU node's cgroup v2 tree, /proc and /var/log/pods.

Run from the repository root: ``python3 tests/data/kubenode/make.py`` (it replaces the tree).
Shapes, not captures (this machine runs no kubelet); each from its source:

- cgroup paths: the kubelet's systemd cgroup driver (pkg/kubelet/cm/cgroup_manager_linux.go:
  the cgroupfs name kubepods/burstable/pod<uid> becomes kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid with '-' as '_'>.slice; Guaranteed pods sit right under
  kubepods.slice) and containerd's systemd cgroup for a container, cri-containerd-<id>.scope;
  the sandbox (pause) container has a scope of its own.
- environments: what Kubeflow's PyTorchJob / Trainer sets for torchrun (PET_NNODES,
  PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT; RANK and WORLD_SIZE
  of the replica) and what torchrun sets in its workers (RANK, LOCAL_RANK, GROUP_RANK,
  LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID); an Indexed Job's JOB_COMPLETION_INDEX.
- /var/log/pods/<namespace>_<pod>_<uid>/<container>/0.log in the CRI format
  (tests/common/criwriter.py).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tests.common.criwriter import records  # noqa: E402

T0 = 1796330000 * 1_000_000_000
PODS = [  # (namespace, name, uid, qos, memory.max, containers: [(name, id, [(pid, env)])])
    ("training", "llama-master-0", "0f3c6d2a-7b1e-4c55-9a0d-2e8f41b7c901", "guaranteed", "68719476736",
     [("pytorch", "a1" * 32, [
         (4100, {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "0",
                 "PET_MASTER_ADDR": "llama-master-0", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "llama-master-0",
                 "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "0"}),
         (4150, {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "0", "MASTER_ADDR": "llama-master-0",
                 "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0",
                 "LOCAL_WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "llama"})])]),
    ("training", "llama-worker-0", "6a1d9e40-2c3b-4f8e-b7a6-51c0de9f3a24", "burstable", "max",
     [("pytorch", "b2" * 32, [
         (4200, {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1", "MASTER_ADDR": "llama-master-0",
                 "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}),
         (4250, {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1", "MASTER_ADDR": "llama-master-0",
                 "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "0", "GROUP_RANK": "1",
                 "LOCAL_WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "llama"}),
         # a DataLoader worker of that rank (it inherited the rank's environment)
         (4290, {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "llama"})])]),
    ("batch", "shard-2-x7k2p", "c4e2b8d1-9a7f-4e36-8c15-7d0b3f6a2e98", "besteffort", "max",
     [("main", "c3" * 32, [(4300, {"JOB_COMPLETION_INDEX": "2", "PATH": "/usr/bin"})])]),
    ("kube-system", "nvidia-device-plugin-daemonset-q8x4m", "9b7a5c3e-1d2f-4a6b-8e9c-0f1a2b3c4d5e", "burstable",
     "max", [("nvidia-device-plugin-ctr", "d4" * 32, [(3900, {"PATH": "/usr/bin"})])]),
]


def write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def main() -> None:
    for sub in ("sys", "proc", "var"):
        shutil.rmtree(HERE / sub, ignore_errors=True)
    cg = HERE / "sys/fs/cgroup"
    write(cg / "cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
    write(cg / "system.slice/containerd.service/cgroup.procs", "812\n")
    write(cg / "system.slice/kubelet.service/cgroup.procs", "930\n")
    write(cg / "kubepods.slice/memory.max", "1081823010816\n")
    for ns, name, uid, qos, mem, containers in PODS:
        under = "kubepods.slice" if qos == "guaranteed" else f"kubepods.slice/kubepods-{qos}.slice"
        slice_name = ("kubepods" if qos == "guaranteed" else f"kubepods-{qos}") + f"-pod{uid.replace('-', '_')}.slice"
        pod = cg / under / slice_name
        write(pod / "memory.max", mem + "\n")
        write(pod / "cgroup.procs", "")
        pause_id = uid.replace("-", "")[:16] * 4
        pause_pid = containers[0][2][0][0] - 90
        write(pod / f"cri-containerd-{pause_id}.scope/cgroup.procs", f"{pause_pid}\n")
        write(HERE / f"proc/{pause_pid}/environ", b"PATH=/usr/local/sbin:/usr/bin\0")
        write(HERE / f"proc/{pause_pid}/cgroup", f"0::/{under}/{slice_name}/cri-containerd-{pause_id}.scope\n")
        for cname, cid, procs in containers:
            scope = pod / f"cri-containerd-{cid}.scope"
            write(scope / "cgroup.procs", "".join(f"{pid}\n" for pid, _ in procs))
            write(scope / "memory.max", mem + "\n")
            for pid, env in procs:
                write(HERE / f"proc/{pid}/environ", b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
                write(HERE / f"proc/{pid}/cgroup", f"0::/{under}/{slice_name}/cri-containerd-{cid}.scope\n")
            log = HERE / f"var/log/pods/{ns}_{name}_{uid}/{cname}/0.log"
            write(log, records("stdout", f"{name} started".encode(), T0))


if __name__ == "__main__":
    main()
