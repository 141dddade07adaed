"""cgroup: parsing real /proc/<pid>/cgroup and v1 files, v2 on fixture trees, and a real
process in a real v1 memory cgroup killed by the real kernel OOM killer."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from firstfault.agent.hostpaths import HostPaths
from firstfault.agent.sources.cgroup import CgroupSource, parse_keyed, parse_proc_cgroup, parse_value
from tests.agent.sources.conftest import DATA, IS_ROOT, V1_MEMORY, needs_v1_memory, remove_cgroup

CG = DATA / "cgroup"
PROC = DATA / "proc"
TASK = "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_{}"
NOWHERE = "/nonexistent/firstfault"


def test_parse_real_proc_cgroup_files():
    text = (PROC / "torchrun" / "25569" / "cgroup").read_text()  # hybrid host: v1 and v2
    assert parse_proc_cgroup(text) == ("/ff-pcap-25524-torchrun/job_4242",
                                       "/ff-pcap-25524-torchrun/job_4242")
    v2_only = (PROC / "v2-slurm" / "31337" / "cgroup").read_text()
    assert parse_proc_cgroup(v2_only) == (None, TASK.format(0))
    assert parse_proc_cgroup("4:cpu,memory:/a\n") == ("/a", None)
    assert parse_proc_cgroup("") == (None, None)


def test_parse_real_v1_and_v2_files():
    assert parse_keyed((CG / "v1" / "oom-after" / "memory.oom_control").read_text()) == {
        "oom_kill_disable": 0, "under_oom": 0, "oom_kill": 1}
    assert parse_keyed("oom 1\nbad line\nx y\n") == {"oom": 1}
    assert parse_value("max\n") is None and parse_value("1610612736\n") == 1610612736


def test_v1_counters_from_a_real_oom_capture(tmp_path, sink):
    root = tmp_path / "v1"
    shutil.copytree(CG / "v1", root)
    src = CgroupSource(v1_root=str(root), v2_root=NOWHERE, cgroups=["/job"], interval_s=0.001,
                       notify=False)
    shutil.copytree(CG / "v1" / "oom-before", root / "job")
    try:
        [before] = src.poll()
        assert before.kind == "cgroup.memory" and before.source == "cgroup"
        assert before.fields == {
            # the child's pages were charged before it moved in (no move_charge_at_immigrate)
            "cgroup": "/job", "version": 1, "pids": "", "usage_bytes": 0,
            "limit_bytes": 67108864, "peak_bytes": 0, "hierarchical_limit_bytes": 67108864,
            "failcnt": 0, "rss_bytes": 0, "cache_bytes": 0, "oom_kill": 0, "under_oom": 0,
            "oom_kill_disable": 0}
        for f in (CG / "v1" / "oom-after").iterdir():
            shutil.copy(f, root / "job" / f.name)
        oom, sample = later(src)
        assert oom.kind == "cgroup.oom" and oom.severity == 3 and oom.occurred_ns is None
        assert oom.message == "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
        assert oom.fields["oom_kill"] == 1 and oom.fields["delta_oom_kill"] == 1
        assert oom.fields["failcnt"] > 0 and oom.fields["peak_bytes"] == 67108864
        assert not oom.fields["notified"] and not oom.fields["first_sample"]
        assert sample.kind == "cgroup.memory"
        assert [d.kind for d in later(src)] == ["cgroup.memory"]  # counted once
    finally:
        src.close()


def later(src: CgroupSource) -> list:
    """poll() once the (1 ms) interval has passed: a full sample."""
    time.sleep(0.002)
    return src.poll()


def v2_source(root: Path, pids=(31337, 31338), **kw) -> CgroupSource:
    return CgroupSource(paths=HostPaths(proc=str(PROC / "v2-slurm")), v1_root=NOWHERE,
                        v2_root=str(root), pids=pids, interval_s=0.001, **kw)


def test_v2_pids_to_cgroups_and_samples_on_the_fixture_tree():
    src = v2_source(CG / "v2", notify=False)
    out = src.poll()
    mem = {d.fields["cgroup"]: d for d in out if d.kind == "cgroup.memory"}
    assert set(mem) == {TASK.format(0), TASK.format(1)}
    t0 = mem[TASK.format(0)].fields
    assert t0 == {
        "cgroup": TASK.format(0), "version": 2, "pids": "31337", "usage_bytes": 1609990144,
        "limit_bytes": None, "high_bytes": None, "peak_bytes": 1610563584,
        "hierarchical_limit_bytes": 1610612736, "anon_bytes": 1560281088,
        "file_bytes": 37748736, "oom": 0, "oom_kill": 0, "oom_group_kill": 0,
        "low_events": 0, "high_events": 0, "max_events": 0}
    # task_1 had its kill before we looked: reported, marked as the first sample
    [oom] = [d for d in out if d.kind == "cgroup.oom"]
    assert oom.fields["cgroup"] == TASK.format(1) and oom.fields["first_sample"]
    assert oom.fields["oom_kill"] == 1 and oom.fields["delta_oom_kill"] == 1
    assert oom.fields["delta_oom"] == 0 and oom.message.startswith("low 0\nhigh 0\nmax 0\noom 0")
    assert not [d for d in later(src) if d.kind == "cgroup.oom"]


def test_v2_oom_counter_moving_gives_a_cgroup_oom(tmp_path):
    shutil.copytree(CG / "v2", tmp_path / "v2")
    src = v2_source(tmp_path / "v2", pids=(31337,), notify=False)
    assert [d.kind for d in src.poll()] == ["cgroup.memory"]
    (tmp_path / "v2" / TASK.format(0)[1:] / "memory.events").write_text(
        "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
    oom, _ = later(src)
    assert oom.kind == "cgroup.oom" and oom.fields["delta_oom"] == 1
    assert oom.fields["delta_oom_kill"] == 1 and oom.fields["max_events"] == 3


def test_a_cgroup_whose_pids_left_is_sampled_once_more_then_dropped(tmp_path):
    pids = [31337]
    src = v2_source(CG / "v2", pids=lambda: pids, notify=False)
    src.poll()
    pids.clear()
    src.interval_s = 0.0001
    time.sleep(0.01)
    out = src.poll()
    assert [d.fields["pids"] for d in out] == [""] and not src.watches


def test_v2_notification_on_a_regular_file_never_spins(sink, running):
    src = v2_source(CG / "v2", pids=(31337,))
    src.interval_s = 30
    with running(src, sink):
        sink.wait_for(lambda d: d.kind == "cgroup.memory")
        time.sleep(0.5)
        assert [w.fd is not None for w in src.watches.values()] == [True]  # polled for POLLPRI
    assert len(sink.of("cgroup.memory")) == 1  # no busy wake-ups on a plain file


def test_missing_cgroups_and_pids_are_not_errors():
    src = CgroupSource(v1_root=NOWHERE, v2_root=NOWHERE, pids=[10**7], cgroups=["/gone"])
    assert src.poll() == []


# --- the real kernel ----------------------------------------------------------------------

ALLOCATE = """import os, sys
open(sys.argv[1], "w").write(str(os.getpid()))
sys.stdin.readline()
b = []
while True:
    b.append(b"\\x01" * (1 << 20))
