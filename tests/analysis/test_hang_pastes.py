"""Whole pasted logs, written from the frameworks' format strings, through ``analyze -``: what an
inferred hang, a failure named only in words, and a launcher's summary answer."""

from tests.offline.scoring import Case, analyze, first_failure_of

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
    got = first_failure_of(TWO_RUNS)
    assert got["inferred"] and got["rank"] is None and got["category"] == "cascade" and got["confidence"] == "low"


def test_ranks_below_the_one_that_timed_out_are_suspects_only():
    got = first_failure_of(ONE_SURVIVOR)
    assert got["inferred"] and got["rank"] is None and got["confidence"] == "low"
    assert got["suspects"] == [0, 1, 2] and got["category"] == "cascade"


def test_the_one_rank_that_timed_out_is_not_where_the_job_stopped():
    got = first_failure_of(RANK0_ONLY)
    assert got["inferred"] and got["rank"] is None and got["confidence"] == "low"


# ---- a failure named only in words (judge.named_in_words) ------------------------------------

# DeepSpeed runtime/zero/stage_1_and_2.py (logger.info "Rank: {} partition count {} and sizes{}") and a
# tqdm bar: training had started; the paste ends before any error line
OOM_TITLE = """\
# ZeRO-2 training runs out of memory after a few hundred steps: CUDA out of memory
[2026-03-02 10:11:12,001] [INFO] [stage_1_and_2.py:547:__init__] Rank: 0 partition count [2] and sizes[(7411712, False)]
[2026-03-02 10:11:12,002] [INFO] [stage_1_and_2.py:547:__init__] Rank: 1 partition count [2] and sizes[(7411712, False)]
  0%|          | 1/77212 [00:03<71:12:03,  3.32s/it]
"""

OOM_TITLE_AND_TIMEOUT = "# OOM on one GPU, then the others time out\n" + ONE_SURVIVOR.split("\n", 1)[1]

NO_FAILURE = """\
# How do I speed up ZeRO-2 training?
[2026-03-02 10:11:12,001] [INFO] [stage_1_and_2.py:547:__init__] Rank: 0 partition count [2] and sizes[(7411712, False)]
  0%|          | 1/77212 [00:03<71:12:03,  3.32s/it]
"""


def test_a_failure_named_in_a_title_when_the_log_is_cut_before_it():
    got = first_failure_of(OOM_TITLE)
    assert (got["category"], got["confidence"], got["rank"], got["inferred"]) == ("gpu-memory", "low", None, False)
    assert got["signature"] == "text.failure_mention" and "Confirm" in got["first_action"]
    assert "in words only" in got["evidence"][0]["linked_by"]


def test_words_naming_a_failure_beat_a_hang_that_names_no_rank():
    got = first_failure_of(OOM_TITLE_AND_TIMEOUT)
    assert (got["category"], got["confidence"], got["signature"]) == ("gpu-memory", "low", "text.failure_mention")


def test_no_words_of_a_failure_no_failure():
    assert first_failure_of(NO_FAILURE) is None


# ---- torchrun's ChildFailedError with its table cut (judge.exit_failure) ---------------------

# NCCL src/init.cc ("comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx commId 0x%llx - Init START"),
# torch/distributed/launcher/api.py launch_agent (raise ChildFailedError(...)) and
# elastic/multiprocessing/errors/__init__.py ChildFailedError.format_msg (2.x)
CHILD_FAILED_CUT = """\
[rank0]:node-a:3100:3170 [0] NCCL INFO ncclCommInitRankConfig comm 0x5a1e2c0 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 18000 commId 0x1f2e3d4c5b6a7980 - Init START
W0301 09:00:12.500000 3001 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 3101 closing signal SIGTERM
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 263, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
"""


def test_torchruns_child_failed_error_is_a_failure_even_when_its_table_is_cut():
    got = first_failure_of(CHILD_FAILED_CUT)
    assert (got["signature"], got["category"], got["confidence"], got["rank"]) == (
        "torchelastic.child_failed", "unknown", "low", None)
    assert got["phase"] == "init" and "set-up lines" in got["phase_from"]


# ---- a launcher stopping its workers is no hang (judge.launcher_stopped) ----------------------

