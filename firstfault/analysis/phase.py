"""The lifecycle phase a failure happened in, from stack frames.

Two kinds of phase. The enclosing ones (construction and ``deepspeed.initialize``,
a checkpoint save or load) hold everything under them: a parameter gather inside
``save_checkpoint`` or inside ``zero.Init`` is still the save or the init, so any
frame of theirs in the stack names the phase. Otherwise the innermost frame of a
step's own parts names it: a ValueError in the user's ``forward`` called from
``engine.forward`` is ``forward``; a CUDA OOM in ``all_gather_coalesced`` under
``fetch_sub_module`` is ``param-gather``. Rules name files by their path and
functions by name (``path:func`` for a function only in that file), as they appear
in DeepSpeed 0.9-0.19, PyTorch 2.x and transformers tracebacks (the frame families
of knowledge/deepspeed-failure-guide.txt), e.g.::

    File ".../deepspeed/runtime/zero/partitioned_param_coordinator.py", line 341, in fetch_sub_module
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

# (phase, path fragments or "path:func", function names). A frame matches a rule when its
# path holds a fragment or its function is one of the names.
_ENCLOSING: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("checkpoint-save", ("torch/serialization.py:save", "torch/distributed/checkpoint/state_dict_saver.py"), (
        "save_checkpoint", "_save_checkpoint", "_save_zero_checkpoint", "save_16bit_model",
        "_save_moe_checkpoint", "_create_checkpoint_file", "_create_zero_checkpoint_files",
        "_checkpoint_tag_validation", "save_pretrained", "_save_checkpoint_async", "save_model",
    )),
    ("checkpoint-load", ("torch/serialization.py:load",), (
        "load_checkpoint", "_load_checkpoint", "_load_zero_checkpoint", "load_module_state_dict",
        "_load_optimizer_state", "load_sharded_checkpoint", "_load_from_checkpoint", "load_universal_checkpoint",
    )),
    ("init", ("deepspeed/__init__.py:initialize", "deepspeed/runtime/config.py", "pydantic",
              "partition_parameters.py:_post_init_method", "partition_parameters.py:__enter__",
              "deepspeed/runtime/engine.py:__init__"), (
        "init_distributed", "from_pretrained", "_load_pretrained_model", "_configure_distributed_model",
        "_configure_optimizer", "_configure_zero_optimizer", "_do_args_sanity_check", "_do_sanity_check",
        "_batch_assertion", "_configure_train_batch_size", "init_process_group", "from_config",
        "_convert_to_zero_parameters", "_zero_init_param",
    )),
)
_STEP: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # the coordinator's fetch and release (not its step bookkeeping: reset_step runs as backward starts)
    ("param-gather", ("partition_parameters.py",), (
        "fetch_sub_module", "all_gather_coalesced", "_all_gather", "allgather_params", "_allgather_params",
        "_allgather_params_coalesced", "__all_gather_params", "__all_gather_params_", "pre_sub_module_forward_function",
        "pre_sub_module_backward_function", "_pre_forward_module_hook", "_pre_backward_module_hook",
        "release_sub_module", "release_and_reset_all",
    )),
    ("optimizer-step", ("torch/optim/", "deepspeed/ops/adam", "stage_1_and_2.py:step", "stage3.py:step",
                        "deepspeed/runtime/engine.py:step"), (
        "_take_model_step", "_optimizer_step", "_post_step", "update_scale", "_update_scale",
        "check_overflow", "has_overflow", "unscale_and_clip_grads", "step",
    )),
    ("backward", ("torch/autograd/", "deepspeed/runtime/engine.py:backward"), (
        "backward", "allreduce_gradients", "reduce_gradients", "reduce_ipg_grads", "_backward_prologue",
        "_backward_epilogue", "average_tensor", "reduce_partition_and_remove_grads",
        "independent_gradient_partition_epilogue", "__reduce_and_partition_ipg_grads",
    )),
    ("data", ("torch/utils/data/",), ("_next_data", "__next__", "collate_fn", "default_collate", "_get_batch")),
    ("forward", ("deepspeed/runtime/engine.py:forward",), (
        "forward", "_call_impl", "_wrapped_call_impl", "compute_loss", "prediction_step",
    )),
)


def _matches(fr: Frame, rule: tuple[str, tuple[str, ...], tuple[str, ...]]) -> bool:
    _, fragments, funcs = rule
    if fr.func in funcs:
        return True
    path = fr.file.replace("\\", "/")
    where = f"{path}:{fr.func}"
    return any(frag in (where if ":" in frag else path) for frag in fragments)


def phase_from_frames(frames: Sequence[Frame]) -> str | None:
    """The phase the frames show (outermost first, as in a traceback), or None."""
    for fr in reversed(frames):
        for rule in _ENCLOSING:
            if _matches(fr, rule):
                return rule[0]
    for fr in reversed(frames):
        for rule in _STEP:
            if _matches(fr, rule):
                return rule[0]
    return None
