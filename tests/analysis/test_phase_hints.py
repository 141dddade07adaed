"""Phase hints that are not frames (firstfault/analysis/phases.toml [[collective]], [[marker]],
[[task]]): lines written from the format strings their references name, filled with made-up
values, and near-misses that must give nothing."""

from __future__ import annotations

import pytest

from firstfault.analysis.phase import (
    PROGRESS,
    phase_before_failure,
    phase_from_collective,
    phase_from_marker,
    phase_from_task,
    phase_hint,
)

# ProcessGroupNCCL's WorkNCCL, as its watchdog and timeout lines print it (torch 1.10-2.9).
WATCHDOG = ("[rank{r}]:[E1203 10:11:12.345678901 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=4096, NumelOut=4096, "
            "Timeout(ms)=600000) ran for 600011 milliseconds before timing out.")
OLD_WATCHDOG = "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, Timeout(ms)=1800000) ran for 1800456 milliseconds before timing out."


@pytest.mark.parametrize("line, sharded, want", [
    (WATCHDOG.format(r=2, seq=1, op="BROADCAST"), None, "init"),
    (OLD_WATCHDOG.format(seq=1, op="BROADCAST"), False, "init"),
    (WATCHDOG.format(r=0, seq=1, op="ALLGATHER"), None, "init"),  # DDP's shape check, first of all
    (WATCHDOG.format(r=0, seq=1, op="ALLGATHER"), True, "init"),
    (WATCHDOG.format(r=5, seq=8812, op="_ALLGATHER_BASE"), True, "param-gather"),
    (WATCHDOG.format(r=5, seq=8812, op="ALLGATHER"), True, "param-gather"),
    (WATCHDOG.format(r=5, seq=8813, op="_REDUCE_SCATTER_BASE"), True, "backward"),
    (WATCHDOG.format(r=5, seq=8813, op="REDUCE_SCATTER"), True, "backward"),
    # a reduce-scatter reduces gradients whether or not the job shards its parameters (ZeRO-1/2,
    # Megatron's distributed optimizer; DDP never reduce-scatters)
    (WATCHDOG.format(r=5, seq=8813, op="_REDUCE_SCATTER_BASE"), False, "backward"),
    (WATCHDOG.format(r=5, seq=8813, op="_REDUCE_SCATTER_BASE"), None, "backward"),
    # not-examples: an all-gather in a job that does not shard its parameters says nothing
    (WATCHDOG.format(r=5, seq=8812, op="_ALLGATHER_BASE"), None, None),
    (WATCHDOG.format(r=5, seq=8812, op="_ALLGATHER_BASE"), False, None),
    # a broadcast later on (a checkpoint path, an early-stopping flag) is not init
    (WATCHDOG.format(r=2, seq=230, op="BROADCAST"), None, None),
    (WATCHDOG.format(r=2, seq=11, op="ALLREDUCE"), True, None),
    (WATCHDOG.format(r=2, seq=1, op="ALLREDUCE"), None, None),  # a script's own first all-reduce of a tensor
    # a barrier (one element all-reduced) as a group's first collective: set-up waiting for every rank
    (WATCHDOG.format(r=2, seq=1, op="ALLREDUCE").replace("NumelIn=4096", "NumelIn=1"), None, "init"),
    (WATCHDOG.format(r=2, seq=9, op="ALLREDUCE").replace("NumelIn=4096", "NumelIn=1"), None, None),
    ("[Rank 0] Timeout at NCCL work: 28956, last enqueued NCCL work: 28956, last completed NCCL work: 28955.", True, None),
    ("NCCL INFO AllGather: opCount 4 sendbuff 0x7f00 recvbuff 0x7f80 count 4096 datatype 7", True, None),
])
def test_the_collective_of_a_watchdog_line(line, sharded, want):
    assert phase_from_collective(line, sharded=sharded) == want


