"""`firstfault analyze` on the other real captures (tests/data/formats, see its README)."""

import json
from pathlib import Path

import pytest

from firstfault.cli import main

FORMATS = Path(__file__).resolve().parents[1] / "data" / "formats"


def analyze(capsys, *names: str) -> dict:
    assert main(["analyze", *(str(FORMATS / n) for n in names), "--format", "json", "--tz", "UTC"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("names,rank,signature,category,phase", [
    (["srun-label-ddp-rank2-exception.log"], 2, "python.exception", "user-code", "unknown"),
    (["srun-label-kill-on-bad-exit.log"], 2, "python.exception", "user-code", "unknown"),
    (["hf-trainer-torchrun-ddp-rank1-exception.log"], 1, "python.exception", "user-code", "forward"),
    (["deepspeed-fp16-loss-scale-at-minimum.log"], None, "deepspeed.fp16_loss_scale_min", "numerics", "optimizer-step"),
    (["deepspeed-zero2-rank1-exception.log"], 1, "python.exception", "user-code", None),
    (["torchrun-2node-failing-node.log", "torchrun-2node-peer-node.log"], 2, "python.exception", "user-code", None),
    (["hf-trainer-nan-loss.log"], None, "numerics.nan_loss", "numerics", None),
    (["torch-cpu-alloc-not-enough-memory.log"], None, "torch.cpu_alloc_failed", "host-memory", None),
    (["faulthandler-segfault.log"], None, "python.fatal_error", None, None),
    (["rich-traceback-nocolor.log"], None, "python.exception", "user-code", None),
    (["rich-traceback-ansi.log"], None, "python.exception", "user-code", None),
    (["py311-exception-group-taskgroup.log"], None, "python.exception", "user-code", None),
])
def test_first_failure(capsys, names, rank, signature, category, phase):
    ff = analyze(capsys, *names)["first_failure"]
    assert ff["signature"] == signature
    if rank is not None:
        assert ff["rank"] == rank
    if category is not None:
        assert ff["category"] == category
    if phase is not None:
        assert ff["phase"] == phase


def test_srun_labels_name_every_rank(capsys):
    rep = analyze(capsys, "srun-label-ddp-rank2-exception.log")
    assert sorted(rep["ranks"]) == ["0", "1", "2", "3"]
    assert {rep["ranks"][r]["first_error"]["role"] for r in ("0", "1", "3")} == {"cascade"}


def test_peer_node_alone_is_a_hang_without_a_culprit(capsys):
    ff = analyze(capsys, "torchrun-2node-peer-node.log")["first_failure"]
    assert ff["inferred"] and ff["rank"] is None and ff["confidence"] == "low"


def test_hung_rank_found_by_silence_then_by_its_stack(capsys):
    ff = analyze(capsys, "torchrun-gloo-timeout-hung-rank.log")["first_failure"]
    assert ff["inferred"] and ff["rank"] == 1 and "no error of its own" in ff["inferred_from"][0]
    ff = analyze(capsys, "torchrun-gloo-timeout-hung-rank.log", "py-spy-dump-hung-rank.log")["first_failure"]
    assert ff["rank"] == 1 and "load_next_batch" in ff["inferred_from"][0]


def test_healthy_run_has_no_failure(capsys):
    rep = analyze(capsys, "deepspeed-zero3-bf16-ok.log")
    assert rep["first_failure"] is None and rep["distinct_failures"] == []
