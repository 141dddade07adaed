"""CUDA errors, the NVIDIA driver, the kernel, Megatron-Core / Transformer Engine, FSDP / DeviceMesh /
torchtitan and torch.compile: the catalog against lines written from the format strings of the
sources (c10/cuda CUDAException, the CUDA runtime's error strings, ATen device asserts, the Linux
kernel's printk formats, NVIDIA's Xid table, Megatron-Core, TransformerEngine logging.h,
torch.distributed.fsdp, device_mesh.py, torchtitan parallel_dims.py, torch/_dynamo/exc.py, triton),
and small pasted logs through the whole analysis.

Every line is written from a format string with made-up values; none is copied from a user's log.
"""

from __future__ import annotations

import pytest

from firstfault.analysis.catalog import load_catalog
from tests.analysis.catalog_lines import assert_line
from tests.offline.scoring import Case
from tests.offline.scoring import analyze as analyze_case

CATALOG = load_catalog()

# (line, signature id, role, category, facts it must carry)
LINES = [
    ("[rank2]: RuntimeError: CUDA error: device-side assert triggered", "cuda.device_assert", "root", "config", {}),
    ("/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1308: indexSelectLargeIndex: block: [7,0,0], thread: [3,0,0] "
     "Assertion `srcIndex < srcSelectDimSize` failed.", "cuda.device_assert", "root", "config",
     {"assertion": "srcIndex < srcSelectDimSize"}),
    ("/tmp/torchinductor_ab/q3/cq3x.py:40: unknown: block: [5,0,0], thread: [9,0,0] "
     "Assertion `index out of bounds: 0 <= tmp7 < 151936` failed.", "cuda.device_assert", "root", "config",
     {"assertion": "index out of bounds: 0 <= tmp7 < 151936"}),
    ("RuntimeError: HIP error: device-side assert triggered", "cuda.device_assert", "root", "config", {}),
    ("[rank1]: torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device",
     "cuda.no_kernel_image", "root", "config", {}),
    ("NVIDIA B200 with CUDA capability sm_100 is not compatible with the current PyTorch installation.",
     "cuda.no_kernel_image", "root", "config", {"arch": "sm_100"}),
    ("RuntimeError: CUDA error: misaligned address", "cuda.misaligned_address", "root", "framework", {}),
    ("RuntimeError: CUDA error: the launch timed out and was terminated", "cuda.launch_timeout", "root", "unknown", {}),
    ("[rank4]: RuntimeError: CUDA error: invalid device ordinal", "cuda.invalid_device_ordinal", "root", "config",
     {}),
    ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed "
     "a driver from http://www.nvidia.com/Download/index.aspx", "cuda.device_unavailable", "root", "config", {}),
    ("RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use "
     "the 'spawn' start method", "cuda.fork_reinit", "root", "user-code", {}),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, "
     "k, &alpha, a, lda, b, ldb, &beta, c, ldc)`", "cuda.cublas_error", "root", "unknown",
     {"error": "CUBLAS_STATUS_EXECUTION_FAILED", "call": "cublasSgemm"}),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED", "cuda.cudnn_error", "root", "unknown",
     {"error": "CUDNN_STATUS_EXECUTION_FAILED"}),
    # the allocation codes stay GPU memory
    ("RuntimeError: cuDNN error: CUDNN_STATUS_NOT_ENOUGH_MEMORY", "cuda.library_alloc_failed", "root", "gpu-memory", {}),
    ("RuntimeError: CUDA error: uncorrectable NVLink error was detected during the execution",
     "cuda.nvlink_uncorrectable", "root", "hardware", {}),
    ("[rank6]: RuntimeError: CUDA error: an illegal memory access was encountered", "cuda.illegal_memory_access",
     "root", "framework", {}),
    # NCCL's CUDACHECK with a specific CUDA error: the CUDA meaning wins over the generic NCCL one
    ("node-4:881:902 [5] enqueue.cc:1556 NCCL WARN Cuda failure 'an illegal memory access was encountered'",
     "cuda.illegal_memory_access", "root", "framework", {}),
    ("node-4:881:902 [5] enqueue.cc:1556 NCCL WARN Cuda failure 'initialization error'", "nccl.cuda_failure",
     "root", "unknown", {}),
    ("RuntimeError: CUDA error: unknown error", "cuda.unknown_error", "root", "hardware", {}),
    ("RuntimeError: CUDA error: operation not permitted when stream is capturing", "cuda.error", "root", "unknown",
     {"error": "operation not permitted when stream is capturing"}),
    # the kernel
    ("[ 7001.000100] EXT4-fs error (device md0): ext4_lookup:1786: inode #5506: comm python3: iget: bad extra_isize 6",
     "kernel.fs_error", "root", "storage", {"device": "md0", "function": "ext4_lookup"}),
    ("[ 7001.000200] EXT4-fs (md0): Remounting filesystem read-only", "kernel.fs_error", "root", "storage",
     {"device": "md0"}),
    ("Dec  2 10:03:21 gpu-07 kernel: [ 7001.000300] nfs: server storage-3 not responding, still trying",
     "kernel.nfs_not_responding", "root", "storage", {"server": "storage-3"}),
    ("[ 7001.000400] I/O error, dev sdc, sector 88123 op 0x1:(WRITE) flags 0x0 phys_seg 8 prio class 2",
     "kernel.block_io_error", "root", "storage", {"device": "sdc", "block": "88123"}),
    ("[ 7001.000500] traps: python3[4242] trap invalid opcode ip:7f0a11c2 sp:7ffc9e10 error:0 in "
     "libtorch_cpu.so[7f0a0000000+4000000]", "kernel.trap", "root", "framework",
     {"pid": "4242", "object": "libtorch_cpu.so"}),
    ("[ 7001.000600] python3[4242]: segfault at 0 ip 00007f0a11c2 sp 00007ffc9e10 error 4 in libnccl.so.2[7f0a0000+2000]",
     "kernel.segfault", "root", "framework", {"pid": "4242"}),
    ("[ 7001.000700] Out of memory: Killed process 4242 (python3) total-vm:9000000kB, anon-rss:8000000kB, "
     "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:20000kB oom_score_adj:0", "kernel.oom_kill", "root", "host-memory",
     {"pid": "4242"}),
    ("[ 9123.000001] Kernel panic - not syncing: Fatal machine check", "kernel.fatal_machine_check", "root",
     "hardware", {}),
    # the NVIDIA driver: Xid 13/31/43 are the program's, 45 only reports an earlier one, 48/79/94/95 the GPU
    ("NVRM: Xid (PCI:0000:b3:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): "
     "Misaligned Address", "nvidia.xid", "root", "user-code", {"xid": "13"}),
    ("NVRM: Xid (PCI:0000:b3:00): 43, pid=4242, name=python3, Ch 00000008", "nvidia.xid", "root", "user-code",
     {"xid": "43"}),
    ("NVRM: Xid (PCI:0000:b3:00): 45, pid=4242, name=python3, Ch 00000008 caused by previous Xid 13",
     "nvidia.xid", "context", "user-code", {"xid": "45"}),
    ("NVRM: Xid (PCI:0000:b3:00): 95, pid=4242, name=python3, Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
     "nvidia.xid", "root", "hardware", {"xid": "95"}),
    ("NVRM: Xid (PCI:0000:b3:00): 54, Auxiliary power is not connected to the GPU board",
     "nvidia.xid", "root", "hardware", {"xid": "54"}),
    ("NVRM: GPU at PCI:0000:b3:00: GPU-11111111-2222-3333-4444-555555555555 has fallen off the bus.",
     "nvidia.gpu_fell_off_bus", "root", "hardware", {"pci": "0000:b3:00"}),
    ("    Remapping Failure Occurred    : Yes", "nvidia.row_remap_failure", "root", "hardware", {}),
    # nvidia-smi with NVML's NVML_ERROR_GPU_IS_LOST; old drivers glue the bus id to "GPU", new ones name the index
    ("Unable to determine the device handle for GPU 0000:3b:00.0: GPU is lost.  Reboot the system to recover this GPU",
     "nvidia.smi_gpu_lost", "root", "hardware", {"pci": "0000:3b:00.0"}),
    ("Unable to determine the device handle for GPU0000:86:00.0: GPU is lost.  Reboot the system to recover this GPU",
     "nvidia.smi_gpu_lost", "root", "hardware", {"pci": "0000:86:00.0"}),
    ("Unable to determine the device handle for GPU2: 0000:41:00.0: GPU is lost.  Reboot the system to recover this GPU",
     "nvidia.smi_gpu_lost", "root", "hardware", {"pci": "0000:41:00.0", "gpu_index": "2"}),
    # Megatron-Core, Transformer Engine
    ("[rank3]: AssertionError: Communication call has not been issued for this bucket (2/7 params have grad available)",
     "megatron.grad_sync_not_issued", "root", "framework", {"ready": "2", "params": "7", "rank": None}),
    ("RuntimeError: /opt/te/transformer_engine/common/gemm/cublaslt_gemm.cu:300 in function cublas_gemm: "
     "cuBLAS Error: an internal operation failed", "transformer_engine.error", "root", "framework",
     {"function": "cublas_gemm"}),
    # TE's own CUDA Error words: the CUDA meaning first
    ("RuntimeError: /opt/te/transformer_engine/common/util/cuda_runtime.cpp:40 in function sm_count: "
     "CUDA Error: an illegal memory access was encountered", "cuda.illegal_memory_access", "root", "framework", {}),
    ("megatron.core.dist_checkpointing.core.CheckpointingException: Global shape mismatch for loaded ((4096, 1024)) "
     "and expected ((8192, 1024)) tensor for key decoder.layers.self_attention.linear_qkv.weight",
     "megatron.dist_ckpt_shape_mismatch", "root", "config", {"key": "decoder.layers.self_attention.linear_qkv.weight"}),
    # FSDP, DeviceMesh, torchtitan
    ("ValueError: Must flatten tensors with uniform dtype but got torch.float32 and torch.uint8",
     "fsdp.mixed_dtype_flatten", "root", "config", {"dtype": "torch.float32", "other": "torch.uint8"}),
    ("RuntimeError: FSDP only supports single device modules, but got params on {device(type='cpu'), "
     "device(type='cuda', index=0)}", "fsdp.multi_device_module", "root", "config", {}),
    ("[rank0]: RuntimeError: Mesh should not be bigger than default world size 8, but found 16 ranks!",
     "device_mesh.bigger_than_world", "root", "config", {"world": "8", "size": "16"}),
    ("AssertionError: Invalid parallel dims: dp(4) * tp(2) * pp(2) != WORLD_SIZE(8)", "torchtitan.parallel_dims",
     "root", "config", {"world": "8"}),
    # torch.compile: the inner error's words decide; an OOM inside is GPU memory
    ("torch._inductor.exc.InductorError: OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 "
     "has a total capacity of 79.10 GiB of which 1.00 GiB is free.", "cuda.oom", "root", "gpu-memory", {}),
    ("torch._inductor.exc.InductorError: CppCompileError: C++ compile error", "compile.backend_failed", "root",
     "framework", {"exc_type": "CppCompileError"}),
    ("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\nRuntimeError: No space left on device",
     "compile.backend_failed", "root", "storage", {"backend": "inductor"}),
    ("triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 232448, Hardware limit: 232448."
     " Reducing block sizes or `num_stages` may help.", "compile.triton_out_of_resources", "root", "framework",
     {"resource": "shared memory"}),
    ("torch._dynamo.exc.TorchRuntimeError: Failed running call_function <built-in function add>(*(FakeTensor(..., "
     "size=(2, 3)), FakeTensor(..., size=(4,))), **{}):", "compile.dynamo_user_error", "root", "user-code", {}),
    ("torch._dynamo.exc.Unsupported: generator", "compile.dynamo_internal", "root", "framework", {}),
]


