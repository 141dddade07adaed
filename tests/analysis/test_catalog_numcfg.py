"""Numerics, configuration errors and memory: the catalog's lines for them, written from the
frameworks' format strings (DeepSpeed, Megatron-Core, transformers/accelerate, Lightning, verl,
torchtitan, PyTorch), and small pasted logs run through the whole analysis.

Every line below is ours, filled in from a format string with made-up values."""

from __future__ import annotations

import pytest

from firstfault.analysis.catalog import load_catalog
from tests.offline.scoring import Case
from tests.offline.scoring import analyze as analyze_case

CATALOG = load_catalog()


def _match(line: str):
    m = CATALOG.match(line)
    assert m is not None, f"nothing matches {line!r}"
    return m


# (line, signature, role, category, groups that must be there)
LINES = [
    # numerics: any spelling and case
    ("epoch 2 step 310 loss=NaN lr=2e-5", "numerics.nan_loss", "root", "numerics", {"value": "NaN"}),
    ("step 12 | loss: nan | grad_norm: 3.1", "numerics.nan_loss", "root", "numerics", {"value": "nan"}),
    ("WARNING: The loss is NaN at step 77", "numerics.nan_loss", "root", "numerics", {"value": "NaN"}),
    ("{'loss': nan, 'learning_rate': 2e-05, 'epoch': 0.3}", "numerics.nan_loss", "root", "numerics", {"what": "loss"}),
    ("Steps:   0%|▏          | 17/6000 [00:58<4:50:05,  2.91s/it, lr=0, noise_step_loss=nan]", "numerics.nan_loss",
     "root", "numerics", {"value": "nan"}),
    ("policy_loss became inf after 40 updates", "numerics.nan_loss", "root", "numerics", {"value": "inf"}),
    ("{'loss': '0', 'grad_norm': 'inf', 'learning_rate': '1e-05', 'epoch': '0.5'}", "numerics.nan_grad_norm_logged", "root",
     "numerics", {"what": "grad_norm", "value": "inf"}),
    ("(WorkerDict pid=311, ip=10.1.2.3) WARN: rank 5 grad_norm is not finite: nan",
     "numerics.grad_norm_not_finite", "root", "numerics", {"rank": "5", "value": "nan"}),
    ("WARN: grad_norm is not finite: inf", "numerics.grad_norm_not_finite", "root", "numerics", {"value": "inf"}),
    ("[rank6]: RuntimeError: Rank 6, node n-0042, device 6, iteration 31: Unexpected result nan (message='found NaN "
     "in local grad norm for bucket #1 in backward pass before data-parallel communication collective')",
     "megatron.nan_grad_norm", "root", "numerics", {"rank": "6", "value": "NaN", "node": "n-0042"}),
    # the older check, in the optimizer step's gradient clipping (clip_grads.py): its own signature, its own phase
    ("AssertionError: Rank 9: found NaN in local grad norm in backwards pass. Device: 1, node: n-0007",
     "megatron.nan_grad_norm_at_clip", "root", "numerics", {"rank": "9"}),
    ("AssertionError: Rank 11: found NaN in local forward loss calculation. Device: 3, node: n-0002",
     "megatron.nan_forward_loss", "root", "numerics", {"rank": "11"}),
    ("RuntimeError: Function 'PowBackward0' returned nan values in its 0th output.", "torch.anomaly_nan", "root",
     "numerics", {"function": "PowBackward0"}),
    ("ValueError: The loss returned in `training_step` is nan.", "lightning.nonfinite_loss", "root", "numerics", {}),
    ("Monitored metric val_loss = inf is not finite. Previous best value was 1.250. Signaling Trainer to stop.",
     "lightning.early_stopping_nonfinite", "root", "numerics", {"metric": "val_loss"}),
    ("RuntimeError: Loss or gradient norm is not finite on at least one rank at step 90. Stopping training before "
     "the optimizer update.", "torchtitan.nonfinite_step", "root", "numerics", {"iteration": "90"}),
    ("RuntimeError: value cannot be converted to type at::Half without overflow", "torch.half_overflow", "root",
     "numerics", {"dtype": "at::Half"}),
    # fp16 loss scaling: skipped steps are context, the floor is the failure
    ("[2026-12-03 08:00:00,001] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
     "step. Attempted loss scale: 65536, reducing to 32768", "deepspeed.fp16_overflow", "context", "numerics",
     {"loss_scale": "65536"}),
    ("[2023-02-28 20:08:24,113] [INFO] [stage_1_and_2.py:1769:step] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
     "Attempted loss scale: 128.0, reducing to 64.0", "deepspeed.fp16_overflow", "context", "numerics", {}),
    ("[2026-12-03 08:00:00,001] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
     "step. Attempted loss scale: 1, reducing to 1", "fp16.loss_scale_floor", "root", "numerics", {}),
    ("[rank2]: Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
     "deepspeed.fp16_loss_scale_min", "root", "numerics", {}),
    # configuration
    ("ValueError: Please correct the following DeepSpeed config values that mismatch TrainingArguments values:",
     "hf.deepspeed_config_mismatch", "root", "config", {"against": "TrainingArguments"}),
    ("- ds gradient_accumulation_steps=4 vs hf gradient_accumulation_steps=1", "hf.deepspeed_config_mismatch",
     "root", "config", {"key": "gradient_accumulation_steps"}),
    ("ValueError: `train_micro_batch_size_per_gpu` not found in kwargs. Please specify "
     "`train_micro_batch_size_per_gpu` without `auto` (set to correct value) in the DeepSpeed config file or pass "
     "it in kwargs.", "hf.deepspeed_auto_unresolved", "root", "config", {"key": "train_micro_batch_size_per_gpu"}),
    ("ValueError: DeepSpeed Zero-3 is not compatible with passing a `device_map`.", "hf.zero3_incompatible", "root",
     "config", {}),
    ("AssertionError: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
     "gradient_acc_step * world_size 64 != 4 * 2 * 4", "deepspeed.batch_size_mismatch", "root", "config",
     {"train_batch_size": "64", "world_size": "4"}),
    ("AssertionError: Train batch size: 0 has to be greater than 0", "deepspeed.batch_config", "root", "config",
     {"key": "Train batch size", "value": "0"}),
    ("[rank0]: pydantic_core._pydantic_core.ValidationError: 2 validation errors for DeepSpeedZeroConfig",
     "deepspeed.config_validation", "root", "config", {}),
    ("  extra fields not permitted (type=value_error.extra)", "deepspeed.config_validation", "root", "config", {}),
    ("AssertionError: 40 is not divisible by 6", "megatron.parallel_config", "root", "config", {"size": "40"}),
    ("RuntimeError: Error(s) in loading state_dict for GPT2LMHeadModel:", "torch.state_dict_mismatch", "root",
     "config", {"module": "GPT2LMHeadModel"}),
    ("\tsize mismatch for lm_head.weight: copying a param with shape torch.Size([50257, 768]) from checkpoint, the "
     "shape in current model is torch.Size([50304, 768]).", "torch.state_dict_mismatch", "root", "config",
     {"key": "lm_head.weight"}),
    ("ValueError: Default process group has not been initialized, please make sure to call init_process_group.",
     "c10d.default_pg_not_initialized", "root", "config", {}),
    ("train.py: error: unrecognized arguments: --lr=3e-4", "python.unrecognized_arguments", "root", "config",
     {"args": "--lr=3e-4"}),
    # PyTorch 2.0's launcher renamed the argument a 1.x script parses: a version interaction
    ("train.py: error: unrecognized arguments: --local-rank=1", "torch.launch_local_rank_renamed", "root", "framework",
     {"passed": "1"}),
    ("RuntimeError: world_size (24) is not divisible by tensor_model_parallel_size (8) x "
     "pipeline_model_parallel_size (2) x context_parallel_size (1)", "megatron.parallel_config", "root", "config",
     {"size": "24"}),
    ("lightning_fabric.utilities.exceptions.MisconfigurationException: You requested gpu: [0, 1] But your machine "
     "only has: [0]", "lightning.misconfiguration", "root", "config", {}),
    ("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cpu!",
     "torch.device_mismatch", "root", "user-code", {"dev_a": "cuda:1"}),
    ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (16x4096 and 0x4096)", "torch.shape_mismatch", "root",
     "user-code", {"mat2": "0x4096"}),
    ("AttributeError: Can't pickle local object 'build_loader.<locals>.<lambda>'", "python.pickle_error", "root",
     "user-code", {}),
    ("Parameter indices which did not receive grad for rank 3: 12 13", "torch.ddp_unused_parameters", "root",
     "user-code", {"rank": "3"}),
    ("ValueError: Some specified arguments are not used by the HfArgumentParser: ['--local-rank=2']",
     "torch.launch_local_rank_renamed", "root", "framework", {"passed": "2"}),
    ("ValueError: Some specified arguments are not used by the HfArgumentParser: ['--lora_rank', '8']",
     "hf.argument_parser_unused", "root", "config", {}),
    ("RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the following "
     "reasons: 1) Use of a module parameter outside the `forward` function.", "torch.ddp_marked_ready_twice", "root",
     "config", {}),
    ("ValueError: Expected a string path to an existing deepspeed config, or a dictionary or a valid base64. "
     "Received: ds.json", "deepspeed.setup_config", "root", "config", {"config": "ds.json"}),
    ("RuntimeError: Error building extension 'cpu_adam'", "torch.extension_build_failed", "root", "config",
     {"extension": "cpu_adam"}),
    ("ValueError: Your setup doesn't support bf16/gpu.", "hf.training_arguments", "root", "config", {}),
    ("NotImplementedError: Cannot copy out of meta tensor; no data!", "torch.meta_tensor_copy", "root", "config", {}),
    ("ValueError: Attempting to unscale FP16 gradients.", "torch.grad_scaler_misuse", "root", "config", {}),
    ("AssertionError: pipeline_model parallel group is not initialized", "megatron.parallel_group_uninitialized",
     "root", "user-code", {}),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
     "initializing the engine.", "vllm.kv_cache_memory", "root", "gpu-memory", {}),
    ("Loading checkpoint shards:  75%|███████▌  | 3/4 [00:09<00:03,  3.10s/it]", "hf.loading_checkpoint_shards",
     "context", "unknown", {"done": "3", "total": "4"}),
    # GPU memory, every PyTorch wording; GPU N is a device index, never a rank
    ("RuntimeError: CUDA out of memory. Tried to allocate 64.00 MiB (GPU 3; 31.75 GiB total capacity; 30.1 GiB "
     "already allocated; 12.94 MiB free; 30.5 GiB reserved in total by PyTorch) If reserved memory is >> allocated "
     "memory try setting max_split_size_mb to avoid fragmentation.", "cuda.oom", "root", "gpu-memory",
     {"gpu": "3", "size": "64.00 MiB"}),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 5 has a total capacity of "
     "79.33 GiB of which 2.12 GiB is free. Process 77 has 77.2 GiB memory in use.", "cuda.oom", "root",
     "gpu-memory", {"gpu": "5"}),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
     "cuda.library_alloc_failed", "root", "gpu-memory", {"error": "CUBLAS_STATUS_ALLOC_FAILED"}),
    ("node-3:1234:1290 [5] NCCL WARN Cuda failure 2 'out of memory'", "nccl.cuda_oom", "root", "gpu-memory", {}),
    # host memory
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough memory: you tried to "
     "allocate 8589934592 bytes.", "torch.cpu_alloc_failed", "root", "host-memory", {"bytes": "8589934592"}),
    ("OSError: [Errno 12] Cannot allocate memory", "host.alloc_failed", "root", "host-memory", {}),
    ("Bus error (core dumped)", "shell.bus_error", "root", "config", {}),
    ("memory allocation of 1048576 bytes failed", "host.alloc_failed", "root", "host-memory", {"bytes": "1048576"}),
    ("Killed", "shell.killed", "root", "host-memory", {}),
    ("run.sh: line 7: 918273 Killed                  python train.py", "shell.killed", "root", "host-memory",
     {"pid": "918273"}),
    ("RuntimeError: DataLoader worker (pid 4410) is killed by signal: Killed.", "dataloader.worker_killed", "root",
     "host-memory", {"worker_pid": "4410"}),
    ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
     "dataloader.shm_exhausted", "root", "config", {}),
    ("RuntimeError: DataLoader worker (pid(s) 4410, 4411) exited unexpectedly", "dataloader.workers_exited", "root",
     "host-memory", {"worker_pids": "4410, 4411"}),
]


