"""The rules of firstfault/analysis/compare.py, each on a small report of the report contract.

The reports here are built field by field (our own format, REPORT.md); what real runs give is
tested on the captures in tests/offline/test_compare_real.py.
"""

from __future__ import annotations

import copy

from firstfault.analysis.compare import (
    checkpoint_interval,
    compare_reports,
    diff_fields,
    launch_tokens,
)

CONFIG = {"zero_stage": 2, "offload_optimizer": None, "offload_param": None, "offload_optimizer_pin_memory": None,
          "offload_param_pin_memory": None, "precision": "fp32", "gradient_accumulation_steps": 1,
          "train_micro_batch_size_per_gpu": 8}


def report(*, failure: dict | None = None, ranks: dict | None = None, steps: dict | None = None,
           tags: list[tuple[int, str]] = (), context: dict | None = None, distinct: list | None = None) -> dict:
    """A report with what compare reads: the first failure, each rank's first error and last step, the tags."""
    ranks = ranks or {}
    steps = steps or {}
    out_ranks = {}
    for r in sorted(set(ranks) | set(steps) | {0, 1}):
        fe = ranks.get(r)
        out_ranks[str(r)] = {
            "node": "n1",
            "first_error": None if fe is None else {"signature": fe[0], "fingerprint": fe[1], "role": "root"},
            "last_progress": None if r not in steps else {"step": steps[r], "at": None},
            "exit": None,
        }
    ctx = {"versions": {"deepspeed": "0.19.8", "torch": None, "cuda": None, "nccl": None, "python": None},
           "launcher": "deepspeed", "launch_command": None, "world_size": 2, **CONFIG, "missing": []}
    ctx.update(context or {})
    return {
        "schema": "firstfault.report/1", "job": None, "first_failure": failure, "blame": "unknown",
        "distinct_failures": distinct or [], "ranks": out_ranks, "context": ctx,
        "checkpoint": {"verdict": "safe" if tags else "unknown", "resume_from": None, "reason": "",
                       "disk_path": "ckpt" if tags else None,
                       "tags": [{"tag": f"global_step{s}", "step": s, "verdict": v} for s, v in tags]},
    }


PY = ("python.exception", "python.exception|RuntimeError: mat# must be a matrix, got #-D tensor")


def failed(rank=0, sig=PY, phase="forward", **kw) -> dict:
    ff = {"rank": rank, "signature": sig[0], "fingerprint": sig[1], "category": "user-code", "phase": phase,
          "summary": "it broke"}
    return report(failure=ff, ranks={rank: sig}, **kw)


BEFORE = failed(steps={0: 4}, tags=[(2, "safe"), (4, "safe")])
PASSED = report(steps={0: 6}, tags=[(2, "safe"), (4, "safe"), (6, "safe")])


def codes(c: dict) -> list[str]:
    return [r["code"] for r in c["reasons"]]


def test_launch_command_is_compared_without_rendezvous_and_placement():
    a = launch_tokens("python -u -m deepspeed.launcher.launch --world_info=eyJh --master_addr=10.0.0.1 "
                      "--master_port=29500 train.py --lr 1")
    b = launch_tokens("['python', '-u', 'train.py', '--local_rank=3', '--master_port', '1234', '--lr', '1']")
    assert a == ["python", "-u", "-m", "deepspeed.launcher.launch", "train.py", "--lr", "1"]
    assert b == ["python", "-u", "train.py", "--lr", "1"]
    assert launch_tokens(None) is None


def test_checkpoint_interval_needs_two_evenly_spaced_tags():
    assert checkpoint_interval(report(tags=[(3, "safe"), (6, "unsafe"), (9, "safe")])) == 3
    assert checkpoint_interval(report(tags=[(2, "safe"), (6, "safe"), (8, "safe")])) is None
    assert checkpoint_interval(report(tags=[(2, "safe")])) is None


def test_an_offload_left_out_of_a_printed_config_is_none_not_unknown():
    seen = report(context={"offload_optimizer": "cpu", "offload_optimizer_pin_memory": True})
    unseen = report(context={k: None for k in CONFIG} | {"missing": ["resolved DeepSpeed config (…)"]})
    rows = {r["field"]: r for r in diff_fields(seen, report())["fields"]}
    assert (rows["offload_optimizer"]["status"], rows["offload_optimizer_pin_memory"]["status"]) == ("changed",) * 2
    assert rows["versions.deepspeed"]["status"] == "same" and rows["versions.torch"]["status"] == "unknown"
    rows = {r["field"]: r for r in diff_fields(seen, unseen)["fields"]}
    assert rows["offload_optimizer"]["status"] == "one-side" and rows["zero_stage"]["status"] == "one-side"
    assert rows["offload_optimizer"]["after_known"] is False


