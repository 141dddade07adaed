"""`firstfault analyze` on the other real captures (tests/data/formats, see its README)."""

import json
from pathlib import Path

import pytest

from firstfault.cli import main

FORMATS = Path(__file__).resolve().parents[1] / "data" / "formats"


def analyze(capsys, *names: str) -> dict:
    assert main(["analyze", *(str(FORMATS / n) for n in names), "--format", "json", "--tz", "UTC"]) == 0
    return json.loads(capsys.readouterr().out)


EXPECTED = json.loads((FORMATS / "expected.json").read_text())  # the truth of each failing capture (README)


@pytest.mark.parametrize("case", EXPECTED, ids=["+".join(c["files"]) for c in EXPECTED])
def test_first_failure(capsys, case):
    ff = analyze(capsys, *case["files"])["first_failure"]
    assert ff["signature"] == case["signature"]
    for key in ("rank", "category", "phase"):  # null: not asserted
        if case[key] is not None:
            assert ff[key] == case[key], key


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