@pytest.mark.parametrize("line,sig,role,category,groups", LINES, ids=[x[1] + f"[{i}]" for i, x in enumerate(LINES)])
def test_format_lines(line, sig, role, category, groups):
    m = _match(line)
    assert (m.signature.id, m.role, m.category) == (sig, role, category)
    for k, v in groups.items():
        assert m.groups.get(k) == v, (k, m.groups)


def test_a_gpu_index_is_never_a_rank():
    for line in ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 7 has a total capacity "
                 "of 79.10 GiB of which 1.02 GiB is free.",
                 "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 7; 15.78 GiB total capacity; "
                 "14.52 GiB already allocated; 3.44 MiB free; 14.65 GiB reserved in total by PyTorch)",
                 "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, "
                 "cuda:7 and cpu!"):
        assert "rank" not in _match(line).groups


# Lines that must not be taken for these failures: (line, signatures it must not match).
NUMERICS = ("numerics.nan_loss", "numerics.nan_grad_norm_logged", "numerics.nan_detected", "numerics.grad_norm_not_finite",
            "megatron.nan_grad_norm", "megatron.unexpected_result")
NOT = [
    ("Epoch 1: train loss 0.91, best loss inf", NUMERICS),
    ("Best val loss: inf", NUMERICS),
    ("min_loss = inf", NUMERICS),
    ("loss_scale: inf", NUMERICS),
    ("{'loss': 1.7731, 'grad_norm': 0.812, 'learning_rate': 1.9e-05, 'epoch': 0.12}", NUMERICS),
    ("    if torch.isnan(loss): raise ValueError('no loss')", NUMERICS),
    ("        check_for_nan_in_grad: If true, check if local grad norm is NaN.", NUMERICS),
    ("    # skip the update if the loss is nan", NUMERICS),
    ("Unexpected result 12.3 on rank 0 at iteration #40 invocation #1 (message='Spiky loss')", NUMERICS),
    ("        if \"CUDA out of memory\" in exception.args[0]:", ("cuda.oom", "torch.oom_at_setup")),
    ("srun: error: gpu-07: task 3: Killed", ("shell.killed",)),
    ("[ 2002.145344] Out of memory: Killed process 24215 (python3) total-vm:12531344kB", ("shell.killed",)),
    ("RuntimeError: DataLoader worker (pid 29001) is killed by signal: Killed.", ("shell.killed",)),
    ("- ds_config: configs/zero3.json", ("hf.deepspeed_config_mismatch",)),
    ("from lightning_fabric.utilities.exceptions import MisconfigurationException", ("lightning.misconfiguration",)),
    ("Command '['python', 'train.py', '--deepspeed', 'ds.json']' returned non-zero exit status 1.",
     ("hf.deepspeed_argument",)),
    ("[2026-12-03 08:00:00,001] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping "
     "step. Attempted loss scale: 2, reducing to 1", ("fp16.loss_scale_floor",)),
]