@pytest.mark.parametrize("line, want", [
    ("Loading checkpoint shards:  50%|█████     | 1/2 [00:04<00:04,  4.12s/it]", "init"),
    ("[INFO|modeling_utils.py:3474] 2026-12-03 10:00:01,123 >> loading weights file /m/pytorch_model.bin", "init"),
    ("Some weights of LlamaForSequenceClassification were not initialized from the model checkpoint at /m and are "
     "newly initialized: ['score.weight']", "init"),
    ("[2026-12-03 10:00:02,000] [INFO] [comm.py:652:init_distributed] Initializing TorchBackend in DeepSpeed with backend nccl",
     "init"),
    ("[2026-12-03 10:00:03,000] [INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed info: version=0.14.0, git-hash=unknown, "
     "git-branch=unknown", "init"),
    ("Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/4", "init"),
    ("> initializing torch distributed ...", "init"),
    ("[2026-12-03 10:00:04,000] [INFO] [utils.py:800:see_memory_usage] DeepSpeedZeRoOffload initialize [begin]", "init"),
    ("node1:4242:4300 [0] NCCL INFO Connected all rings", "init"),
    ("node1:4242:4300 [0] NCCL INFO Channel 00/02 :    0   1", "init"),
    ("node1:4242:4300 [0] NCCL INFO comm 0x5a1b2c0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x1f2e - Init COMPLETE",
     "init"),
    ("I1203 10:00:05.123456 4242 ProcessGroupNCCL.cpp:869] [PG 0 Rank 2] ProcessGroupNCCL initialization options: "
     "size: 8, global rank: 2, TIMEOUT(ms): 600000, USE_HIGH_PRIORITY_STREAM: 0", "init"),
    (" iteration       20/  500000 | consumed samples:          640 | elapsed time per iteration (ms): 812.3 |", PROGRESS),
    ("{'loss': 2.3012, 'grad_norm': 1.25, 'learning_rate': 1e-05, 'epoch': 0.01}", PROGRESS),
    ("Epoch 0:  12%|█▏        | 120/1000 [01:02<07:38,  1.92it/s, v_num=3, loss=0.812]", PROGRESS),
    ("  3%|▎         | 30/1000 [00:41<22:05,  1.37s/it]", PROGRESS),
    ("[before the start of training step] datetime: 2026-12-03 10:05:00", PROGRESS),
    # not-examples
    ("    init_process_group(backend='nccl', rank=rank, world_size=world_size)", None),  # a traceback's source line
    ("    model = AutoModelForCausalLM.from_pretrained(args.model)", None),
    ("node1:4242:4242 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0", None),
    ("node1:4242:4242 [0] NCCL INFO cudaDriverVersion 12020", None),
    ("Saving checkpoint at iteration 100", None),
    ("number of iterations to run: 100", None),
])
def test_a_line_marks_init_or_progress_or_nothing(line, want):
    assert phase_from_marker(line) == want


def test_the_last_marker_with_no_progress_after_it_names_the_phase():
    setup = ["Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2",
             "node1:4242:4300 [0] NCCL INFO Connected all trees",
             "Loading checkpoint shards:  50%|█████     | 1/2 [00:04<00:04,  4.12s/it]"]
    assert phase_before_failure(setup) == "init"
    assert phase_before_failure(setup + ["{'loss': 2.3012, 'grad_norm': 1.25, 'learning_rate': 1e-05, 'epoch': 0.01}"]) is None
    # NCCL builds communicators lazily: once training is under way its set-up lines are no init
    assert phase_before_failure(setup + [" iteration       20/  500000 | consumed samples:          640 |",
                                         "node1:4242:4400 [0] NCCL INFO Channel 00/1 : 0[0] -> 1[1] via P2P/IPC"]) is None
    # but a model loaded after a finished run (the next split, the next stage) is init again
    assert phase_before_failure(setup + ["{'loss': 2.3012, 'grad_norm': 1.25, 'learning_rate': 1e-05, 'epoch': 0.01}",
                                         "***** test metrics *****",
                                         "loading weights file /m/stage2/pytorch_model.bin"]) == "init"
    assert phase_before_failure([]) is None
    assert phase_before_failure(["hello", "world"]) is None


@pytest.mark.parametrize("text, want", [
    ("ray.exceptions.RayTaskError(RuntimeError): ray::WorkerDict.actor_rollout_save_checkpoint() (pid=4242, ip=10.0.0.5, "
     "actor_id=abc, repr=<verl.single_controller.ray.base.WorkerDict object at 0x7f00>)", "checkpoint-save"),
    ("ray::WorkerDict.actor_rollout_generate_sequences() (pid=4242, ip=10.0.0.5)", "forward"),
    ("ray::WorkerDict.ref_compute_ref_log_prob() (pid=4242, ip=10.0.0.5)", "forward"),
    ("ray::WorkerDict.critic_compute_values() (pid=4242, ip=10.0.0.5)", "forward"),
    ("ray::WorkerDict.actor_rollout_init_model() (pid=4242, ip=10.0.0.5)", "init"),
    ("ray::CriticModelRayActor.save_model() (pid=4242, ip=10.0.0.5)", "checkpoint-save"),
    ("ray::g() (pid=4242, ip=10.0.0.5)\n  At least one of the input arguments for this task could not be computed:\n"
     "ray.exceptions.RayTaskError: ray::WorkerDict.actor_rollout_load_checkpoint() (pid=4243, ip=10.0.0.6)", "checkpoint-load"),
    # not-examples: a task whose method holds several phases, a Ray log prefix, no task at all
    ("ray::WorkerDict.actor_rollout_update_actor() (pid=4242, ip=10.0.0.5)", None),
    ("(WorkerDict pid=4242, ip=10.0.0.5) step 3: loss 0.5", None),
    ("(raylet) A worker died or was killed while executing a task by an unexpected system error.", None),
    ("ray::IDLE", None),
])
def test_the_ray_task_that_failed(text, want):
    assert phase_from_task(text) == want


