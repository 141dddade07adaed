"""Phase from the frames of each framework of issue 21 (point 4): HF Trainer, FSDP/FSDP2,
Megatron-Core, Lightning, NeMo, torchtitan, ColossalAI, verl/OpenRLHF. Stacks written here from
the frameworks' real files and functions (outermost first; line numbers made up)."""

from __future__ import annotations

import pytest

from firstfault.analysis.events import Frame
from firstfault.analysis.phase import importing, phase_from_frames

SP = "/env/lib/python3.11/site-packages"
MLM = "/workspace/Megatron-LM"


def stack(*specs: tuple[str, str]) -> list[Frame]:
    return [Frame(p if p.startswith("/") else f"{SP}/{p}", 10 + i, fn) for i, (p, fn) in enumerate(specs)]


CASES = {
    "hf trainer backward through accelerate and deepspeed": (stack(
        ("/w/train.py", "main"), ("transformers/trainer.py", "train"), ("transformers/trainer.py", "_inner_training_loop"),
        ("transformers/trainer.py", "training_step"), ("accelerate/accelerator.py", "backward"),
        ("deepspeed/runtime/engine.py", "backward")), "backward"),
    "hf trainer compute_loss": (stack(
        ("transformers/trainer.py", "_inner_training_loop"), ("transformers/trainer.py", "training_step"),
        ("transformers/trainer.py", "compute_loss"), ("torch/nn/modules/module.py", "_call_impl"),
        ("transformers/models/llama/modeling_llama.py", "forward")), "forward"),
    "hf trainer evaluation loop": (stack(
        ("transformers/trainer.py", "_inner_training_loop"), ("transformers/trainer.py", "_maybe_log_save_evaluate"),
        ("transformers/trainer.py", "_evaluate"), ("transformers/trainer.py", "evaluate"),
        ("transformers/trainer.py", "evaluation_loop")), "forward"),
    "hf eval's data loader is data": (stack(
        ("transformers/trainer.py", "evaluation_loop"), ("accelerate/data_loader.py", "__iter__")), "data"),
    "hf save inside _maybe_log_save_evaluate is the save": (stack(
        ("transformers/trainer.py", "_maybe_log_save_evaluate"), ("transformers/trainer.py", "_save_checkpoint"),
        ("transformers/trainer.py", "evaluate")), "checkpoint-save"),
    "hf callbacks told of a save, TRL's on_save among them": (stack(
        ("transformers/trainer.py", "_inner_training_loop"), ("transformers/trainer.py", "_maybe_log_save_evaluate"),
        ("transformers/trainer_callback.py", "on_save"), ("transformers/trainer_callback.py", "call_event"),
        ("trl/trainer/utils.py", "on_save")), "checkpoint-save"),
    "accelerate's main_process_first barrier, around a dataset prepared at set-up": (stack(
        ("/w/train.py", "main"), ("accelerate/accelerator.py", "main_process_first"),
        ("/usr/lib/python3.11/contextlib.py", "__enter__"), ("accelerate/state.py", "main_process_first"),
        ("accelerate/state.py", "_goes_first"), ("torch/distributed/c10d_logger.py", "wrapper"),
        ("torch/distributed/distributed_c10d.py", "barrier")), "init"),
    "a main_process_first of the user's own says nothing": (stack(
        ("/w/train.py", "main"), ("/w/utils/dist.py", "main_process_first"),
        ("torch/distributed/distributed_c10d.py", "barrier")), None),
    "fsdp2 unshard": (stack(
        ("/w/t.py", "main"), ("torch/nn/modules/module.py", "_call_impl"),
        ("torch/distributed/fsdp/_fully_shard/_fsdp_state.py", "_pre_forward"),
        ("torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "pre_forward"),
        ("torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "unshard"),
        ("torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "foreach_all_gather")), "param-gather"),
    "fsdp post-backward reduce": (stack(
        ("torch/_tensor.py", "backward"), ("torch/autograd/__init__.py", "backward"),
        ("torch/distributed/fsdp/_runtime_utils.py", "_post_backward_hook"),
        ("torch/distributed/fsdp/_runtime_utils.py", "_reduce_grad")), "backward"),
    "fsdp load_state_dict": (stack(
        ("/w/t.py", "main"), ("torch/nn/modules/module.py", "load_state_dict"),
        ("torch/distributed/fsdp/_state_dict_utils.py", "_pre_load_state_dict_hook"),
        ("torch/distributed/fsdp/_state_dict_utils.py", "_full_pre_load_state_dict_hook"),
        ("torch/distributed/fsdp/_runtime_utils.py", "_unshard")), "checkpoint-load"),
    "dcp's sharded optimizer state loaded back, a tensor made on a device": (stack(
        ("/w/t.py", "resume"), ("torch/distributed/checkpoint/optimizer.py", "load_sharded_optimizer_state_dict"),
        ("torch/distributed/_shard/api.py", "_shard_tensor"),
        ("torch/distributed/_shard/sharding_spec/chunk_sharding_spec.py", "shard")), "checkpoint-load"),
    "dcp's set_optimizer_state_dict": (stack(
        ("/w/t.py", "resume"), ("torch/distributed/checkpoint/state_dict.py", "set_optimizer_state_dict"),
        ("torch/distributed/checkpoint/state_dict.py", "_load_optim_state_dict")), "checkpoint-load"),
    "fsdp's full optimizer state scattered to the ranks": (stack(
        ("/w/t.py", "resume"), ("torch/distributed/fsdp/fully_sharded_data_parallel.py", "scatter_full_optim_state_dict"),
        ("torch/distributed/fsdp/_optim_utils.py", "_flatten_optim_state_dict")), "checkpoint-load"),
    "fairseq's own optimizer step": (stack(
        ("fairseq/trainer.py", "train_step"), ("fairseq/optim/fp16_optimizer.py", "step"),
        ("fairseq/optim/adam.py", "step")), "optimizer-step"),
    "megatron forward_step": (stack(
        (f"{MLM}/megatron/training/training.py", "train_step"),
        (f"{MLM}/megatron/core/pipeline_parallel/schedules.py", "forward_backward_no_pipelining"),
        (f"{MLM}/megatron/core/pipeline_parallel/schedules.py", "forward_step"),
        (f"{MLM}/pretrain_gpt.py", "forward_step")), "forward"),
    "megatron float16 module casts its output back to float (a paste cut above it)": (stack(
        (f"{MLM}/megatron/core/transformer/module.py", "conversion_helper"),
        (f"{MLM}/megatron/core/transformer/module.py", "float_conversion")), "forward"),
    "a conversion_helper of another package says nothing": (stack(
        ("/w/utils/module.py", "conversion_helper"), ("/w/utils/module.py", "float_conversion")), None),
    "megatron p2p activations": (stack(
        (f"{MLM}/megatron/training/training.py", "train_step"),
        (f"{MLM}/megatron/core/pipeline_parallel/schedules.py", "forward_backward_pipelining_without_interleaving"),
        (f"{MLM}/megatron/core/pipeline_parallel/p2p_communication.py", "recv_forward"),
        (f"{MLM}/megatron/core/pipeline_parallel/p2p_communication.py", "_communicate")), "forward"),
    "megatron p2p gradients": (stack(
        (f"{MLM}/megatron/core/pipeline_parallel/schedules.py", "forward_backward_pipelining_without_interleaving"),
        (f"{MLM}/megatron/core/pipeline_parallel/p2p_communication.py", "send_backward"),
        (f"{MLM}/megatron/core/pipeline_parallel/p2p_communication.py", "_communicate")), "backward"),
    "megatron distributed optimizer": (stack(
        (f"{MLM}/megatron/training/training.py", "train_step"),
        (f"{MLM}/megatron/core/optimizer/optimizer.py", "step"),
        (f"{MLM}/megatron/core/optimizer/distrib_optimizer.py", "step_with_ready_grads")), "optimizer-step"),
    "megatron's async save finalized at a later step (its writer's results gathered)": (stack(
        (f"{MLM}/megatron/training/training.py", "train"),
        (f"{MLM}/megatron/training/async_utils.py", "maybe_finalize_async_save"),
        (f"{MLM}/megatron/core/dist_checkpointing/strategies/async_utils.py", "maybe_finalize_async_calls"),
        (f"{MLM}/megatron/core/dist_checkpointing/strategies/torch.py", "finalize_fn"),
        (f"{MLM}/megatron/core/dist_checkpointing/strategies/state_dict_saver.py", "save_state_dict_async_finalize"),
        (f"{MLM}/megatron/core/dist_checkpointing/strategies/filesystem_async.py", "retrieve_write_results")),
        "checkpoint-save"),
    "megatron's save plan, its write buckets prepared": (stack(
        (f"{MLM}/megatron/core/dist_checkpointing/strategies/torch.py", "async_save"),
        (f"{MLM}/megatron/core/dist_checkpointing/strategies/state_dict_saver.py", "save_state_dict_async_plan"),
        ("torch/distributed/checkpoint/utils.py", "reduce_scatter")), "checkpoint-save"),
    "megatron's load strategy in the same torch.py is no save": (stack(
        (f"{MLM}/megatron/training/checkpointing.py", "load_checkpoint"),
        (f"{MLM}/megatron/core/dist_checkpointing/strategies/torch.py", "load")), "checkpoint-load"),
    "colossalai shardformer's replacement forward": (stack(
        ("/w/train.py", "train"), ("colossalai/pipeline/schedule/one_f_one_b.py", "run_forward_backward"),
        ("colossalai/shardformer/modeling/llama.py", "llama_model_forward")), "forward"),
    "megatron finalize_model_grads": (stack(
        (f"{MLM}/megatron/core/pipeline_parallel/schedules.py", "forward_backward_no_pipelining"),
        (f"{MLM}/megatron/core/distributed/finalize_model_grads.py", "finalize_model_grads"),
        (f"{MLM}/megatron/core/distributed/distributed_data_parallel.py", "finish_grad_sync")), "backward"),
    "lightning closure runs the user's training_step": (stack(
        ("lightning/pytorch/loops/optimization/automatic.py", "_optimizer_step"),
        ("lightning/pytorch/core/module.py", "optimizer_step"), ("lightning/pytorch/core/optimizer.py", "step"),
        ("torch/optim/optimizer.py", "wrapper"), ("lightning/pytorch/loops/optimization/automatic.py", "closure"),
        ("lightning/pytorch/loops/optimization/automatic.py", "_training_step"),
        ("lightning/pytorch/strategies/strategy.py", "training_step"), ("/w/model.py", "training_step")), "forward"),
    "nemo wrapped_forward_step": (stack(
        ("nemo/lightning/megatron_parallel.py", "forward"),
        ("megatron/core/pipeline_parallel/schedules.py", "forward_backward_no_pipelining"),
        ("megatron/core/pipeline_parallel/schedules.py", "forward_step"),
        ("nemo/lightning/megatron_parallel.py", "wrapped_forward_step")), "forward"),
    "lightning before 1.0 makes the checkpoint callback's folder at set-up": (stack(
        ("torch/multiprocessing/spawn.py", "_wrap"), ("pytorch_lightning/trainer/ddp_mixin.py", "ddp_train"),
        ("pytorch_lightning/trainer/trainer.py", "run_pretrain_routine"),
        ("pytorch_lightning/trainer/callback_config.py", "configure_checkpoint_callback"),
        ("/usr/lib/python3.7/os.py", "makedirs")), "init"),
    "lightning's checkpoint callback: the ranks agree whether this save is a top k": (stack(
        ("pytorch_lightning/callbacks/model_checkpoint.py", "save_checkpoint"),
        ("pytorch_lightning/callbacks/model_checkpoint.py", "check_monitor_top_k"),
        ("pytorch_lightning/plugins/training_type/parallel.py", "reduce_boolean_decision"),
        ("torch/distributed/distributed_c10d.py", "all_reduce")), "checkpoint-save"),
    "a cut at check_monitor_top_k alone, as pasted": (stack(
        ("lightning/pytorch/callbacks/model_checkpoint.py", "check_monitor_top_k"),
        ("lightning/pytorch/strategies/ddp.py", "reduce_boolean_decision")), "checkpoint-save"),
    "megatron's save at an interval, then its exit decision": (stack(
        (f"{MLM}/megatron/training/training.py", "pretrain"), (f"{MLM}/megatron/training/training.py", "train"),
        (f"{MLM}/megatron/training/training.py", "checkpoint_and_decide_exit"),
        (f"{MLM}/megatron/training/training.py", "save_checkpoint_and_time"),
        (f"{MLM}/megatron/training/checkpointing.py", "save_checkpoint")), "checkpoint-save"),
    "megatron-bridge's, cut under the call": (stack(
        ("megatron/bridge/training/train.py", "train"),
        ("megatron/bridge/training/train.py", "checkpoint_and_decide_exit")), "checkpoint-save"),
    "deepspeed-chat's hybrid engine builds its inference containers at set-up": (stack(
        ("deepspeed/__init__.py", "initialize"), ("deepspeed/runtime/hybrid_engine.py", "__init__"),
        ("deepspeed/runtime/hybrid_engine.py", "create_inference_module"),
        ("deepspeed/runtime/hybrid_engine.py", "new_inference_container"),
        ("deepspeed/module_inject/containers/gptneox.py", "get_hidden_heads")), "init"),
    "its step refreshes them from the new weights": (stack(
        ("/w/step3/main.py", "main"), ("deepspeed/runtime/hybrid_engine.py", "step")), "optimizer-step"),
    "torchtitan optimizer": (stack(
        ("torchtitan/train.py", "train_step"), ("torchtitan/components/optimizer.py", "step")), "optimizer-step"),
    "colossalai pipeline send_forward": (stack(
        ("colossalai/pipeline/schedule/one_f_one_b.py", "run_forward_backward"),
        ("colossalai/pipeline/schedule/one_f_one_b.py", "send_forward"),
        ("colossalai/pipeline/p2p.py", "send_forward")), "forward"),
    "a model moved to its gpu at set-up": (stack(
        ("/w/train.py", "main"), ("torch/nn/modules/module.py", "to"), ("torch/nn/modules/module.py", "_apply"),
        ("torch/nn/modules/module.py", "_apply"), ("torch/nn/modules/module.py", "convert"),
        ("bitsandbytes/nn/modules.py", "to")), "init"),
    "a module moved inside forward is the forward": (stack(
        ("transformers/trainer.py", "training_step"), ("torch/nn/modules/module.py", "_call_impl"),
        ("/w/model.py", "forward"), ("torch/nn/modules/module.py", "to"),
        ("torch/nn/modules/module.py", "_apply")), "forward"),
    "llama-factory loads its model": (stack(
        ("llamafactory/train/sft/workflow.py", "run_sft"), ("llamafactory/model/loader.py", "load_model"),
        ("transformers/modeling_utils.py", "_load_state_dict_into_meta_model")), "init"),
    "colossalai materialises a lazy model": (stack(
        ("colossalai/booster/booster.py", "boost"), ("colossalai/lazy/lazy_init.py", "materialize"),
        ("colossalai/lazy/lazy_init.py", "_materialize_data")), "init"),
    "nemo-rl builds its policy in setup": (stack(
        ("/opt/nemo-rl/examples/run_grpo.py", "main"), ("/opt/nemo-rl/nemo_rl/algorithms/grpo.py", "setup"),
        ("/opt/nemo-rl/nemo_rl/models/policy/lm_policy.py", "print_node_ip_and_gpu_id")), "init"),
    "slime's log-probabilities are a forward": (stack(
        ("/root/slime/slime/backends/megatron_utils/model.py", "forward_only"),
        ("/root/slime/slime/utils/ppo_utils.py", "calculate_log_probs_and_entropy"),
        ("/root/slime/slime/utils/ppo_utils.py", "compute_log_probs")), "forward"),
    "a crash inside torch.save's zip writer": (stack(
        ("<unknown>", "mz_zip_writer_add_mem_ex_v2"), ("<unknown>", "mz_crc32")), "checkpoint-save"),
    "fairseq's first all_reduce in distributed_init": (stack(
        ("/w/fairseq/fairseq_cli/train.py", "distributed_main"), ("/w/fairseq/fairseq_cli/train.py", "main"),
        ("/w/fairseq/fairseq/distributed_utils.py", "distributed_init"),
        ("torch/distributed/distributed_c10d.py", "all_reduce")), "init"),
    "verl optimizer step": (stack(
        ("verl/workers/fsdp_workers.py", "update_actor"), ("verl/workers/actor/dp_actor.py", "update_policy"),
        ("verl/workers/actor/dp_actor.py", "_optimizer_step")), "optimizer-step"),
    # an FSDP state dict gathered for the rollout engine (verl's sharding manager) is no save: the weight sync
    "verl's state dict for the rollout engine": (stack(
        ("verl/workers/sharding_manager/fsdp_vllm.py", "__enter__"), ("torch/nn/modules/module.py", "state_dict"),
        ("torch/distributed/fsdp/_state_dict_utils.py", "_full_post_state_dict_hook")), "param-gather"),
    # the rollout engine's start-up: vLLM profiles a forward to size its KV cache, once, when it is built
    "vllm's memory profile at start-up": (stack(
        ("vllm/worker/worker_base.py", "execute_method"), ("vllm/worker/worker.py", "determine_num_available_blocks"),
        ("vllm/worker/model_runner.py", "profile_run"), ("vllm/worker/model_runner.py", "execute_model"),
        ("torch/nn/modules/module.py", "_call_impl")), "init"),
    "deepspeed-chat's rollout through the hybrid engine": (stack(
        ("/w/DeepSpeed-Chat/training/step3_rlhf_finetuning/main.py", "main"),
        ("/w/DeepSpeed-Chat/dschat/rlhf/ppo_trainer.py", "generate_experience"),
        ("deepspeed/runtime/hybrid_engine.py", "generate"), ("torch/nn/modules/module.py", "_call_impl")), "forward"),
    "deepspeed's pipeline engine reduces the gradients after the last backward": (stack(
        ("/w/gpt-neox/megatron/training.py", "train_step_pipe"), ("deepspeed/runtime/pipe/engine.py", "train_batch"),
        ("deepspeed/runtime/pipe/engine.py", "_exec_schedule"), ("deepspeed/runtime/pipe/engine.py", "_exec_reduce_grads")),
        "backward"),
    "sglang's scheduler runs a generation batch": (stack(
        ("sglang/srt/managers/scheduler.py", "event_loop_overlap"), ("sglang/srt/managers/scheduler.py", "get_next_batch_to_run"),
        ("sglang/srt/managers/scheduler.py", "update_running_batch")), "forward"),
    "context parallel attention's forward": (stack(
        ("/w/train.py", "train_step"), ("torch/nn/modules/module.py", "_call_impl"),
        ("torch/distributed/tensor/experimental/_context_parallel/_attention.py", "_sdpa_handler")), "forward"),
    "an fsdp2 model built from rank 0's full weights": (stack(
        ("/app/skyrl_train/workers/fsdp_worker.py", "_prepare_ref_model"), ("/app/skyrl_train/distributed/fsdp_utils.py",
                                                                     "fsdp2_load_full_state_dict")), "init"),
    "vllm v1 loads its weights": (stack(
        ("vllm/v1/executor/multiproc_executor.py", "worker_main"), ("vllm/v1/worker/gpu_worker.py", "load_model"),
        ("vllm/model_executor/model_loader/default_loader.py", "load_weights")), "init"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_framework_frames_name_the_phase(name):
    frames, want = CASES[name]
    assert phase_from_frames(frames) == want


@pytest.mark.parametrize("frames", [
    # one call of both directions says neither
    stack((f"{MLM}/megatron/core/pipeline_parallel/p2p_communication.py", "send_forward_recv_backward"),
          (f"{MLM}/megatron/core/pipeline_parallel/p2p_communication.py", "_communicate")),
    # the user's own evaluate is not the Trainer's
    stack(("/w/train.py", "main"), ("/w/train.py", "evaluate")),
    # a user's own setup or load_model is not a framework's
    stack(("/w/train.py", "setup"), ("/w/train.py", "load_model")),
    # Lightning before 1.0 trains inside run_pretrain_routine: cut there, the traceback says no phase
    stack(("pytorch_lightning/trainer/distrib_data_parallel.py", "ddp_train"),
          ("pytorch_lightning/trainer/trainer.py", "run_pretrain_routine")),
    # vLLM's generation after start-up is no start-up
    stack(("vllm/worker/worker_base.py", "execute_method"), ("vllm/worker/worker.py", "execute_model")),
])
def test_not_examples_name_no_phase(frames):
    assert phase_from_frames(frames) is None


def test_an_import_at_the_top_of_a_script_failed_while_it_loaded_its_code():
    from tests.offline.scoring import first_failure_of
    top = ('Traceback (most recent call last):\n'
           '  File "/w/train.py", line 6, in <module>\n'
           '    from transformers import LlamaTokenizer\n'
           "ImportError: cannot import name 'LlamaTokenizer' from 'transformers' (/env/transformers/__init__.py)\n")
    ff = first_failure_of(top)
    assert (ff["category"], ff["phase"]) == ("config", "init")
    # not an example: the same import made inside a step is that step's
    inside = ('Traceback (most recent call last):\n'
              f'  File "{SP}/transformers/trainer.py", line 3675, in training_step\n'
              '    loss = self.compute_loss(model, inputs)\n'
              '  File "/w/train.py", line 40, in compute_loss\n'
              '    from mylosses import focal\n'
              "ModuleNotFoundError: No module named 'mylosses'\n")
    assert first_failure_of(inside)["phase"] == "forward"


FROZEN = "<frozen importlib._bootstrap>"


@pytest.mark.parametrize("frames, want", [
    # a package's __init__ importing torch, pasted from the middle: importlib's loader inside its body
    (stack(("vllm/__init__.py", "<module>"), (FROZEN, "_find_and_load"), (FROZEN, "_load_unlocked")), True),
    # module bodies importing each other, the last frame line cut inside its name
    (stack(("torchtitan/__init__.py", "<module>"), ("torchtitan/models/__init__.py", "<modul")), True),
    (stack(("/w/train.py", "<module>"), ("/w/model.py", "<module>")), True),
    # not examples: a script's own top-level code running, a function called from it, a cut name of nothing
    (stack(("/w/train.py", "<module>")), False),
    (stack(("/w/train.py", "<module>"), ("/w/train.py", "main")), False),
    (stack(("/w/train.py", "<module>"), ("/w/model.py", "<mo")), False),
    (stack(("/w/train.py", "main"), (FROZEN, "_find_and_load")), False),
])
def test_an_import_under_way(frames, want):
    assert importing([Frame(FROZEN, 1, fr.func) if fr.file.endswith(FROZEN) else fr for fr in frames]) is want