@pytest.mark.parametrize("line,forbidden", NOT, ids=[f"not[{i}]" for i in range(len(NOT))])
def test_near_misses(line, forbidden):
    m = CATALOG.match(line)
    assert m is None or m.signature.id not in forbidden, (line, m.signature.id)


# ---------------------------------------------------------------------------
# Whole pasted logs through `firstfault analyze -`
# ---------------------------------------------------------------------------

def analyze(text: str) -> dict:
    return analyze_case(Case("paste", ["-"], {}, stdin=text.encode()))


MEGATRON_NAN = """\
 iteration     1207/  500000 | consumed samples:       617984 | elapsed time per iteration (ms): 812.4 | learning rate: 2.999E-04 | global batch size:   512 | lm loss: 2.301127E+00 | loss scale: 1.0 | grad norm: 0.912 | number of skipped iterations:   0 | number of nan iterations:   0 |
[rank14]: Traceback (most recent call last):
[rank14]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 301, in <module>
[rank14]:     pretrain(
[rank14]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 880, in pretrain
[rank14]:     iteration, num_floating_point_operations_so_far = train(
[rank14]:   File "/workspace/Megatron-LM/megatron/core/distributed/param_and_grad_buffer.py", line 356, in check_grads
[rank14]:     rerun_state_machine.validate_result(
[rank14]:   File "/workspace/Megatron-LM/megatron/core/rerun_state_machine.py", line 534, in validate_result
[rank14]:     raise RuntimeError(full_message)
[rank14]: RuntimeError: Rank 14, node gpu-node-3, device 6, iteration 1208: Unexpected result nan (message='found NaN in local grad norm for bucket #0 in backward pass before data-parallel communication collective')
"""

