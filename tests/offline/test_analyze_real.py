"""`firstfault analyze` on the logs of real failed jobs (tests/data/real, see its README).

Each folder holds what a real DeepSpeed run on this kind of machine left behind and a
scenario.json with the truth of what was injected. The report must name the rank,
category, phase, blame and checkpoint verdict that the truth implies.
"""

import json
import os
from pathlib import Path

import pytest

from firstfault.cli import main

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
SCENARIOS = sorted(p.name for p in REAL.iterdir() if (p / "scenario.json").exists())


def analyze(folder: Path, capsys, *extra: str) -> dict:
    args = ["analyze", str(folder), *extra, "--format", "json", "--tz", "UTC"]
    if (folder / "checkpoints").is_dir():
        args += ["--checkpoint-dir", str(folder / "checkpoints")]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", SCENARIOS)
def test_report_names_the_truth(name, capsys):
    folder = REAL / name
    truth = json.loads((folder / "scenario.json").read_text())
    exp = truth["expected"]
    rep = analyze(folder, capsys)
    assert rep["schema"] == "firstfault.report/1"
    ck = rep["checkpoint"]
    assert (ck["verdict"], ck["resume_from"]) == (exp["checkpoint_verdict"], exp["checkpoint_resume_from"])
    ff = rep["first_failure"]
    if exp.get("failed") is False:
        assert ff is None and rep["blame"] == "unknown"
        return
    assert ff is not None
    if exp.get("rank") is not None:
        assert ff["rank"] == exp["rank"]
    if exp.get("ranks_sharing"):
        assert ff["ranks_sharing"] == exp["ranks_sharing"]
    assert ff["category"] == exp["category"]
    assert rep["blame"] == exp["blame"]
    assert ff["phase"] == (exp.get("phase") or "unknown")  # the hang's truth is no phase: the logs show none
    if exp.get("signal"):
        assert rep["ranks"][str(exp["rank"])]["exit"]["signal"] == exp["signal"]
    if exp.get("incomplete_tag"):
        tag = next(t for t in ck["tags"] if t["tag"] == exp["incomplete_tag"])
        assert tag["verdict"] == "unsafe" and tag["problems"]
    # every rank of the job appears, survivors with their cascade
    assert sorted(map(int, rep["ranks"])) == list(range(truth["world_size"]))


def test_oom_kill_linked_by_pid_and_cascades_do_not_win(capsys):
    rep = analyze(REAL / "torchrun-oom-rank1-of-2", capsys)
    ff = rep["first_failure"]
    assert ff["signature"] == "kernel.memcg_oom_kill" and ff["confidence"] == "high"
    assert "pid" in ff["evidence"][0]["linked_by"]
    assert rep["ranks"]["0"]["first_error"]["role"] == "cascade"
    assert [d["signature"] for d in rep["distinct_failures"]] == ["kernel.memcg_oom_kill"]


def test_without_kernel_log_a_sigkill_is_named_but_not_blamed_on_memory(capsys):
    src = REAL / "torchrun-oom-rank1-of-2"
    rep = analyze(src / "logs", capsys, str(src / "launcher.log"))
    ff = rep["first_failure"]
    assert ff["rank"] == 1 and ff["signature"] == "torchelastic.worker_sigkill"
    assert ff["category"] == "unknown" and "kernel" in ff["summary"]


def test_hang_is_inferred_and_says_how(capsys):
    rep = analyze(REAL / "torchrun-hang-rank1-of-2", capsys)
    ff = rep["first_failure"]
    assert ff["inferred"] is True and ff["rank"] == 1
    assert ff["signature"] == "hang.stopped_first"
    assert any("no error of its own" in how for how in ff["inferred_from"])


def test_context_from_deepspeed_logs(capsys):
    rep = analyze(REAL / "deepspeed-exception-rank2-of-4", capsys)
    ctx = rep["context"]
    assert ctx["launcher"] == "deepspeed" and ctx["world_size"] == 4
    assert (ctx["zero_stage"], ctx["precision"], ctx["offload_optimizer"], ctx["offload_param"]) == (2, "fp32", None, None)
    assert (ctx["gradient_accumulation_steps"], ctx["train_micro_batch_size_per_gpu"]) == (1, 8)
    assert "deepspeed.launcher.launch" in ctx["launch_command"]
    assert ctx["versions"]["python"] == "3.11"
    # DeepSpeed 0.19.8 on this machine printed no version line into these logs: the report says so
    assert ctx["versions"]["deepspeed"] is None and "deepspeed version" in ctx["missing"]


def test_pasted_interleaved_log_on_stdin(monkeypatch, capsys):
    import io
    import sys

    data = (REAL / "torchrun-pasted-exception-rank2-of-4" / "launcher.log").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["analyze", "-", "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["first_failure"]["rank"] == 2
    assert os.environ.get("NO_SUCH") is None
