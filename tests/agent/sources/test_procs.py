"""procs: identities from real torchrun / DeepSpeed environments, exits from real zombie
stat files, the source on a captured /proc tree, and on real child processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime

import psutil
import pytest

from firstfault.agent.clock import BootWall
from firstfault.agent.hostpaths import HostPaths
from firstfault.agent.sources import procs
from firstfault.agent.sources.cgroup import CgroupSource
from firstfault.agent.sources.kmsg import KmsgSource
from firstfault.agent.sources.procs import ProcsSource, exit_fields, parse_environ, parse_stat, rank_identity
from tests.agent.sources.conftest import DATA, V1_MEMORY, Sink, needs_v1_memory, remove_cgroup

PROC = DATA / "proc"
TORCHRUN = json.loads((PROC / "torchrun" / "roles.json").read_text())
DEEPSPEED = json.loads((PROC / "deepspeed" / "roles.json").read_text())


def env_of(scenario: str, pid: int) -> dict[str, str]:
    return parse_environ((PROC / scenario / str(pid) / "environ").read_bytes())


# --- pure ------------------------------------------------------------------------------

def test_identity_of_real_torchrun_workers():
    for rank, pid in TORCHRUN["ranks"].items():
        ident = rank_identity(env_of("torchrun", pid), job_label="label")
        assert ident.job == "29580efb-40c8-407a-a285-5cb8037b2d64"  # TORCHELASTIC_RUN_ID
        assert (ident.rank, ident.local_rank) == (int(rank), int(rank))
        assert ident.env["WORLD_SIZE"] == "2" and ident.env["MASTER_ADDR"] == "localhost"
        assert ident.env["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/{rank}/error.json")
        assert "RANK" not in ident.env and "PATH" not in ident.env
    assert rank_identity(env_of("torchrun", TORCHRUN["launcher"])) is None  # the agent


def test_identity_of_real_deepspeed_launcher_workers():
    for rank, pid in DEEPSPEED["ranks"].items():
        ident = rank_identity(env_of("deepspeed", pid), job_label="nightly-7")
        assert (ident.job, ident.rank, ident.local_rank) == ("nightly-7", int(rank), int(rank))
        assert ident.env["LOCAL_SIZE"] == "2" and ident.env["CROSS_RANK"] == "0"
    assert rank_identity(env_of("deepspeed", pid)).job is None  # no label, no job id
    for pid in (DEEPSPEED["launcher"], *DEEPSPEED["intermediate"]):
        assert rank_identity(env_of("deepspeed", pid)) is None


def test_job_id_precedence():
    env = {"RANK": "3", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "run-9"}
    assert rank_identity({**env, "SLURM_JOB_ID": "12345"}, "lbl").job == "12345"
    assert rank_identity(env, "lbl").job == "run-9"
    assert rank_identity({**env, "TORCHELASTIC_RUN_ID": "none"}, "lbl").job == "lbl"  # torchrun default
    assert rank_identity({"LOCAL_RANK": "0"}).job is None


def test_rank_from_slurm_when_asked_to_match_slurm_tasks():
    env = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "5", "SLURM_LOCALID": "1"}
    assert rank_identity(env) is None  # every process of a step has these
    ident = rank_identity(env, match_env=("RANK", "LOCAL_RANK", "SLURM_PROCID"))
    assert (ident.job, ident.rank, ident.local_rank) == ("77", 5, 1)
    assert rank_identity({"RANK": "x"}).rank is None


def test_parse_environ_keeps_odd_bytes():
    env = parse_environ(b"A=1\0B=x=y\0C=\xff\0junk\0=v\0")
    assert env == {"A": "1", "B": "x=y", "C": "\\xff"}


def test_exit_status_of_real_zombies():
    roles = json.loads((PROC / "zombie" / "roles.json").read_text())
    for role, want in (("sigkill", {"wait_status": 9, "code": -9, "signal": "SIGKILL",
                                    "core_dumped": False}),
                       ("exit3", {"wait_status": 768, "code": 3, "signal": None,
                                  "core_dumped": False})):
        st = parse_stat((PROC / "zombie" / str(roles[role]["pid"]) / "stat").read_text())
        assert st.state == "Z" and exit_fields(st.exit_status) == want
        assert want["code"] == roles[role]["returncode"]  # what Popen.wait() said


def test_parse_stat_with_spaces_and_parens_in_comm():
    text = "42 (a) b (c)) S 1 42 42 0 -1 0 " + " ".join(["0"] * 12) + " 777 " + "0 " * 30
    st = parse_stat(text)
    assert (st.comm, st.state, st.ppid, st.start_ticks, st.exit_status) == ("a) b (c)", "S", 1, 777, 0)


# --- on a captured /proc tree ----------------------------------------------------------------

def captured_boot(tree) -> BootWall:
    """The clock of the machine the tree was captured on, at the capture: its boot (``btime``
    of the tree's stat, whole seconds) and how long it had been up when captured. The source
    reads start ticks from the tree, so its boot must be the tree's too: this machine's may be
    minutes old, which put the captured ranks' starts in the future."""
    btime = next(int(line.split()[1]) for line in (tree / "stat").read_text().splitlines()
                 if line.startswith("btime "))
    captured = datetime.fromisoformat(json.loads((tree / "roles.json").read_text())["captured"])
    return BootWall(btime * 1_000_000_000, 500_000_000, int(captured.timestamp() - btime) * 1_000_000_000)


@pytest.fixture
def torchrun_tree(tmp_path, monkeypatch):
    tree = tmp_path / "proc"
    shutil.copytree(PROC / "torchrun", tree)
    monkeypatch.setattr(psutil, "PROCFS_PATH", psutil.PROCFS_PATH)  # restored after
    monkeypatch.setattr(procs, "boot_wall", lambda: captured_boot(tree))
    return tree


def test_source_on_a_captured_torchrun_tree(torchrun_tree):
    src = ProcsSource(paths=HostPaths(proc=str(torchrun_tree)), job_label="lbl")
    assert psutil.PROCFS_PATH == str(torchrun_tree) and not src.use_pidfd
    out = src.poll()
    starts = {d.pid: d for d in out if d.kind == "proc.start"}
    ranks = {int(r): p for r, p in TORCHRUN["ranks"].items()}
    assert set(starts) == set(ranks.values())  # not the agent, not the ranks' helper children
    d = starts[ranks[1]]
    assert (d.job, d.rank, d.local_rank) == ("29580efb-40c8-407a-a285-5cb8037b2d64", 1, 1)
    assert d.message.endswith("python3.11 -u /tmp/ff-pcap-ih1l5e4s/worker.py")
    assert d.fields["cgroup"] == "/ff-pcap-25524-torchrun/job_4242" and d.fields["cgroup_version"] == 1
    assert d.fields["ppid"] == TORCHRUN["launcher"] and d.fields["comm"] == "python3.11"
    assert d.fields["world_size"] == "2" and d.fields["torchelastic_restart_count"] == "0"
    page = os.sysconf("SC_PAGE_SIZE")
    assert d.fields["rss_bytes"] == int((torchrun_tree / str(ranks[1]) / "statm").read_text().split()[1]) * page
    ticks = int((torchrun_tree / str(ranks[1]) / "stat").read_text().rpartition(")")[2].split()[19])
    started = captured_boot(torchrun_tree).ns + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    assert d.occurred_ns == d.fields["start_ns"] == started < d.observed_ns
    assert src.ranks()[ranks[0]].rank == 0 and set(src.pids()) == set(ranks.values())
    assert [d.kind for d in src.poll()] == []  # nothing new; memory samples every 10 s

    shutil.rmtree(torchrun_tree / str(ranks[1]))  # gone, reaped by its parent
    [exit_] = src.poll()
    assert exit_.kind == "proc.exit" and exit_.pid == ranks[1] and exit_.rank == 1
    assert "code" not in exit_.fields and "signal" not in exit_.fields  # not our child
    assert exit_.occurred_ns is None and exit_.severity == 5
    assert exit_.fields["last_seen_ns"] <= exit_.observed_ns
    assert exit_.fields["rss_bytes"] == d.fields["rss_bytes"]
    assert exit_.message == f"pid {ranks[1]} exited: status unknown"
    assert set(src.pids()) == {ranks[0]}


def test_memory_samples(torchrun_tree):
    src = ProcsSource(paths=HostPaths(proc=str(torchrun_tree)), rss_interval_s=0.001)
    mem = [d for d in src.poll() if d.kind == "proc.memory"]
    assert len(mem) == 2 and all(d.fields["rss_bytes"] > 0 and d.rank is not None for d in mem)


# --- real processes --------------------------------------------------------------------------

def spawn(env: dict, *argv: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(list(argv), env={"PATH": os.environ["PATH"], **env}, **kw)


def reap(*procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_real_ranks_start_and_exit(sink, running):
    job = f"ff-test-{os.getpid()}"
    base = {"WORLD_SIZE": "2", "SLURM_JOB_ID": job, "TORCHELASTIC_RUN_ID": "r1", "MASTER_ADDR": "h"}
    r0 = spawn({**base, "RANK": "0", "LOCAL_RANK": "0"}, "sh", "-c", "read x; exit 3",
               stdin=subprocess.PIPE)
    r1 = spawn({**base, "RANK": "1", "LOCAL_RANK": "1"}, "sleep", "60")
    try:
        src = ProcsSource(interval_s=0.05, job_label="lbl")
        with running(src, sink):
            s0 = sink.wait_for(lambda d: d.kind == "proc.start" and d.pid == r0.pid)
            s1 = sink.wait_for(lambda d: d.kind == "proc.start" and d.pid == r1.pid)
            assert (s1.job, s1.rank, s1.local_rank) == (job, 1, 1)  # SLURM_JOB_ID first
            assert s1.message == "sleep 60" and s1.fields["torchelastic_run_id"] == "r1"
            assert s0.fields["cmdline"] == "sh -c read x; exit 3"
            assert abs(s1.occurred_ns - time.time_ns()) < 5 * 10**9
            assert set(src.pids()) >= {r0.pid, r1.pid}

            r1.send_signal(signal.SIGKILL)  # not reaped yet: a zombie
            e1 = sink.wait_for(lambda d: d.kind == "proc.exit" and d.pid == r1.pid)
            r0.stdin.write(b"\n")
            r0.stdin.flush()
            e0 = sink.wait_for(lambda d: d.kind == "proc.exit" and d.pid == r0.pid)
    finally:
        reap(r0, r1)
    assert (e1.fields["code"], e1.fields["signal"], e1.rank, e1.job) == (-9, "SIGKILL", 1, job)
    assert e1.message == f"pid {r1.pid} exited: signal 9 (SIGKILL)" and e1.severity == 4
    assert (e0.fields["code"], e0.fields["signal"], e0.severity) == (3, None, 4)
    for e in (e0, e1):  # the pidfd told when
        assert e.occurred_ns is not None and e.fields["last_seen_ns"] <= e.occurred_ns <= e.observed_ns
        assert e.fields["rss_bytes"] > 0 and e.fields["uptime_s"] > 0


@pytest.mark.root
def test_a_rank_that_reuses_the_pid_of_a_process_found_not_a_rank_is_found(sink, running):
    """Known non-ranks are not read again while their /proc/PID inode stays: a new
    process under the same pid (forced through ns_last_pid) must still be read."""
    last_pid = "/proc/sys/kernel/ns_last_pid"
    if not os.access(last_pid, os.W_OK):
        pytest.skip("needs root to choose the next pid (ns_last_pid)")
    src = ProcsSource(interval_s=0.5, young_s=0)
    other = spawn({}, "sleep", "60")
    try:
        with running(src, sink):
            deadline = time.monotonic() + 10
            while other.pid not in src._seen and time.monotonic() < deadline:
                time.sleep(0.02)
            assert other.pid in src._seen  # found, not a rank
            time.sleep(0.1)  # just after a poll: the next is ~0.4 s away
            reap(other)
            with open(last_pid, "w") as f:
                f.write(str(other.pid - 1))
            rank = spawn({"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "4"}, "sleep", "60")
            try:
                if rank.pid != other.pid:
                    pytest.skip(f"another process took pid {other.pid} first")
                start = sink.wait_for(lambda d: d.kind == "proc.start" and d.pid == rank.pid)
                assert start.rank == 3
            finally:
                reap(rank)
    finally:
        reap(other)


def test_helpers_of_a_rank_are_not_ranks(sink, running):
    code = "import subprocess, sys, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    rank = spawn({"RANK": "0", "LOCAL_RANK": "0"}, sys.executable, "-c", code,
                 start_new_session=True)
    try:
        with running(ProcsSource(interval_s=0.05), sink):
            sink.wait_for(lambda d: d.kind == "proc.start" and d.pid == rank.pid)
            deadline = time.monotonic() + 5
            while len(psutil.Process(rank.pid).children()) < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            [helper] = psutil.Process(rank.pid).children()
            time.sleep(0.3)
            assert helper.pid not in {d.pid for d in sink.of("proc.start")}
    finally:
        os.killpg(rank.pid, signal.SIGKILL)
        rank.wait()


def test_descendants_of_a_rank_are_helpers_and_count_toward_its_memory(sink, running):
    """A compile or data-loader worker started through an intermediate process (a pool's
    fork server) inherits RANK two levels down: still the rank's helper, not a rank, and
    its RSS counts in the rank's proc.memory."""
    grandchild = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
    code = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grandchild!r}]); "
            "time.sleep(60)")
    rank = spawn({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}, sys.executable, "-c", code,
                 start_new_session=True)
    try:
        with running(ProcsSource(interval_s=0.05, rss_interval_s=0.2), sink):
            sink.wait_for(lambda d: d.kind == "proc.start" and d.pid == rank.pid)
            deadline = time.monotonic() + 10
            while (len(psutil.Process(rank.pid).children(recursive=True)) < 2
                   and time.monotonic() < deadline):
                time.sleep(0.02)
            family = psutil.Process(rank.pid).children(recursive=True)
            assert len(family) == 2
            mem = sink.wait_for(lambda d: d.kind == "proc.memory" and d.pid == rank.pid
                                and d.fields.get("children") == 2)
            assert {d.pid for d in sink.of("proc.start")} & {p.pid for p in family} == set()
    finally:
        os.killpg(rank.pid, signal.SIGKILL)
        rank.wait()
    assert mem.rank == 1 and mem.fields["children_rss_bytes"] > 0 and mem.fields["rss_bytes"] > 0


