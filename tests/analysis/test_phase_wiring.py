"""The phase of the first failure from what is not its own frames: the same failure told
elsewhere, the collective survivors waited in, set-up lines before it, the failure a heading
names. Inputs are written from the frameworks' formats."""

from __future__ import annotations

from tests.offline.scoring import first_failure_of


def _watchdog(rank: int, op: str, seq: int) -> str:
    return (f"[rank{rank}]:[E1203 09:20:10.220000 4000 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught "
            f"collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=600000) ran for 600013 milliseconds before timing out.\n")


def test_a_hang_at_the_first_broadcast_is_in_init():
    ff = first_failure_of(_watchdog(0, "BROADCAST", 1) + _watchdog(1, "BROADCAST", 1))
    assert ff["signature"] == "hang.stopped_first" and ff["phase"] == "init"
    assert ff["phase_from"] == "the collective it timed out in"


def test_a_heading_naming_the_failure_gives_a_cut_traceback_its_phase():
    text = ("# found NaN in local grad norm for bucket #0 in backward pass before data-parallel communication "
            "collective\n"
            "[rank3]: Traceback (most recent call last):\n"
            '[rank3]:   File "/w/pretrain.py", line 12, in <module>\n'
            "[rank3]:     main()\n")
    ff = first_failure_of(text)
    assert ff["rank"] == 3 and ff["category"] == "numerics" and ff["phase"] == "backward"


def test_the_same_failure_with_frames_on_the_same_rank_gives_the_phase():
    text = ("[rank2]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "[rank2]: Traceback (most recent call last):\n"
            '[rank2]:   File "/site-packages/torch/autograd/graph.py", line 768, in _engine_run_backward\n'
            "[rank2]:     return Variable._execution_engine.run_backward(\n"
            "[rank2]: RuntimeError: CUDA error: an illegal memory access was encountered\n")
    ff = first_failure_of(text)
    assert ff["rank"] == 2 and (ff["phase"], ff["phase_from"]) == ("backward", "frames")


def test_survivors_errors_without_a_rank_are_a_cascade_not_no_failure():
    """Only a survivor's line, no rank prefix (an old torch, a paste): the failure the log shows is a
    cascade, in the phase its signature belongs to (the unique id exchange is set-up)."""
    text = ("RuntimeError: [2] is setting up NCCL communicator and retreiving ncclUniqueId from [0] via c10d "
            "key-value store by key '0', but store->get('0') got error: Socket Timeout\n")
    ff = first_failure_of(text)
    assert ff is not None and ff["signature"] == "hang.stopped_first" and ff["category"] == "cascade"
