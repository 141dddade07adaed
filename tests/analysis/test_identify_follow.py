"""identify's rule 4b (``followed_by_rank``): a failure printed without a rank prefix (an NCCL WARN
line, a CUDA kernel's device-side assert) takes the rank of its process's own error that follows it.

Inputs written from the format strings: NCCL's "host:pid:tid [cudaDev] file:line NCCL WARN ..."
(src/include/debug.h, 2.10-2.27), ATen's device assert ("<file>:<line>: <kernel>: block: [..],
thread: [..] Assertion `<cond>` failed."), PyTorch 2.2+'s "[rank<N>]:" stderr prefix and
ProcessGroupNCCL's "[Rank N] found async exception ..." (2.x). Values are made up.
"""

from __future__ import annotations

from firstfault.analysis.identify import FOLLOW_GAP
from tests.offline.scoring import first_failure_of

ASSERT_THEN_TRACEBACK = """\
/src/aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [12,0,0], thread: [64,0,0] Assertion `srcIndex < srcSelectDimSize` failed.
/src/aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [12,0,0], thread: [65,0,0] Assertion `srcIndex < srcSelectDimSize` failed.
[rank3]: Traceback (most recent call last):
[rank3]:   File "/work/train.py", line 88, in <module>
[rank3]:     loss = model(batch).loss
[rank3]: RuntimeError: CUDA error: device-side assert triggered
"""

WARN_THEN_ASYNC = """\
gpu-node-7:51234:51300 [2] transport/net_ib.cc:1700 NCCL WARN NET/IB : Got completion from peer 10.1.2.3<40021> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.1.2.4 remoteGids::ffff:10.1.2.3 hca mlx5_2
gpu-node-7:51234:51300 [2] NCCL INFO transport/net.cc:1298 -> 6
[rank6]:[E1202 10:43:22.118000 51234 ProcessGroupNCCL.cpp:1704] [Rank 6] found async exception when checking for NCCL errors: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5
"""


def test_device_assert_takes_the_rank_of_the_traceback_below():
    ff = first_failure_of(ASSERT_THEN_TRACEBACK)
    assert ff["signature"] == "cuda.device_assert"
    assert ff["rank"] == 3
    assert ff["rank_from"] == "the ranked error that follows it"
    assert ff["confidence"] != "high"  # adjacency is the weakest evidence of a rank


def test_nccl_warn_takes_the_rank_of_its_process_error():
    ff = first_failure_of(WARN_THEN_ASYNC)
    assert ff["signature"] == "nccl.ib_completion_error"
    assert ff["rank"] == 6
    assert ff["category"] == "network"


def test_not_when_two_processes_printed_the_unranked_lines():
    text = WARN_THEN_ASYNC.replace("gpu-node-7:51234:51300 [2] NCCL INFO",
                                   "gpu-node-7:51240:51301 [3] transport/net_ib.cc:1700 NCCL WARN NET/IB : Got completion from peer 10.1.2.3<40022> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.1.2.4 remoteGids::ffff:10.1.2.3 hca mlx5_3\ngpu-node-7:51240:51301 [3] NCCL INFO")
    assert first_failure_of(text)["rank"] is None


def test_not_when_the_ranked_error_is_another_pid():
    """The ranked line below names its own process (NCCL's origin), another than the WARN's."""
    text = WARN_THEN_ASYNC.splitlines(keepends=True)[0] + (
        "[rank6]:gpu-node-7:60001:60050 [3] transport/net_ib.cc:1700 NCCL WARN NET/IB : Got completion from peer "
        "10.1.2.3<40021> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.1.2.4 "
        "remoteGids::ffff:10.1.2.3 hca mlx5_3\n")
    ff = first_failure_of(text)
    assert ff["rank"] is None or ff["rank_from"] != "the ranked error that follows it"


def test_not_when_far_below():
    gap = "".join(f"step {i} loss 2.{i:03d}\n" for i in range(FOLLOW_GAP + 2))
    lines = ASSERT_THEN_TRACEBACK.splitlines(keepends=True)
    text = "".join(lines[:2]) + gap + "".join(lines[2:])
    ff = first_failure_of(text)
    assert ff["rank_from"] != "the ranked error that follows it"


def test_a_gpu_index_is_not_a_rank():
    """The WARN's "[2]" is its CUDA device: with no ranked error below, the answer names no rank."""
    ff = first_failure_of(WARN_THEN_ASYNC.splitlines(keepends=True)[0])
    assert ff["rank"] is None


def test_another_printers_line_breaks_the_run():
    """Ray's raylet (or a launcher) printing between: its line is no rank's own."""
    text = ("/src/aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [12,0,0], thread: [64,0,0] "
            "Assertion `srcIndex < srcSelectDimSize` failed.\n"
            "E1202 10:12:00.462000 2611 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) "
            "local_rank: 0 (pid: 24215) of binary: /usr/bin/python3\n"
            + "".join(ASSERT_THEN_TRACEBACK.splitlines(keepends=True)[2:]))
    ff = first_failure_of(text)
    assert not (ff["signature"] == "cuda.device_assert" and ff["rank"] == 3 and ff["rank_from"] == "the ranked error that follows it")