def test_the_status_of_a_rank_its_parent_reaps_at_once_is_read_as_its_pidfd_fires(sink, running):
    """A launcher polls its workers and reaps one within ~0.1 s: the status is read from the
    zombie when the pidfd fires, long before the next poll (5 s here). (How soon matters under
    load: procs.wait reads it before the poll's scan of /proc; a parent that reaps within
    microseconds still wins, which no test here can pin down.)"""
    rank = spawn({"RANK": "1", "LOCAL_RANK": "1"}, "sh", "-c", "read x; exit 3", stdin=subprocess.PIPE)
    src = ProcsSource(interval_s=5.0)
    if not src.use_pidfd:
        pytest.skip("no pidfd_open here")
    try:
        deadline = time.monotonic() + 10
        while b"RANK=1" not in open(f"/proc/{rank.pid}/environ", "rb").read() and time.monotonic() < deadline:
            time.sleep(0.01)  # exec'd: the first poll finds it
        with running(src, sink):
            sink.wait_for(lambda d: d.kind == "proc.start" and d.pid == rank.pid)
            time.sleep(0.2)  # the source waits on the pidfd now
            rank.stdin.write(b"\n")
            rank.stdin.flush()
            time.sleep(0.1)
            rank.wait()  # reaped: /proc/PID is gone before the next poll
            e = sink.wait_for(lambda d: d.kind == "proc.exit" and d.pid == rank.pid, timeout=15)
    finally:
        reap(rank)
    assert (e.fields["code"], e.fields["signal"]) == (3, None)


