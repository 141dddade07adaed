"""Ray-based trainers (verl, OpenRLHF), Lightning, HF Trainer/accelerate, DeepSpeed's own messages
and numerics: the catalog's lines for them, written from the frameworks' format strings, their
near-misses, and small pasted logs run through the whole analysis.

Every line below is ours, filled in from a format string with made-up values (ids, pids, hosts)."""

from __future__ import annotations

import pytest

from firstfault.analysis.catalog import load_catalog
from tests.offline.scoring import first_failure_of

CATALOG = load_catalog()

# ray/exceptions.py ActorDiedError: the base message, then one tab-indented line per field it knows.
ACTOR_DIED = ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
              "\tclass_name: create_colocated_worker_cls.<locals>.WorkerDict\n"
              "\tactor_id: 4c3b2a1f0e9d8c7b6a59483701000000\n"
              "\tpid: {pid}\n"
              "\tname: XyZ9abWorkerDict_{pg}:{local}\n"
              "\tnamespace: 7d6c5b4a-3928-4716-a5b4-c3d2e1f0a9b8\n"
              "\tip: 10.1.2.3\n")
# gcs_actor_manager.cc GenWorkerDiedCause + the raylet's SYSTEM_ERROR detail (its list of possible causes)
SYSTEM_ERROR = ("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
                "detail: Worker unexpectedly exits with a connection error code 2. End of file. There are some "
                "potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. "
                "(2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other "
                "unexpected errors.")


# the driver's side of a remote failure, up to Ray's re-raise (ray/_private/worker.py get_objects)
DRIVER_TB = ("Traceback (most recent call last):\n"
             "  File \"/opt/verl/verl/trainer/main_ppo.py\", line 64, in main\n"
             "    run_ppo(config)\n"
             "  File \"/opt/venv/lib/python3.10/site-packages/ray/_private/worker.py\", line 873, in get_objects\n"
             "    raise value.as_instanceof_cause()\n")


def _match(text: str):
    m = CATALOG.match(text)
    assert m is not None, f"nothing matches {text!r}"
    return m


