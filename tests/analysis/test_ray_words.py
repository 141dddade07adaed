"""What a person's words add to a Ray-based trainer's failure (verl, OpenRLHF, ROLL): the class of
a worker death Ray could not explain, and the phase a title names by the worker method it failed
in. Lines are filled in from the format strings of Ray (node_manager.cc, exceptions.py) and
PyTorch (ProcessGroupNCCL.cpp); headings are made up."""

from __future__ import annotations

import pytest

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.phase import phase_from_task_words
from tests.offline.scoring import first_failure_of

CATALOG = load_catalog()

# src/ray/raylet/node_manager.cc: the WORKER_DIED error pushed to the driver (2.9-2.4x)
RAYLET_DIED = (
    "(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot "
    "the problem, check the logs for the dead worker. RayTask ID: 0f1e2d3c4b5a69788796a5b4c3d2e1f001000000 "
    "Worker ID: 5c9a1b2c Node ID: 3a4b5c6d Worker IP address: 10.0.0.5 Worker port: 10003 Worker PID: 24215 "
    "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. "
    "End of file. There are some potential root causes. (1) The process is killed by SIGKILL by OOM killer due "
    "to high memory usage. (2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV "
    "or other unexpected errors.\n")

# python/ray/exceptions.py ActorDiedError, with the GCS death cause of a worker that died
ACTOR_DIED = (
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: PolicyActor\n\tactor_id: 9f8e7d6c5b4a39281706f5e401000000\n\tpid: 40404\n"
    "\tnamespace: 0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d\n\tip: 10.0.0.7\n"
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
    "Worker unexpectedly exits with a connection error code 2. End of file.\n")




# ---------------------------------------------------------------------------------------------
# A death Ray could not explain takes its class from the text's words
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("heading, body", [
    ("# Rollout workers get OOM killed after 3 steps", RAYLET_DIED),
    ("# OOM", ACTOR_DIED),  # "OOM" of a process that died with no error of its own: it was killed
    ("# Workers die after fork: Cannot allocate memory", RAYLET_DIED),
])
def test_an_unexplained_ray_death_takes_host_memory_from_the_words(heading, body):
    ff = first_failure_of(heading + "\n```\n" + body + "```\n")
    assert (ff["signature"], ff["category"], ff["confidence"]) == ("ray.worker_died", "host-memory", "low")
    assert "text's words" in ff["evidence"][0]["linked_by"]


def test_words_that_put_the_oom_on_the_gpu_keep_it_there():
    ff = first_failure_of("# CUDA out of memory on 8 GPUs during generation\n```\n" + RAYLET_DIED + "```\n")
    assert (ff["signature"], ff["category"], ff["confidence"]) == ("ray.worker_died", "gpu-memory", "low")


@pytest.mark.parametrize("text", [
    RAYLET_DIED,  # Ray's list of possible causes is no finding (62-ray.toml)
    "# worker process died after the first epoch\n```\n" + RAYLET_DIED + "```\n",  # words naming no class
])
def test_an_unexplained_ray_death_without_such_words_stays_unknown(text):
    ff = first_failure_of(text)
    assert (ff["signature"], ff["category"]) == ("ray.worker_died", "unknown")
    assert ff["confidence"] == "medium"


@pytest.mark.parametrize("words, category", [
    ("Some tasks have been OOM Killed", "host-memory"),
    ("the oom-kill counter went up", "host-memory"),
    ("Invoked the OOM killer twice", "host-memory"),
    ("OOM when the sequence length is 700k", "gpu-memory"),  # unchanged: no kill named
])
def test_an_oom_kill_in_words_is_host_memory(words, category):
    assert CATALOG.category_of(words, "unknown") == category