def test_an_orphan_rank_exit_is_recorded(sink, running):
    """A rank whose parent is gone is reaped by init: the agent still records its exit."""
    out = subprocess.run(["sh", "-c", "RANK=4 LOCAL_RANK=0 sleep 60 >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]})
    pid = int(out.stdout)
    try:
        with running(ProcsSource(interval_s=0.05), sink):
            sink.wait_for(lambda d: d.kind == "proc.start" and d.pid == pid)
            os.kill(pid, signal.SIGKILL)
            e = sink.wait_for(lambda d: d.kind == "proc.exit" and d.pid == pid)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert e.rank == 4 and e.fields.get("code", -9) == -9  # known only if seen as a zombie


# --- all three sources on one real OOM kill ----------------------------------------------------

@needs_v1_memory
@pytest.mark.root
def test_a_rank_killed_by_the_kernel_oom_killer_seen_by_every_source(tmp_path, running):
    cg = V1_MEMORY / f"ff-src-test-{os.getpid()}-e2e"
    cg.mkdir()
    (cg / "memory.limit_in_bytes").write_text("64M")
    code = ("import os, sys\nopen(sys.argv[1], 'w').write(str(os.getpid()))\nsys.stdin.readline()\n"
            "b = []\nwhile True:\n    b.append(b'\\x01' * (1 << 20))\n")
    rank = spawn({"RANK": "1", "LOCAL_RANK": "1", "SLURM_JOB_ID": "4242"},
                 sys.executable, "-c", code, str(cg / "cgroup.procs"), stdin=subprocess.PIPE)
    sink = Sink()
    try:
        while str(rank.pid) not in (cg / "cgroup.procs").read_text().split():
            time.sleep(0.01)
        procs = ProcsSource(interval_s=0.05)
        with running(procs, sink), running(CgroupSource(pids=procs.pids, interval_s=30), sink), \
                running(KmsgSource(state_dir=str(tmp_path)), sink):
            start = sink.wait_for(lambda d: d.kind == "proc.start" and d.pid == rank.pid)
            sink.wait_for(lambda d: d.kind == "cgroup.memory" and d.fields["cgroup"] == f"/{cg.name}")
            rank.stdin.write(b"go\n")
            rank.stdin.flush()
            oom = sink.wait_for(lambda d: d.kind == "cgroup.oom")
            exit_ = sink.wait_for(lambda d: d.kind == "proc.exit" and d.pid == rank.pid)
            kill = sink.wait_for(lambda d: d.kind == "kernel.line" and d.message.startswith(
                f"Memory cgroup out of memory: Killed process {rank.pid} "))
    finally:
        reap(rank)
        remove_cgroup(cg)
    assert (start.job, start.rank, start.fields["cgroup"]) == ("4242", 1, f"/{cg.name}")
    assert oom.fields["cgroup"] == start.fields["cgroup"] and oom.fields["oom_kill"] == 1
    assert exit_.fields.get("code", -9) == -9 and exit_.fields["peak_rss_bytes"] > 0
    assert kill.severity == 3 and kill.fields["facility"] == 0  # the kernel's own line
    # the clocks agree: the kernel's kill time lies between the OOM notification and the exit
    assert oom.occurred_ns - 10**8 <= kill.occurred_ns <= exit_.observed_ns + kill.fields["clock_error_ns"]