# (text, signature, role, category, groups that must be there)
LINES = [
    # Ray: who died and why, from Ray's own words
    (ACTOR_DIED.format(pid=5151, pg=0, local=2) + SYSTEM_ERROR, "ray.worker_died", "root", "unknown",
     {"pid": "5151", "rank": "2", "ip": "10.1.2.3", "exit_type": "SYSTEM_ERROR"}),
    (ACTOR_DIED.format(pid=5151, pg=0, local=2) + "The actor is dead because its worker process has died. Worker exit "
     "type: NODE_OUT_OF_MEMORY Worker exit detail: Task was killed due to the node running low on memory.",
     "ray.oom_killed", "root", "host-memory", {"pid": "5151", "rank": "2"}),
    (ACTOR_DIED.format(pid=5151, pg=0, local=4) + "The actor is dead because its node has died. Node Id: 11aa22bb33cc",
     "ray.node_dead", "root", "unknown", {"rank": "4", "ip": "10.1.2.3"}),
    (ACTOR_DIED.format(pid=5151, pg=0, local=1) + "The actor is dead because it was killed by `ray.kill`.",
     "ray.worker_exit_intended", "cascade", "cascade", {}),
    ("The actor is dead because all references to the actor were removed.", "ray.worker_exit_intended", "cascade",
     "cascade", {}),
    ("(raylet) Raylet is terminated. Termination is graceful.", "ray.worker_exit_intended", "cascade", "cascade", {}),
    ("(raylet) Raylet is terminated. Termination is unexpected. Possible reasons include: (1) SIGKILL by the user or "
     "system OOM killer, (2) Invalid memory access from Raylet causing SIGSEGV or SIGBUS, (3) Other termination "
     "signals. Last 20 lines of the Raylet logs:", "ray.raylet_died", "root", "unknown", {}),
    ("(raylet, ip=10.1.2.3) [2026-12-03 08:00:01,002 C 7001 7001] (raylet) node_manager.cc:2871: An unexpected "
     "system state has occurred. Check failed: lease_entry != nullptr", "ray.core_fatal", "root", "framework",
     {"component": "raylet", "where": "node_manager.cc:2871"}),
    ("ray.exceptions.OwnerDiedError: Failed to retrieve object 00aa. To see information about where this ObjectRef "
     "was created in Python, set the environment variable RAY_record_ref_creation_sites=1 during `ray start` and "
     "`ray.init()`.\n\nThe object's owner has exited. This is the Python worker that first created the ObjectRef via "
     "`.remote()` or `ray.put()`. Check cluster logs (`/tmp/ray/session_latest/logs`) for more information about "
     "the Python worker failure.", "ray.object_lost", "cascade", "cascade", {}),
    ("The local object store is full of objects that are still in scope and cannot be evicted. Tip: Use the `ray "
     "memory` command to list active objects in the cluster.", "ray.object_store_full", "root", "host-memory", {}),
    ("The object cannot be created because the local object store is full and the local disk's utilization is over "
     "capacity (95% by default).Tip: Use `df` on this node to check disk usage and `ray memory` to check object "
     "store memory usage.", "ray.out_of_disk", "root", "storage", {}),
    ("ray.exceptions.TaskUnschedulableError: The task is not schedulable: The node specified via "
     "NodeAffinitySchedulingStrategy doesn't exist any more or is infeasible, and soft=False was specified.",
     "ray.unschedulable", "root", "config", {"what": "task"}),
    ("(autoscaler +12s) Error: No available node types can fulfill resource request {'GPU': 16.0}. Add suitable node "
     "types to this cluster to resolve this issue.", "ray.unschedulable", "root", "config", {"detail": "{'GPU': 16.0}"}),
    ("(scheduler +40s) Warning: The following resource request cannot be scheduled right now: {'CPU': 1.0, 'GPU': "
     "1.0}. This is likely due to all cluster resources being claimed by actors. Consider creating fewer actors or "
     "adding more nodes to this Ray cluster.", "ray.resources_pending", "root", "config",
     {"request": "{'CPU': 1.0, 'GPU': 1.0}"}),
    # a remote error whose own traceback is cut: the wrapped class decides, except OutOfMemoryError (GPU or host)
    (DRIVER_TB + "ray.exceptions.RayTaskError(FileNotFoundError): ray::WorkerDict.actor_rollout_save_checkpoint() "
     "(pid=5151, ip=10.1.2.3)", "ray.task_error_unresolved", "root", "config", {"exc_type": "FileNotFoundError"}),
    (DRIVER_TB + "ray.exceptions.RayTaskError(DistBackendError): ray::TrainRayActor.async_train() (pid=5151, "
     "ip=10.1.2.3)", "ray.task_error_unresolved", "root", "unknown", {"pid": "5151"}),
    (DRIVER_TB + "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_update_actor() "
     "(pid=5151, ip=10.1.2.3)", "ray.task_oom_unresolved", "root", "unknown", {"pid": "5151"}),
    ("2026-12-03 08:00:01,002\tERROR serialization.py:533 -- Failed to unpickle serialized exception",
     "ray.exception_unpicklable", "root", "unknown", {}),
    ("ValueError: Total available GPUs 8.0 is less than total desired GPUs 16", "ray.unschedulable", "root", "config",
     {}),
    ("(raylet) [2026-12-03 08:00:01,002 E 3000 3000] (raylet) worker_pool.cc:589: Some workers of the worker "
     "process(44123) have not registered within the timeout. The process is dead, probably it crashed during start.",
     "ray.worker_register_timeout", "root", "config", {"pid": "44123", "state": "dead"}),
    # Lightning
    ("[rank: 2] Child process with PID 31337 terminated with code -9. Forcefully terminating all other processes to "
     "avoid zombies 🧟", "lightning.child_killed", "root", "unknown", {"pid": "31337", "exitcode": "-9"}),
    ("[rank: 2] Child process with PID 31337 terminated with code -15. Forcefully terminating all other processes to "
     "avoid zombies 🧟", "lightning.child_terminated", "cascade", "cascade", {"exitcode": "-15"}),
    ("[rank: 2] Child process with PID 31337 terminated with code 1. Forcefully terminating all other processes to "
     "avoid zombies 🧟", "lightning.child_failed", "context", "unknown", {"exitcode": "1"}),
    ("[rank: 1] Received SIGTERM: 15", "lightning.sigterm_received", "cascade", "cascade", {"death_signal": "15"}),
    ("RuntimeError: It looks like your LightningModule has parameters that were not used in producing the loss "
     "returned by training_step. If this is intentional, you must enable the detection of unused parameters in DDP, "
     "either by setting the string value `strategy='ddp_find_unused_parameters_true'` or by setting the flag in the "
     "strategy with `strategy=DDPStrategy(find_unused_parameters=True)`.", "lightning.unused_parameters", "root",
     "user-code", {}),
    ("RuntimeError: Lightning can't create new processes if CUDA is already initialized. Did you manually call "
     "`torch.cuda.*` functions, have moved the model to the device, or allocated memory on the GPU any other way? "
     "Please remove any such calls, or change the selected strategy.", "lightning.cuda_before_fork", "root", "config",
     {}),
    # transformers / accelerate / safetensors
    ("RuntimeError: Some tensors share memory, this will lead to duplicate memory on disk and potential differences "
     "when loading them again: [{'transformer.wte.weight', 'lm_head.weight'}].", "hf.shared_tensors_save", "root",
     "config", {"tensors": "[{'transformer.wte.weight', 'lm_head.weight'}]"}),
    ("ValueError: Asking to pad but the tokenizer does not have a padding token. Please select a token to use as "
     "`pad_token` `(tokenizer.pad_token = tokenizer.eos_token e.g.)` or add a new pad token via "
     "`tokenizer.add_special_tokens({'pad_token': '[PAD]'})`.", "hf.pad_token_missing", "root", "config", {}),
    ('ValueError: Trying to set a tensor of shape torch.Size([151936, 2048]) in "weight" (which has shape '
     'torch.Size([0])), this looks incorrect.', "accelerate.tensor_shape_mismatch", "root", "config",
     {"model_shape": "torch.Size([0])"}),
    ("RuntimeError: 'weight' must be 2-D", "torch.embedding_not_2d", "root", "user-code", {}),
    ("ValueError: The global train batch size (7 x 1) must be evenly divisible by the number of generations per "
     "prompt (8). Given the current train batch size, the valid values for the number of generations are: [7].",
     "trl.grpo_generations_batch", "root", "config", {"processes": "7", "generations": "8"}),
    ("ValueError: When using `deepspeed_config_file`, the following accelerate config variables will be ignored: "
     "['gradient_accumulation_steps', 'zero_stage'].", "accelerate.prepare_config", "root", "config", {}),
    # DeepSpeed's own messages
    ("deepspeed.runtime.zero.utils.ZeRORuntimeException: The checkpoint being loaded used a DP world size of 4 but "
     "the current world size is 2. Automatic adjustment of ZeRO's optimizer state partitioning with a new world "
     "size is not currently supported.", "deepspeed.zero_dp_world_size_changed", "root", "config",
     {"ckpt_dp": "4", "dp": "2"}),
    ("AttributeError: 'DeepSpeedCPUAdam' object has no attribute 'ds_opt_adam'", "deepspeed.cpu_adam_unbuilt", "root",
     "config", {"optimizer": "DeepSpeedCPUAdam"}),
    ("ValueError: [deepspeed] failed to resume from checkpoint /ckpt/run7/checkpoint-1200", "deepspeed.resume_failed",
     "root", "config", {"path": "/ckpt/run7/checkpoint-1200"}),
    ("[2026-12-03 08:00:01,002] [WARNING] [engine.py:2957:load_checkpoint] Unable to find latest file at "
     "/ckpt/run7/checkpoint-1200/latest, if trying to load latest checkpoint please ensure this file exists or pass an "
     "explicit checkpoint tag when loading a checkpoint.", "deepspeed.latest_file_missing", "context", "unknown",
     {"path": "/ckpt/run7/checkpoint-1200/latest"}),
    ("RuntimeError: Unable to proceed, no GPU resources available", "deepspeed.no_gpu", "root", "config", {}),
    ("[2026-12-03 08:00:01,002] [WARNING] [stage3.py:2117:step] 2 pytorch allocator cache flushes since last step. "
     "this happens when there is high memory pressure and is detrimental to performance.",
     "deepspeed.allocator_flushes", "context", "gpu-memory", {"flushes": "2"}),
    # numerics
    ("RuntimeError: probability tensor contains either `inf`, `nan` or element < 0", "torch.multinomial_invalid",
     "root", "numerics", {}),
    ("ValueError: Expected parameter loc (Tensor of shape (64, 4)) of distribution Normal(loc: torch.Size([64, 4]), "
     "scale: torch.Size([64, 4])) to satisfy the constraint Real(), but found invalid values:",
     "torch.distribution_invalid", "root", "numerics", {"param": "loc", "dist": "Normal"}),
    (" iteration     1200/  100000 | consumed samples:       614400 | lm loss: 9.87E+00 | loss scale: 1.0 | number of "
     "skipped iterations:   5 | number of nan iterations:   5 |", "megatron.nan_iterations", "root", "numerics",
     {"count": "5"}),
    ("FloatingPointError: gradients are Nan/Inf", "fairseq.gradients_nonfinite", "root", "numerics", {}),
    ("step:57 - actor/pg_loss:nan - actor/grad_norm:nan - critic/score/mean:0.41", "numerics.nan_loss", "root",
     "numerics", {}),
]