# ---------------------------------------------------------------------------------------------
# The worker method a title names gives the phase where no line says it
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, phase", [
    ("a timeout in ray::WorkerDict.critic_init_model on 4 nodes", "init"),
    ("compute_log_prob dies with an NCCL timeout", "forward"),
    ("hang in ray::WorkerDict.actor_rollout_generate_sequences()", "forward"),
    ("OpenRLHF save_model fails on 2 nodes", "checkpoint-save"),
    ("error in LLMRayActor.__init__", "init"),
])
def test_a_worker_method_named_in_words_gives_its_phase(text, phase):
    assert phase_from_task_words(text) == phase


@pytest.mark.parametrize("text", [
    "NCCL timeout in update_actor at step 40",  # a method no task rule names
    "error while initializing the model",  # words, not the method's identifier
    "compute_log_probability_v2 crashed",  # another identifier that merely starts like one
    "crash between init_model and compute_log_prob",  # two phases: no answer
])
def test_no_phase_from_words_that_name_no_one_method(text):
    assert phase_from_task_words(text) is None


def test_every_task_rule_method_is_a_needle_of_the_task_mention():
    from firstfault.analysis.phase import rules
    needles = set(CATALOG.get("text.task_failure_mention").needles)
    assert {m for r in rules().tasks for m in r.methods} <= needles


WATCHDOG = (
    "(WorkerDict pid=7001, ip=10.0.0.5) [rank1]:[E0611 09:15:02.118400022 ProcessGroupNCCL.cpp:632] [Rank 1] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, "
    "Timeout(ms)=600000) ran for 600310 milliseconds before timing out.\n")


def test_a_hang_takes_the_phase_of_the_task_its_title_names():
    ff = first_failure_of("# NCCL timeout in ray::WorkerDict.actor_rollout_compute_log_prob after 20 steps\n```\n"
               + WATCHDOG + "```\n")
    assert ff["signature"] == "hang.stopped_first"
    assert ff["phase"] == "forward" and "title" in ff["phase_from"]


def test_a_hang_whose_title_names_no_task_keeps_its_unknown_phase():
    ff = first_failure_of("# NCCL timeout after 20 steps\n```\n" + WATCHDOG + "```\n")
    assert ff["signature"] == "hang.stopped_first" and ff["phase"] == "unknown"


# python/ray/exceptions.py RayTaskError: "ray::TaskRunner.run() (pid=..., ip=...)" with the remote
# traceback after it, cut here before the wrapped exception's own line
DRIVER_CUT = """\
Traceback (most recent call last):
  File "/app/main_ppo.py", line 41, in run_ppo
    ray.get(runner.run.remote(config))
  File "/usr/lib/python3.10/site-packages/ray/_private/worker.py", line 929, in get_objects
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(RuntimeError): ray::TaskRunner.run() (pid=11272, ip=10.0.0.5, actor_id=f6e8, repr=<main_ppo.TaskRunner object at 0x7ef9>)
  File "/app/main_ppo.py", line 149, in run
    trainer.fit()
"""


def test_a_failure_with_no_phase_of_its_own_takes_the_phase_its_title_names():
    ff = first_failure_of("# FSDP2 run fails while saving the checkpoint\n\n" + DRIVER_CUT)
    assert ff["phase"] == "checkpoint-save" and "title" in ff["phase_from"]


def test_a_failure_whose_frames_say_the_phase_keeps_it():
    frames = DRIVER_CUT + ('  File "/usr/lib/python3.10/site-packages/torch/_tensor.py", line 525, in backward\n'
                           "    torch.autograd.backward(\nRuntimeError: Function 'MulBackward0' returned nan values\n")
    ff = first_failure_of("# FSDP2 run fails while saving the checkpoint\n\n" + frames)
    assert ff["phase"] == "backward" and ff["phase_from"] == "frames"


# ---------------------------------------------------------------------------------------------
# A death Ray could not explain, printed after a collective timeout, is the watchdog's doing
# ---------------------------------------------------------------------------------------------