@pytest.mark.parametrize("text,sig,role,category,facts", LINES, ids=[f"{x[1]}-{i}" for i, x in enumerate(LINES)])
def test_lines_from_the_format_strings(text, sig, role, category, facts):
    assert_line(CATALOG, text, sig, role, category, facts)


# (near miss, the signature it must not be)
NEAR_MISSES = [
    ("    if 'device-side assert triggered' in str(err):", "cuda.device_assert"),
    ("        tl.device_assert((0 <= tmp7) & (tmp7 < 151936), \"index out of bounds: 0 <= tmp7 < 151936\")",
     "cuda.device_assert"),
    ("[ 7001.000900] nfs: server storage-3 OK", "kernel.nfs_not_responding"),
    ("OSError: [Errno 5] Input/output error: '/ckpt/step_100/model.safetensors'", "kernel.block_io_error"),
    ("    Remapping Failure Occurred    : No", "nvidia.row_remap_failure"),
    ("from torch._dynamo.exc import BackendCompilerFailed", "compile.backend_failed"),
    ("  File \"/opt/venv/lib/python3.11/site-packages/transformer_engine/pytorch/attention.py\", line 5000, in forward",
     "transformer_engine.error"),
    ("        f'Communication call has not been issued for this bucket '", "megatron.grad_sync_not_issued"),
    # nvidia-smi's other NVML errors say nothing of the hardware by themselves (a driver not loaded, a BIOS setting)
    ("Unable to determine the device handle for GPU0000:86:00.0: Unknown Error", "nvidia.smi_gpu_lost"),
    ("Unable to determine the device handle for GPU1: 0000:41:00.0: Unknown Error", "nvidia.smi_gpu_lost"),
    # nvidia-smi's device number is not a rank
    ("Unable to determine the device handle for GPU2: 0000:41:00.0: GPU is lost.  Reboot the system to recover this GPU",
     "no-rank"),
    # a GPU index is not a rank
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.10 GiB",
     "no-rank"),
]


