"""Pasted fragments and calibrated confidence (tests/data/fragments, scored by tests/offline/scoring.py).

The fragments set must score at least 95% on the rank, 90% on the category and 85% on the
phase; on every test set (real captures, format captures, fragments) every "high" confidence
answer must be right. bench/accuracy.py prints the same figures (bench/RESULTS.md).
"""

import json

import pytest

from tests.offline.scoring import DATA, SETS, analyze, fragment_cases, score

FRAGMENTS = fragment_cases()


def test_the_set_is_what_the_issue_asks_for():
    manifest = json.loads((DATA / "fragments" / "manifest.json").read_text())
    assert len(manifest) >= 30
    assert {e["file"] for e in manifest} == {p.name for p in (DATA / "fragments").glob("*.log")}
    assert all(e["shape"] for e in manifest)


def test_fragments_score_above_the_thresholds():
    s = score(FRAGMENTS)
    wrong = "\n".join(f"  {c}: {k} got {g!r}, want {w!r}" for c, k, g, w in s.wrong)
    assert s.pct("rank") >= 95 and s.pct("category") >= 90 and s.pct("phase") >= 85, wrong


@pytest.mark.parametrize("name", list(SETS))
def test_high_confidence_answers_are_right(name):
    s = score(SETS[name]())
    assert s.high > 0
    assert s.high_wrong == [], s.high_wrong


def _report(name):
    return analyze(next(c for c in FRAGMENTS if c.name == name))


def test_a_mid_stack_zero3_assertion_is_a_framework_gather_failure():
    ff = _report("zero3-inflight-mid-stack-rank3.log")["first_failure"]
    assert (ff["rank"], ff["signature"], ff["category"], ff["phase"], ff["phase_from"]) == (
        3, "deepspeed.zero3_param_status", "framework", "param-gather", "frames")


def test_a_cuda_oom_inside_the_all_gather_is_memory_in_the_gather():
    ff = _report("zero3-cuda-oom-all-gather-coalesced-rank1.log")["first_failure"]
    assert (ff["rank"], ff["category"], ff["phase"]) == (1, "gpu-memory", "param-gather")


def test_no_timestamps_no_occurred_time():
    ff = _report("no-timestamps-valueerror-rank1.log")["first_failure"]
    assert ff["occurred_at"] is None and ff["clock"] is None and ff["observed_at"] is None
    assert "unknown" in ff["time_note"]


def test_silent_ranks_of_a_watchdog_timeout_are_the_suspects():
    ff = _report("nccl-watchdog-4-of-8-others-silent.log")["first_failure"]
    assert ff["inferred"] and ff["rank"] is None and ff["suspects"] == [4, 5, 6, 7] and ff["confidence"] == "low"
    assert "BROADCAST, sequence 880" in ff["inferred_from"][0]
    one = _report("nccl-watchdog-7-of-8-rank5-silent.log")["first_failure"]
    assert (one["rank"], one["suspects"], one["confidence"]) == (5, [5], "medium")


def test_a_rank_that_never_enqueued_the_collective_is_named():
    ff = _report("nccl-work-status-rank6-never-enqueued.log")["first_failure"]
    assert ff["rank"] == 6 and "never reached it" in ff["inferred_from"][0]


def test_exit_minus_9_without_a_kernel_log_is_likely_host_memory():
    ff = _report("torchrun-summary-sigkill-no-kernel-log.log")["first_failure"]
    assert (ff["rank"], ff["category"], ff["confidence"]) == (3, "host-memory", "low")
    assert "dmesg -T" in ff["evidence"][0]["linked_by"]


def test_sigabrt_after_a_timeout_is_a_cascade_and_alone_it_is_the_failure():
    after = _report("nccl-timeout-then-sigabrt-rank1-silent.log")
    assert after["first_failure"]["rank"] == 1 and after["distinct_failures"] == []
    alone = _report("cuda-illegal-address-abort-rank2.log")["first_failure"]
    assert (alone["rank"], alone["signature"], alone["inferred"]) == (2, "cuda.illegal_memory_access", False)