# DeepSpeed launcher/launch.py sigkill_handler (logger.info(f"Killing subprocess {process.pid}")), called
# when a worker returned non-zero; transformers logging (logger.info "loading weights file ...")
DS_KILLED = """\
# Training several models in a row: the process gets killed
02/03/2026 03:17:08 - INFO - __main__ -     test_loss = 1.4941
loading weights file pytorch_model.bin from cache
[2026-02-03 03:17:53,592] [INFO] [launch.py:318:sigkill_handler] Killing subprocess 143917
[2026-02-03 03:17:53,593] [INFO] [launch.py:318:sigkill_handler] Killing subprocess 143918
"""


def test_a_launcher_killing_its_workers_is_a_worker_that_ended_not_a_hang():
    got = first_failure_of(DS_KILLED)
    assert not got["inferred"] and got["signature"] == "deepspeed.launcher_kill"
    assert (got["rank"], got["category"], got["confidence"]) == (None, "unknown", "low")
    assert "A worker ended" in got["summary"]


def test_the_launchers_kill_beside_a_timeout_is_still_a_hang():
    text = ONE_SURVIVOR + "[2026-02-03 03:17:53,592] [INFO] [launch.py:318:sigkill_handler] Killing subprocess 143917\n"
    got = first_failure_of(text)
    assert got["inferred"] and got["signature"] == "hang.stopped_first"


# ---- torchrun's Root Cause block names the rank among several that failed (verdict._with_exit_rank) ----

def _row(idx: int, rank: int, code: int, pid: int) -> str:
    # elastic/multiprocessing/errors/__init__.py _FAILURE_FORMAT_TEMPLATE (2.x)
    return (f"[{idx}]:\n  time      : 2026-03-05_07:01:51\n  host      : node-a\n"
            f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: {pid})\n"
            "  error_file: <N/A>\n  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n")


# a CUDA error no line ties to a rank (c10/cuda/CUDAException: "CUDA error: an illegal memory access was
# encountered"), then torchrun's ChildFailedError.format_msg with two failed ranks
UNRANKED = """\
Traceback (most recent call last):
  File "/w/train.py", line 88, in <module>
    loss.backward()
RuntimeError: CUDA error: an illegal memory access was encountered
"""


def _summary(other: tuple[int, int], root: tuple[int, int]) -> str:
    return ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 40 + "\ntrain.py FAILED\n"
            + "-" * 40 + "\nFailures:\n" + _row(1, *other, 701) + "-" * 40
            + "\nRoot Cause (first observed failure):\n" + _row(0, *root, 703) + "=" * 40 + "\n")


def test_the_root_cause_rank_among_several_failed_is_used_at_low():
    got = first_failure_of(UNRANKED + _summary((1, 1), (3, 1)))
    assert (got["rank"], got["confidence"]) == (3, "low") and "Root Cause" in got["rank_from"]
    assert got["signature"] != "python.traceback"  # the CUDA error, not the table


def test_two_agents_root_causes_that_disagree_name_no_rank():
    got = first_failure_of(UNRANKED + _summary((1, 1), (3, 1)) + _summary((5, 1), (6, 1)))
    assert got["rank"] is None


# ---- a heading that names the phase a job failed in (99-fallback's phase mentions) ------------

# DeepSpeed runtime/engine.py _load_checkpoint (logger.info "rank: {} loading checkpoint: {}"): the paste
# ends before the save its title says failed
SAVE_TITLE = """\
# save_checkpoint fails: one process exits during the save
[2026-01-06 12:08:42,985] [INFO] [engine.py:1348:_load_checkpoint] rank: 3 loading checkpoint: /ckpt/80000/mp_rank_01_model_states.pt
"""

SAVE_HANG = "# Multi GPU timeout on save checkpoint\n" + ONE_SURVIVOR.split("\n", 1)[1]

SAVE_QUESTION = """\
# How to save checkpoint every 500 steps
[2026-01-06 12:08:42,985] [INFO] [engine.py:1348:_load_checkpoint] rank: 3 loading checkpoint: /ckpt/80000/mp_rank_01_model_states.pt
"""


def test_a_title_naming_a_failed_save_is_the_answer_when_the_log_shows_none():
    got = first_failure_of(SAVE_TITLE)
    assert (got["phase"], got["category"], got["confidence"], got["rank"]) == ("checkpoint-save", "unknown", "low", None)


def test_a_hang_takes_its_phase_from_the_title_when_nothing_else_gives_one():
    got = first_failure_of(SAVE_HANG)
    assert got["inferred"] and got["phase"] == "checkpoint-save" and "title" in got["phase_from"]
    assert got["confidence"] == "low"


