"""Collective timeouts whose cause the log does show (timeout_cause.py): one rank's work outlasting the
timeout, and code after training ended. Whole pastes written from the frameworks' format strings, through
``analyze -``: examples and not-examples."""

import pytest

from firstfault.analysis.parse import elapsed_s
from tests.offline.scoring import first_failure_of

# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp WorkNCCL::checkTimeout (2.0-2.9): "Watchdog caught collective
# operation timeout: WorkNCCL(SeqNum=..., OpType=..., NumelIn=..., NumelOut=..., Timeout(ms)=...) ran for ...
# milliseconds before timing out."
WATCHDOG = ("[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=5, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)={ms}) ran for {ran} milliseconds "
            "before timing out.\n")
TIMEOUT_30 = WATCHDOG.format(ms=1800000, ran=1800412)
NO_TIMEOUT_NAMED = "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=BROADCAST)\n"

# tqdm/std.py format_meter (4.x): "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining},
# {rate_fmt}]"; datasets Dataset.map's desc and unit (2.x); Lightning's TQDMProgressBar descs (2.x)
TOKENIZING = "Tokenizing train set:  94%|#########4| 63/67 [29:12<01:51, 27.80s/it]\n"
MAP_PAST = "Map (num_proc=4):  71%|#######1  | 71000/100000 [31:05<12:41, 38.07 examples/s]\n"
BYTES = " 40%|####      | 8.30G/20.8G [36:10<54:30, 3.82MB/s]\n"
EVALUATING = "Validation DataLoader 0:  90%|######### | 90/100 [30:20<03:22, 20.22s/it]\n"
SHORT_BAR = "Tokenizing train set:  12%|#1        | 8/67 [04:55<36:17, 36.90s/it]\n"
TRAIN_BAR = " 45%|####5     | 450/1000 [31:10<38:06,  4.16s/it]\n"
EPOCH_BAR = "Epoch 2:  45%|####5     | 45/100 [31:10<38:06,  0.02it/s, v_num=0, train_loss=0.912]\n"
WEIGHTS = "model-00002-of-00004.safetensors:  60%|######    | 3.00G/4.98G [30:40<20:15, 1.63MB/s]\n"

# Lightning loops/fit_loop.py _FitLoop.done (rank_zero_info, 1.x-2.5); transformers trainer.py
# _inner_training_loop (logger.info, 4.x-5.x)
FIT_EPOCHS = "`Trainer.fit` stopped: `max_epochs=20` reached.\n"
FIT_STEPS = "INFO:lightning.pytorch.utilities.rank_zero:`Trainer.fit` stopped: `max_steps=5000` reached.\n"
HF_DONE = "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n\n"


@pytest.mark.parametrize("text,want", [("27:15", 1635), ("1:02:03", 3723), ("71:12:03", 256323), ("?", None)])
def test_elapsed_is_read_as_tqdm_prints_it(text, want):
    assert elapsed_s(text) == want


@pytest.mark.parametrize("bar,timeout,phase,conf", [
    (TOKENIZING, TIMEOUT_30, "data", "low"),  # near the timeout
    (MAP_PAST, TIMEOUT_30, "data", "medium"),  # past it
    (BYTES, TIMEOUT_30, "data", "medium"),  # no words, but a unit of bytes
    (EVALUATING, TIMEOUT_30, "forward", "medium"),
    (TOKENIZING, NO_TIMEOUT_NAMED, "data", "low"),  # init_process_group's default, 30 min
    (SHORT_BAR, WATCHDOG.format(ms=300000, ran=300120), "data", "low"),  # a 5 min timeout
])
def test_one_ranks_work_that_outlasted_the_timeout_is_a_timeout_too_short(bar, timeout, phase, conf):
    for text in (bar + timeout, timeout + "\n```\n" + bar):  # the bar above the watchdog line, or pasted below it
        got = first_failure_of(text)
        assert (got["category"], got["phase"], got["confidence"]) == ("config", phase, conf), text
        assert got["inferred"] and got["evidence"][0]["text"].strip() == bar.strip()
        assert "timeout" in got["first_action"] and "every rank" in got["first_action"]
        assert got["reference"] and "tqdm" in got["reference"]
    if timeout is NO_TIMEOUT_NAMED:
        assert "no line names it" in first_failure_of(bar + timeout)["summary"]


