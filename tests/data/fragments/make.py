"""Write tests/data/fragments: inputs shaped as people paste them (see README.md), and manifest.json.

    python3 tests/data/fragments/make.py            # rewrites the .log files and manifest.json here

Each input is written from the format strings of the DeepSpeed, PyTorch, transformers and NCCL
sources named in its manifest ``shape`` (Python's traceback format, c10 and torchrun log headers,
the exception texts), or cut from this project's own captures in tests/data/real and
tests/data/formats. No third-party log text. Deterministic: running it again writes the same files.
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
REAL = HERE.parent / "real"
OUT.mkdir(parents=True, exist_ok=True)
DS = "/opt/conda/lib/python3.10/site-packages/deepspeed"
T = "/opt/conda/lib/python3.10/site-packages/torch"
TF = "/opt/conda/lib/python3.10/site-packages/transformers"
entries = []

def frame(path, line, func, src):
    return [f'  File "{path}", line {line}, in {func}', f"    {src}"]

def summary(i, status, numel, ds_numel, shape, active="set()", grad=None):
    return (f"{{'id': {i}, 'status': '{status}', 'numel': {numel}, 'ds_numel': {ds_numel}, 'shape': {shape}, "
            f"'ds_shape': ({ds_numel},), 'requires_grad': True, 'grad_shape': {grad}, 'persist': False, "
            f"'active_sub_modules': {active}, 'ds_tensor.shape': torch.Size([{ds_numel // 8}])}}")

USER_FWD = frame("/workspace/train.py", 212, "train_step", 'outputs = model_engine(batch["input_ids"], labels=batch["labels"])')
MOD_CALL = frame(f"{T}/nn/modules/module.py", 1518, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)") + \
    frame(f"{T}/nn/modules/module.py", 1527, "_call_impl", "return forward_call(*args, **kwargs)")
MOD_PREHOOK = frame(f"{T}/nn/modules/module.py", 1518, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)") + \
    frame(f"{T}/nn/modules/module.py", 1557, "_call_impl", "args_result = hook(self, args)")
NVTX = frame(f"{DS}/utils/nvtx.py", 15, "wrapped_fn", "ret_val = func(*args, **kwargs)")
CTX = frame(f"{T}/utils/_contextlib.py", 115, "decorate_context", "return func(*args, **kwargs)")
ENGINE_FWD = NVTX + frame(f"{DS}/runtime/engine.py", 1852, "forward", "loss = self.module(*inputs, **kwargs)")
HF_LAYER = frame(f"{TF}/models/llama/modeling_llama.py", 1140, "forward", "outputs = self.model(") + MOD_CALL + \
    frame(f"{TF}/models/llama/modeling_llama.py", 1014, "forward", "layer_outputs = decoder_layer(")
FETCH = frame(f"{DS}/runtime/zero/parameter_offload.py", 278, "_pre_forward_module_hook",
              "self.pre_sub_module_forward_function(module)") + CTX + \
    frame(f"{DS}/runtime/zero/parameter_offload.py", 452, "pre_sub_module_forward_function",
          "param_coordinator.fetch_sub_module(sub_module, forward=True)") + NVTX + CTX
WAIT = frame(f"{DS}/runtime/zero/partitioned_param_coordinator.py", 309, "fetch_sub_module",
             "self.__inflight_param_registry.pop(param).wait()") + NVTX + \
    frame(f"{DS}/runtime/zero/partition_parameters.py", 678, "wait",
          'assert param.ds_status == ZeroParamStatus.INFLIGHT, f"expected param {param.ds_summary()} to be inflight"')
GATHER = frame(f"{DS}/runtime/zero/partitioned_param_coordinator.py", 290, "fetch_sub_module",
               "self.__all_gather_params(params_to_fetch, forward)") + NVTX + \
    frame(f"{DS}/runtime/zero/partitioned_param_coordinator.py", 463, "__all_gather_params",
          "handle = param_group[0].all_gather_coalesced(param_group, quantize=quantize)") + NVTX + \
    frame(f"{DS}/runtime/zero/partition_parameters.py", 1252, "all_gather_coalesced",
          "handles.append(_all_gather_dtype(dtype, params, world_size, rank_in_group, ds_process_group))") + \
    frame(f"{DS}/runtime/zero/partition_parameters.py", 1128, "_all_gather_dtype",
          "flat_tensor = torch.empty(partition_sz * world_size,")
OOM = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU {g} has a total capacity "
       "of 79.15 GiB of which 1.02 GiB is free. Process {p} has 78.11 GiB memory in use. Of the allocated memory "
       "74.30 GiB is allocated by PyTorch, and 2.41 GiB is reserved by PyTorch but unallocated. If reserved but "
       "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
       "fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
HEADER = "Traceback (most recent call last):"


def write(name, lines, *, category, phase, shape, rank=None, prefix="", note=None):
    text = "\n".join(prefix + ln if prefix is not None else ln for ln in lines) + "\n"
    (OUT / name).write_text(text)
    e = {"file": name, "category": category, "phase": phase, "shape": shape}
    if rank is not None:
        e["rank"] = rank
    if note:
        e["note"] = note
    entries.append(e)


def glog(level, t, pid, where, msg):
    return f"{level}{t} {pid} {where}] {msg}"

DS_SRC = ("DeepSpeed v0.14.0 sources (deepspeed/runtime/engine.py, zero/parameter_offload.py, "
          "zero/partitioned_param_coordinator.py, zero/partition_parameters.py); Python traceback format")

# ---- ZeRO-3 parameter gather family ------------------------------------------------------------
inflight = f"AssertionError: expected param {summary(57, 'AVAILABLE', 4096, 4096, '(4096,)', '{12}')} to be inflight"
write("zero3-inflight-mid-stack-rank3.log", ENGINE_FWD + MOD_CALL + HF_LAYER + MOD_PREHOOK + FETCH + WAIT + [inflight],
      rank=3, prefix="[rank3]: ", category="framework", phase="param-gather",
      shape=f"a paste starting at engine.forward (no Traceback header), [rankN]: prefixes (PyTorch 2.x); {DS_SRC}")
write("zero3-inflight-frames-only.log", FETCH[-6:] + WAIT + [inflight], category="framework", phase="param-gather",
      shape=f"the last frames only, no header, no prefix; {DS_SRC}")
write("zero3-inflight-unindented.log", [ln.strip() for ln in WAIT] + [inflight], category="framework",
      phase="param-gather", shape=f"frames whose indentation a chat or web page removed; {DS_SRC}")
avail = f"AssertionError: {summary(44, 'NOT_AVAILABLE', 0, 2048, '(0,)', '{7}')}"
write("zero3-not-available-fetch-rank0.log", [HEADER] + USER_FWD + MOD_CALL + ENGINE_FWD + MOD_PREHOOK + FETCH +
      frame(f"{DS}/runtime/zero/partitioned_param_coordinator.py", 316, "fetch_sub_module",
            "assert param.ds_status == ZeroParamStatus.AVAILABLE, param.ds_summary()") + [avail],
      rank=0, prefix="[rank0]: ", category="framework", phase="param-gather",
      shape=f"fetch_sub_module's AVAILABLE assertion with ds_summary(); {DS_SRC}")
oom_frames = ENGINE_FWD + MOD_PREHOOK + FETCH + GATHER
write("zero3-cuda-oom-all-gather-coalesced-rank1.log", oom_frames + [OOM.format(g=1, p=81234)], rank=1,
      prefix="[rank1]: ", category="gpu-memory", phase="param-gather",
      shape=f"CUDA OOM (c10/cuda/CUDACachingAllocator.cpp message) raised in partition_parameters' all-gather; {DS_SRC}")
# ---- "still have inflight params": reset_step at the start of backward (DeepSpeed < 0.15.3) -------
still = ("RuntimeError: still have inflight params [" + summary(918, "INFLIGHT", 0, 5120, "(0,)") + "]")
write("zero3-still-inflight-backward-rank2.log",
      frame("/workspace/train.py", 230, "train_step", "model_engine.backward(loss)") + NVTX +
      frame(f"{DS}/runtime/engine.py", 1976, "backward", "self.optimizer.backward(loss, retain_graph=retain_graph)") +
      NVTX + frame(f"{DS}/runtime/zero/stage3.py", 2215, "backward",
                   "self._get_param_coordinator(training=True).reset_step()") + NVTX +
      frame(f"{DS}/runtime/zero/partitioned_param_coordinator.py", 207, "reset_step",
            'raise RuntimeError(f"still have inflight params "') + [still],
      rank=2, prefix="[rank2]: ", category="framework", phase="backward",
      shape="PartitionedParameterCoordinator.reset_step called from DeepSpeedZeroOptimizer_Stage3.backward "
            "(DeepSpeed v0.14.0; removed in v0.15.3)")
# ---- "Cannot partition a param in flight" during a checkpoint save --------------------------------
write("zero3-cannot-partition-in-save-rank5.log", [HEADER] +
      frame("/workspace/train.py", 260, "main", "model_engine.save_checkpoint(args.output_dir, tag=f\"global_step{step}\")") +
      frame(f"{DS}/runtime/engine.py", 3118, "save_checkpoint", "self._save_checkpoint(save_dir,") +
      frame(f"{DS}/runtime/engine.py", 3317, "_save_checkpoint", "module=self.module_state_dict(") +
      frame(f"{DS}/runtime/engine.py", 2502, "module_state_dict", "sd = self.module.state_dict(destination, prefix, keep_vars)") +
      frame(f"{DS}/runtime/zero/partition_parameters.py", 1326, "partition", "self._partition(param_list, has_been_updated=has_been_updated)") +
      frame(f"{DS}/runtime/zero/partition_parameters.py", 1475, "_partition", "self._partition_param(param, has_been_updated=has_been_updated)") +
      NVTX + frame(f"{DS}/runtime/zero/partition_parameters.py", 1484, "_partition_param",
                   'assert param.ds_status is not ZeroParamStatus.INFLIGHT, f" {param} Cannot partition a param in flight"') +
      ["AssertionError:  Parameter containing:",
       "tensor([], device='cuda:5', dtype=torch.bfloat16, requires_grad=True) Cannot partition a param in flight"],
      rank=5, prefix="[rank5]: ", category="framework", phase="checkpoint-save",
      shape=f"partition_parameters._partition_param's in-flight assertion under engine.save_checkpoint, the message over two lines (str of a Parameter); {DS_SRC}")
# ---- fetch-queue tracing error -----------------------------------------------------------------
qsum = summary(51, "NOT_AVAILABLE", 0, 65536, "(0,)").replace("'id': 51", "'id': 'name=layers.3.mlp.weight id=51'")
write("zero3-fetch-queue-order-rank4.log", FETCH[-6:] +
      frame(f"{DS}/runtime/zero/partitioned_param_coordinator.py", 339, "fetch_sub_module", "raise RuntimeError(") +
      ["RuntimeError: tracing error at step 12: ", "module id: 34, training: True",
       f"expected the next 2 parameters in the parameter fetch queue to be ({qsum},) ",
       "but got ", f" ({qsum.replace('51', '48').replace('layers.3', 'layers.2')},)."],
      rank=4, prefix="[rank4]: ", category="framework", phase="param-gather",
      shape=f"fetch_sub_module's multi-line tracing error (f-string with \\n); {DS_SRC}")
# ---- memory at init: zero.Init, deepspeed.initialize, from_pretrained -----------------------------
write("oom-in-zero-init-rank0.log",
      frame("/workspace/train.py", 88, "build_model", "model = AutoModelForCausalLM.from_config(config)") +
      frame(f"{TF}/models/auto/auto_factory.py", 437, "from_config", "model = model_class._from_config(config, **kwargs)") +
      frame(f"{DS}/runtime/zero/partition_parameters.py", 511, "wrapper", "f(module, *args, **kwargs)") +
      frame(f"{TF}/models/llama/modeling_llama.py", 1120, "__init__", "self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)") +
      frame(f"{DS}/runtime/zero/partition_parameters.py", 520, "wrapper", "self._post_init_method(module)") +
      frame(f"{DS}/runtime/zero/partition_parameters.py", 1062, "_post_init_method", "param.data = param.data.to(self.local_device)") +
      [OOM.format(g=0, p=4242)],
      rank=0, prefix="[rank0]: ", category="gpu-memory", phase="init",
      shape="model construction under deepspeed.zero.Init (partition_parameters.py wrapper/_post_init_method, DeepSpeed v0.14.0), transformers from_config")
write("oom-in-from-pretrained.log", [HEADER] +
      frame("/workspace/sft.py", 41, "<module>", "model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16)") +
      frame(f"{TF}/models/auto/auto_factory.py", 564, "from_pretrained", "return model_class.from_pretrained(") +
      frame(f"{TF}/modeling_utils.py", 3754, "from_pretrained", ") = cls._load_pretrained_model(") +
      frame(f"{TF}/modeling_utils.py", 4214, "_load_pretrained_model", "new_error_msgs, offload_index, state_dict_index = _load_state_dict_into_meta_model(") +
      [OOM.format(g=2, p=3131)],
      category="gpu-memory", phase="init", shape="transformers PreTrainedModel.from_pretrained frames, no rank prefix (a single process paste)")
write("oom-in-deepspeed-initialize-rank6.log",
      frame("/workspace/train.py", 120, "main", "engine, optimizer, _, _ = deepspeed.initialize(model=model, config=ds_config)") +
      frame(f"{DS}/__init__.py", 181, "initialize", "engine = DeepSpeedEngine(args=args,") +
      frame(f"{DS}/runtime/engine.py", 262, "__init__", "self._configure_distributed_model(model)") +
      frame(f"{DS}/runtime/engine.py", 1112, "_configure_distributed_model", "self.module.to(self.device)") +
      frame(f"{T}/nn/modules/module.py", 1160, "to", "return self._apply(convert)") + [OOM.format(g=6, p=5151)],
      rank=6, prefix="[rank6]: ", category="gpu-memory", phase="init",
      shape="deepspeed.initialize -> DeepSpeedEngine.__init__ -> _configure_distributed_model (DeepSpeed v0.14.0)")
# ---- optimizer step, backward, data, forward ------------------------------------------------------
write("oom-in-optimizer-step-rank3.log",
      frame("/workspace/train.py", 232, "train_step", "model_engine.step()") +
      frame(f"{DS}/runtime/engine.py", 2169, "step", "self._take_model_step(lr_kwargs)") +
      frame(f"{DS}/runtime/engine.py", 2075, "_take_model_step", "self.optimizer.step()") +
      frame(f"{DS}/runtime/zero/stage_1_and_2.py", 1880, "step", "self._optimizer_step(i)") +
      frame(f"{DS}/runtime/zero/stage_1_and_2.py", 1787, "_optimizer_step", "self.optimizer.step()") +
      frame(f"{T}/optim/adamw.py", 163, "step", "self._init_group(") +
      frame(f"{T}/optim/adamw.py", 113, "_init_group", "state[\"exp_avg_sq\"] = torch.zeros_like(") +
      [OOM.format(g=3, p=7000)], rank=3, prefix="[rank3]: ", category="gpu-memory", phase="optimizer-step",
      shape="engine.step -> _take_model_step -> ZeRO-2 step -> torch AdamW state init (DeepSpeed v0.14.0, torch 2.1 optim)")
write("oom-in-backward-rank7.log",
      frame("/workspace/train.py", 230, "train_step", "model_engine.backward(loss)") + NVTX +
      frame(f"{DS}/runtime/engine.py", 1976, "backward", "self.optimizer.backward(loss, retain_graph=retain_graph)") +
      frame(f"{DS}/runtime/zero/stage_1_and_2.py", 2040, "backward", "self.loss_scaler.backward(loss.float(), retain_graph=retain_graph)") +
      frame(f"{DS}/runtime/fp16/loss_scaler.py", 63, "backward", "scaled_loss.backward(retain_graph=retain_graph)") +
      frame(f"{T}/_tensor.py", 492, "backward", "torch.autograd.backward(") +
      frame(f"{T}/autograd/__init__.py", 251, "backward", "Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass") +
      [OOM.format(g=7, p=7777)], rank=7, prefix="[rank7]: ", category="gpu-memory", phase="backward",
      shape="engine.backward -> ZeRO-2 backward -> loss_scaler -> torch.autograd.backward (DeepSpeed v0.14.0, torch 2.1)")
write("device-assert-in-forward.log", [HEADER] + USER_FWD + MOD_CALL + ENGINE_FWD + MOD_CALL +
      frame(f"{TF}/models/llama/modeling_llama.py", 1196, "forward", "loss = loss_fct(shift_logits, shift_labels)") + MOD_CALL +
      frame(f"{T}/nn/modules/loss.py", 1179, "forward", "return F.cross_entropy(input, target, weight=self.weight,") +
      frame(f"{T}/nn/functional.py", 3053, "cross_entropy", "return torch._C._nn.cross_entropy_loss(input, target, weight, _Reduction.get_enum(reduction), ignore_index, label_smoothing)") +
      ["RuntimeError: CUDA error: device-side assert triggered",
       "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
       "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
       "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."],
      category="user-code", phase="forward",
      shape="c10/cuda/CUDAException.cpp message (with its hint lines) under a HF forward through engine.forward; no prefix")
write("keyerror-in-collate-rank1.log", [HEADER] +
      frame("/workspace/train.py", 205, "main", "for step, batch in enumerate(train_loader):") +
      frame(f"{T}/utils/data/dataloader.py", 630, "__next__", "data = self._next_data()") +
      frame(f"{T}/utils/data/dataloader.py", 674, "_next_data", "data = self._dataset_fetcher.fetch(index)  # may raise StopIteration") +
      frame(f"{T}/utils/data/_utils/fetch.py", 54, "fetch", "return self.collate_fn(data)") +
      frame("/workspace/data.py", 77, "collate", 'input_ids = [ex["input_ids"] for ex in examples]') +
      ["KeyError: 'input_ids'"], rank=1, prefix="[rank1]: ", category="user-code", phase="data",
      shape="torch.utils.data DataLoader frames (torch 2.1) into a user collate function")
write("enospc-in-save-rank0.log", [HEADER] +
      frame("/workspace/train.py", 260, "main", "model_engine.save_checkpoint(args.output_dir)") +
      frame(f"{DS}/runtime/engine.py", 3125, "save_checkpoint", "self._save_zero_checkpoint(save_dir, tag)") +
      frame(f"{DS}/runtime/engine.py", 3483, "_save_zero_checkpoint", "self.checkpoint_engine.save(zero_sd, zero_checkpoint_name)") +
      frame(f"{DS}/runtime/checkpoint_engine/torch_checkpoint_engine.py", 22, "save", "torch.save(state_dict, path)") +
      frame(f"{T}/serialization.py", 618, "save", "with _open_zipfile_writer(f) as opened_zipfile:") +
      ["OSError: [Errno 28] No space left on device"], rank=0, prefix="[rank0]: ", category="storage",
      phase="checkpoint-save", shape="engine.save_checkpoint -> _save_zero_checkpoint -> TorchCheckpointEngine.save -> torch.save; strerror(ENOSPC)")
write("fp16-loss-scale-floor-rank2.log",
      frame(f"{DS}/runtime/engine.py", 2169, "step", "self._take_model_step(lr_kwargs)") +
      frame(f"{DS}/runtime/engine.py", 2075, "_take_model_step", "self.optimizer.step()") +
      frame(f"{DS}/runtime/zero/stage_1_and_2.py", 1830, "step", "self._update_scale(self.overflow)") +
      frame(f"{DS}/runtime/zero/stage_1_and_2.py", 2060, "_update_scale", "self.loss_scaler.update_scale(has_overflow)") +
      frame(f"{DS}/runtime/fp16/loss_scaler.py", 175, "update_scale", 'raise Exception(') +
      ["Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."],
      rank=2, prefix="[rank2]: ", category="numerics", phase="optimizer-step",
      shape="DynamicLossScaler.update_scale's exception (deepspeed/runtime/fp16/loss_scaler.py) under ZeRO-2 step")
write("mixed-dtype-allgather-rank0.log", ENGINE_FWD + MOD_PREHOOK + FETCH +
      frame(f"{DS}/runtime/zero/partitioned_param_coordinator.py", 290, "fetch_sub_module", "self.__all_gather_params(params_to_fetch, forward)") +
      frame(f"{DS}/runtime/zero/partition_parameters.py", 1144, "_all_gather_dtype", "handle = _dist_allgather_fn(partitions[rank_in_group], flat_tensor, ds_process_group)") +
      frame(f"{T}/distributed/distributed_c10d.py", 2897, "all_gather_into_tensor", "work = group._allgather_base(output_tensor, input_tensor, opts)") +
      ["TypeError: output tensor must have the same type as input tensor"], rank=0, prefix="[rank0]: ",
      category="framework", phase="param-gather",
      shape="ProcessGroupNCCL::_allgather_base's type check (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp) under ZeRO-3 gather")
write("batch-size-assert-at-init.log", [HEADER] +
      frame("/workspace/train.py", 120, "main", "engine, optimizer, _, _ = deepspeed.initialize(model=model, config=ds_config)") +
      frame(f"{DS}/__init__.py", 162, "initialize", "config_class = DeepSpeedConfig(config, mpu)") +
      frame(f"{DS}/runtime/config.py", 797, "__init__", "self._configure_train_batch_size()") +
      frame(f"{DS}/runtime/config.py", 980, "_configure_train_batch_size", "self._batch_assertion()") +
      frame(f"{DS}/runtime/config.py", 928, "_batch_assertion", "assert train_batch == micro_batch * grad_acc * self.world_size, (") +
      ["AssertionError: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size 32 != 4 * 1 * 4"],
      category="config", phase="init", shape="DeepSpeedConfig._batch_assertion message (deepspeed/runtime/config.py)")
write("pipe-shape-mismatch-rank1.log",
      frame(f"{DS}/runtime/pipe/engine.py", 1360, "_exec_schedule", "self._exec_instr(**cmd.kwargs)") +
      frame(f"{DS}/runtime/pipe/engine.py", 745, "_exec_backward_pass", "torch.autograd.backward(tensors=(outputs, ), grad_tensors=(grad_tensors, ))") +
      frame(f"{T}/autograd/__init__.py", 244, "backward", "grad_tensors_ = _make_grads(tensors, grad_tensors_, is_grads_batched=False)") +
      frame(f"{T}/autograd/__init__.py", 88, "_make_grads", "raise RuntimeError(") +
      ["RuntimeError: Mismatch in shape: grad_output[0] has a shape of torch.Size([8, 4096]) and output[0] has a shape of torch.Size([8, 2048])."],
      rank=1, prefix="[rank1]: ", category="framework", phase="backward",
      shape="torch.autograd._make_grads message under PipelineEngine._exec_backward_pass")

# ---- collective timeouts, NCCL -------------------------------------------------------------------
def nccl_lines(rank, t, seq, op, ran, pg="[PG ID 0 PG GUID 0(default_pg) Rank {r}]"):
    p = f"[rank{rank}]:[E1203 {t} {4000 + rank} ProcessGroupNCCL.cpp:{{l}}] " + pg.format(r=rank) + " "
    return [p.format(l=632) + f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
            f"NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for {ran} milliseconds before timing out.",
            p.format(l=2097) + f"Exception (either an error or timeout) detected by watchdog at work: {seq}, "
            f"last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}."]

init = [f"[rank{r}]:I1203 09:10:0{r}.100000 {4000 + r} ProcessGroupNCCL.cpp:936] [PG ID 0 PG GUID 0 Rank {r}] "
        f"ProcessGroupNCCL initialization options: size: 8, global rank: {r}, TIMEOUT(ms): 600000, "
        "USE_HIGH_PRIORITY_STREAM: 0, SPLIT_FROM: 0, SPLIT_COLOR: 0, PG Name: 0" for r in range(8)]
lines = init[:]
for r in (0, 1, 2, 3, 4, 6, 7):
    lines += nccl_lines(r, f"09:20:1{r}.22{r}000", 880, "BROADCAST", 600000 + 37 * r)
write("nccl-watchdog-7-of-8-rank5-silent.log", lines, rank=5, category="unknown", phase="unknown",
      shape="ProcessGroupNCCL.cpp (torch 2.5/2.6): initialization options line with size, the watchdog's timeout line "
            "(WorkNCCL operator<<) and its 'Exception (either an error or timeout) detected by watchdog at work' line, "
            "logPrefix '[PG ID n PG GUID g(desc) Rank r] ', c10 glog header and the [rankN]: prefix")
lines = init[:]
for r in (0, 1, 2, 3):
    lines += nccl_lines(r, f"09:20:1{r}.22{r}000", 880, "BROADCAST", 600000 + 37 * r)
write("nccl-watchdog-4-of-8-others-silent.log", lines, category="unknown", phase="unknown",
      shape="as nccl-watchdog-7-of-8-rank5-silent.log with ranks 0-3 timing out and ranks 4-7 printing nothing: "
            "four suspects, none singled out",
      note="no one rank is shown: the answer names ranks 4-7 as the suspects, at low confidence")
lines = init[:]
for r in (0, 1, 2, 3):
    lines += nccl_lines(r, f"09:20:1{r}.22{r}000", 880, "BROADCAST", 600000 + 37 * r)
for r in (4, 5, 7):
    lines.append(f"[rank{r}]:[E1203 09:20:1{r}.5{r}0000 {4000 + r} ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
                 "Received a dump signal due to a collective timeout from  rank 0 and we will try our best to dump the debug info. "
                 "Last enqueued NCCL work: 880, last completed NCCL work: 879.This is most likely caused by incorrect usages of "
                 "collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the "
                 "scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other "
                 "reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ")
lines.append("[rank6]:[E1203 09:20:16.560000 4006 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank 6] "
             "Received a dump signal due to a collective timeout from  rank 0 and we will try our best to dump the debug info. "
             "Last enqueued NCCL work: 879, last completed NCCL work: 879.This is most likely caused by incorrect usages of "
             "collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the "
             "scheduled collective, for some reason, didn't run. Additionally, this can be caused by GIL deadlock or other "
             "reasons such as network errors or bugs in the communications library (e.g. NCCL), etc. ")
write("nccl-work-status-rank6-never-enqueued.log", lines, rank=6, category="unknown", phase="unknown",
      shape="ProcessGroupNCCL.cpp (torch 2.6): ranks 0-3 time out in SeqNum 880; the others print "
            "getNCCLWatchdogTimeoutErrorMsg ('Received a dump signal ... Last enqueued NCCL work: E, last completed NCCL work: C.'); "
            "rank 6 never enqueued 880")
lines = []
for r in (0, 2, 3):
    lines += nccl_lines(r, f"09:20:1{r}.22{r}000", 4012, "ALLREDUCE", 1800000 + 11 * r, pg="[PG 0 (default_pg) Rank {r}]")
    lines += [f"[rank{r}]:[E1203 09:20:1{r}.23{r}000 {4000 + r} ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank {r}] "
              f"Timeout at NCCL work: 4012, last enqueued NCCL work: 4012, last completed NCCL work: 4011.",
              f"[rank{r}]:[E1203 09:20:1{r}.23{r}100 {4000 + r} ProcessGroupNCCL.cpp:621] [Rank {r}] Some NCCL operations have "
              "failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
              "corrupted/incomplete data.",
              f"[rank{r}]:[E1203 09:20:1{r}.23{r}200 {4000 + r} ProcessGroupNCCL.cpp:627] [Rank {r}] To avoid data inconsistency, "
              "we are taking the entire process down.",
              f"[rank{r}]:[E1203 09:20:1{r}.24{r}000 {4000 + r} ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank {r}] Process "
              "group watchdog thread terminated with exception: [Rank " + str(r) + "] Watchdog caught collective operation "
              "timeout: WorkNCCL(SeqNum=4012, OpType=ALLREDUCE, NumelIn=25165824, NumelOut=25165824, Timeout(ms)=1800000) ran for "
              f"{1800000 + 11 * r} milliseconds before timing out.",
              "terminate called after throwing an instance of 'c10::DistBackendError'"]
lines += [glog("E", "1203 09:20:21.118000", 3900, "torch/distributed/elastic/multiprocessing/api.py:869",
               "failed (exitcode: -6) local_rank: 0 (pid: 4000) of binary: /opt/conda/bin/python"),
          "Root Cause (first observed failure):", "[0]:", "  time      : 2026-12-03_09:20:21",
          "  host      : gpu-07", "  rank      : 0 (local_rank: 0)", "  exitcode  : -6 (pid: 4000)",
          "  error_file: <N/A>", "  traceback : Signal 6 (SIGABRT) received by PID 4000"]
write("nccl-timeout-then-sigabrt-rank1-silent.log", lines, rank=1, category="unknown", phase="unknown",
      shape="ProcessGroupNCCL.cpp (torch 2.4): watchdog timeout, 'Timeout at NCCL work', 'Some NCCL operations have failed or "
            "timed out', 'Process group watchdog thread terminated with exception', libstdc++ terminate; torchrun's Root Cause "
            "(exitcode -6, SIGABRT) naming rank 0; ranks 0, 2, 3 of 4 timed out, rank 1 printed nothing")
write("torchrun-summary-sigkill-no-kernel-log.log",
      [glog("W", "1203 09:31:02.100000", 3900, "torch/distributed/elastic/multiprocessing/api.py:897",
            f"Sending process {4000 + r} closing signal SIGTERM") for r in (0, 1, 2)] +
      [glog("E", "1203 09:31:02.900000", 3900, "torch/distributed/elastic/multiprocessing/api.py:869",
            "failed (exitcode: -9) local_rank: 3 (pid: 4003) of binary: /opt/conda/bin/python"),
       "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
       "============================================================", "train.py FAILED",
       "------------------------------------------------------------", "Failures:", "  <NO_OTHER_FAILURES>",
       "------------------------------------------------------------", "Root Cause (first observed failure):", "[0]:",
       "  time      : 2026-12-03_09:31:02", "  host      : gpu-07", "  rank      : 3 (local_rank: 3)",
       "  exitcode  : -9 (pid: 4003)", "  error_file: <N/A>", "  traceback : Signal 9 (SIGKILL) received by PID 4003",
       "============================================================"],
      rank=3, category="host-memory", phase="unknown",
      shape="torchrun's agent lines (multiprocessing/api.py) and ChildFailedError.format_msg (errors/__init__.py): a worker "
            "killed with -9 and no kernel log given: the OOM killer is the likely sender",
      note="host-memory is the likely cause, said at low confidence with the dmesg command that confirms it")
write("cuda-illegal-address-abort-rank2.log",
      [f"[rank2]:[E1203 09:40:01.100000 4002 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 2] Process group watchdog "
       "thread terminated with exception: CUDA error: an illegal memory access was encountered",
       "[rank2]:CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
       "terminate called after throwing an instance of 'c10::DistBackendError'",
       "  what():  [PG 0 (default_pg) Rank 2] Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered",
       glog("E", "1203 09:40:03.500000", 3900, "torch/distributed/elastic/multiprocessing/api.py:869",
            "failed (exitcode: -6) local_rank: 2 (pid: 4002) of binary: /opt/conda/bin/python")],
      rank=2, category="framework", phase="unknown",
      shape="ProcessGroupNCCL watchdog 'terminated with exception' carrying a CUDA error, libstdc++ terminate and what(), "
            "torchrun exit -6: an abort with no collective timeout before it is the failure itself")
# ---- no timestamps at all -----------------------------------------------------------------------
write("no-timestamps-valueerror-rank1.log",
      ["[rank1]: " + ln for ln in [HEADER] + USER_FWD + MOD_CALL + ENGINE_FWD + MOD_CALL +
       frame("/workspace/model.py", 57, "forward", "x = self.embed(tokens)") + MOD_CALL +
       frame(f"{T}/nn/modules/sparse.py", 162, "forward", "return F.embedding(") +
       frame(f"{T}/nn/functional.py", 2233, "embedding", "return torch.embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)") +
       ["IndexError: index out of range in self"]] +
      ["[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.1.2.7]:51122"],
      prefix=None, rank=1, category="user-code", phase="forward",
      shape="a pasted console without any timestamp: torch.nn.functional.embedding's IndexError on rank 1 in forward "
            "(torch 2.1 frames), gloo's peer-closed on rank 0 (gloo/transport/tcp/pair.cc)")

# ---- cut from our own captures -----------------------------------------------------------------
def cut(path, start, stop, name, **kw):
    lines = (REAL / path).read_text(errors="replace").splitlines()[start:stop]
    write(name, lines, prefix=None, **kw)


def find(path, needle, nth=0):
    lines = (REAL / path).read_text(errors="replace").splitlines()
    hits = [i for i, ln in enumerate(lines) if needle in ln]
    return hits[nth]

p = next((REAL / "torchrun-exception-rank1-of-2/logs").glob("*/attempt_0/1/stderr.log")).relative_to(REAL)
i = find(p, "in train_step")
cut(p, i, find(p, "ValueError: feature vector") + 1, "cut-rank1-valueerror-no-header.log", rank=1,
    category="user-code", phase="forward", shape=f"cut from tests/data/real/{p}: the traceback from train_step on, header and first frames left out")
p = "torchrun-pasted-exception-rank2-of-4/launcher.log"
i = find(p, "[default2]:[rank2]:   File") + 2
cut(p, i, find(p, "[default2]:[rank2]: ValueError") + 1, "cut-interleaved-rank2-mid-stack.log", rank=2,
    category="user-code", phase="forward",
    shape=f"cut from tests/data/real/{p}: four ranks' tracebacks interleaved, the cut starting mid-stack")
p = "torchrun-sigterm-hang-rank1-of-3/launcher.log"
cut(p, find(p, "death signal"), find(p, "Traceback (most recent call last):"), "cut-killed-from-outside-faulthandler.log",
    rank=1, category="unknown", phase="data",
    shape=f"cut from tests/data/real/{p}: torchrun's 'Received 15 death signal' and the ranks' faulthandler dumps")
p = "torchrun-never-reach-rank3-of-4/launcher.log"
cut(p, find(p, "[default0]:[rank0]: RuntimeError"), None, "cut-never-reach-tail.log", rank=3, category="unknown",
    phase="unknown", shape=f"cut from tests/data/real/{p}: from rank 0's timeout line to the end (three timeouts, torchrun's summary naming a survivor)")
p = "torchrun-abort-after-timeout-rank1-of-2/launcher.log"
cut(p, find(p, "[default0]:Traceback (most recent call last):"), None, "cut-abort-after-timeout.log", rank=1,
    category="unknown", phase="unknown", shape=f"cut from tests/data/real/{p}: rank 0's timeout traceback, its abort and torchrun's -6 summary")
p = next((REAL / "deepspeed-bad-config-2/logs").glob("*_rank0.log")).relative_to(REAL)
cut(p, find(p, "in get_zero_config"), find(p, "Extra inputs are not permitted") + 1, "cut-pydantic-validation-fragment.log",
    rank=0, category="config", phase="init",
    shape=f"cut from tests/data/real/{p}: the last frame and the multi-line ValidationError, no header")
p = "torchrun-oom-rank1-of-2/dmesg-T.txt"
dm = (REAL / p).read_text(errors="replace").splitlines()
kill = [ln for ln in dm if "Killed process" in ln or "oom-kill:" in ln]
q = "torchrun-oom-rank1-of-2/launcher.log"
ql = (REAL / q).read_text(errors="replace").splitlines()
tail = ql[find(q, "Root Cause (first observed failure):"):find(q, "Root Cause (first observed failure):") + 8]
write("cut-dmesg-and-torchrun-summary-oom.log", kill + tail, prefix=None, rank=1, category="host-memory", phase="unknown",
      shape=f"cut from tests/data/real/{p} (the kill lines as dmesg -T printed them) and {q} (torchrun's Root Cause)")
p = "torchrun-nan-rank1-of-2/launcher.log"
cut(p, find(p, "FloatingPointError: loss is") - 4, find(p, "FloatingPointError: loss is") + 1, "cut-nan-loss-check.log",
    category="numerics", phase="forward", shape=f"cut from tests/data/real/{p}: the last frame lines and the script's FloatingPointError")
p = "hf-trainer-compute-loss-exception.log"
FORM = REAL.parent / "formats"
fl = (FORM / p).read_text(errors="replace").splitlines()
j = next(i for i, ln in enumerate(fl) if "in compute_loss" in ln)
write("cut-hf-trainer-compute-loss.log", fl[j - 6:j + 4], prefix=None, category="user-code", phase="forward",
      shape=f"cut from tests/data/formats/{p}: Trainer frames down to the custom compute_loss and its RuntimeError")
p = "rich-traceback-nocolor.log"
fl = (FORM / p).read_text(errors="replace").splitlines()
j = next(i for i, ln in enumerate(fl) if "in train_step" in ln)
write("cut-rich-box-middle.log", fl[j:], prefix=None, category="user-code", phase="unknown",
      shape=f"cut from tests/data/formats/{p}: a rich panel from its middle (no top border) to the exception line")

(OUT / "manifest.json").write_text(json.dumps(entries, indent=1) + "\n")
print(len(entries), "fragments")