def test_a_hang_during_a_save_is_a_save_that_outlasted_the_timeout_inferred():
    got = analyze(Case("paste", ["-"], {}, stdin=SAVE_HANG.encode()))
    ff = got["first_failure"]
    assert (ff["category"], ff["confidence"], ff["inferred"]) == ("storage", "low", True)
    assert "saving a checkpoint" in ff["summary"] and "inferred" in ff["summary"]
    assert ff["first_action"].startswith("Time the save") and got["blame"] == "infrastructure"


def test_a_hang_outside_a_save_stays_a_cascade():
    ff = first_failure_of(ONE_SURVIVOR)
    assert ff["phase"] != "checkpoint-save" and ff["category"] == "cascade"


# torch/distributed/elastic/agent/server/api.py SimpleElasticAgent.run ("Received %s death signal, shutting
# down workers"): the launcher was stopped from outside during the save, so no save outlasted anything
SAVE_CANCELLED = SAVE_HANG + (
    "W0616 00:37:22.830000 4015698 torch/distributed/elastic/agent/server/api.py:719] "
    "Received Signals.SIGTERM death signal, shutting down workers\n")


def test_a_save_stopped_from_outside_is_not_blamed_on_storage():
    ff = first_failure_of(SAVE_CANCELLED)
    assert ff["killed_from_outside"] and ff["category"] != "storage"


def test_a_title_that_asks_how_to_save_is_no_failure():
    assert first_failure_of(SAVE_QUESTION) is None


# ---- a heading speaks of the whole log below it (failure_phase.before) ------------------------

# NCCL src/misc/socket.cc socketProgress (WARN "socketProgress: Connection closed by remote peer %s") in
# the title; transport/net.cc ("Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d") and
# transport/generic.cc ("Connected all rings") below it, with mpirun's [rank] prefix
PEER_TITLE = """\
# NCCL WARN socketProgress: Connection closed by remote peer gpu-b<51234>
[0] gpu-a:2001:2001 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
[1] gpu-b:3001:3001 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [receive] via NET/Socket/0
[1] gpu-b:3001:3001 [0] NCCL INFO Connected all rings
"""


def test_a_heading_over_set_up_lines_fails_in_init():
    got = first_failure_of(PEER_TITLE)
    assert got["phase"] == "init" and got["rank"] is None and got["confidence"] == "low"


# ---- a worker's exit status that says what kind of failure it was ---------------------------------

def _only_failure(code: int) -> str:
    """torchrun's ChildFailedError table (2.x) with one failed worker and nothing else of it."""
    return ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 40 + "\ntrain.py FAILED\n"
            + "-" * 40 + "\nFailures:\n  <NO_OTHER_FAILURES>\n" + "-" * 40
            + "\nRoot Cause (first observed failure):\n" + _row(0, 1, code, 703) + "=" * 40 + "\n")


def test_exit_status_2_alone_is_a_rejected_command_line_at_low():
    got = first_failure_of(_only_failure(2))
    assert (got["rank"], got["category"], got["confidence"], got["phase"]) == (1, "config", "low", "init")


def test_exit_status_1_alone_names_no_category():
    assert first_failure_of(_only_failure(1))["category"] == "unknown"


def test_words_that_name_a_class_beat_exit_status_2():
    got = first_failure_of("# CUDA out of memory on one rank\n" + _only_failure(2))
    assert got["category"] == "gpu-memory"


def test_a_failure_row_cut_before_its_pid_still_names_the_rank():
    """A paste that ends at the Root Cause row's "exitcode  : 1" (its "(pid: N)" cut off)."""
    got = first_failure_of(_only_failure(1).split(" (pid: 703)")[0] + "\n")
    assert (got["rank"], got["signature"]) == (1, "torchelastic.worker_failed")


# Two survivors of a peer that went away, each in DDP's gradient all-reduce under loss.backward():
# gloo's "Connection closed by peer" (third_party/gloo/gloo/transport/tcp/pair.cc) under the frames
# of torch/_tensor.py Tensor.backward and torch/autograd/__init__.py backward (1.10-2.x).
def _survivor(rank: int) -> str:
    return (f"[rank{rank}]: Traceback (most recent call last):\n"
            f"[rank{rank}]:   File \"/w/train.py\", line 88, in <module>\n"
            f"[rank{rank}]:     loss.backward()\n"
            f"[rank{rank}]:   File \"/env/lib/python3.10/site-packages/torch/_tensor.py\", line 307, in backward\n"
            f"[rank{rank}]:     torch.autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)\n"
            f"[rank{rank}]:   File \"/env/lib/python3.10/site-packages/torch/autograd/__init__.py\", line 156, in backward\n"
            f"[rank{rank}]:     allow_unreachable=True, accumulate_grad=True)\n"
            f"[rank{rank}]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed "
            f"by peer [10.0.0.{rank + 7}]:12717\n")


