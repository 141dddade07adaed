"""The pods source on a Kubernetes node's tree (tests/data/kubenode): each pod's job and rank, and
a kernel memcg OOM kill in a pod's cgroup named by that pod's rank, through to the report."""

from __future__ import annotations

from pathlib import Path

from firstfault.agent.clock import BootWall
from firstfault.agent.hostpaths import HostPaths
from firstfault.agent.sources.kmsg import KmsgStream
from firstfault.agent.sources.pods import KIND_POD_EXIT, KIND_POD_START, PodsSource
from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.records import events_from_records
from firstfault.analysis.report import Inputs, build_report
from firstfault.wire import Record

DATA = Path(__file__).resolve().parents[2] / "data"
NODE = DATA / "kubenode"
KMSG = DATA / "kernel" / "memcg-oom.kmsg"
WORKER = "6a1d9e40-2c3b-4f8e-b7a6-51c0de9f3a24"
SCOPE = (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{WORKER.replace('-', '_')}.slice/"
         f"cri-containerd-{'b2' * 32}.scope")
T0 = 1_796_330_000_000_000_000
S = 10**9


def source(**kw) -> PodsSource:
    return PodsSource(paths=HostPaths(proc=str(NODE / "proc"), sys=str(NODE / "sys")),
                      pod_logs=str(NODE / "var/log/pods"), **kw)


def test_each_training_pod_is_shipped_once_with_its_job_and_rank():
    src = source()
    first = src.poll()
    assert all(d.kind == KIND_POD_START for d in first)
    got = {d.fields["pod"]: (d.job, d.rank, d.fields["node_rank"], d.fields["namespace"], d.fields["qos"])
           for d in first}
    assert got == {"llama-master-0": ("llama", 0, 0, "training", "guaranteed"),
                   "llama-worker-0": ("llama", 1, 1, "training", "burstable"),
                   "shard-2-x7k2p": (None, None, 2, "batch", "besteffort")}
    assert src.poll() == []  # nothing changed


def test_a_pod_gone_is_shipped_as_gone(tmp_path):
    import shutil
    shutil.copytree(NODE, tmp_path / "node", symlinks=True)
    src = PodsSource(paths=HostPaths(proc=str(tmp_path / "node/proc"), sys=str(tmp_path / "node/sys")),
                     pod_logs=str(tmp_path / "node/var/log/pods"))
    src.poll()
    shutil.rmtree(tmp_path / "node/sys/fs/cgroup" / SCOPE.lstrip("/").rsplit("/", 1)[0])
    [gone] = src.poll()
    assert (gone.kind, gone.rank, gone.fields["pod_uid"]) == (KIND_POD_EXIT, 1, WORKER)


def test_the_hosts_cgroup_tree_where_it_is_mounted_and_bad_options():
    import pytest
    src = PodsSource(cgroup_root=str(NODE / "sys/fs/cgroup"), paths=HostPaths(proc=str(NODE / "proc")),
                     pod_logs=str(NODE / "var/log/pods"))
    assert len(src.poll()) == 3
    for bad in ({"cgroup_root": "host/sys"}, {"pod_logs": "logs"}, {"pod_logs": 3}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            PodsSource(**bad)


def oom_kill(memcg: str, pid: int, at_ns: int) -> list:
    """The real capture's oom-kill and 'Killed process' records as the kmsg source reads them,
    the cgroup and pid replaced, stamped at ``at_ns``."""
    raws = [ln for ln in KMSG.read_bytes().splitlines(True) if b"oom-kill:" in ln or b"Killed process" in ln]
    out = []
    for raw in raws:
        raw = raw.replace(b"/ff-kcap-8289", memcg.encode()).replace(b"8333", str(pid).encode())
        usec = int(raw.split(b",")[2])
        boot = BootWall(ns=at_ns - usec * 1000, error_ns=50, at_boottime_ns=usec * 1000)
        out += KmsgStream("boot-1", last_seq=int(raw.split(b",")[1]) - 1).feed(raw, boot, observed_ns=at_ns)
    return out


def test_an_oom_kill_in_a_pods_cgroup_gets_the_pods_rank_and_other_lines_are_left_alone():
    src = source()
    src.poll()
    tagged = [src.tag(d) for d in oom_kill(SCOPE, 4290, T0)]
    assert [(d.rank, d.job, d.fields.get("pod"), d.fields.get("rank_from")) for d in tagged] == [
        (1, "llama", "llama-worker-0", "pod")] * 2
    other = [src.tag(d) for d in oom_kill("/system.slice/cron.service", 4290, T0)]
    assert [(d.rank, d.fields.get("pod")) for d in other] == [(None, None)] * 2


def proc(kind: str, rank: int, pid: int, at_ns: int, seq: int, **fields) -> Record:
    return Record(node="gpu-1", stream="a", seq=seq, source="procs", kind=kind, message="",
                  occurred_ns=at_ns, observed_ns=at_ns, job="llama", rank=rank, local_rank=0, pid=pid, fields=fields)


def report(kills: list) -> dict:
    records = [proc("proc.start", 0, 4150, T0, 1), proc("proc.start", 1, 4250, T0 + S // 10, 2),
               *[d.to_record("gpu-1", "k", i) for i, d in enumerate(kills)],
               proc("proc.exit", 1, 4250, T0 + 31 * S, 3, code=1)]
    records.sort(key=lambda r: r.occurred_ns or r.observed_ns)
    return build_report(events_from_records(records), load_catalog(),
                        Inputs(job="llama", gaps=[], clocks={}, generated_ns=T0 + 60 * S, rank_nodes={}))


def test_the_report_names_the_pods_rank_for_a_kill_of_a_process_that_is_no_rank():
    """The kernel killed rank 1's DataLoader worker (pid 4290, no rank itself) in the worker
    pod's memory cgroup: only the pod says whose it was."""
    src = source()
    src.poll()
    untagged = report(oom_kill(SCOPE, 4290, T0 + 30 * S))["first_failure"]
    assert untagged["signature"] == "kernel.memcg_oom_kill" and untagged["rank"] is None
    first = report([src.tag(d) for d in oom_kill(SCOPE, 4290, T0 + 30 * S)])["first_failure"]
    assert (first["signature"], first["rank"]) == ("kernel.memcg_oom_kill", 1)
    assert "Killed process 4290" in first["evidence"][0]["text"]


def test_the_daemon_wires_the_pods_tag_into_kmsg(tmp_path):
    from firstfault.agent.config import parse_args
    from firstfault.agent.daemon import build_sources
    cfg, _ = parse_args(["--collector", "127.0.0.1:7140", "--state-dir", str(tmp_path), "--pods-enabled", "true",
                         "--kmsg-enabled", "true", "--cgroup-enabled", "false", "--procs-enabled", "false",
                         "--ranklog-pod-dirs", "/var/log/pods"])
    (tmp_path / "kmsg").write_bytes(b"")  # a readable kmsg: a container running this test may have none
    paths = HostPaths(proc=str(NODE / "proc"), sys=str(NODE / "sys"), dev=str(tmp_path))
    built = {s.name: s for s in build_sources(cfg, paths, create_dirs=True)[0]}
    assert built["kmsg"].tag == built["pods"].tag
    assert built["ranklog"].pod_owner == built["pods"].by_uid