def test_an_unexplained_ray_death_after_a_collective_timeout_is_a_cascade():
    ff = first_failure_of("```\n" + WATCHDOG + RAYLET_DIED + "```\n")
    assert ff["signature"] == "hang.stopped_first" and ff["category"] == "cascade"


def test_an_unexplained_ray_death_before_any_timeout_stays_the_failure():
    ff = first_failure_of("```\n" + RAYLET_DIED + WATCHDOG + "```\n")
    assert (ff["signature"], ff["category"]) == ("ray.worker_died", "unknown")


# ---------------------------------------------------------------------------------------------
# A RayTaskError whose remote traceback is cut before the worker's exception line
# ---------------------------------------------------------------------------------------------

DRIVER_OOM_CUT = DRIVER_CUT.replace("RayTaskError(RuntimeError)", "RayTaskError(OutOfMemoryError)")


@pytest.mark.parametrize("text, signature", [
    (DRIVER_CUT, "ray.task_error_unresolved"),
    (DRIVER_CUT + '  File "/app/ray_trai', "ray.task_error_unresolved"),  # cut inside a frame line
    (DRIVER_OOM_CUT, "ray.task_oom_unresolved"),
    (DRIVER_CUT.split("\n", 1)[1], "ray.task_error_unresolved"),  # the paste starts below the header too
    (DRIVER_CUT.split("\n", 1)[1].replace("RayTaskError(RuntimeError)", "RayTaskError(DistBackendError)"),
     "ray.task_error_unresolved"),
])
def test_a_ray_task_error_cut_inside_its_remote_traceback_is_unresolved(text, signature):
    ff = first_failure_of(text)
    assert ff["signature"] == signature and ff["category"] == "unknown"


def test_a_headerless_ray_task_error_with_the_workers_exception_line_is_that_exception():
    ff = first_failure_of(DRIVER_CUT.split("\n", 1)[1] + "ValueError: prompt too long for max_prompt_length=512\n")
    assert (ff["signature"], ff["category"]) == ("python.exception", "user-code")


def test_a_ray_task_error_with_the_workers_exception_line_is_that_exception():
    ff = first_failure_of(DRIVER_OOM_CUT + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
               "total capacity of 79.10 GiB of which 1.02 GiB is free.\n")
    assert (ff["signature"], ff["category"]) == ("cuda.oom", "gpu-memory")


# ---------------------------------------------------------------------------------------------
# A RayTaskError that carries an actor's death (ActorDiedError, WorkerCrashedError) and ends there
# ---------------------------------------------------------------------------------------------

DRIVER_ACTOR_DIED = DRIVER_CUT.replace("RayTaskError(RuntimeError)", "RayTaskError(ActorDiedError)")


def test_a_carried_actor_death_after_a_collective_timeout_is_a_cascade():
    ff = first_failure_of("```\n" + WATCHDOG + "```\n" + DRIVER_ACTOR_DIED)
    assert (ff["signature"], ff["category"]) == ("hang.stopped_first", "cascade")


def test_a_carried_actor_death_alone_is_an_unexplained_death():
    ff = first_failure_of(DRIVER_ACTOR_DIED)
    assert (ff["signature"], ff["category"]) == ("ray.task_actor_died", "unknown")
    assert ff["confidence"] != "high"


def test_a_carried_actor_death_told_in_full_is_the_worker_death_it_tells():
    ff = first_failure_of(DRIVER_ACTOR_DIED.rsplit("\n  File", 1)[0] + "\n" + ACTOR_DIED)
    assert ff["signature"] == "ray.worker_died"


# ---------------------------------------------------------------------------------------------
# The failing actor's rank in the RayTaskError's header: its repr (NeMo-RL: "Class[rank=N]")
# ---------------------------------------------------------------------------------------------

RANKED_REPR = "repr=MegatronPolicyWorker[rank=3])"


