"""`firstfault compare` on real runs: a run that failed under ZeRO-3 and four retries
(tests/data/compare, see its README): fixed, not fixed, three changes at once, cancelled early.

Each pair is compared as a user would: both folders with their checkpoint folders. The
verdict each must get is the one tests/realjobs/run.py COMPARISONS names with the runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from firstfault.cli import main
from tests.analysis.shipped import ship_file
from tests.realjobs.run import COMPARISONS

DATA = Path(__file__).resolve().parents[1] / "data" / "compare"
EXIT = {"fixed": 0, "not-fixed": 1, "inconclusive": 3}


def compare(capsys, before: str, after: str, *extra: str, fmt: str = "json") -> tuple[int, str]:
    b, a = DATA / before, DATA / after
    code = main(["compare", str(b), str(a), "--before-checkpoint-dir", str(b / "checkpoints"),
                 "--after-checkpoint-dir", str(a / "checkpoints"), "--format", fmt, "--tz", "UTC", *extra])
    return code, capsys.readouterr().out


def case(capsys, name: str) -> dict:
    before, after, verdict = COMPARISONS[name]
    code, out = compare(capsys, before, after)
    c = json.loads(out)
    assert c["schema"] == "firstfault.compare/1"
    assert (c["verdict"], code) == (verdict, EXIT[verdict])
    return c


def codes(c: dict) -> list[str]:
    return [r["code"] for r in c["reasons"]]


def changed(c: dict) -> dict:
    return {r["field"]: (r["before"], r["after"]) for r in c["changes"]["fields"] if r["status"] == "changed"}


def test_before_is_the_zero3_failure_on_rank_0(capsys):
    c = case(capsys, "fixed")
    init = c["initiating"]
    assert (init["rank"], init["signature"], init["phase"]) == (0, "python.exception", "forward")
    assert "mat2 must be a matrix" in init["summary"]
    assert c["boundary"]["before_last_step"] == 4 and c["boundary"]["failing_step"] == 5


def test_fixed_one_setting_changed_and_a_save_passed(capsys):
    c = case(capsys, "fixed")
    assert codes(c) == ["gone", "boundary-passed", "one-change"]
    assert changed(c) == {"zero_stage": (3, 2)}
    assert all(v["initiating_in_after"] is None and v["in_after"] for v in c["ranks"].values())
    bd = c["boundary"]
    assert (bd["after_last_step"], bd["checkpoint_after"], bd["passed"]) == (6, "global_step6", True)
    assert c["after"]["checkpoint"]["verdict"] == "safe"


def test_not_fixed_the_same_failure_came_back_on_rank_0(capsys):
    c = case(capsys, "not-fixed")
    assert codes(c) == ["came-back"]
    assert changed(c) == {"train_micro_batch_size_per_gpu": (8, 4)}
    assert c["ranks"]["0"]["initiating_in_after"] == "same-fingerprint"
    assert c["ranks"]["1"]["initiating_in_after"] is None  # rank 1 only lost its peer, in both runs
    assert c["after"]["first_failure"]["fingerprint"] == c["initiating"]["fingerprint"]


def test_three_changes_at_once_is_inconclusive_although_it_passed(capsys):
    c = case(capsys, "three-changes")
    assert codes(c) == ["too-many-changes", "gone", "boundary-passed"]
    assert changed(c) == {"zero_stage": (3, 2), "precision": ("fp32", "bf16"), "train_micro_batch_size_per_gpu": (8, 4)}
    assert c["boundary"]["passed"] is True and c["came_back"] is False


def test_cancelled_before_the_failing_step_is_inconclusive(capsys):
    c = case(capsys, "stopped-early")
    scenario = json.loads((DATA / COMPARISONS["stopped-early"][1] / "scenario.json").read_text())
    assert codes(c) == ["stopped-early", "one-change"]
    assert changed(c) == {"zero_stage": (3, 2)}
    bd = c["boundary"]
    assert scenario["result"]["cancelled"]["after_step"] <= bd["after_last_step"] < bd["failing_step"]
    assert bd["checkpoint_after"] is None and bd["passed"] is False


@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_the_launch_commands_differ_only_in_the_master_port(name, capsys):
    c = case(capsys, name)
    row = next(r for r in c["changes"]["fields"] if r["field"] == "launch_command")
    assert row["status"] == "same" and "--ds-config" in row["before"]
    raw = [json.loads((DATA / run / "scenario.json").read_text())["command"] for run in COMPARISONS[name][:2]]
    assert raw[0] != raw[1]  # the ports differ
    port = raw[0].index("--master_port")
    assert raw[0][:port] + raw[0][port + 2:] == raw[1][:port] + raw[1][port + 2:]


@pytest.mark.parametrize("fmt", ["text", "md", "html"])
@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_every_format_states_the_verdict_and_its_reasons(name, fmt, capsys):
    before, after, verdict = COMPARISONS[name]
    code, out = compare(capsys, before, after, fmt=fmt)
    assert code == EXIT[verdict]
    words = {"fixed": "FIXED:", "not-fixed": "NOT FIXED:", "inconclusive": "INCONCLUSIVE:"}[verdict]
    assert words in out
    assert "ZeRO stage" in out and "step 5" in out
    if fmt == "html":
        assert out.startswith("<!doctype html>") and "<script" not in out and "http" not in out


def test_a_side_that_is_a_job_at_the_collector(tmp_path, capsys):
    """BEFORE as the agents would have shipped its rank logs to a collector (its SQLite store)."""
    from firstfault.collector.store.sqlite import SqliteStore
    from firstfault.wire import Record

    before, after, _ = COMPARISONS["fixed"]
    records = []
    for r, p in enumerate(sorted((DATA / before / "logs").glob("*_rank*.log"))):
        records += ship_file(p, "vm", r, len(records))
    records = [Record(**{**{f: getattr(rec, f) for f in rec.__slots__}, "job": "zero3-1"}) for rec in records]
    db = tmp_path / "ff.db"
    with SqliteStore(db) as store:
        store.insert(records)
    a = DATA / after
    args = ["compare", "zero3-1", str(a), "--after-checkpoint-dir", str(a / "checkpoints"), "--db", str(db),
            "--format", "json", "--tz", "UTC"]
    assert main(args) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["verdict"] == "fixed" and c["before"]["source"] == {"job": "zero3-1"}
    assert changed(c) == {"zero_stage": (3, 2)}
    # the rank logs hold no launcher command: only AFTER's launcher.log shows one
    assert "launch_command" in c["changes"]["not_comparable"]
    assert main(["compare", "no-such-job", str(a), "--db", str(db)]) == 2
    assert "no-such-job" in capsys.readouterr().err


def test_usage_errors_exit_2(tmp_path, capsys):
    a = str(DATA / COMPARISONS["fixed"][1])
    assert main(["compare", str(tmp_path / "nothing-here"), a]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty"), a]) == 2
    assert "BEFORE: no log files found" in capsys.readouterr().err
    assert main(["compare", "-", a]) == 2
    assert "no standard input" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["compare", a])
    assert e.value.code == 2
