"""Real jobs on one shared node under the real agent and collector (``firstfault agent`` and
``firstfault collector`` as processes): each job's report holds its own ranks, exits, world
size and events only.

One agent watches, at once: a torchrun job (rank 1 raises ValueError at step 5), a DeepSpeed
job (a Slurm-like job id; it saves global_step2 and global_step4, then rank 1 raises at step 5),
an unrelated process with ``RANK=0 WORLD_SIZE=8`` in its environment, and a process outside both
jobs that the kernel's memcg OOM killer ends while they run. Then a DeepSpeed job whose rank 1
calls ``os.abort()`` (no traceback, no faulthandler): the failure, not a hang. And a clean torchrun
job that saves its final tag, with the agent's checkpoint inspection off: the ranks' own exits 0
after the save began make the final tag the resume point (torchrun logs nothing of a clean exit).

Needs root (the memory cgroup, /dev/kmsg) and torch + deepspeed; about a minute of two cores.
Run alone: ``pytest -m realjob tests/realjobs/test_live_node.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from firstfault.cli import main
from firstfault.common.layouts import parse_log_path
from firstfault.demo import Daemon
from tests.realjobs import run
from tests.realjobs.test_realjobs import HAVE_STACK

pytestmark = [
    pytest.mark.realjob, pytest.mark.root,
    pytest.mark.skipif(not HAVE_STACK, reason="needs torch and deepspeed (pip install -e '.[realjobs]')"),
    pytest.mark.skipif(os.geteuid() != 0 or not os.access(run.CGROUP_V1_MEMORY, os.W_OK),
                       reason="needs root and cgroup v1's memory controller (the OOM kill outside the jobs)"),
]

TORCHRUN = run.SCENARIOS["torchrun-exception-rank1-of-2"]
DEEPSPEED = run.Scenario("live-deepspeed-exception-rank1-of-2", "deepspeed", 2, "exception", 1, 5)
ABORT = run.Scenario("live-deepspeed-abort-rank1-of-2", "deepspeed", 2, "abort", 1, 3, save=False)
CLEAN = run.SCENARIOS["torchrun-clean-2"]
HOG = ("import os, sys\nwith open(sys.argv[1] + '/cgroup.procs', 'w') as f:\n    f.write(str(os.getpid()))\n"
       "hog = []\nwhile True:\n    hog.append(bytearray(8 << 20))\n")


class Node:
    """A collector and an agent on this host, the agent following the jobs under ``root``."""

    def __init__(self, root: Path, *more: str) -> None:
        self.root = root
        (root / "tr").mkdir()
        cfg = root / "agent.toml"
        cfg.write_text(
            "[sources.ranklog]\n"
            f"dirs = [{json.dumps(str(root / 'tr' / 'run' / 'logs'))}]\n"  # torchrun's layout: the job is its run id
            f"globs = [{json.dumps(str(root / '{job}' / 'logs' / '*_rank{rank}.log'))}]\n"
            "[sources.stacks]\nenabled = false\n")
        self.col = Daemon("collector", ["collector", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                                        "--db", str(root / "ff.db")], root / "collector.log",
                          r"(?:ingest listening address=(?P<ingest>\S+))|(?:http listening address=(?P<http>\S+))")
        addr = self.col.wait_ready()
        self.url = f"http://{addr['http']}"
        self.agent = Daemon("agent", ["agent", "--config", str(cfg), "--collector", addr["ingest"], "--node", "live",
                                      "--state-dir", str(root / "agent"), "--metrics", "", "--procs-interval-s", "0.25",
                                      "--checkpoints-settle-s", "1", *more],
                            root / "agent.log", r"agent started (?P<started>node)=")
        self.agent.wait_ready()

    def flush(self) -> None:
        time.sleep(5)  # the procs poll sees the exits, the checkpoints source inspects after settle_s
        assert self.agent.stop() == 0, (self.root / "agent.log").read_text()[-3000:]

    def report(self, job: str, capsys) -> dict:
        assert main(["report", job, "--collector", self.url, "--format", "json"]) == 0
        return json.loads(capsys.readouterr().out)

    def timeline(self, job: str, capsys, *more: str) -> list[dict]:
        assert main(["timeline", job, "--collector", self.url, "--format", "jsonl", *more]) == 0
        return [json.loads(x) for x in capsys.readouterr().out.splitlines()]

    def close(self) -> None:
        self.agent.stop()
        self.col.stop()


def _wait_for(paths_glob: str, root: Path, text: bytes, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(text in p.read_bytes() for p in root.glob(paths_glob)):
            return True
        time.sleep(0.5)
    return False


def _oom_outside_the_jobs(root: Path) -> dict:
    cg = run.capture.make_cgroup(64 << 20)
    try:
        p = subprocess.run([sys.executable, "-c", HOG, str(cg)], timeout=120, capture_output=True)
        return {"returncode": p.returncode, **run.capture.close_cgroup(cg)}
    except BaseException:
        run.capture.close_cgroup(cg)
        raise


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    root = tmp_path_factory.mktemp("live")
    run.ensure_comm_op()
    ds_job = f"live-ds-{os.getpid()}"
    node = Node(root)
    stray = subprocess.Popen(["sleep", "20"], env={"PATH": os.environ["PATH"], "RANK": "0", "LOCAL_RANK": "0",
                                                   "WORLD_SIZE": "8"})
    done: dict = {}

    def job(name, sc, out, env):
        done[name] = run.run_scenario(sc, out, timeout_s=300, env=env)

    threads = [threading.Thread(target=job, args=("tr", TORCHRUN, root / "tr" / "run", None)),
               threading.Thread(target=job, args=("ds", DEEPSPEED, root / ds_job, {**os.environ, "SLURM_JOB_ID": ds_job}))]
    try:
        for t in threads:
            t.start()
        # both jobs' ranks are up (their lives overlap from here until the torchrun job fails at step 5)
        both = (_wait_for("tr/run/logs/*/attempt_0/0/stdout.log", root, b"", 240)
                and _wait_for(f"{ds_job}/logs/*_rank0.log", root, b"", 240))
        oom = _oom_outside_the_jobs(root) if both else None
        for t in threads:
            t.join(360)
        stray.wait(30)
        node.flush()
        yield node, ds_job, done, oom
    finally:
        if stray.poll() is None:
            stray.kill()
        node.close()


def _tr_job(node: Node, capsys) -> str:
    """The torchrun job's id: its run id, the name of its log folder less mkdtemp's suffix (other
    processes on this shared machine, e.g. a `firstfault demo`, may be jobs of the collector too)."""
    [folder] = (node.root / "tr" / "run" / "logs").iterdir()
    job = parse_log_path(str(folder / "attempt_0" / "0" / "stdout.log")).run_id  # as the agent reads it
    assert main(["jobs", "--collector", node.url, "--format", "json"]) == 0
    assert job in [j["job"] for j in json.loads(capsys.readouterr().out)["jobs"]]
    return job


def _why(rep: dict, folder: Path) -> str:
    """What a report rests on, for a failing assertion: its first failure's evidence, the ranks'
    exits and the checkpoint's reasons; and the end of the job's launcher log (``folder``), which
    tells a job that hung (killed at the runner's timeout) from one that failed."""
    keep = {"first_failure": rep.get("first_failure"), "exits": {r: v.get("exit") for r, v in rep.get("ranks", {}).items()},
            "checkpoint": rep.get("checkpoint"), "node_context": rep.get("node_context")}
    launcher = folder / "launcher.log"
    tail = launcher.read_text(errors="replace")[-3000:] if launcher.exists() else "(no launcher.log)"
    return json.dumps(keep, indent=1, default=str)[:6000] + "\nlauncher.log ends:\n" + tail


def test_the_scene_happened(shared):
    _, _, done, oom = shared
    assert done["tr"]["result"]["launcher_exit_code"] != 0 and done["ds"]["result"]["launcher_exit_code"] != 0
    assert oom is not None and oom["returncode"] == -9 and "oom_kill 1" in oom["memory.oom_control"]


@pytest.mark.parametrize("which", ["tr", "ds"])
def test_each_report_holds_its_own_ranks_exits_world_size_and_events(shared, capsys, which):
    node, ds_job, _, _ = shared
    job = ds_job if which == "ds" else _tr_job(node, capsys)
    folder = node.root / ds_job if which == "ds" else node.root / "tr" / "run"
    rep = node.report(job, capsys)
    ff = rep["first_failure"]
    assert (ff["rank"], ff["category"]) == (1, "user-code"), _why(rep, folder)
    assert ff["failing_frame"]["function"] == "check_features" and ff["failing_frame"]["in_user_code"]
    assert sorted(rep["ranks"]) == ["0", "1"] and rep["context"]["world_size"] == 2
    assert not [g for g in rep["gaps"] if g.get("rank") is not None]  # no phantom ranks of WORLD_SIZE=8
    assert rep["ranks"]["1"]["exit"] == {"code": 1, "signal": None}  # the rank process's own exit
    # Rank 0 is stopped by its launcher, which reaps it at once: the agent (not its parent) reads a
    # status only from a zombie it sees, so rank 0's may be unknown; never the other process's exit 0.
    assert (rep["ranks"]["0"]["exit"] or {}).get("code") != 0
    every = json.dumps({k: rep[k] for k in ("first_failure", "distinct_failures", "ranks")})
    assert "Killed process" not in every and "oom-kill" not in every
    assert any("Killed process" in e["text"] for e in rep["node_context"]["events"])
    own = node.timeline(job, capsys)
    assert own and all(r["job"] == job for r in own if r["source"] not in ("kmsg", "cgroup"))
    assert not [r for r in own if r["source"] == "kmsg" and "Killed process" in r["message"]]
    assert not [r for r in own if r["source"] == "procs" and r["fields"].get("world_size") == "8"]
    with_ctx = node.timeline(job, capsys, "--node-context")
    assert any(r.get("node_context") and "Killed process" in r["message"] for r in with_ctx)


def test_the_deepspeed_jobs_checkpoint_is_checked_on_disk_over_the_collector(shared, capsys):
    node, ds_job, _, _ = shared
    rep = node.report(ds_job, capsys)
    ck = rep["checkpoint"]
    assert (ck["verdict"], ck["resume_from"]) == ("safe", "global_step4"), _why(rep, node.root / ds_job)
    assert ck["disk_path"] == str(node.root / ds_job / "checkpoints")
    offline = subprocess.run([sys.executable, "-m", "firstfault", "checkpoint", str(node.root / ds_job / "checkpoints"),
                              "--format", "json"], capture_output=True, text=True)
    assert json.loads(offline.stdout)["verdict"] == "safe"


def test_a_rank_that_aborts_is_the_failure_not_a_hang(tmp_path_factory, capsys):
    root = tmp_path_factory.mktemp("abort")
    run.ensure_comm_op()
    job = f"live-abort-{os.getpid()}"
    node = Node(root)
    try:
        doc = run.run_scenario(ABORT, root / job, timeout_s=300, env={**os.environ, "SLURM_JOB_ID": job})
        assert doc["result"]["launcher_exit_code"] != 0
        node.flush()
        rep = node.report(job, capsys)
    finally:
        node.close()
    ff = rep["first_failure"]
    assert (ff["rank"], ff["inferred"]) == (1, False) and "SIGABRT" in ff["summary"]
    assert ff["signature"] != "hang.stopped_first"
    assert rep["ranks"]["1"]["exit"] == {"code": -6, "signal": "SIGABRT"}


def test_a_clean_runs_final_save_is_the_resume_point_from_the_logs_and_exits(tmp_path_factory, capsys):
    root = tmp_path_factory.mktemp("clean")
    run.ensure_comm_op()
    node = Node(root, "--checkpoints-enabled", "false")  # no disk: the logs and the agent's exits decide
    try:
        doc = run.run_scenario(CLEAN, root / "tr" / "run", timeout_s=300)
        assert doc["result"]["launcher_exit_code"] == 0
        node.flush()
        job = _tr_job(node, capsys)
        rep = node.report(job, capsys)
    finally:
        node.close()
    assert rep["first_failure"] is None
    assert {r: v["exit"] for r, v in rep["ranks"].items()} == {"0": {"code": 0, "signal": None},
                                                                "1": {"code": 0, "signal": None}}
    ck = rep["checkpoint"]
    assert (ck["verdict"], ck["resume_from"], ck["disk_path"]) == ("safe", "global_step6", None)