@pytest.mark.parametrize("text", [
    DRIVER_CUT.replace("repr=<main_ppo.TaskRunner object at 0x7ef9>)", RANKED_REPR),
    DRIVER_ACTOR_DIED.replace("repr=<main_ppo.TaskRunner object at 0x7ef9>)", RANKED_REPR),
    DRIVER_CUT.replace("repr=<main_ppo.TaskRunner object at 0x7ef9>)", RANKED_REPR).split("\n", 1)[1],
])
def test_the_failing_actor_s_repr_names_its_rank(text):
    assert first_failure_of(text)["rank"] == 3


def test_a_repr_without_a_rank_names_none():
    assert first_failure_of(DRIVER_CUT)["rank"] is None


def test_a_plain_ray_task_error_carries_the_worker_s_failure():
    """Ray raises the plain RayTaskError where it could not subclass the cause's class: the line says
    which actor failed, not what failed."""
    text = DRIVER_CUT.replace("RayTaskError(RuntimeError)", "RayTaskError").replace(
        "repr=<main_ppo.TaskRunner object at 0x7ef9>)", RANKED_REPR)
    ff = first_failure_of(text.split("\n  File \"/app/main_ppo.py\", line 149")[0] + "\n")
    assert (ff["signature"], ff["category"], ff["rank"]) == ("ray.task_error_unwrapped", "unknown", 3)
    assert ff["confidence"] != "high"


# ---------------------------------------------------------------------------------------------
# Ray Train's word on which worker died: "Worker N has failed." (train/_internal/utils.py)
# ---------------------------------------------------------------------------------------------

def test_ray_train_s_failed_worker_names_the_rank_of_an_unexplained_death():
    ff = first_failure_of(RAYLET_DIED + "(TorchTrainer pid=89392) Worker 2 has failed.\n")
    assert (ff["signature"], ff["rank"]) == ("ray.worker_died", 2)
    assert ff["confidence"] != "high"


def test_two_failed_workers_name_no_one_rank():
    ff = first_failure_of(RAYLET_DIED + "(TorchTrainer pid=89392) Worker 2 has failed.\n"
                                        "(TorchTrainer pid=89392) Worker 5 has failed.\n")
    assert ff["signature"] == "ray.worker_died" and ff["rank"] is None


def test_a_failure_with_its_own_rank_keeps_it():
    text = ("(RayTrainWorker pid=5, ip=10.0.0.5) [rank1]: Traceback (most recent call last):\n"
            "(RayTrainWorker pid=5, ip=10.0.0.5) [rank1]:   File \"/app/train.py\", line 40, in train_func\n"
            "(RayTrainWorker pid=5, ip=10.0.0.5) [rank1]:     batch = next(it)\n"
            "(RayTrainWorker pid=5, ip=10.0.0.5) [rank1]: KeyError: 'pixel_values'\n"
            "(TorchTrainer pid=89392) Worker 4 has failed.\n")
    ff = first_failure_of(text)
    assert (ff["rank"], ff["category"]) == (1, "user-code")


# ---------------------------------------------------------------------------------------------
# A vLLM rollout worker's failed method (vllm/worker/worker_base.py execute_method)
# ---------------------------------------------------------------------------------------------

VLLM_HEAD = "(RayWorkerWrapper pid=22792, ip=10.0.0.5) ERROR 12-08 10:40:08 worker_base.py:467] "
VLLM_FAILED = (VLLM_HEAD + "Error executing method determine_num_available_blocks. This might cause deadlock in "
               "distributed execution.\n")
VLLM_TRACE = "".join(VLLM_HEAD + ln + "\n" for ln in [
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3/site-packages/vllm/worker/worker_base.py", line 459, in execute_method',
    "    return executor(*args, **kwargs)",
    '  File "/usr/lib/python3/site-packages/vllm/worker/worker.py", line 173, in determine_num_available_blocks',
    "    self.model_runner.profile_run()",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB "
    "of which 1.02 GiB is free."])


