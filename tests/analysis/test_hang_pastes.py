"""Whole pasted logs, written from the frameworks' format strings, through ``analyze -``: what an
inferred hang, a failure named only in words, and a launcher's summary answer."""

from tests.offline.scoring import Case, analyze


def first(text: str) -> dict:
    return analyze(Case("paste", ["-"], {}, stdin=text.encode()))["first_failure"]


# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp WorkNCCL::checkTimeout ("Watchdog caught collective
# operation timeout: WorkNCCL(SeqNum=..., OpType=..., ...) ran for ... milliseconds before timing out.")
# and ProcessGroupNCCL::watchdogHandler ("Timeout at NCCL work: ..., last enqueued NCCL work: ..., last
# completed NCCL work: ...") (2.2-2.9)
TWO_RUNS = """\
# NCCL timeout at the end of the epoch
Here is part of the error message.
[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=52011, OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) ran for 600093 milliseconds before timing out.
[rank0]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 0] Timeout at NCCL work: 52011, last enqueued NCCL work: 52017, last completed NCCL work: 52010.

And again in another run:
[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2207, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600004 milliseconds before timing out.
[rank1]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 1] Timeout at NCCL work: 2207, last enqueued NCCL work: 2207, last completed NCCL work: 2206.
"""

ONE_SURVIVOR = """\
# NCCL timeout error during training
[rank3]:[E ProcessGroupNCCL.cpp:523] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=61, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, Timeout(ms)=1800000) ran for 1800410 milliseconds before timing out.
[rank3]:[E ProcessGroupNCCL.cpp:537] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
[rank3]:[E ProcessGroupNCCL.cpp:543] To avoid data inconsistency, we are taking the entire process down.
"""

RANK0_ONLY = """\
`Trainer.fit` stopped: `max_epochs=3` reached.
[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800052 milliseconds before timing out.
"""


def test_status_lines_of_two_runs_single_out_no_rank():
    got = first(TWO_RUNS)
    assert got["inferred"] and got["rank"] is None and got["category"] == "cascade" and got["confidence"] == "low"


def test_ranks_below_the_one_that_timed_out_are_suspects_only():
    got = first(ONE_SURVIVOR)
    assert got["inferred"] and got["rank"] is None and got["confidence"] == "low"
    assert got["suspects"] == [0, 1, 2] and got["category"] == "cascade"


def test_the_one_rank_that_timed_out_is_not_where_the_job_stopped():
    got = first(RANK0_ONLY)
    assert got["inferred"] and got["rank"] is None and got["confidence"] == "low"