@pytest.mark.parametrize("text,sig,role,category,groups", LINES, ids=[x[1] + f"[{i}]" for i, x in enumerate(LINES)])
def test_format_lines(text, sig, role, category, groups):
    m = _match(text)
    assert (m.signature.id, m.role, m.category) == (sig, role, category)
    for k, v in groups.items():
        assert m.groups.get(k) == v, (k, m.groups)


def test_verl_actor_name_is_a_rank_only_in_placement_group_zero():
    """verl names an actor <prefix><Class>_<pg>:<local_rank>: in placement group 0 the local rank is the global
    one; in a later group the sizes before it are unknown, so no rank is taken."""
    later = _match(ACTOR_DIED.format(pid=5151, pg=1, local=2) + SYSTEM_ERROR)
    assert later.signature.id == "ray.worker_died" and "rank" not in later.groups
    assert later.groups["pid"] == "5151"


# (text, signatures it must not match)
NOT = [
    # Ray's list of possible causes names the OOM killer: it is not evidence of one
    ("(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot the "
     "problem, check the logs for the dead worker. RayTask ID: ffff01 Worker ID: 5a99 Node ID: 1537 Worker IP address: "
     "10.1.2.3 Worker port: 4228 Worker PID: 5151 Worker exit type: SYSTEM_ERROR Worker exit detail: Worker "
     "unexpectedly exits with a connection error code 2. End of file. There are some potential root causes. (1) The "
     "process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is called. (3) The "
     "worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.", ("ray.oom_killed",)),
    (ACTOR_DIED.format(pid=5151, pg=0, local=2) + SYSTEM_ERROR, ("ray.oom_killed", "ray.node_dead")),
    ("(raylet) Raylet is terminated. Termination is graceful.", ("ray.raylet_died",)),
    ("F1203 08:00:01.002000 7001 other.cc:12] Check failed: n > 0", ("ray.core_fatal",)),
    ("[2026-12-03 08:00:01,002 W 7001 7001] (raylet) node_manager.cc:12: Check failed: warnings are not fatal",
     ("ray.core_fatal",)),
    ("[rank: 2] Child process with PID 31337 terminated with code 1. Forcefully terminating all other processes to "
     "avoid zombies 🧟", ("lightning.child_killed", "lightning.child_terminated")),
    ("[rank: 2] Child process with PID 31337 terminated with code -15. Forcefully terminating all other processes to "
     "avoid zombies 🧟", ("lightning.child_killed",)),
    # a recovering fp16 overflow is context, never a numerics root
    ("[2026-12-03 08:00:01,002] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
     "Attempted loss scale: 65536, reducing to 32768", ("fp16.loss_scale_floor", "numerics.nan_loss")),
    (" iteration      100/  100000 | lm loss: 9.87E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number "
     "of nan iterations:   0 |", ("megatron.nan_iterations", "numerics.nan_loss")),
    ("    raise FloatingPointError(\"gradients are Nan/Inf\")", ("fairseq.gradients_nonfinite",)),
    ("  TORCH_CHECK(weight.dim() == 2, \"'weight' must be 2-D\");", ("torch.embedding_not_2d",)),
]