@pytest.mark.parametrize("bar", [SHORT_BAR, TRAIN_BAR, EPOCH_BAR, WEIGHTS, TOKENIZING + TRAIN_BAR],
                         ids=["far-below", "trainer-step-bar", "lightning-epoch-bar", "model-download", "trained-after"])
def test_training_or_brief_work_names_no_cause(bar):
    got = first_failure_of(bar + TIMEOUT_30)
    assert got["category"] == "cascade" and got["reference"] is None


def test_a_bar_another_record_was_printed_straight_after_still_counts():
    # tqdm redraws with a carriage return: the watchdog's line lands on the bar's, and a later bar of
    # another process (just started) on another line; the bar that ran 29 min is the one waited for
    glued = TOKENIZING.rstrip("\n") + TIMEOUT_30 + SHORT_BAR.replace("8/67 [04:55", "0/67 [00:00").rstrip("\n") + \
        TIMEOUT_30.replace("rank1", "rank2").replace("Rank 1", "Rank 2")
    got = first_failure_of(glued)
    assert (got["category"], got["phase"], got["inferred"]) == ("config", "data", True)
    assert got["evidence"][0]["text"].strip() == TOKENIZING.strip()
    # not-example: the same glued line when the bar had run four minutes names no cause
    assert first_failure_of(SHORT_BAR.rstrip("\n") + TIMEOUT_30)["category"] == "cascade"


def test_a_bar_printed_long_before_the_collective_began_is_not_what_it_waited_for():
    stamped = ("[2026-03-02 08:00:00,000] [INFO] [runner.py:10:main] start\n" + TOKENIZING
               + "[2026-03-02 09:30:00,000] [INFO] [runner.py:20:main] still here\n" + TIMEOUT_30
               + "[2026-03-02 09:30:01,000] [INFO] [runner.py:30:main] end\n")
    assert first_failure_of(stamped)["category"] == "cascade"


@pytest.mark.parametrize("ended", [FIT_EPOCHS, FIT_STEPS, HF_DONE])
def test_a_timeout_after_training_ended_is_code_after_training(ended):
    got = first_failure_of(ended + TIMEOUT_30)
    assert (got["category"], got["confidence"], got["inferred"]) == ("user-code", "low", True)
    assert "after training" in got["summary"] and "every rank" in got["first_action"]
    assert got["evidence"][0]["text"].strip().endswith(ended.strip()[-20:])


def test_training_that_ended_after_the_timeout_says_nothing_of_it():
    got = first_failure_of(TIMEOUT_30 + FIT_EPOCHS)
    assert got["category"] == "cascade"


def test_work_that_outlasted_the_timeout_comes_before_the_end_of_training():
    got = first_failure_of(FIT_EPOCHS + EVALUATING + TIMEOUT_30)
    assert (got["category"], got["phase"]) == ("config", "forward")


def test_a_rank_that_failed_on_its_own_is_the_failure_not_the_bar():
    oom = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
           "capacity of 79.15 GiB of which 1.10 GiB is free.\n")
    got = first_failure_of(TOKENIZING + oom + TIMEOUT_30)
    assert got["category"] == "gpu-memory" and not got["inferred"]


# ---------------------------------------------------------------------------------------------
# A save begun as the others started waiting (rule 2): timed lines only
# ---------------------------------------------------------------------------------------------

def _stamped(clock: str, line: str) -> str:
    return f"[2026-03-02 {clock},000] [INFO] [train.py:200:main] {line}"