def test_a_hang_s_phase_is_the_step_its_survivors_tracebacks_waited_in():
    ff = first_failure_of(_survivor(0) + _survivor(1))
    assert (ff["category"], ff["phase"]) == ("cascade", "backward")
    assert ff["phase_from"] == "the survivors' tracebacks (where they waited)"


def test_survivors_in_different_steps_give_the_hang_no_phase():
    other = _survivor(1).replace("loss.backward()", "out = model(batch)").replace(
        "torch/_tensor.py\", line 307, in backward", "torch/nn/modules/module.py\", line 1501, in _call_impl")
    other = other.replace("torch/autograd/__init__.py\", line 156, in backward",
                          "torch/nn/parallel/distributed.py\", line 1040, in forward")
    ff = first_failure_of(_survivor(0) + other)
    assert ff["phase"] == "unknown"


# ProcessGroupNCCL's watchdog prints "Timeout at NCCL work: ..." only for a work that timed out: a paste
# that kept these lines and not the "Watchdog caught collective operation timeout" ones shows a hang
WORK_TIMEOUTS_ONLY = """\
[rank1]:[E1203 10:43:22.118000 2631 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 1] Timeout at NCCL work: 880, last enqueued NCCL work: 880, last completed NCCL work: 879.
[rank2]:[E1203 10:43:22.119000 2632 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 2] Timeout at NCCL work: 880, last enqueued NCCL work: 880, last completed NCCL work: 879.
[rank3]:[E1203 10:43:22.120000 2633 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 3] Timeout at NCCL work: 880, last enqueued NCCL work: 880, last completed NCCL work: 879.
"""


def test_the_watchdogs_work_timeout_lines_alone_are_a_hang_not_no_failure():
    ff = first_failure_of(WORK_TIMEOUTS_ONLY)
    assert ff is not None and ff["signature"] == "hang.stopped_first"
    assert ff["rank"] not in (1, 2, 3) and ff["confidence"] != "high"  # they waited: the one that did not is inferred


# accelerate accelerator.py save_state logs each model's and optimizer's save under FSDP or DeepSpeed
# ("Saving FSDP model", "Saving DeepSpeed Model and Optimizer") before the all-gather that writes it
ACCELERATE_SAVE_HANG = """INFO:accelerate.accelerator:Saving current state to /out/step_400
INFO:accelerate.accelerator:Saving FSDP model
[E ProcessGroupNCCL.cpp:828] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=18364, \
OpType=ALLGATHER, Timeout(ms)=4800000) ran for 4804648 milliseconds before timing out.
"""


def test_a_hang_after_accelerate_began_a_model_s_save_is_in_the_save():
    assert first_failure_of(ACCELERATE_SAVE_HANG)["phase"] == "checkpoint-save"
    alone = ACCELERATE_SAVE_HANG.replace("INFO:accelerate.accelerator:Saving current state to /out/step_400\n", "")
    assert first_failure_of(alone)["phase"] == "checkpoint-save"
    # not an example: the save's end, then training, before the ranks waited
    ended = ACCELERATE_SAVE_HANG.replace(
        "INFO:accelerate.accelerator:Saving FSDP model\n",
        "INFO:accelerate.accelerator:Saving FSDP model\nINFO:accelerate.checkpointing:Random states saved in "
        "/out/step_400/random_states_0.pkl\n")
    assert first_failure_of(ended)["phase"] != "checkpoint-save"


# A title quoting c10d's blocking-wait timeout (ProcessGroupNCCL.cpp WorkNCCL::checkTimeout: "Work WorkNCCL(...)
# timed out in blocking wait.", 2.1-2.9) over a survivor's traceback pasted without its exception line.
CUT_UNDER_A_TIMEOUT_TITLE = """\
# Work WorkNCCL(SeqNum=2521, OpType=ALLREDUCE, NumelIn=1606720, NumelOut=1606720, Timeout(ms)=600000) timed out in blocking wait.
[rank3]: Traceback (most recent call last):
[rank3]:   File "/w/train.py", line 1750, in main
[rank3]:     accelerator.backward(loss)
[rank3]:   File "/env/lib/python3.10/site-packages/accelerate/accelerator.py", line 2726, in backward
[rank3]:     self.deepspeed_engine_wrapped.backward(loss, sync_gradients=self.sync_gradients, **kwargs)
[rank3]:   File "/env/lib/python3.10/site-packages/deepspeed/runtime/engine.py", line 2323, in backward
[rank3]:     self._do_optimizer_backward(loss, retain_graph)
"""