def test_fixed_needs_one_change_the_signature_gone_and_a_boundary():
    after = copy.deepcopy(PASSED)
    after["context"]["zero_stage"] = 3
    c = compare_reports(BEFORE, after)
    assert c["verdict"] == "fixed"
    assert codes(c) == ["gone", "boundary-passed", "one-change"]
    assert c["boundary"] | {"after_checkpoint": None} == {
        "before_last_step": 4, "failing_step": 5, "after_last_step": 6, "passed_failing_step": True,
        "optimizer_step_after": True, "checkpoint_after": "global_step6", "after_checkpoint": None, "passed": True}


def test_no_visible_change_is_fixed_with_a_note():
    c = compare_reports(BEFORE, PASSED)
    assert c["verdict"] == "fixed" and c["changes"]["count"] == 0
    assert [n["code"] for n in c["notes"]] == ["no-change-seen"]


def test_the_same_message_on_another_rank_came_back_whatever_else_changed():
    after = failed(rank=1, steps={0: 6}, tags=[(6, "safe")], context={"zero_stage": 3, "precision": "bf16"})
    c = compare_reports(BEFORE, after)
    assert c["verdict"] == "not-fixed" and codes(c) == ["came-back"]
    assert c["ranks"]["1"]["initiating_in_after"] == "same-fingerprint"
    assert c["ranks"]["0"]["initiating_in_after"] is None
    assert "rank 1" in c["reasons"][0]["text"]


def test_another_python_exception_is_not_the_same_failure():
    other = ("python.exception", "python.exception|ValueError: bad record at step #")
    after = failed(sig=other, steps={0: 6}, tags=[(6, "safe")])
    c = compare_reports(BEFORE, after)
    assert c["came_back"] is False and c["verdict"] == "fixed"
    assert "after-failed" in [n["code"] for n in c["notes"]]


def test_a_specific_signature_counts_even_when_tied_to_no_rank():
    oom = ("kernel.memcg_oom_kill", "kernel.memcg_oom_kill|")
    before = failed(sig=oom, steps={0: 4})
    after = report(steps={0: 6}, tags=[(6, "safe")],
                   distinct=[{"signature": oom[0], "fingerprint": oom[1], "ranks": [], "category": "host-memory"}])
    c = compare_reports(before, after)
    assert c["verdict"] == "not-fixed" and c["came_back_unranked"] == ["same-fingerprint"]


def test_stopping_before_the_failing_step_is_inconclusive():
    c = compare_reports(BEFORE, report(steps={0: 3}, tags=[(2, "safe")]))
    assert c["verdict"] == "inconclusive" and codes(c)[0] == "stopped-early"
    assert "gone" not in codes(c)


def test_no_save_after_the_failing_step_is_inconclusive_and_says_the_disk_was_not_checked():
    after = report(steps={0: 8}, tags=[(4, "safe")])
    after["checkpoint"]["disk_path"] = None
    c = compare_reports(BEFORE, after)
    assert c["verdict"] == "inconclusive" and codes(c) == ["no-save-after", "gone"]
    assert "not checked on disk" in c["reasons"][0]["text"]


def test_one_step_past_the_failure_is_not_yet_an_optimizer_step_after_it():
    c = compare_reports(BEFORE, report(steps={0: 5}, tags=[(5, "safe")]))
    assert c["verdict"] == "inconclusive" and codes(c) == ["no-step-after", "gone"]


def test_too_many_changes_is_inconclusive_even_when_it_passed():
    after = copy.deepcopy(PASSED)
    after["context"].update(zero_stage=3, precision="bf16", train_micro_batch_size_per_gpu=4)
    c = compare_reports(BEFORE, after)
    assert c["verdict"] == "inconclusive" and codes(c)[0] == "too-many-changes"
    assert set(c["changes"]["changed"]) == {"zero_stage", "precision", "train_micro_batch_size_per_gpu"}


def test_a_failure_at_init_has_step_zero_as_its_last_complete_step():
    before = failed(phase="init")
    assert compare_reports(before, report(steps={0: 1}, tags=[(1, "safe")]))["boundary"]["failing_step"] == 1
    assert compare_reports(before, PASSED)["verdict"] == "fixed"


def test_before_without_a_failure_or_a_known_step_is_inconclusive():
    assert codes(compare_reports(PASSED, PASSED)) == ["before-did-not-fail"]
    c = compare_reports(failed(), PASSED)
    assert c["verdict"] == "inconclusive" and codes(c)[0] == "failing-step-unknown"


def test_an_inferred_hang_comes_back_by_signature():
    hang = {"rank": 1, "signature": "hang.stopped_first", "fingerprint": None, "inferred": True, "phase": "unknown"}
    before = report(failure=hang, steps={0: 4})
    after = report(failure=dict(hang, rank=0), steps={0: 7}, tags=[(6, "safe")])
    c = compare_reports(before, after)
    assert c["verdict"] == "not-fixed" and c["ranks"]["0"]["initiating_in_after"] == "same-signature"
