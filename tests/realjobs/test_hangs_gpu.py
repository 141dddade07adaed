"""The NCCL side of hang capture, on a machine with at least two GPUs (marked gpu).

What the CPU runs here cannot show: NCCL's watchdog line (``Watchdog caught collective
operation timeout``) triggering the agent's capture, and the Flight Recorder dumps NCCL
writes by itself on a timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``) picked up from the ranks'
environment and read (``nccl:all_reduce`` entries).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from firstfault.agent.sources.stacks import find_py_spy
from tests.realjobs import hangs

HERE = Path(__file__).resolve().parent


def _gpus() -> int:
    if importlib.util.find_spec("torch") is None:
        return 0
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                       capture_output=True, text=True)
    return int(r.stdout.strip() or 0) if r.returncode == 0 else 0


pytestmark = [pytest.mark.gpu, pytest.mark.realjob,
              pytest.mark.skipif(not find_py_spy() or os.geteuid() != 0, reason="needs py-spy and root")]


def test_nccl_hang_is_captured_and_its_own_dumps_name_the_rank(tmp_path):
    if _gpus() < 2:
        pytest.skip("needs two GPUs (one per NCCL rank)")
    out = tmp_path / "nccl"

    def job(env):
        (out / "job").mkdir()
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2", "--log-dir",
               "logs", "--redirects", "3", "--tee", "3", str(HERE / "nccl_hang.py")]
        r = subprocess.run(cmd, cwd=out / "job", env=env, capture_output=True, timeout=300)
        return {"result": {"launcher_exit_code": r.returncode}}

    doc = hangs.agent_around(out, job, env_more={"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_BUFFER_SIZE": "2000"})
    records = [json.loads(ln) for ln in (out / "timeline.jsonl").read_text().splitlines() if ln.strip()]
    rep = json.loads((out / "report.json").read_text())
    assert doc["result"]["launcher_exit_code"] != 0
    assert any("Watchdog caught collective operation timeout" in r["message"] for r in records)
    spy = [r for r in records if r["kind"] == "rank.stacks" and r["source"] == "stacks"]
    assert {r["rank"] for r in spy} == {0, 1}
    fr = [r for r in records if r["kind"] == "rank.flight_recorder"]
    assert {r["rank"] for r in fr} >= {0} and all("nccl:" in r["message"] for r in fr)
    assert rep["first_failure"]["rank"] == 1 and rep["first_failure"]["phase"] == "forward"
    assert rep["flight_recorder"]["culprits"] == [1]