@pytest.mark.parametrize("text,forbidden", NOT, ids=[f"not[{i}]" for i in range(len(NOT))])
def test_near_misses(text, forbidden):
    m = CATALOG.match(text)
    assert m is None or m.signature.id not in forbidden, (text, m.signature.id)


def test_the_megatron_progress_line_with_nan_iterations_is_not_progress():
    line = (" iteration     1200/  100000 | lm loss: 9.87E+00 | loss scale: 1.0 | number of skipped iterations:   5 | "
            "number of nan iterations:   5 |")
    assert _match(line).signature.id == "megatron.nan_iterations"
    healthy = line.replace("   5 |", "   0 |")
    assert _match(healthy).signature.id == "training.step_progress"


# --- whole pasted logs through the analysis -----------------------------------------------------------------------



VERL_DEATH = """\
(TaskRunner pid=2000) step:11 - actor/pg_loss:0.021 - actor/grad_norm:0.310 - critic/score/mean:0.52
(WorkerDict pid=5151, ip=10.1.2.3) INFO 12-03 08:00:00 model_runner.py:1041] Capturing cudagraphs for decoding.
(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot the \
problem, check the logs for the dead worker. RayTask ID: ffffffffffffffff4c3b2a1f0e9d8c7b6a59483701000000 Worker ID: \
8e7d Node ID: 9c8b Worker IP address: 10.1.2.3 Worker port: 40111 Worker PID: 5151 Worker exit type: SYSTEM_ERROR \
Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. There are some potential \
root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is \
called. (3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.
Error executing job with overrides: ['trainer.n_gpus_per_node=8']
Traceback (most recent call last):
  File "/opt/verl/verl/trainer/main_ppo.py", line 64, in main
    run_ppo(config)
  File "/opt/venv/lib/python3.10/site-packages/ray/_private/worker.py", line 2661, in get
    values, debugger_breakpoint = worker.get_objects(object_refs, timeout=timeout)
  File "/opt/venv/lib/python3.10/site-packages/ray/_private/worker.py", line 873, in get_objects
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(ActorDiedError): ray::TaskRunner.run() (pid=2000, ip=10.1.2.3, actor_id=aa11)
  File "/opt/verl/verl/trainer/ppo/ray_trainer.py", line 1012, in fit
    gen_batch_output = self.actor_rollout_wg.generate_sequences(gen_batch)
  File "/opt/verl/verl/single_controller/ray/base.py", line 42, in func
    output = ray.get(output)
""" + ACTOR_DIED.format(pid=5151, pg=0, local=2) + SYSTEM_ERROR + "\n"