@pytest.mark.parametrize("text,sig", NEAR_MISSES)
def test_near_misses(text, sig):
    m = CATALOG.match(text)
    if sig == "no-rank":
        assert m is not None and "rank" not in m.groups
        return
    assert m is None or m.signature.id != sig, (m and m.signature.id)


def test_xid_13_31_43_are_the_programs_and_45_is_context():
    assert {CATALOG.xid(c).category for c in (13, 31, 43)} == {"user-code"}
    assert CATALOG.xid(45).role == "context"
    assert {CATALOG.xid(c).category for c in (48, 54, 79, 94, 95, 119, 120)} == {"hardware"}


def test_an_illegal_access_or_a_device_assert_is_never_high_by_itself():
    for sid in ("cuda.illegal_memory_access", "cuda.device_assert", "cuda.misaligned_address", "cuda.cublas_error"):
        assert CATALOG.get(sid).max_confidence == "medium"


# ---------------------------------------------------------------------------
# Whole pasted logs (written from the formats) through `firstfault analyze -`
# ---------------------------------------------------------------------------

LOGS = {}
LOGS['assert'] = """\
/opt/pytorch/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1290: indexSelectLargeIndex: block: [21,0,0], thread: [64,0,0] Assertion `srcIndex < srcSelectDimSize` failed.
/opt/pytorch/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1290: indexSelectLargeIndex: block: [21,0,0], thread: [65,0,0] Assertion `srcIndex < srcSelectDimSize` failed.
[rank0]: Traceback (most recent call last):
[rank0]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 240, in <module>
[rank0]:     pretrain(
[rank0]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 350, in pretrain
[rank0]:     iteration, num_floating_point_operations_so_far = train(
[rank0]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 1210, in train
[rank0]:     train_step(forward_step_func,
[rank0]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 700, in train_step
[rank0]:     losses_reduced = forward_backward_func(
[rank0]:   File "/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", line 470, in forward_backward_no_pipelining
[rank0]:     output_tensor, num_tokens = forward_step(
[rank0]:   File "/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", line 275, in forward_step
[rank0]:     output_tensor, loss_func = forward_step_func(data_iterator, model)
[rank0]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 190, in forward_step
[rank0]:     output_tensor = model(tokens, position_ids, attention_mask, labels=labels)
[rank0]: RuntimeError: CUDA error: device-side assert triggered
[rank0]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
[rank0]: For debugging consider passing CUDA_LAUNCH_BLOCKING=1
[rank0]: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""
LOGS['xid'] = """\
[ 8812.100100] NVRM: Xid (PCI:0000:3b:00): 79, pid=24215, name=python3, GPU has fallen off the bus.
[ 8812.100200] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.
[rank3]:[E1202 10:03:22.000000000 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog thread terminated with exception: CUDA error: unspecified launch failure
"""
LOGS['titan'] = """\
[rank0]:[titan] 2026-12-02 10:00:01,000 - root - INFO - Starting job: Llama 3 8B training
[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/torchtitan/torchtitan/train.py", line 640, in <module>
[rank0]:     trainer = Trainer(config)
[rank0]:   File "/work/torchtitan/torchtitan/train.py", line 90, in __init__
[rank0]:     self.parallel_dims = parallel_dims = ParallelDims(
[rank0]:   File "<string>", line 14, in __init__
[rank0]:   File "/work/torchtitan/torchtitan/distributed/parallel_dims.py", line 40, in __post_init__
[rank0]:     self._validate()
[rank0]:   File "/work/torchtitan/torchtitan/distributed/parallel_dims.py", line 62, in _validate
[rank0]:     raise ValueError(
[rank0]: ValueError: Invalid parallel dims: dp_replicate(1) * dp_shard(2) * cp(1) * tp(4) * pp(1) != WORLD_SIZE(6)
"""
LOGS['ordinal'] = """\
[rank7]: Traceback (most recent call last):
[rank7]:   File "/work/train.py", line 22, in <module>
[rank7]:     torch.cuda.set_device(local_rank)
[rank7]:   File "/opt/venv/lib/python3.11/site-packages/torch/cuda/__init__.py", line 478, in set_device
[rank7]:     torch._C._cuda_setDevice(device)
[rank7]: torch.AcceleratorError: CUDA error: invalid device ordinal
[rank7]: GPU device may be out of range, do you have enough GPUs?
"""
LOGS['fsdp'] = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/train.py", line 80, in <module>
[rank1]:     model = FSDP(model, auto_wrap_policy=policy, device_id=torch.cuda.current_device())
[rank1]:   File "/opt/venv/lib/python3.11/site-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py", line 509, in __init__
[rank1]:     _init_param_handle_from_module(
[rank1]:   File "/opt/venv/lib/python3.11/site-packages/torch/distributed/fsdp/_init_utils.py", line 636, in _init_param_handle_from_module
[rank1]:     _init_param_handle_from_params(state, managed_params, fully_sharded_module)
[rank1]:   File "/opt/venv/lib/python3.11/site-packages/torch/distributed/fsdp/_flat_param.py", line 791, in _validate_tensors_to_flatten
[rank1]:     raise ValueError(
[rank1]: ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32
"""


def _ff(name: str) -> dict:
    return analyze_case(Case("paste", ["-"], {}, stdin=LOGS[name].encode()))["first_failure"]


def test_a_megatron_embedding_assert_is_a_size_mismatch_in_forward_not_high():
    ff = _ff("assert")
    assert (ff["rank"], ff["signature"], ff["category"], ff["phase"]) == (0, "cuda.device_assert", "config", "forward")
    assert ff["confidence"] != "high"


def test_an_xid_79_beside_a_launch_failure_is_the_gpu():
    ff = _ff("xid")
    assert ff["category"] == "hardware" and ff["signature"] in ("nvidia.xid", "nvidia.gpu_fell_off_bus")


def test_torchtitan_parallel_dims_is_config_at_init():
    ff = _ff("titan")
    assert (ff["rank"], ff["signature"], ff["category"], ff["phase"]) == (0, "torchtitan.parallel_dims", "config", "init")


def test_more_ranks_than_gpus_is_config_at_init():
    ff = _ff("ordinal")
    assert (ff["rank"], ff["signature"], ff["category"], ff["phase"]) == (7, "cuda.invalid_device_ordinal", "config", "init")


def test_fsdp_mixed_dtypes_is_config_at_init():
    ff = _ff("fsdp")
    assert (ff["rank"], ff["signature"], ff["category"], ff["phase"]) == (1, "fsdp.mixed_dtype_flatten", "config", "init")


FABRIC_NOT_UP = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/w/train.py", line 40, in <module>
[rank0]:     dist.barrier()
[rank0]:   File "/env/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", line 4635, in barrier
[rank0]:     work = group.barrier(opts=opts)
[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.25.1
[rank0]: ncclUnhandledCudaError: Call to CUDA function failed.
[rank0]: Last error:
[rank0]: Cuda failure 802 'system not yet initialized'
"""


def test_cuda_802_is_the_node_s_fabric_not_up_at_start():
    """NCCL's first CUDA call on a node whose NVSwitch fabric is not up: the node owner's, not the job's."""
    ff = analyze_case(Case("paste", ["-"], {}, stdin=FABRIC_NOT_UP.encode()))["first_failure"]
    assert (ff["signature"], ff["category"], ff["phase"], ff["rank"]) == ("cuda.system_not_ready", "hardware", "init", 0)
    other = FABRIC_NOT_UP.replace("802 'system not yet initialized'", "999 'unknown error'")
    assert analyze_case(Case("paste", ["-"], {}, stdin=other.encode()))["first_failure"]["category"] != "hardware"


def test_an_fsdp_wrap_class_the_model_lacks_is_config_even_raised_in_a_library():
    """peft's and accelerate's FSDP wrap policies raise it: the class name came from the user's settings."""
    text = ("[rank2]: Traceback (most recent call last):\n"
            "[rank2]:   File \"/w/training.py\", line 682, in <module>\n"
            "[rank2]:     fsdp_plugin.auto_wrap_policy = fsdp_auto_wrap_policy(trainer.model)\n"
            "[rank2]:   File \"/env/lib/python3.10/site-packages/peft/utils/other.py\", line 428, in fsdp_auto_wrap_policy\n"
            "[rank2]:     raise Exception(\"Could not find the transformer layer class to wrap in the model.\")\n"
            "[rank2]: Exception: Could not find the transformer layer class to wrap in the model.\n")
    ff = analyze_case(Case("paste", ["-"], {}, stdin=text.encode()))["first_failure"]
    assert (ff["signature"], ff["category"], ff["phase"], ff["rank"]) == ("fsdp.wrap_class_missing", "config", "init", 2)