MEGATRON_OLD_ASSERT = """\
Traceback (most recent call last):
  File "pretrain_gpt.py", line 230, in <module>
    pretrain(train_valid_test_datasets_provider,
  File "/workspace/megatron/core/distributed/param_and_grad_buffer.py", line 115, in check_for_nan_in_grad
    assert not norm_is_nan, (
AssertionError: Rank 3: found NaN in local grad norm in backward pass before data-parallel communication collective. Device: 3, node: gpu-node-1
"""

HF_DS_MISMATCH = """\
Traceback (most recent call last):
  File "/work/train.py", line 88, in <module>
    trainer.train()
  File "/opt/venv/lib/python3.10/site-packages/transformers/trainer.py", line 1539, in train
    return inner_training_loop(
  File "/opt/venv/lib/python3.10/site-packages/transformers/integrations/deepspeed.py", line 394, in deepspeed_init
    hf_deepspeed_config.trainer_config_finalize(args, model, num_training_steps)
  File "/opt/venv/lib/python3.10/site-packages/transformers/integrations/deepspeed.py", line 265, in trainer_config_finalize
    raise ValueError(
ValueError: Please correct the following DeepSpeed config values that mismatch TrainingArguments values:
- ds train_micro_batch_size_per_gpu=4 vs hf per_device_train_batch_size=8
The easiest method is to set these DeepSpeed config values to 'auto'.
"""

