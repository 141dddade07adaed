"""A real kernel memcg OOM kill in a pod's memory cgroup, named by the pod's rank.

The machine has no cgroup v2 memory controller (tests/data/cgroup/README.md), so the pod's
cgroups are made where the kubelet's cgroupfs driver puts them on a v1 node:
``memory/kubepods/burstable/pod<uid>/<container id>``. A rank process (RANK=3 in its
environment) joins the container's cgroup, the pods source polls, the process allocates until
the real kernel kills it, and the kernel's own oom-kill and Killed process records, read from
/dev/kmsg by the kmsg source's parser, get rank 3 from the pods source's tag."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from firstfault.agent.clock import boot_wall
from firstfault.agent.sources.kmsg import KmsgStream
from firstfault.agent.sources.pods import PodsSource
from tests.agent.sources.conftest import V1_MEMORY, needs_v1_memory, remove_cgroup
from tests.agent.sources.test_cgroup import ALLOCATE


def kmsg_after(fd: int, want: bytes, timeout: float = 10.0) -> list[bytes]:
    """Records read from ``fd`` (opened at the end of the buffer) until one holds ``want``."""
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = os.read(fd, 8192)
        except BlockingIOError:
            time.sleep(0.02)
            continue
        except BrokenPipeError:
            continue
        out.append(data)
        if want in data:
            return out
    raise AssertionError(f"{want!r} not in /dev/kmsg after {timeout} s")


@needs_v1_memory
@pytest.mark.root
def test_a_real_oom_kill_in_a_pods_cgroup_names_the_pods_rank(tmp_path):
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex * 2
    made = [V1_MEMORY / "kubepods", V1_MEMORY / "kubepods/burstable", V1_MEMORY / f"kubepods/burstable/pod{uid}",
            V1_MEMORY / f"kubepods/burstable/pod{uid}/{cid}"]
    if made[0].exists():
        pytest.skip("this machine has a kubepods cgroup of its own")
    for d in made:
        d.mkdir()
    (made[-1] / "memory.limit_in_bytes").write_text("64M")
    (tmp_path / "pods" / f"training_llama-worker-2_{uid}").mkdir(parents=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
           "TORCHELASTIC_RUN_ID": "llama"}
    child = subprocess.Popen([sys.executable, "-c", ALLOCATE, str(made[-1] / "cgroup.procs")],
                             stdin=subprocess.PIPE, env=env)
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.lseek(fd, 0, os.SEEK_END)
        deadline = time.monotonic() + 10
        while str(child.pid) not in (made[-1] / "cgroup.procs").read_text().split():
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.01)
        src = PodsSource(cgroup_root=str(V1_MEMORY), pod_logs=str(tmp_path / "pods"))
        [start] = src.poll()
        assert (start.rank, start.job, start.fields["pod"], start.fields["qos"]) == (3, "llama", "llama-worker-2",
                                                                                       "burstable")
        child.stdin.write(b"go\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == -9  # the kernel's SIGKILL
        raws = kmsg_after(fd, f"Killed process {child.pid} ".encode())
    finally:
        os.close(fd)
        if child.poll() is None:
            child.kill()
            child.wait()
        for d in reversed(made):
            remove_cgroup(d)
    stream, boot = KmsgStream("boot"), boot_wall()
    drafts = [src.tag(d) for raw in raws for d in stream.feed(raw, boot) if d.kind == "kernel.line"]
    kill = [d for d in drafts if "oom-kill:" in d.message and f"pid={child.pid}," in d.message]
    killed = [d for d in drafts if f"Killed process {child.pid} " in d.message]
    assert len(kill) == len(killed) == 1
    assert f"task_memcg=/kubepods/burstable/pod{uid}/{cid}" in kill[0].message  # the kernel's own words
    for d in kill + killed:
        assert (d.rank, d.job, d.fields["pod_uid"], d.fields["pod"], d.fields["rank_from"]) == (
            3, "llama", uid, "llama-worker-2", "pod")