def test_a_line_of_another_printer_takes_no_rank():
    """A NIC provider library's line (rdma-core's mlx5 "got completion with error") is printed by no
    framework on the rank's behalf with an origin: a ranked error below does not make it that rank's."""
    text = ("(WorkerWrapper pid=7001, ip=10.0.0.3) mlx5: gpu-node-3: got completion with error:\n"
            "(WorkerWrapper pid=7002, ip=10.0.0.3) [rank1]:[E1202 10:43:22.118000 7002 ProcessGroupNCCL.cpp:1704] "
            "[Rank 1] found async exception when checking for NCCL errors: NCCL error: remote process exited or "
            "there was a network error, NCCL version 2.21.5\n")
    ff = first_failure_of(text)
    assert ff["signature"] == "nccl.ib_completion_error"
    assert ff["rank"] is None


def test_colossalai_run_failure_alone_is_a_failure_of_unknown_cause():
    """colossalai run's line (cli/launcher/multinode_runner.py run_on_host) over a log with nothing
    else: a failure, not "no failure found", whose category its command line's words do not give."""
    ff = first_failure_of("Error: failed to run torchrun --nproc_per_node=4 --nnodes=1 --node_rank=0 "
                "--rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29500 train.py --config config.py on 127.0.0.1\n")
    assert ff["signature"] == "colossalai.run_failed"
    assert (ff["category"], ff["rank"], ff["confidence"]) == ("unknown", None, "low")


def test_not_when_another_ranks_line_lies_between():
    """A line the catalog reads (DeepSpeed's step line, 10-progress.toml) of another rank between.
    (Lines the catalog does not read are not seen by identify: a gap of FOLLOW_GAP bounds them.)"""
    lines = ASSERT_THEN_TRACEBACK.splitlines(keepends=True)
    text = "".join(lines[:2]) + ("[rank0]:[2026-12-02 10:11:59,790] [INFO] [logging.py:123:log_dist] [Rank 0] "
                                 "step=10, skipped=0, lr=[0.001], mom=[(0.9, 0.999)]\n") \
        + "".join(lines[2:])
    ff = first_failure_of(text)
    assert ff["rank_from"] != "the ranked error that follows it"


TWO_RANKS_UNDER_A_CAPTION = """\
Error:
[rank4]:   File "/opt/Megatron-LM/megatron/core/dist_checkpointing/strategies/filesystem_async.py", line 337, in retrieve_write_results
[rank4]:     raise RuntimeError(f'Worker failure: {write_results_or_exc}') from write_results_or_exc
[rank4]: RuntimeError: Worker failure: _write_item() missing 1 required positional argument: 'serialization_format'
[rank5]: TypeError: _write_item() missing 1 required positional argument: 'serialization_format'
"""


def test_a_persons_caption_over_the_paste_takes_no_rank():
    """"Error:" alone on a line is a caption (prefixes.peel marks it prose), no process's line: it
    neither takes rank 4 from the traceback below nor hides that traceback as rank 4's first error."""
    ff = first_failure_of(TWO_RANKS_UNDER_A_CAPTION)
    assert (ff["rank"], ff["signature"]) == (4, "python.exception")
    assert "Worker failure" in ff["summary"]


ERROR_FIRST_THEN_ITS_FRAMES = """\
RuntimeError: It looks like your LightningModule has parameters that were not used in producing the loss returned by training_step.
[rank3]: Traceback (most recent call last):
[rank3]:   File "/w/train.py", line 80, in main
[rank3]:     trainer.fit(model, train_loader, val_loader)
[rank3]:   File "/venv/lib/python3.11/site-packages/lightning/pytorch/trainer/trainer.py", line 544, in fit
"""


def test_an_exception_pasted_above_its_ranks_cut_traceback_is_that_ranks():
    """A paste that puts the error first and then the frames it came from: the rank's traceback has no
    exception line of its own, the unprefixed one above it is that line."""
    ff = first_failure_of(ERROR_FIRST_THEN_ITS_FRAMES)
    assert (ff["rank"], ff["signature"]) == (3, "lightning.unused_parameters")
    assert ff["rank_from"] == "the ranked error that follows it" and ff["confidence"] != "high"


def test_not_when_the_ranks_traceback_has_an_exception_of_its_own():
    whole = ERROR_FIRST_THEN_ITS_FRAMES + "[rank3]: ValueError: batch of 0 samples\n"
    ff = first_failure_of(whole)
    assert not (ff["signature"] == "lightning.unused_parameters" and ff["rank"] == 3)
