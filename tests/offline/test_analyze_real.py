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


def analyze(folder: Path, capsys, *extra: str, logs_only: bool = False) -> dict:
    """`firstfault analyze` on a capture: the folder (per-node folders as NODE=DIR, as the scenario
    says), with its checkpoint folder checked on disk unless ``logs_only``."""
    scen = folder / "scenario.json"
    paths = json.loads(scen.read_text()).get("analyze_paths", ["."]) if scen.exists() else ["."]
    paths = [str(folder) if p == "." else p.split("=", 1)[0] + "=" + str(folder / p.split("=", 1)[1])
             for p in paths]
    args = ["analyze", *paths, *extra, "--format", "json", "--tz", "UTC"]
    if (folder / "checkpoints").is_dir() and not logs_only:
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
    if exp.get("node"):
        assert ff["node"] == exp["node"] and rep["ranks"][str(exp["rank"])]["node"] == exp["node"]
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


@pytest.mark.parametrize("name", [n for n in SCENARIOS
                                  if "logs_only" in json.loads((REAL / n / "scenario.json").read_text())["expected"]])
def test_the_logs_alone_prove_what_they_can_of_the_checkpoint(name, capsys):
    """No checkpoint folder given: the verdict and resume point the logs prove (scenario.json
    expected.logs_only), never a resume point the disk would refute."""
    want = json.loads((REAL / name / "scenario.json").read_text())["expected"]["logs_only"]
    ck = analyze(REAL / name, capsys, logs_only=True)["checkpoint"]
    assert (ck["verdict"], ck["resume_from"]) == (want["checkpoint_verdict"], want["checkpoint_resume_from"])


def test_oom_kill_linked_by_pid_and_cascades_do_not_win(capsys):
    rep = analyze(REAL / "torchrun-oom-rank1-of-2", capsys)
    ff = rep["first_failure"]
    assert ff["signature"] == "kernel.memcg_oom_kill" and ff["confidence"] == "high"
    assert "pid" in ff["evidence"][0]["linked_by"]
    assert rep["ranks"]["0"]["first_error"]["role"] == "cascade"
    assert [d["signature"] for d in rep["distinct_failures"]] == ["kernel.memcg_oom_kill"]


def test_without_kernel_log_a_sigkill_is_likely_memory_at_low_confidence(capsys):
    """The OOM run's logs without its kernel log: the SIGKILL is named, host memory is the
    likely cause (the OOM killer is the usual sender), at low confidence, with how to confirm."""
    src = REAL / "torchrun-oom-rank1-of-2"
    rep = analyze(src / "logs", capsys, str(src / "launcher.log"))
    ff = rep["first_failure"]
    assert ff["rank"] == 1 and ff["signature"] == "torchelastic.worker_sigkill"
    assert ff["category"] == "host-memory" and ff["confidence"] == "low"
    assert "dmesg -T" in ff["evidence"][0]["linked_by"] and "kernel" in ff["summary"]


def test_a_sigkill_the_kernel_log_does_not_explain_stays_unknown(capsys):
    """kill-in-save: the node's kernel log covers the kill and holds no OOM kill."""
    rep = analyze(REAL / "torchrun-kill-in-save-rank1-of-2", capsys)
    ff = rep["first_failure"]
    assert ff["rank"] == 1 and ff["category"] == "unknown" and ff["confidence"] == "medium"
    assert "holds no OOM kill" in ff["evidence"][0]["linked_by"]


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


def test_per_node_folders_give_every_rank_its_node(capsys):
    """Two torchrun agents, each folder given as NODE=DIR: rank 2's first error is its error.json
    (whole-second stamp, earlier than its log lines); its rank comes from its worker folder and
    every rank's node from its folder, not from torchrun's "host : localhost"."""
    rep = analyze(REAL / "torchrun-2node-exception-rank2-of-4", capsys)
    assert {r: v["node"] for r, v in rep["ranks"].items()} == {"0": "node0", "1": "node0", "2": "node1", "3": "node1"}
    ff = rep["first_failure"]
    assert (ff["rank"], ff["node"]) == (2, "node1") and ff["evidence"][0]["origin"].endswith("error.json")


def test_per_node_folders_are_nodes_when_the_parent_folder_is_given(tmp_path, capsys):
    """The same two folders under one parent given as it is (no NODE=): local ranks repeat on
    every node, so each folder that holds a torchrun worker layout is a node; rank 2 is found
    on node-b, not taken for local rank 0 of one node."""
    import shutil
    src = REAL / "torchrun-2node-exception-rank2-of-4"
    for folder, node in (("node0", "node-a"), ("node1", "node-b")):
        shutil.copytree(src / folder, tmp_path / node)
    assert main(["analyze", str(tmp_path), "--format", "json", "--tz", "UTC"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert {r: v["node"] for r, v in rep["ranks"].items()} == {"0": "node-a", "1": "node-a", "2": "node-b", "3": "node-b"}
    assert (rep["first_failure"]["rank"], rep["first_failure"]["node"]) == (2, "node-b")


def test_a_job_killed_from_outside_names_the_rank_whose_stack_was_elsewhere(capsys):
    rep = analyze(REAL / "torchrun-sigterm-hang-rank1-of-3", capsys)
    ff = rep["first_failure"]
    assert ff["killed_from_outside"] and ff["inferred"] and ff["rank"] == 1 and ff["phase"] == "data"
    assert ff["phase_from"] == "stack dump" and ff["confidence"] == "medium"
    assert "in __next__" in ff["inferred_from"][0] and "0,2 waited" in ff["inferred_from"][0]
    assert "stopped from outside" in ff["summary"]


def test_an_abort_after_a_collective_timeout_is_a_cascade(capsys):
    """Rank 0 timed out, printed the error and died of SIGABRT (-6): torchrun's Root Cause names it;
    the abort is how a rank is taken down after a timeout, so the silent rank 1 is inferred."""
    rep = analyze(REAL / "torchrun-abort-after-timeout-rank1-of-2", capsys)
    ff = rep["first_failure"]
    assert ff["inferred"] and ff["rank"] == 1 and rep["distinct_failures"] == []
    assert rep["ranks"]["0"]["exit"]["signal"] == "SIGABRT" and rep["ranks"]["0"]["first_error"]["role"] == "cascade"


def test_ranks_that_never_reach_the_collective_are_named(capsys):
    rep = analyze(REAL / "torchrun-never-reach-rank3-of-4", capsys)
    ff = rep["first_failure"]
    assert ff["rank"] == 3 and ff["suspects"] == [3] and "0-2 timed out" in ff["inferred_from"][0]


def test_a_clean_deepspeed_run_proves_its_last_save_from_the_launchers_exit_lines(capsys):
    ck = analyze(REAL / "deepspeed-clean-2", capsys, logs_only=True)["checkpoint"]
    assert (ck["verdict"], ck["resume_from"]) == ("safe", "global_step6")
    assert ck["tags"][0]["evidence"] == "logs" and "all 2 ranks" in ck["reason"]