def test_verl_worker_death_names_the_rank_and_not_an_oom():
    ff = first_failure_of(VERL_DEATH)
    assert ff is not None
    assert ff["rank"] == 2  # WorkerDict_0:2
    assert ff["category"] != "host-memory"  # Ray's list of possible causes is not a finding
    assert ff["confidence"] != "high"


def test_ray_memory_monitor_kill_is_host_memory_on_the_named_rank():
    text = (
        "(raylet) [2026-12-03 08:00:05,100 E 3000 3000] (raylet) node_manager.cc:3069: 1 Workers (tasks / actors) "
        "killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 9c8b7a, IP: "
        "10.1.2.3) over the last time period.\n"
        + ACTOR_DIED.format(pid=5151, pg=0, local=3)
        + "The actor is dead because its worker process has died. Worker exit type: NODE_OUT_OF_MEMORY Worker exit "
        "detail: Task was killed due to the node running low on memory.\n")
    ff = first_failure_of(text)
    assert ff["category"] == "host-memory"
    assert ff["signature"] == "ray.oom_killed"


def test_rl_rollout_sampling_nan_is_numerics_in_forward():
    text = """\
Traceback (most recent call last):
  File "/opt/verl/verl/trainer/main_ppo.py", line 64, in main
    run_ppo(config)
  File "/opt/venv/lib/python3.10/site-packages/ray/_private/worker.py", line 873, in get_objects
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(RuntimeError): ray::WorkerDict.actor_rollout_generate_sequences() (pid=5151, \
ip=10.1.2.3, actor_id=bb22, repr=<verl.single_controller.ray.base.WorkerDict object at 0x7f00aa>)
  File "/opt/verl/verl/workers/fsdp_workers.py", line 610, in generate_sequences
    output = self.rollout.generate_sequences(prompts=prompts)
  File "/opt/venv/lib/python3.10/site-packages/transformers/generation/utils.py", line 3250, in _sample
    next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
RuntimeError: probability tensor contains either `inf`, `nan` or element < 0
"""
    ff = first_failure_of(text)
    assert (ff["category"], ff["phase"]) == ("numerics", "forward")