def test_a_vllm_worker_s_failed_method_with_its_traceback_is_that_traceback_s_exception():
    ff = first_failure_of(VLLM_FAILED + VLLM_TRACE)
    assert (ff["signature"], ff["category"], ff["phase"]) == ("cuda.oom", "gpu-memory", "init")


def test_a_vllm_worker_s_failed_method_alone_is_a_failure_of_unknown_kind():
    ff = first_failure_of(VLLM_FAILED)
    assert (ff["signature"], ff["category"]) == ("vllm.worker_method_failed", "unknown")
    assert ff["confidence"] == "low"


# ---------------------------------------------------------------------------------------------
# Ray's task header in place of a remote traceback's "Traceback (most recent call last):"
# (python/ray/exceptions.py RayTaskError.__str__): the task and actor it names are the frames'
# ---------------------------------------------------------------------------------------------

REMOTE_CUT = """\
  File "/app/nemo_rl/models/policy/workers/dtensor_policy_worker_v2.py", line 653, in get_logprobs
    token_logprobs = self._forward(batch)
  File "/app/nemo_rl/models/policy/workers/dtensor_policy_worker_v2.py", line 610, in _forward
    logits = self.model(input_ids).logits
"""
# frames that name no phase of their own: the task's header says it
REMOTE_SAVE_CUT = """\
  File "/app/verl/single_controller/base/decorator.py", line 540, in inner
    return func(*args, **kwargs)
  File "/app/verl/utils/fs.py", line 88, in copy_to_local
    shutil.copytree(src, dst)
"""


@pytest.mark.parametrize("header, rank, phase", [
    ("ray.exceptions.RayTaskError(OutOfMemoryError): ray::DTensorPolicyWorkerV2.get_logprobs() (pid=2671339, "
     "ip=10.0.0.5, actor_id=d583, repr=DTensorPolicyWorkerV2[rank=2])", 2, "forward"),
    ("(TaskRunner pid=281) Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): "
     "ray::WorkerDict.actor_rollout_save_checkpoint() (pid=2826850, ip=10.0.0.7, actor_id=743d, "
     "repr=<verl.single_controller.ray.base.WorkerDict object at 0x7f1c>)", None, "checkpoint-save"),
])
def test_the_task_header_above_a_remote_traceback_names_its_rank_and_phase(header, rank, phase):
    body = REMOTE_CUT if header.startswith("ray.") else "".join("(TaskRunner pid=281) " + ln + "\n"
                                                                 for ln in REMOTE_SAVE_CUT.splitlines())
    ff = first_failure_of(header + "\n" + body)
    assert (ff["rank"], ff["phase"]) == (rank, phase)


def test_verl_s_batch_that_does_not_split_among_its_workers_is_config():
    """verl/protocol.py DataProto.chunk asserts the batch divides among the worker group it dispatches to,
    raised in verl's own code: the sizes are the user's settings, not verl's defect."""
    text = ('Traceback (most recent call last):\n  File "/app/verl/trainer/main_ppo.py", line 64, in main\n'
            "    run_ppo(config)\n"
            '  File "/env/lib/python3.10/site-packages/verl/single_controller/ray/base.py", line 42, in func\n'
            "    args, kwargs = dispatch_fn(self, *args, **kwargs)\n"
            '  File "/env/lib/python3.10/site-packages/verl/protocol.py", line 520, in chunk\n'
            "    assert len(self) % chunks == 0, (\n"
            "AssertionError: only support equal chunk. Got size of DataProto 512 and chunk 6.\n")
    ff = first_failure_of(text)
    assert (ff["signature"], ff["category"]) == ("verl.unequal_chunk", "config")