def test_phase_hint_tries_the_task_then_the_collective_then_the_markers():
    setup = ["Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2"]
    task = "ray::WorkerDict.actor_rollout_save_checkpoint() (pid=4242, ip=10.0.0.5)"
    assert phase_hint(task, setup) == ("checkpoint-save", "the Ray task that failed")
    timeout = WATCHDOG.format(r=1, seq=1, op="BROADCAST")
    assert phase_hint(timeout, setup) == ("init", "the collective it timed out in")
    gather = WATCHDOG.format(r=1, seq=900, op="_ALLGATHER_BASE")
    assert phase_hint(gather, [], sharded=True)[0] == "param-gather"
    assert phase_hint(gather, setup)[0] == "init"  # not sharded: the collective says nothing, the markers do
    assert phase_hint("Killed", setup) == ("init", "set-up lines before it, with no training progress after them")
    assert phase_hint("Killed", setup + ["{'loss': 1.5, 'grad_norm': 0.9, 'learning_rate': 1e-05, 'epoch': 0.1}"]) is None


def test_a_deepspeed_checkpoint_read_back_is_the_load_until_training_goes_on():
    # transformers integrations/deepspeed.py deepspeed_load_checkpoint, DeepSpeed engine.py
    # _get_all_zero_checkpoint_state_dicts / _load_zero_checkpoint (format strings filled in)
    resume = ["[INFO|deepspeed.py:449] 2026-12-02 10:00:01,000 >> Attempting to resume from out/checkpoint-40",
              "[2026-12-02 10:00:31,000] [INFO] [engine.py:4836:_get_all_zero_checkpoint_state_dicts] "
              "successfully read 4 ZeRO state_dicts for rank 2"]
    assert phase_before_failure(resume) == "checkpoint-load"
    assert phase_before_failure(resume[:1]) == "checkpoint-load"
    assert phase_before_failure(resume + ["  3%|▎         | 30/1000 [00:41<22:05,  1.37s/it]"]) is None  # resumed, training
    # not-examples: the source lines of the format strings, a script's own words
    assert phase_from_marker('        logger.info(f"successfully read {len(zero_optimizer_sd)} ZeRO state_dicts '
                             'for rank {self.global_rank}")') is None
    assert phase_from_marker('    logger.info(f"Attempting to resume from {checkpoint_path}")') is None
    assert phase_from_marker("read 4 state dicts for rank 2") is None


def test_survivors_stuck_in_different_collectives_name_no_phase_by_their_collective():
    from tests.offline.scoring import first_failure_of
    rs = WATCHDOG.format(r=3, seq=8813, op="_REDUCE_SCATTER_BASE") + "\n"
    ag = WATCHDOG.format(r=0, seq=8811, op="_ALLGATHER_BASE") + "\n"
    assert first_failure_of(rs)["phase"] == "backward"
    assert first_failure_of(ag + rs)["phase"] == "unknown"


def test_megatrons_async_checkpoint_writer_names_a_save():
    """FileSystemWriterAsync (megatron/core/dist_checkpointing/strategies/filesystem_async.py) writes only
    a save: its logger's name in Megatron's log format and its own words say so, the failure's line too."""
    failed = ("ERROR: megatron.core.dist_checkpointing.strategies.filesystem_async: Local process 0 encountered an "
              "error: [Errno 5] Input/output error")
    assert phase_from_marker(failed) == "checkpoint-save"
    assert phase_from_marker("FileSystemWriterAsync: collecting worker results...") == "checkpoint-save"
    assert phase_hint("OSError: [Errno 5] Input/output error", [failed]) == (
        "checkpoint-save", "lines of a save under way before it, with no training progress after them")
    assert phase_from_marker('            err_msg = f"An error is caught while a proc {i} is created, error: {e}"') is None