def test_a_cut_traceback_under_a_title_quoting_a_timeout_is_the_timeout_s():
    ff = first_failure_of(CUT_UNDER_A_TIMEOUT_TITLE)
    assert (ff["category"], ff["confidence"]) == ("cascade", "low")
    assert "title" in ff["evidence"][0]["linked_by"]


def test_a_cut_traceback_under_a_title_naming_no_failure_keeps_its_owner_s_guess():
    ff = first_failure_of(CUT_UNDER_A_TIMEOUT_TITLE.replace(
        CUT_UNDER_A_TIMEOUT_TITLE.splitlines()[0], "# Training stops in the backward pass"))
    assert ff["category"] == "framework"


CUT_IN_LIGHTNING = """\
Traceback (most recent call last):
  File "/w/train.py", line 66, in main
    trainer.fit(model)
  File "/env/lib/python3.10/site-packages/lightning/pytorch/trainer/trainer.py", line 538, in fit
    call._call_and_handle_interrupt(
"""


def test_a_title_naming_a_failure_and_the_save_it_came_in_gives_both():
    """Words naming a phase and a failure keep both: the category from the failure's words, the phase from the
    save they name."""
    for title, category in (("# Cannot allocate memory while multinode checkpointing", "host-memory"),
                            ("# OOM when saving the model after training", "gpu-memory"),
                            ("# No disk space left while saving checkpoints", "storage")):
        ff = first_failure_of(title + "\n" + CUT_IN_LIGHTNING)
        assert (ff["category"], ff["phase"]) == (category, "checkpoint-save"), title
    ff = first_failure_of("# OOM with activation checkpointing enabled\n" + CUT_IN_LIGHTNING)
    assert (ff["category"], ff["phase"]) == ("gpu-memory", "unknown")


# accelerate's save_state start (accelerator.py: "Saving current state to {output_dir}"), then a survivor's watchdog
SAVING = "[rank1]:INFO:accelerate.accelerator:Saving current state to /out/step_400\n"
WAITED = ("[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL("
          "SeqNum=6075, OpType={op}, NumelIn=1366, NumelOut=4098, Timeout(ms)=1800000) ran for 1800084 milliseconds "
          "before timing out.\n")


def test_a_hang_in_a_save_by_the_collective_the_ranks_waited_in():
    """Untimed: the save under way is told by its start line. Waiting in an all-reduce or a barrier, the ranks waited
    for the writer (storage); in an all-gather they were inside the save's own gather, which a rank never entered."""
    got = first_failure_of(SAVING + WAITED.format(op="_ALLGATHER_BASE"))
    assert (got["category"], got["phase"], got["confidence"]) == ("user-code", "checkpoint-save", "low")
    got = first_failure_of(SAVING + WAITED.format(op="ALLREDUCE"))
    assert (got["category"], got["phase"], got["confidence"]) == ("storage", "checkpoint-save", "low")


def test_a_title_quoting_a_known_failure_names_a_cut_traceback_s_class():
    """transformers' get_chat_template refusal quoted in the title; the traceback below stops in the data's formatting."""
    ff = first_failure_of("# tokenizer.chat_template is not set and no template argument was passed\n" + CUT_IN_LIGHTNING)
    assert (ff["category"], ff["confidence"]) == ("config", "low")


def test_a_title_naming_the_model_it_was_loading_says_set_up():
    oom = ("RuntimeError: CUDA out of memory. Tried to allocate 162.00 MiB (GPU 2; 79.35 GiB total capacity; 77.00 GiB "
           "already allocated; 146.19 MiB free; 77.01 GiB reserved in total by PyTorch)\n")
    ff = first_failure_of("# cuda OOM on loading opt-66B\n" + oom)
    assert (ff["category"], ff["phase"]) == ("gpu-memory", "init") and "title" in ff["phase_from"]
    assert first_failure_of("# cuda OOM after loading data for 2 hours\n" + oom)["phase"] == "unknown"
