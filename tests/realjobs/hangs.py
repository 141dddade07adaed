"""Real hung jobs with the agent running: stacks captured before torchrun kills the job.

    python tests/realjobs/hangs.py --list
    python tests/realjobs/hangs.py agent-hang-rank1-of-2 /tmp/out

Each scenario starts a collector (SQLite) and an agent on this machine (the real
daemons, as ``firstfault demo`` does), then runs a real DeepSpeed job under torchrun
(run.py's ``run_scenario``, gloo, timeout ``timeout_s``) in which one rank stops
inside its step. The agent follows the job's ``--log-dir`` (ranklog), its processes
(procs), takes every rank's stacks with py-spy when the job's logs stall for
``STALL_S`` (the stacks source; below the gloo timeout, so every rank still lives) and
ships the Flight Recorder dumps the ranks write (``TORCH_FR_BUFFER_SIZE``; train.py
writes torch's dump when a collective raises or on SIGTERM, as NCCL's dump-on-timeout
does). Ranks also dump their stacks with faulthandler on torchrun's SIGTERM
(``--faulthandler``), which ranklog ships as rank.stacks too.

The folder afterwards: ``job/`` (run.py's scenario folder), ``fr/`` (the dumps),
``agent.log``, ``collector.log``, ``firstfault.db``, ``report.json`` (``firstfault report
JOB --format json`` from the collector's API), ``timeline.jsonl`` (every record of the
job), ``hang.json`` (what the test checks: job id, expected rank and phase).
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from firstfault.common.layouts import parse_log_path
from firstfault.demo import Daemon

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("firstfault_realjobs_run", HERE / "run.py")
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)

STALL_S = 4.0  # the agent's stacks.stall_s: well below the gloo timeout
TIMEOUT_S = 15.0  # gloo timeout of the world group (train.py --timeout)


def _hang(name, nproc, fail, rank, phase, truth, category="unknown", save=False):
    return run.Scenario(name, "torchrun", nproc, fail, rank, 3, steps=5, save=save, save_every=3, timeout_s=TIMEOUT_S,
                        train_extra=("--faulthandler",),
                        expected=dict(rank=rank, phase=phase, category=category, inferred=True), truth=truth)


HANGS = {s.name: s for s in [
    _hang("agent-hang-rank1-of-2", 2, "hang", 1, "data",
          "Rank 1's data loader blocks at step 3; rank 0 waits in the loss all_reduce until gloo's timeout."),
    _hang("agent-sleep-rank2-of-4", 4, "sleep", 2, "forward",
          "Rank 2 sleeps inside its model's forward at step 3; ranks 0, 1, 3 wait in the loss all_reduce."),
    _hang("agent-branch-rank1-of-4", 4, "branch", 1, "forward",
          "In its forward at step 3 rank 1 calls broadcast; ranks 0, 2, 3 call the loss all_reduce: every rank "
          "waits in a different collective until gloo's timeout."),
    _hang("agent-stall-in-save-rank1-of-2", 2, "stall-in-save", 1, "checkpoint-save",
          "Rank 1's write of its optimizer shard never returns in the save of step 3; rank 0 waits in the save's "
          "closing barrier until gloo's timeout.", category="storage", save=True),
]}


def _firstfault(*args, **kw):
    return subprocess.run([sys.executable, "-m", "firstfault", *args], capture_output=True, text=True,
                          timeout=120, **kw)


def run_with_agent(name, out, *, timeout_s=300):
    """Run hang scenario ``name`` into the fresh folder ``out`` with a collector and an agent."""
    sc = HANGS[name]
    doc = agent_around(Path(out), lambda env: run.run_scenario(sc, Path(out) / "job", timeout_s=timeout_s, env=env))
    info = {"name": sc.name, "job": doc["job"], "world_size": sc.nproc, "expected": sc.expected, "truth": sc.truth,
            "stall_s": STALL_S, "timeout_s": TIMEOUT_S, "run": doc["result"], "scenario": dataclasses.asdict(sc)}
    (Path(out) / "hang.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def agent_around(out, job, *, env_more=None):
    """A collector and an agent around ``job(env)`` (which runs a torchrun job into
    ``out/job`` with ``--log-dir logs`` and returns a dict); then report.json and
    timeline.jsonl of the job. Returns job's dict with ``job`` (the run id) added."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "fr").mkdir()
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "256", "TORCH_FR_DUMP_TEMP_FILE": str(out / "fr" / "rank_"),
           "PYTHONUNBUFFERED": "1", **(env_more or {})}
    started = []
    try:
        col = Daemon("collector", ["collector", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                                   "--db", str(out / "firstfault.db")], out / "collector.log",
                     r"(?:ingest listening address=(?P<ingest>\S+))|(?:http listening address=(?P<http>\S+))")
        started.append(col)
        addr = col.wait_ready()
        agent = Daemon("agent", [
            "agent", "--collector", addr["ingest"], "--node", socket.gethostname(), "--state-dir",
            str(out / "agent"), "--metrics", "", "--ranklog-dirs", str(out / "job" / "logs"),
            "--ranklog-safety-poll-s", "0.5", "--procs-interval-s", "0.25", "--stacks-stall-s", str(STALL_S),
            "--stacks-min-interval-s", "0", "--stacks-max-captures-per-job", "10",
            "--flightrec-interval-s", "0.5", "--flightrec-settle-s", "0.5", "--kmsg-enabled", "false",
            "--cgroup-enabled", "false", "--marks-enabled", "false", "--nvml-enabled", "false",
        ], out / "agent.log", r"agent started (?P<started>node)=")
        started.append(agent)
        agent.wait_ready()
        doc = job(env)
        time.sleep(3)  # the last lines, the exits and the dumps (settle 0.5 s, polls 0.5 s) reach the spool
        agent.stop()
        # the job as ranklog names it: torchrun's run id, the run folder's name (other jobs may run here)
        doc["job"] = parse_log_path(str(next((out / "job" / "logs").glob("*/attempt_0/0/stderr.log")))).run_id
        url = f"http://{addr['http']}"
        (out / "report.json").write_text(_firstfault("report", doc["job"], "--collector", url, "--format", "json").stdout)
        tl = _firstfault("timeline", doc["job"], "--collector", url, "--format", "jsonl")
        (out / "timeline.jsonl").write_text(tl.stdout)
    finally:
        for d in reversed(started):
            d.stop()
    return doc


def main(argv=None):
    p = argparse.ArgumentParser(description="Run a real hung job with the agent running.")
    p.add_argument("name", nargs="?")
    p.add_argument("out", nargs="?")
    p.add_argument("--list", action="store_true")
    a = p.parse_args(argv)
    if a.list or not (a.name and a.out):
        for sc in HANGS.values():
            print(f"{sc.name:28s} {sc.truth}")
        return 0
    info = run_with_agent(a.name, a.out)
    print(f"{a.name}: job {info['job']}, launcher exit {info['run']['launcher_exit_code']} -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
