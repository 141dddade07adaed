"""The lifecycle phase a failure happened in, from stack frames.

Frames are read innermost first: the innermost frame that belongs to a known
DeepSpeed / PyTorch / transformers code path names the phase (a ValueError in
the user's ``forward`` called from ``engine.forward`` is ``forward``; an error in
``torch.save`` under ``engine.save_checkpoint`` is ``checkpoint-save``). Rules
name files by their path suffix and functions by name, as they appear in
DeepSpeed 0.19 and PyTorch 2.x tracebacks.
"""

from __future__ import annotations

from collections.abc import Sequence

from firstfault.analysis.model import Frame

PHASES = (
    "init",
    "forward",
    "backward",
    "param-gather",
    "optimizer-step",
    "checkpoint-save",
    "checkpoint-load",
    "data",
    "unknown",
)

# (phase, path fragments, function names): a frame matches when its path holds
# one of the fragments or its function is one of the names. Checked in order for
# each frame, innermost frame first.
_RULES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("checkpoint-save", ("torch/serialization.py:save",), (
        "save_checkpoint", "_save_checkpoint", "_save_zero_checkpoint", "save_16bit_model",
        "_save_moe_checkpoint", "_create_checkpoint_file", "_create_zero_checkpoint_files",
        "_checkpoint_tag_validation", "save_pretrained", "_save_checkpoint_async",
    )),
    ("checkpoint-load", (), (
        "load_checkpoint", "_load_checkpoint", "_load_zero_checkpoint", "load_module_state_dict",
        "load_state_dict", "_load_optimizer_state", "load_sharded_checkpoint",
    )),
    ("param-gather", ("partitioned_param_coordinator.py", "partition_parameters.py"), (
        "fetch_sub_module", "all_gather_coalesced", "_all_gather", "allgather_params",
        "pre_sub_module_forward_function", "_pre_forward_module_hook", "__all_gather_params",
    )),
    ("optimizer-step", ("torch/optim/", "deepspeed/ops/adam", "zero/stage_1_and_2.py:step", "zero/stage3.py:step"), (
        "_take_model_step", "step", "_optimizer_step", "update_scale", "_update_scale",
        "check_overflow", "has_overflow", "unscale_and_clip_grads",
    )),
    ("backward", ("torch/autograd/",), (
        "backward", "allreduce_gradients", "reduce_gradients", "reduce_ipg_grads",
        "_backward_prologue", "_backward_epilogue", "average_tensor",
    )),
    ("data", ("torch/utils/data/",), ("__next__", "_next_data", "__getitem__", "collate_fn", "_get_batch")),
    ("init", ("deepspeed/__init__.py", "deepspeed/runtime/config.py", "pydantic"), (
        "initialize", "init_distributed", "from_pretrained", "_configure_distributed_model",
        "_configure_optimizer", "_configure_zero_optimizer", "_do_args_sanity_check",
        "_do_sanity_check", "_batch_assertion", "_configure_train_batch_size", "init_process_group",
    )),
    ("forward", (), ("forward", "_call_impl", "_wrapped_call_impl", "compute_loss", "prediction_step")),
)


def _frame_phase(fr: Frame) -> str | None:
    path = fr.file.replace("\\", "/")
    where = f"{path}:{fr.func}"
    for phase, fragments, funcs in _RULES:
        if fr.func in funcs:
            return phase
        for frag in fragments:
            if frag in (where if ":" in frag else path):
                return phase
    return None


def phase_from_frames(frames: Sequence[Frame]) -> str | None:
    """The phase named by the innermost recognised frame, or None."""
    for fr in reversed(frames):
        phase = _frame_phase(fr)
        if phase:
            return phase
    return None