RICH_BATCH = """\
│ /opt/venv/lib/python3.10/site-packages/deepspeed/runtime/config.py:930 in _batch_assertion       │
│                                                                                                  │
│   929 │   │   assert train_batch == micro_batch * grad_acc * self.world_size, (                  │
│ ❱ 930 │   │   │   f"Check batch related parameters. train_batch_size is not equal "              │
╰──────────────────────────────────────────────────────────────────────────────────────────────────╯
AssertionError: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size 96 != 4 * 8 * 2
"""

OOM_LOADING = """\
Loading checkpoint shards:  50%|█████     | 2/4 [00:41<00:41, 20.52s/it]
Traceback (most recent call last):
  File "/work/sft.py", line 51, in <module>
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16, device_map={"": local_rank})
  File "/opt/venv/lib/python3.11/site-packages/transformers/models/auto/auto_factory.py", line 564, in from_pretrained
    return model_class.from_pretrained(
  File "/opt/venv/lib/python3.11/site-packages/transformers/modeling_utils.py", line 4014, in from_pretrained
    ) = cls._load_pretrained_model(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 3 has a total capacity of 23.64 GiB of which 640.31 MiB is free. Including non-PyTorch memory, this process has 22.99 GiB memory in use.
"""

DATALOADER_KILLED = """\
Epoch: [3]  [ 300/1251]  eta: 0:09:51  lr: 0.000600  loss: 6.1123 (6.1502)  time: 0.6210  data: 0.0021  max mem: 14120
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/dataloader.py", line 1133, in _try_get_data
[rank0]:     data = self._data_queue.get(timeout=timeout)
[rank0]:   File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/_utils/signal_handling.py", line 67, in handler
[rank0]:     _error_if_any_worker_fails()
[rank0]: RuntimeError: DataLoader worker (pid 28813) is killed by signal: Killed.
"""

SHELL_KILLED = """\
$ python train.py --epochs 3 --batch-size 256
loading 41 shards into memory
epoch 0 step 100 loss 2.3127
epoch 0 step 200 loss 2.2044
Killed
"""

LOSS_SCALE_FLOOR = """\
[2026-12-03 09:00:01,100] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4, reducing to 2
[2026-12-03 09:00:01,200] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1
[rank2]: Traceback (most recent call last):
[rank2]:   File "/work/train.py", line 140, in <module>
[rank2]:     engine.step()
[rank2]:   File "/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/fp16/loss_scaler.py", line 269, in update_scale
[rank2]:     raise Exception(
[rank2]: Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.
"""

OVERFLOWS_THAT_RECOVER = """\
[2026-12-03 09:00:01,100] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768
[2026-12-03 09:00:01,200] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 32768, reducing to 16384
[2026-12-03 09:00:09,782] [INFO] [timer.py:264:stop] epoch=0/micro_step=40/global_step=40, RunningAvgSamplesPerSec=412.55, CurrSamplesPerSec=431.02, MemAllocated=0.72GB, MaxMemAllocated=0.76GB
"""

