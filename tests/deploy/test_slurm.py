"""deploy/slurm: the Prolog and Epilog write job marks through `firstfault mark`, run as slurmd
runs them (no PATH, Slurm's variables), and exit 0 whatever goes wrong."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from firstfault.agent.sources.marks import marks_dir, parse_mark

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "deploy" / "slurm"


def _firstfault(tmp_path: Path) -> Path:
    """A `firstfault` command running this tree."""
    exe = tmp_path / "firstfault"
    exe.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m firstfault.cli \"$@\"\n")
    exe.chmod(0o755)
    return exe


def _run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    # slurmd sets no PATH; /usr/bin/env -i keeps ours out
    return subprocess.run(["/usr/bin/env", "-i", *[f"{k}={v}" for k, v in env.items()],
                           str(SLURM / script)], capture_output=True, text=True, timeout=60)


def _marks(state: Path) -> list:
    d = marks_dir(str(state))
    return [parse_mark(open(os.path.join(d, n), "rb").read()) for n in sorted(os.listdir(d))]


def test_prolog_and_epilog_mark_the_job_with_its_node_list(tmp_path):
    env = {"FIRSTFAULT": str(_firstfault(tmp_path)), "FIRSTFAULT_STATE_DIR": str(tmp_path / "state"),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu-[01-04]", "SLURM_JOB_USER": "alice",
           "SLURMD_NODENAME": "gpu-02", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
    r = _run("prolog.sh", env)
    assert (r.returncode, r.stderr) == (0, "")
    r = _run("epilog.sh", {**env, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "SLURM_STEP_ID": "0"})
    assert (r.returncode, r.stderr) == (0, "")
    assert [(m.event, m.job, m.step, m.nodes) for m in _marks(tmp_path / "state")] == [
        ("start", "4242", None, "gpu-[01-04]"), ("end", "4242", "0", "gpu-[01-04]")]


def test_problems_are_logged_and_never_fail_the_job(tmp_path):
    state = tmp_path / "state"
    base = {"FIRSTFAULT": str(_firstfault(tmp_path)), "FIRSTFAULT_STATE_DIR": str(state)}
    r = _run("prolog.sh", base)
    assert r.returncode == 0
    assert "start: SLURM_JOB_ID is not set; no mark written" in r.stderr
    r = _run("epilog.sh", {**base, "SLURM_JOB_ID": "has space"})
    assert r.returncode == 0
    assert "job has space end: firstfault mark failed (exit 2): firstfault mark: job 'has space'" in r.stderr
    r = _run("prolog.sh", {**base, "FIRSTFAULT": str(tmp_path / "missing"), "SLURM_JOB_ID": "1"})
    assert r.returncode == 0
    assert "job 1 start: firstfault mark failed (exit 127)" in r.stderr
    assert not state.exists() or os.listdir(marks_dir(str(state))) == []