def test_lightning_child_killed_names_its_rank():
    text = """\
Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/4
Epoch 2:  41%|████      | 410/1000 [03:12<04:37,  2.13it/s, v_num=7, train_loss=0.412]
[rank: 3] Child process with PID 40404 terminated with code -9. Forcefully terminating all other processes to avoid \
zombies 🧟
Killed
"""
    ff = first_failure_of(text)
    assert ff["rank"] == 3
    assert ff["category"] == "host-memory"  # a SIGKILL with no kernel log: the OOM killer, at low confidence
    assert ff["confidence"] == "low"


def test_resuming_zero_checkpoint_on_another_world_size_is_config_at_load():
    text = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/train.py", line 88, in <module>
[rank0]:     trainer.train(resume_from_checkpoint=True)
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py", line 2164, in train
[rank0]:     return inner_training_loop(
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/transformers/trainer.py", line 2322, in _inner_training_loop
[rank0]:     deepspeed_load_checkpoint(
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/transformers/integrations/deepspeed.py", line 443, in \
deepspeed_load_checkpoint
[rank0]:     load_path, _ = deepspeed_engine.load_checkpoint(
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/engine.py", line 2999, in _load_zero_checkpoint
[rank0]:     raise ZeRORuntimeException("The checkpoint being loaded used a DP " \\
[rank0]: deepspeed.runtime.zero.utils.ZeRORuntimeException: The checkpoint being loaded used a DP world size of 8 \
but the current world size is 4. Automatic adjustment of ZeRO's optimizer state partitioning with a new world size \
is not currently supported.
"""
    ff = first_failure_of(text)
    assert (ff["rank"], ff["category"]) == (0, "config")
    assert ff["phase"] in ("checkpoint-load", "init")


def test_recovering_fp16_overflows_alone_blame_nothing_confidently():
    lines = [f"[2026-12-03 08:00:{10 + i:02d},001] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! "
             f"Rank 0 Skipping step. Attempted loss scale: {2 ** (16 - i)}, reducing to {2 ** (15 - i)}"
             for i in range(4)]
    ff = first_failure_of("\n".join(lines) + "\n")
    assert ff is None or ff["confidence"] == "low"


def test_megatron_nan_iterations_are_numerics():
    text = "\n".join([
        " iteration      100/  100000 | consumed samples:        51200 | lm loss: 8.10E+00 | loss scale: 1.0 | "
        "number of skipped iterations:   0 | number of nan iterations:   0 |",
        " iteration      200/  100000 | consumed samples:       102400 | lm loss: 9.87E+00 | loss scale: 1.0 | "
        "number of skipped iterations:   7 | number of nan iterations:   7 |",
    ]) + "\n"
    ff = first_failure_of(text)
    assert ff["category"] == "numerics"
    assert ff["confidence"] != "high"