VERL_GRAD_NORM = """\
(WorkerDict pid=9092, ip=10.0.0.5) step:41 - critic/vf_loss:0.412 - critic/grad_norm:1.03
(WorkerDict pid=9093, ip=10.0.0.5) WARN: rank 3 grad_norm is not finite: nan
(WorkerDict pid=9094, ip=10.0.0.5) WARN: rank 4 grad_norm is not finite: nan
"""

LIGHTNING_MISCONFIG = """\
GPU available: True (cuda), used: True
Traceback (most recent call last):
  File "/work/fit.py", line 33, in <module>
    trainer = pl.Trainer(devices=4, strategy="ddp", max_epochs=10)
lightning_fabric.utilities.exceptions.MisconfigurationException: You requested gpu: [0, 1, 2, 3]
 But your machine only has: [0, 1]
"""


VLLM_NO_KV = """\
(WorkerDict pid=2911, ip=10.0.0.7) INFO 03-01 21:32:40 [gpu_worker.py:220] Initializing the engine
(WorkerDict pid=2911, ip=10.0.0.7) Traceback (most recent call last):
(WorkerDict pid=2911, ip=10.0.0.7)   File "/usr/local/lib/python3.10/dist-packages/vllm/v1/worker/gpu_worker.py", line 187, in init_device
(WorkerDict pid=2911, ip=10.0.0.7)     raise ValueError(
(WorkerDict pid=2911, ip=10.0.0.7) ValueError: Free memory on device (13.91/79.33 GiB) on startup is less than desired GPU memory utilization (0.95, 75.36 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.
"""


@pytest.mark.parametrize("text,rank,category,phase,sig", [
    (MEGATRON_NAN, 14, "numerics", "backward", "megatron.nan_grad_norm"),
    (MEGATRON_OLD_ASSERT, 3, "numerics", "backward", "megatron.nan_grad_norm"),
    (HF_DS_MISMATCH, None, "config", "init", "hf.deepspeed_config_mismatch"),
    (RICH_BATCH, None, "config", "init", "deepspeed.batch_size_mismatch"),
    (OOM_LOADING, None, "gpu-memory", "init", None),
    (DATALOADER_KILLED, 0, "host-memory", "data", "dataloader.worker_killed"),
    (SHELL_KILLED, None, "host-memory", None, "shell.killed"),
    (LOSS_SCALE_FLOOR, 2, "numerics", "optimizer-step", "deepspeed.fp16_loss_scale_min"),
    (VERL_GRAD_NORM, 3, "numerics", "optimizer-step", "numerics.grad_norm_not_finite"),
    (LIGHTNING_MISCONFIG, None, "config", "init", "lightning.misconfiguration"),
    (VLLM_NO_KV, None, "gpu-memory", "init", "vllm.kv_cache_memory"),
], ids=["megatron-nan-rerun", "megatron-nan-assert", "hf-ds-mismatch", "rich-batch", "oom-loading",
        "dataloader-killed", "shell-killed", "loss-scale-floor", "verl-grad-norm", "lightning-misconfig", "vllm-no-kv-cache"])
def test_pasted_logs(text, rank, category, phase, sig):
    ff = analyze(text)["first_failure"]
    assert ff is not None
    assert ff["rank"] == rank and ff["category"] == category, ff
    if phase is not None:
        assert ff["phase"] == phase, ff
    if sig is not None:
        assert ff["signature"] == sig, ff


def test_a_gpu_index_in_an_oom_is_not_the_rank():
    ff = analyze(OOM_LOADING)["first_failure"]
    assert ff["rank"] is None  # "GPU 3" names a device on the node


def test_a_shell_kill_is_never_a_confident_answer():
    ff = analyze(SHELL_KILLED)["first_failure"]
    assert ff["confidence"] != "high"


def test_overflows_that_recover_blame_nothing():
    rep = analyze(OVERFLOWS_THAT_RECOVER)
    assert all(d["signature"] != "deepspeed.fp16_overflow" for d in rep["distinct_failures"])
    assert rep["first_failure"] is None or rep["first_failure"]["category"] != "numerics"
