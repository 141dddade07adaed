"""One failure on several ranks (verdict._among_sharing): with no time to order them, the paste's order
does not say which rank it struck first; torchrun's Root Cause block does. Lines written from the format
strings of PyTorch (ATen's generated device checks, "Expected all tensors to be on the same device, but
found at least two devices, ..."; torch/distributed/elastic/multiprocessing/errors ChildFailedError's table)."""

from __future__ import annotations

from tests.offline.scoring import first_failure_of

DEVICE = ("[rank{r}]: RuntimeError: Expected all tensors to be on the same device, but found at least two devices, "
          "cpu and cuda:{r}! (when checking argument for argument index in method wrapper_CUDA__index_select)\n")
TABLE = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-06-28_16:52:43
  host      : node-a
  rank      : {r} (local_rank: {r})
  exitcode  : 1 (pid: 11965)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_untimed_the_first_printed_rank_is_no_bet():
    ff = first_failure_of(DEVICE.format(r=1) + DEVICE.format(r=0))
    assert (ff["rank"], ff["confidence"]) == (1, "medium")
    assert sorted(ff["ranks_sharing"]) == [0, 1]
    assert "not known to be the first" in ff["evidence"][0]["linked_by"]


def test_torchruns_root_cause_says_which_rank_it_recorded_first():
    ff = first_failure_of(TABLE.format(r=0) + DEVICE.format(r=1) + DEVICE.format(r=0))
    assert (ff["rank"], ff["confidence"]) == (0, "medium")
    assert "Root Cause" in ff["evidence"][0]["linked_by"]


def test_a_root_cause_rank_that_did_not_fail_so_changes_nothing():
    ff = first_failure_of(TABLE.format(r=5) + DEVICE.format(r=1) + DEVICE.format(r=0))
    assert ff["rank"] == 1


def test_one_ranks_failure_alone_keeps_its_confidence():
    assert first_failure_of(DEVICE.format(r=1))["confidence"] == "high"


def test_ranks_whose_times_say_they_failed_together_are_not_capped():
    at = "[2026-06-28 16:52:43,101] "
    ff = first_failure_of(at + DEVICE.format(r=1) + at + DEVICE.format(r=0))
    assert ff["confidence"] == "high" and sorted(ff["ranks_sharing"]) == [0, 1]