"""


@pytest.fixture
def v1_cgroup():
    """A fresh v1 memory cgroup with a 64M limit, removed after the test."""
    path = V1_MEMORY / f"ff-src-test-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    (path / "memory.limit_in_bytes").write_text("64M")
    yield path
    for _ in range(100):
        try:
            path.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError:
            time.sleep(0.05)
    assert not path.exists()


def start_allocator(cg: Path) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", ALLOCATE, str(cg / "cgroup.procs")],
                             stdin=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while str(child.pid) not in (cg / "cgroup.procs").read_text().split():
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.01)
    return child


@needs_v1_memory
@pytest.mark.root
def test_real_oom_kill_in_a_v1_cgroup_is_reported_at_once(v1_cgroup, sink, running):
    child = start_allocator(v1_cgroup)
    name = f"/{v1_cgroup.name}"
    try:
        src = CgroupSource(pids=[child.pid], interval_s=30)  # only a notification is this fast
        with running(src, sink):
            sink.wait_for(lambda d: d.kind == "cgroup.memory" and d.fields["cgroup"] == name)
            child.stdin.write(b"go\n")
            child.stdin.flush()
            assert child.wait(timeout=30) == -9  # the kernel's SIGKILL
            died = time.time_ns()
            oom = sink.wait_for(lambda d: d.kind == "cgroup.oom", timeout=5)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    f = oom.fields
    assert f["cgroup"] == name and f["version"] == 1 and f["pids"] == str(child.pid)
    assert f["oom_kill"] == 1 and f["delta_oom_kill"] == 1 and f["notified"]
    assert f["limit_bytes"] == 64 << 20 and f["peak_bytes"] == 64 << 20 and f["failcnt"] > 0
    assert oom.message.endswith("oom_kill 1\n") and oom.severity == 3
    assert oom.occurred_ns is not None and oom.occurred_ns <= oom.observed_ns
    assert oom.observed_ns - died < 1_000_000_000  # at once, not at the 30 s sample
    assert len(sink.of("cgroup.oom")) == 1


@needs_v1_memory
@pytest.mark.root
def test_real_oom_without_a_kill_is_reported_after_the_hot_window(v1_cgroup, sink, running):
    """oom_kill_disable 1: the kernel notifies, kills nobody, and the task hangs in the OOM."""
    (v1_cgroup / "memory.oom_control").write_text("1")
    child = start_allocator(v1_cgroup)
    name = f"/{v1_cgroup.name}"
    try:
        src = CgroupSource(cgroups=[name], interval_s=30, hot_window_s=0.3)
        with running(src, sink):
            sink.wait_for(lambda d: d.kind == "cgroup.memory" and d.fields["cgroup"] == name)
            child.stdin.write(b"go\n")
            child.stdin.flush()
            oom = sink.wait_for(lambda d: d.kind == "cgroup.oom", timeout=5)
            assert child.poll() is None  # stuck, not killed
    finally:
        child.kill()  # a fatal signal ends the wait in the OOM
        child.wait()
    f = oom.fields
    assert f["notified"] and f["delta_oom_kill"] == 0 and f["oom_kill"] == 0
    assert f["under_oom"] == 1 and f["oom_kill_disable"] == 1 and oom.severity == 4
    assert oom.occurred_ns is not None and oom.observed_ns - oom.occurred_ns >= 300_000_000


@needs_v1_memory
@pytest.mark.root
def test_removing_a_watched_v1_cgroup_drops_it(v1_cgroup, sink, running):
    name = f"/{v1_cgroup.name}"
    src = CgroupSource(cgroups=[name], interval_s=30)
    with running(src, sink):
        sink.wait_for(lambda d: d.kind == "cgroup.memory" and d.fields["cgroup"] == name)
        v1_cgroup.rmdir()  # the kernel signals the eventfd on removal
        deadline = time.monotonic() + 3
        while src.watches and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not src.watches
    assert [d.fields["state"] for d in sink.of("agent.status")] == ["running", "stopped"]


@pytest.mark.skipif(not (IS_ROOT and Path("/sys/fs/cgroup/unified/cgroup.procs").exists()),
                    reason="needs root and a cgroup v2 hierarchy")
@pytest.mark.root
def test_kernfs_raises_pollpri_when_a_v2_events_file_changes():
    """The v2 mechanism the source relies on (memory.events is a kernfs file like
    cgroup.events); the v2 memory controller itself is not enabled here."""
    cg = Path(f"/sys/fs/cgroup/unified/ff-src-test-{os.getpid()}")
    cg.mkdir()
    child = None
    fd = os.open(cg / "cgroup.events", os.O_RDONLY)
    try:
        os.pread(fd, 4096, 0)
        poller = select.poll()
        poller.register(fd, select.POLLPRI)
        assert poller.poll(50) == []
        child = subprocess.Popen(["sleep", "30"])
        (cg / "cgroup.procs").write_text(str(child.pid))  # populated 0 -> 1
        [(got, mask)] = poller.poll(2000)
        assert got == fd and mask & select.POLLPRI
        assert b"populated 1" in os.pread(fd, 4096, 0)
        assert poller.poll(50) == []  # re-armed by the read
    finally:
        os.close(fd)
        if child is not None:
            child.kill()
            child.wait()
        remove_cgroup(cg)