SAVE_SAID = _stamped("10:28:25", "Saving latest checkpoint after 369000 batches\n")
SAVE_BEGINS = _stamped("10:28:25", "Saving model checkpoint to /out/run1/checkpoint-500\n")
STEP_AFTER = _stamped("10:29:10", "step 369001 loss 0.2031\n")
TIMED_OUT_20 = _stamped("10:48:26", WATCHDOG.format(ms=1200000, ran=1200031))


@pytest.mark.parametrize("save", [SAVE_SAID, SAVE_BEGINS], ids=["the-job's-words", "hf-trainer"])
def test_a_save_begun_as_the_others_started_waiting_is_a_save_that_outlasted_the_timeout(save):
    got = first_failure_of(save + TIMED_OUT_20)
    assert (got["category"], got["phase"], got["confidence"], got["inferred"]) == (
        "storage", "checkpoint-save", "low", True)
    assert "save" in got["phase_from"] and "Time the save" in got["first_action"]


def test_a_save_long_before_the_collective_began_is_not_what_it_waited_for():
    early = _stamped("10:20:00", "Saving latest checkpoint after 369000 batches\n")
    assert first_failure_of(early + TIMED_OUT_20)["category"] == "cascade"


def test_training_that_went_on_after_the_save_says_the_save_ended():
    assert first_failure_of(SAVE_SAID + STEP_AFTER + TIMED_OUT_20)["category"] == "cascade"


def test_untimed_save_words_say_nothing_of_a_timeout():
    untimed = "Saving latest checkpoint after 369000 batches\n" + TIMEOUT_30
    assert first_failure_of(untimed)["category"] == "cascade"


def test_a_save_begun_long_after_the_others_started_waiting_is_not_what_they_waited_for():
    late = _stamped("10:38:00", "Saving latest checkpoint after 369000 batches\n")
    assert first_failure_of(late + TIMED_OUT_20)["category"] == "cascade"


@pytest.mark.parametrize("ms,ran", [(1, 61), (100, 5012), (9000, 9088)])
def test_a_collective_timeout_of_under_10_s_is_the_setting(ms, ran):
    """A timeout shorter than a set-up or a slow step: every rank's first long wait fails, whatever it did."""
    got = first_failure_of(WATCHDOG.format(ms=ms, ran=ran))
    assert (got["category"], got["confidence"]) == ("config", "medium")
    assert f"{ms} ms" in got["summary"] and "timedelta" in got["first_action"]


@pytest.mark.parametrize("text", [TIMEOUT_30, WATCHDOG.format(ms=10000, ran=10020), WATCHDOG.format(ms=60000, ran=60020),
                                  NO_TIMEOUT_NAMED])
def test_a_timeout_of_10_s_or_more_or_none_named_is_no_setting_mistake(text):
    got = first_failure_of(text)
    assert got["category"] != "config" and "timedelta" not in got["first_action"]


def test_the_shortest_timeout_decides_before_the_work_a_rank_did():
    """A bar of work far longer than a 1 s timeout is no cause: any wait would have outlasted it."""
    got = first_failure_of(TOKENIZING + WATCHDOG.format(ms=1000, ran=1004))
    assert got["category"] == "config" and "Timeout(ms)=1000)" in got["evidence"][0]["text"]


@pytest.mark.parametrize("op", ["_ALLGATHER_BASE", "ALLGATHER", "ALLGATHER_COALESCED"])
def test_ranks_that_timed_out_inside_the_save_s_own_gather_had_a_rank_missing_from_it(op):
    """An all-gather while a save was under way is the save's own gather of the sharded state (an FSDP full state
    dict): the ranks were inside the save, not waiting for a writer; a rank that never entered it is the cause."""
    gathered = TIMED_OUT_20.replace("OpType=BROADCAST", f"OpType={op}")
    assert gathered != TIMED_OUT_20
    got = first_failure_of(SAVE_SAID + gathered)
    assert (got["category"], got["phase"], got["confidence"], got["inferred"]) == (
        "user-code", "checkpoint-save", "low", True)
    assert "every rank" in got["first_action"] and op in got["summary"]