def test_an_oom_kill_after_verl_s_ranks_began_writing_their_shards_is_in_the_save():
    """verl's checkpoint manager prints "[rank-N]: Saving model to ..." per rank before writing its shard, and no
    line at its end: Ray's OOM kill right after them came during the save."""
    saving = ("(WorkerDict pid=15039) [rank-6]: Saving model to /ckpt/global_step_50/actor/model_world_size_8_rank_6.pt\n"
              "(WorkerDict pid=15039) [rank-6]: Saving checkpoint to /ckpt/global_step_50/actor/model_world_size_8_rank_6.pt\n")
    killed = ("(raylet) [2025-03-01 16:18:15,116 E 2687 2687] (raylet) node_manager.cc:3069: 2 Workers (tasks / actors) "
              "killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: c157, "
              "IP: 10.0.0.5) over the last time period.\n")
    ff = first_failure_of(saving + killed)
    assert (ff["category"], ff["phase"]) == ("host-memory", "checkpoint-save")
    assert first_failure_of(killed)["phase"] == "unknown"


@pytest.mark.parametrize("title, category", [
    ("# compute_log_probs(logits, tokens) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 58.15 GiB.",
     "gpu-memory"),
    ("# OOM after 20 steps of PPO", "host-memory"),  # no GPU in the words: Ray's own OutOfMemoryError (its monitor)
    ("# NCCL timeout after 20 steps", "unknown"),  # words of no memory say nothing of which memory
])
def test_which_memory_a_cut_ray_oom_was_comes_from_words_about_memory(title, category):
    """RayTaskError(OutOfMemoryError) wraps torch's (GPU) and Ray's own (host) alike: the words may say which."""
    ff = first_failure_of(title + "\n" + DRIVER_OOM_CUT)
    assert (ff["signature"], ff["category"], ff["confidence"]) == ("ray.task_oom_unresolved", category, "low")


def test_a_title_quoting_the_failure_with_its_call_gives_the_phase():
    ff = first_failure_of("# compute_log_probs(logits, tokens) torch.OutOfMemoryError: CUDA out of memory. Tried to "
                          "allocate 58.15 GiB.\n" + DRIVER_OOM_CUT)
    assert ff["phase"] == "forward" and "title" in ff["phase_from"]


def _driver(lines: list[str]) -> str:
    return "".join(f"(TaskRunner pid=281) {ln}\n" for ln in lines)


OOM_THEN_NEXT_REPORT = [
    '  File "/env/lib/python3.10/site-packages/torch/nn/functional.py", line 1888, in softmax',
    "    ret = input.softmax(dim)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 5.22 GiB. GPU 0 has a total capacity of 23.69 GiB "
    "of which 1.18 GiB is free.",
    "Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): ray::WorkerDict.actor_rollout_generate_sequences()"
    " (pid=2396579, ip=10.0.0.3, actor_id=9264, repr=<verl.single_controller.ray.base.WorkerDict object at 0x7f5b>)",
    '  File "/app/verl/single_controller/ray/base.py", line 399, in func',
    "    return getattr(self.worker_dict[key], name)(*args, **kwargs)",
]


def test_an_error_whose_task_header_was_cut_takes_the_task_its_stream_reports_next():
    """The exception's own task header is above the paste; right under it Ray reports the next worker's failure of
    the same group call (verl's workers run generate_sequences together): that task's phase, where nothing else
    says one."""
    ff = first_failure_of(_driver(OOM_THEN_NEXT_REPORT))
    assert (ff["signature"], ff["phase"]) == ("cuda.oom", "forward")
    # not an example: the task reported next is not read where the error's own frames say the phase
    own = OOM_THEN_NEXT_REPORT[:]
    own[0:0] = ['  File "/env/lib/python3.10/site-packages/deepspeed/runtime/engine.py", line 2010, in backward',
                "    self.optimizer.backward(loss)"]
    assert first_failure_of(_driver(own))["phase"] == "backward"
    # nor a task whose method no task rule knows
    odd = [ln.replace("actor_rollout_generate_sequences", "refresh_dashboard") for ln in OOM_THEN_NEXT_REPORT]
    assert first_failure_of(_driver(odd))["phase"] == "unknown"
