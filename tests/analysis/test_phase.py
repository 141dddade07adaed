"""The phase rules (firstfault/analysis/phases.toml): each framework's frames, written from its
source's file and function names (the releases each rule's reference names), and the examples
that must NOT give a phase or must give another one; the data file loads; a broken file reports
every problem at once."""

from __future__ import annotations

import pytest

from firstfault.analysis.events import Frame
from firstfault.analysis.phase import (
    ENCLOSING_PHASES,
    PHASES,
    STEP_PHASES,
    PhaseRulesError,
    load_phase_rules,
    parse_phase_rules,
    phase_from_frames,
    rules,
)

SP = "/opt/conda/lib/python3.11/site-packages"
T = f"{SP}/torch"
DS = f"{SP}/deepspeed"
TF = f"{SP}/transformers"
ACC = f"{SP}/accelerate"
PL = f"{SP}/lightning/pytorch"
MG = "/workspace/Megatron-LM"


def stack(*frames: tuple[str, str]) -> list[Frame]:
    """Frames outermost first, as a traceback prints them: (path, function)."""
    return [Frame(path, 10 + i, func) for i, (path, func) in enumerate(frames)]


USER = ("/home/u/train.py", "<module>")
MAIN = ("/home/u/train.py", "main")
MODEL_FWD = ("/home/u/model.py", "forward")
CALL = (f"{T}/nn/modules/module.py", "_call_impl")

CASES = {
    # --- PyTorch: DDP, FSDP (1), FSDP2, autograd, optimizers, DataLoader, c10d ---
    "ddp constructor broadcast": (stack(USER, MAIN, (f"{T}/nn/parallel/distributed.py", "__init__"),
                                        (f"{T}/nn/parallel/distributed.py", "_ddp_init_helper")), "init"),
    "ddp shape verification": (stack(USER, (f"{T}/nn/parallel/distributed.py", "__init__"),
                                     (f"{T}/distributed/utils.py", "_verify_param_shape_across_processes")), "init"),
    "init_process_group rendezvous": (stack(USER, (f"{T}/distributed/c10d_logger.py", "wrapper"),
                                            (f"{T}/distributed/distributed_c10d.py", "init_process_group"),
                                            (f"{T}/distributed/rendezvous.py", "_env_rendezvous_handler"),
                                            (f"{T}/distributed/rendezvous.py", "_create_c10d_store")), "init"),
    "elastic rendezvous": (stack((f"{T}/distributed/elastic/agent/server/api.py", "_invoke_run"),
                                 (f"{T}/distributed/elastic/agent/server/api.py", "_initialize_workers"),
                                 (f"{T}/distributed/elastic/agent/server/api.py", "_rendezvous"),
                                 (f"{T}/distributed/elastic/rendezvous/dynamic_rendezvous.py", "next_rendezvous"),
                                 (f"{T}/distributed/elastic/rendezvous/dynamic_rendezvous.py", "run"),
                                 (f"{T}/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", "_call_store")),
                           "init"),
    "elastic store at launch": (stack((f"{T}/distributed/run.py", "main"),
                                      (f"{T}/distributed/elastic/rendezvous/registry.py", "get_rendezvous_handler"),
                                      (f"{T}/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", "create_backend"),
                                      (f"{T}/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", "_create_tcp_store")),
                                "init"),
    "fsdp wrap oom": (stack(USER, (f"{T}/distributed/fsdp/fully_sharded_data_parallel.py", "__init__"),
                            (f"{T}/distributed/fsdp/_wrap_utils.py", "_auto_wrap"),
                            (f"{T}/distributed/fsdp/wrap.py", "_recursive_wrap")), "init"),
    "fsdp all-gather in forward": (stack(USER, MAIN, CALL, (f"{T}/distributed/fsdp/fully_sharded_data_parallel.py", "forward"),
                                         (f"{T}/distributed/fsdp/_runtime_utils.py", "_pre_forward"),
                                         (f"{T}/distributed/fsdp/_runtime_utils.py", "_pre_forward_unshard"),
                                         (f"{T}/distributed/fsdp/_runtime_utils.py", "_unshard"),
                                         (f"{T}/distributed/fsdp/_flat_param.py", "unshard"),
                                         (f"{T}/distributed/fsdp/_flat_param.py", "_all_gather_flat_param"),
                                         (f"{T}/distributed/c10d_logger.py", "wrapper"),
                                         (f"{T}/distributed/distributed_c10d.py", "all_gather_into_tensor")),
                                   "param-gather"),
    "fsdp 1.13 flat_param.py": (stack(USER, (f"{T}/distributed/fsdp/flat_param.py", "unshard"),
                                      (f"{T}/distributed/fsdp/flat_param.py", "_alloc_padded_unsharded_flat_param")),
                                "param-gather"),
    "fsdp user forward under fsdp forward": (stack(USER, CALL, (f"{T}/distributed/fsdp/fully_sharded_data_parallel.py", "forward"),
                                                   CALL, MODEL_FWD), "forward"),
    "fsdp post-backward reduce-scatter": (stack(USER, (f"{T}/_tensor.py", "backward"), (f"{T}/autograd/__init__.py", "backward"),
                                                (f"{T}/autograd/graph.py", "_engine_run_backward"),
                                                (f"{T}/utils/_contextlib.py", "decorate_context"),
                                                (f"{T}/distributed/fsdp/_runtime_utils.py", "_post_backward_hook"),
                                                (f"{T}/distributed/fsdp/_runtime_utils.py", "_reduce_grad"),
                                                (f"{T}/distributed/distributed_c10d.py", "reduce_scatter_tensor")),
                                          "backward"),
    "fsdp pre-backward unshard is a gather": (stack(USER, (f"{T}/_tensor.py", "backward"),
                                                    (f"{T}/distributed/fsdp/_runtime_utils.py", "_pre_backward_hook"),
                                                    (f"{T}/distributed/fsdp/_runtime_utils.py", "_unshard")),
                                              "param-gather"),
    "fsdp2 all-gather": (stack(USER, CALL, (f"{T}/distributed/fsdp/_fully_shard/_fsdp_state.py", "_pre_forward"),
                               (f"{T}/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "pre_forward"),
                               (f"{T}/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "unshard"),
                               (f"{T}/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "foreach_all_gather")),
                         "param-gather"),
    "fsdp2 2.4 composable path": (stack(USER, (f"{T}/distributed/_composable/fsdp/_fsdp_param_group.py", "wait_for_unshard")),
                                  "param-gather"),
    "fsdp2 post_backward reduce": (stack(USER, (f"{T}/_tensor.py", "backward"),
                                         (f"{T}/distributed/fsdp/_fully_shard/_fsdp_param_group.py", "post_backward"),
                                         (f"{T}/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "foreach_reduce")),
                                   "backward"),
    "fsdp2 fully_shard call": (stack(USER, MAIN, (f"{T}/distributed/_composable/contract.py", "wrapper"),
                                     (f"{T}/distributed/fsdp/_fully_shard/_fully_shard.py", "fully_shard")), "init"),
    "fsdp2 lazy init on first forward": (stack(USER, CALL, (f"{T}/distributed/fsdp/_fully_shard/_fsdp_state.py", "_root_pre_forward"),
                                               (f"{T}/distributed/fsdp/_fully_shard/_fsdp_state.py", "_lazy_init")), "init"),
    "activation recompute inside backward": (stack(USER, (f"{T}/_tensor.py", "backward"), (f"{T}/autograd/__init__.py", "backward"),
                                                   (f"{T}/autograd/function.py", "apply"),
                                                   (f"{T}/utils/checkpoint.py", "backward"), CALL, MODEL_FWD),
                                             "backward"),
    "optimizer step under amp": (stack(USER, (f"{T}/amp/grad_scaler.py", "step"),
                                       (f"{T}/amp/grad_scaler.py", "_maybe_opt_step"),
                                       (f"{T}/optim/optimizer.py", "wrapper"), (f"{T}/optim/adamw.py", "step")),
                                 "optimizer-step"),
    "an optimizer's construction is init": (stack(USER, MAIN, (f"{T}/optim/adamw.py", "__init__"),
                                                  (f"{T}/optim/optimizer.py", "__init__")), "init"),
    "cpu adam built by the user": (stack(USER, (f"{DS}/ops/adam/cpu_adam.py", "__init__"),
                                         (f"{DS}/ops/op_builder/builder.py", "load"),
                                         (f"{DS}/ops/op_builder/builder.py", "jit_load")), "init"),
    "clip_grad_norm_": (stack(USER, (f"{T}/nn/utils/clip_grad.py", "clip_grad_norm_")), "optimizer-step"),
    "dataloader worker killed": (stack(USER, (f"{T}/utils/data/dataloader.py", "__next__"),
                                       (f"{T}/utils/data/dataloader.py", "_next_data"),
                                       (f"{T}/utils/data/dataloader.py", "_try_get_data"),
                                       (f"{T}/utils/data/_utils/signal_handling.py", "handler")), "data"),
    "windows torch.save": (stack(("C:\\u\\train.py", "main"), ("D:\\Anaconda3\\lib\\site-packages\\torch\\serialization.py", "save"),
                                 ("D:\\Anaconda3\\lib\\site-packages\\torch\\serialization.py", "_save")), "checkpoint-save"),
    "dcp save": (stack(USER, (f"{T}/distributed/checkpoint/state_dict_saver.py", "save")), "checkpoint-save"),
    "dcp load": (stack(USER, (f"{T}/distributed/checkpoint/state_dict_loader.py", "load")), "checkpoint-load"),
    # --- DeepSpeed (today's rules, kept) ---
    "ds zero3 gather in forward": (stack(USER, (f"{DS}/runtime/engine.py", "forward"), CALL,
                                         (f"{DS}/runtime/zero/parameter_offload.py", "_pre_forward_module_hook"),
                                         (f"{DS}/runtime/zero/partitioned_param_coordinator.py", "fetch_sub_module"),
                                         (f"{DS}/runtime/zero/partition_parameters.py", "all_gather_coalesced")),
                                   "param-gather"),
    "ds gather inside save is the save": (stack(USER, (f"{DS}/runtime/engine.py", "save_checkpoint"),
                                                (f"{DS}/runtime/zero/partition_parameters.py", "all_gather_coalesced")),
                                          "checkpoint-save"),
    "ds initialize": (stack(USER, (f"{DS}/__init__.py", "initialize"), (f"{DS}/runtime/engine.py", "__init__"),
                            (f"{DS}/runtime/engine.py", "_configure_optimizer")), "init"),
    "ds engine step": (stack(USER, (f"{DS}/runtime/engine.py", "step"), (f"{DS}/runtime/engine.py", "_take_model_step"),
                             (f"{DS}/runtime/zero/stage_1_and_2.py", "step")), "optimizer-step"),
    "ds pipe backward": (stack(USER, (f"{DS}/runtime/pipe/engine.py", "train_batch"),
                               (f"{DS}/runtime/pipe/engine.py", "_exec_schedule"),
                               (f"{DS}/runtime/pipe/engine.py", "_exec_backward_pass"),
                               (f"{T}/autograd/__init__.py", "backward")), "backward"),
    "ds pipe load micro batch": (stack(USER, (f"{DS}/runtime/pipe/engine.py", "_exec_load_micro_batch")), "data"),
    # --- transformers Trainer / accelerate ---
    "trainer compute_loss": (stack(USER, (f"{TF}/trainer.py", "train"), (f"{TF}/trainer.py", "_inner_training_loop"),
                                   (f"{TF}/trainer.py", "training_step"), (f"{TF}/trainer.py", "compute_loss"),
                                   CALL, MODEL_FWD), "forward"),
    "trainer accelerator.backward": (stack(USER, (f"{TF}/trainer.py", "_inner_training_loop"),
                                           (f"{TF}/trainer.py", "training_step"), (f"{ACC}/accelerator.py", "backward"),
                                           (f"{ACC}/utils/deepspeed.py", "backward"), (f"{DS}/runtime/engine.py", "backward"),
                                           (f"{DS}/runtime/zero/stage3.py", "backward")), "backward"),
    "trainer prepare deepspeed": (stack(USER, (f"{TF}/trainer.py", "train"), (f"{TF}/trainer.py", "_inner_training_loop"),
                                        (f"{ACC}/accelerator.py", "prepare"), (f"{ACC}/accelerator.py", "_prepare_deepspeed"),
                                        (f"{DS}/__init__.py", "initialize")), "init"),
    "accelerate prepare ddp oom": (stack(USER, (f"{TF}/trainer.py", "_inner_training_loop"),
                                         (f"{ACC}/accelerator.py", "prepare_model"),
                                         (f"{T}/nn/parallel/distributed.py", "__init__"),
                                         (f"{T}/nn/parallel/distributed.py", "_ddp_init_helper")), "init"),
    "training args device setup": (stack(USER, ("<string>", "__init__"), (f"{TF}/training_args.py", "__post_init__"),
                                         (f"{TF}/training_args.py", "_setup_devices")), "init"),
    "main_process_first barrier": (stack(USER, (f"{TF}/training_args.py", "main_process_first"),
                                         (f"{T}/distributed/distributed_c10d.py", "barrier")), "init"),
    "dataset tokenization before training": (stack(USER, MAIN, (f"{TF}/training_args.py", "main_process_first"),
                                                   (f"{SP}/datasets/arrow_dataset.py", "wrapper"),
                                                   (f"{SP}/datasets/arrow_dataset.py", "map"),
                                                   (f"{SP}/datasets/arrow_dataset.py", "_map_single"),
                                                   ("/home/u/prep.py", "tokenize")), "init"),
    "a lazy iterable map under the DataLoader is data": (stack(USER, (f"{T}/utils/data/dataloader.py", "__next__"),
                                                               (f"{T}/utils/data/_utils/fetch.py", "fetch"),
                                                               (f"{SP}/datasets/iterable_dataset.py", "__iter__"),
                                                               (f"{SP}/datasets/iterable_dataset.py", "_iter_arrow"),
                                                               ("/home/u/prep.py", "tokenize")), "data"),
    "trainer wrap model": (stack(USER, (f"{TF}/trainer.py", "_inner_training_loop"), (f"{TF}/trainer.py", "_wrap_model")), "init"),
    "trainer create_optimizer": (stack(USER, (f"{TF}/trainer.py", "create_optimizer_and_scheduler"),
                                       (f"{TF}/trainer.py", "create_optimizer")), "init"),
    "trainer save": (stack(USER, (f"{TF}/trainer.py", "_maybe_log_save_evaluate"), (f"{TF}/trainer.py", "_save_checkpoint"),
                           (f"{TF}/trainer.py", "_save_optimizer_and_scheduler"), (f"{T}/serialization.py", "save")),
                     "checkpoint-save"),
    "trainer resume": (stack(USER, (f"{TF}/trainer.py", "train"), (f"{TF}/trainer.py", "_load_from_checkpoint"),
                             (f"{T}/serialization.py", "load")), "checkpoint-load"),
    "trainer get_batch_samples": (stack(USER, (f"{TF}/trainer.py", "_inner_training_loop"),
                                        (f"{TF}/trainer.py", "get_batch_samples"), (f"{ACC}/data_loader.py", "__iter__")),
                                  "data"),
    "accelerated optimizer step": (stack(USER, (f"{ACC}/optimizer.py", "step"), (f"{T}/optim/optimizer.py", "wrapper")),
                                   "optimizer-step"),
    "accelerate save_state": (stack(USER, (f"{ACC}/accelerator.py", "save_state"),
                                    (f"{ACC}/utils/fsdp_utils.py", "save_fsdp_optimizer")), "checkpoint-save"),
    "from_pretrained shards": (stack(USER, (f"{TF}/modeling_utils.py", "from_pretrained"),
                                     (f"{TF}/modeling_utils.py", "_load_pretrained_model")), "init"),
    # --- Megatron-Core / Megatron-LM ---
    "megatron forward_step": (stack(("/workspace/Megatron-LM/pretrain_gpt.py", "<module>"),
                                    (f"{MG}/megatron/training/training.py", "pretrain"), (f"{MG}/megatron/training/training.py", "train"),
                                    (f"{MG}/megatron/training/training.py", "train_step"),
                                    (f"{MG}/megatron/core/pipeline_parallel/schedules.py", "forward_backward_no_pipelining"),
                                    (f"{MG}/megatron/core/pipeline_parallel/schedules.py", "forward_step"),
                                    (f"{MG}/pretrain_gpt.py", "forward_step"), CALL, MODEL_FWD), "forward"),
    "megatron get_batch": (stack((f"{MG}/megatron/core/pipeline_parallel/schedules.py", "forward_step"),
                                 (f"{MG}/pretrain_gpt.py", "forward_step"), (f"{MG}/pretrain_gpt.py", "get_batch"),
                                 (f"{MG}/megatron/training/utils.py", "get_batch_on_this_tp_rank")), "data"),
    "megatron backward_step": (stack((f"{MG}/megatron/training/training.py", "train_step"),
                                     (f"{MG}/megatron/core/pipeline_parallel/schedules.py", "forward_backward_pipelining_without_interleaving"),
                                     (f"{MG}/megatron/core/pipeline_parallel/schedules.py", "backward_step"),
                                     (f"{T}/autograd/__init__.py", "backward")), "backward"),
    "megatron finalize_model_grads": (stack((f"{MG}/megatron/core/pipeline_parallel/schedules.py", "forward_backward_no_pipelining"),
                                            (f"{MG}/megatron/core/distributed/finalize_model_grads.py", "finalize_model_grads"),
                                            (f"{MG}/megatron/core/distributed/distributed_data_parallel.py", "finish_grad_sync"),
                                            (f"{MG}/megatron/core/distributed/param_and_grad_buffer.py", "finish_grad_sync")),
                                      "backward"),
    "megatron distributed optimizer step": (stack((f"{MG}/megatron/training/training.py", "train_step"),
                                                  (f"{T}/utils/_contextlib.py", "decorate_context"),
                                                  (f"{MG}/megatron/core/optimizer/optimizer.py", "step"),
                                                  (f"{MG}/megatron/core/optimizer/distrib_optimizer.py", "step_with_ready_grads")),
                                            "optimizer-step"),
    "megatron param all-gather pre-hook": (stack(CALL, (f"{MG}/megatron/core/distributed/distributed_data_parallel.py", "hook"),
                                                 (f"{MG}/megatron/core/distributed/distributed_data_parallel.py", "_finish_param_sync_for_bucket_group"),
                                                 (f"{MG}/megatron/core/distributed/param_and_grad_buffer.py", "finish_param_sync")),
                                           "param-gather"),
    "megatron setup": (stack((f"{MG}/megatron/training/training.py", "pretrain"),
                             (f"{MG}/megatron/training/training.py", "setup_model_and_optimizer"),
                             (f"{MG}/megatron/training/training.py", "get_model")), "init"),
    "megatron resume inside setup is the load": (stack((f"{MG}/megatron/training/training.py", "setup_model_and_optimizer"),
                                                       (f"{MG}/megatron/training/checkpointing.py", "load_checkpoint"),
                                                       (f"{T}/serialization.py", "load")), "checkpoint-load"),
    "megatron initialize (2022 layout)": (stack(("run_model.py", "<module>"), (f"{MG}/megatron/initialize.py", "initialize_megatron"),
                                                 (f"{MG}/megatron/initialize.py", "finish_mpu_init"),
                                                 (f"{MG}/megatron/initialize.py", "_set_random_seed")), "init"),
    "megatron save": (stack((f"{MG}/megatron/training/training.py", "save_checkpoint_and_time"),
                            (f"{MG}/megatron/training/checkpointing.py", "save_checkpoint"),
                            (f"{MG}/megatron/core/dist_checkpointing/serialization.py", "save")), "checkpoint-save"),
    # --- Lightning / NeMo ---
    "lightning training_step in the optimizer closure": (stack(
        (f"{PL}/trainer/trainer.py", "fit"), (f"{PL}/loops/optimization/automatic.py", "run"),
        (f"{PL}/loops/optimization/automatic.py", "_optimizer_step"), (f"{PL}/core/module.py", "optimizer_step"),
        (f"{PL}/core/optimizer.py", "step"), (f"{PL}/strategies/ddp.py", "optimizer_step"),
        (f"{PL}/plugins/precision/precision.py", "optimizer_step"), (f"{PL}/loops/optimization/automatic.py", "__call__"),
        (f"{PL}/loops/optimization/automatic.py", "closure"), (f"{PL}/loops/optimization/automatic.py", "_training_step"),
        (f"{PL}/trainer/call.py", "_call_strategy_hook"), (f"{PL}/strategies/strategy.py", "training_step"),
        ("/home/u/lit.py", "training_step")), "forward"),
    "lightning backward in the closure": (stack((f"{PL}/core/optimizer.py", "step"),
                                                (f"{PL}/loops/optimization/automatic.py", "closure"),
                                                (f"{PL}/loops/optimization/automatic.py", "backward_fn"),
                                                (f"{PL}/strategies/strategy.py", "backward"), (f"{T}/_tensor.py", "backward")),
                                          "backward"),
    "lightning optimizer step itself": (stack((f"{PL}/core/module.py", "optimizer_step"), (f"{PL}/core/optimizer.py", "step"),
                                              (f"{T}/optim/optimizer.py", "wrapper"), (f"{T}/optim/adam.py", "step")),
                                        "optimizer-step"),
    "lightning strategy setup": (stack((f"{PL}/trainer/trainer.py", "_run"), (f"{PL}/strategies/ddp.py", "setup"),
                                       (f"{PL}/strategies/ddp.py", "_setup_model")), "init"),
    "lightning 1.x plugin setup": (stack((f"{SP}/pytorch_lightning/trainer/trainer.py", "_run"),
                                         (f"{SP}/pytorch_lightning/plugins/training_type/ddp.py", "setup_distributed")), "init"),
    "lightning dist connection": (stack((f"{SP}/lightning/fabric/utilities/distributed.py", "_init_dist_connection"),
                                        (f"{T}/distributed/c10d_logger.py", "wrapper")), "init"),
    "lightning model checkpoint": (stack((f"{PL}/callbacks/model_checkpoint.py", "on_validation_end"),
                                         (f"{PL}/callbacks/model_checkpoint.py", "_save_topk_checkpoint"),
                                         (f"{PL}/trainer/trainer.py", "save_checkpoint")), "checkpoint-save"),
    "lightning restore": (stack((f"{PL}/trainer/trainer.py", "_run"),
                                (f"{PL}/trainer/connectors/checkpoint_connector.py", "_restore_modules_and_callbacks"),
                                (f"{PL}/trainer/connectors/checkpoint_connector.py", "restore_model")), "checkpoint-load"),
    "lightning data fetcher": (stack((f"{PL}/loops/training_epoch_loop.py", "advance"), (f"{PL}/loops/fetchers.py", "__next__"),
                                     (f"{PL}/loops/fetchers.py", "_fetch_next_batch")), "data"),
    "nemo megatron strategy setup": (stack((f"{SP}/nemo/lightning/pytorch/strategies/megatron_strategy.py", "setup"),
                                           (f"{SP}/nemo/lightning/pytorch/strategies/megatron_strategy.py", "setup_megatron_parallel")),
                                     "init"),
    "nemo wrapped_forward_step": (stack((f"{SP}/nemo/lightning/megatron_parallel.py", "training_step"),
                                        (f"{SP}/megatron/core/pipeline_parallel/schedules.py", "forward_step"),
                                        (f"{SP}/nemo/lightning/megatron_parallel.py", "wrapped_forward_step")), "forward"),
    # --- torchtitan, ColossalAI, verl, OpenRLHF, mmengine ---
    "torchtitan trainer init": (stack(("torchtitan/train.py", "main"), (f"{SP}/torchtitan/trainer.py", "__init__"),
                                      (f"{SP}/torchtitan/models/llama3/parallelize.py", "parallelize_llama"),
                                      (f"{SP}/torchtitan/models/llama3/parallelize.py", "apply_fsdp")), "init"),
    "torchtitan checkpoint save": (stack((f"{SP}/torchtitan/trainer.py", "train"),
                                         (f"{SP}/torchtitan/components/checkpoint.py", "save"),
                                         (f"{SP}/torchtitan/components/checkpoint.py", "dcp_save")), "checkpoint-save"),
    "torchtitan clip": (stack((f"{SP}/torchtitan/trainer.py", "train_step"),
                              (f"{SP}/torchtitan/distributed/utils.py", "clip_grad_norm_")), "optimizer-step"),
    "torchtitan batch": (stack((f"{SP}/torchtitan/trainer.py", "train"), (f"{SP}/torchtitan/trainer.py", "batch_generator"),
                               (f"{T}/utils/data/dataloader.py", "__next__")), "data"),
    "colossalai booster backward": (stack(USER, ("/open-sora/scripts/train.py", "main"),
                                          (f"{SP}/colossalai/booster/booster.py", "backward"),
                                          (f"{SP}/colossalai/zero/low_level/low_level_optim.py", "backward"),
                                          (f"{T}/_tensor.py", "backward")), "backward"),
    "colossalai boost": (stack(USER, (f"{SP}/colossalai/booster/booster.py", "boost"),
                               (f"{SP}/colossalai/booster/plugin/gemini_plugin.py", "configure")), "init"),
    "colossalai low level step": (stack(USER, (f"{SP}/colossalai/zero/low_level/low_level_optim.py", "step")),
                                  "optimizer-step"),
    "verl generate_sequences": (stack((f"{SP}/verl/single_controller/ray/base.py", "func"),
                                      (f"{SP}/verl/workers/fsdp_workers.py", "generate_sequences")), "forward"),
    "verl init_model": (stack((f"{SP}/verl/workers/fsdp_workers.py", "init_model"),
                              (f"{SP}/verl/workers/fsdp_workers.py", "_build_model_optimizer"),
                              (f"{TF}/modeling_utils.py", "from_pretrained")), "init"),
    "verl actor optimizer step": (stack((f"{SP}/verl/workers/fsdp_workers.py", "update_actor"),
                                        (f"{SP}/verl/workers/actor/dp_actor.py", "update_policy"),
                                        (f"{SP}/verl/workers/actor/dp_actor.py", "_optimizer_step")), "optimizer-step"),
    "verl checkpoint": (stack((f"{SP}/verl/trainer/ppo/ray_trainer.py", "fit"),
                              (f"{SP}/verl/trainer/ppo/ray_trainer.py", "_save_checkpoint"),
                              (f"{SP}/verl/single_controller/ray/base.py", "__call__"),
                              (f"{T}/serialization.py", "_save")), "checkpoint-save"),
    "openrlhf save_ckpt": (stack((f"{SP}/openrlhf/trainer/ray/ppo_critic.py", "save_checkpoint"),
                                 (f"{SP}/openrlhf/utils/deepspeed.py", "save_ckpt")), "checkpoint-save"),
    "openrlhf strategy optimizer_step": (stack((f"{SP}/openrlhf/trainer/ray/ppo_actor.py", "training_step"),
                                               (f"{SP}/openrlhf/utils/deepspeed/deepspeed.py", "optimizer_step"),
                                               (f"{DS}/runtime/engine.py", "step")), "optimizer-step"),
    "mmengine run_forward": (stack((f"{SP}/mmengine/runner/loops.py", "run_iter"),
                                   (f"{SP}/mmengine/model/wrappers/distributed.py", "train_step"),
                                   (f"{SP}/mmengine/model/wrappers/distributed.py", "_run_forward")), "forward"),
    "mmengine build": (stack((f"{SP}/mmengine/_strategy/deepspeed.py", "prepare"),
                             (f"{SP}/mmengine/_strategy/base.py", "build_model")), "init"),
    # --- torchtune recipes (site-packages/recipes/ or a checkout's recipes/) ---
    "torchtune recipe construction": (stack((f"{SP}/recipes/full_finetune_distributed.py", "recipe_main"),
                                            (f"{SP}/recipes/full_finetune_distributed.py", "__init__")), "init"),
    "torchtune recipe setup loads the model": (stack(("/src/torchtune/recipes/lora_finetune_distributed.py", "recipe_main"),
                                                     ("/src/torchtune/recipes/lora_finetune_distributed.py", "setup"),
                                                     ("/src/torchtune/recipes/lora_finetune_distributed.py", "_setup_model"),
                                                     (f"{SP}/torchtune/training/_distributed.py", "load_from_full_model_state_dict")), "init"),
    "torchtune recipe data setup": (stack((f"{SP}/recipes/full_finetune_distributed.py", "setup"),
                                          (f"{SP}/recipes/full_finetune_distributed.py", "_setup_data"),
                                          (f"{SP}/torchtune/datasets/_sft.py", "__init__")), "init"),
    # --- TRL, vLLM ---
    "trl grpo weight sync under zero3": (stack((f"{TF}/trainer.py", "training_step"), (f"{SP}/trl/extras/profiling.py", "wrapper"),
                                               (f"{SP}/trl/trainer/grpo_trainer.py", "_prepare_inputs"),
                                               (f"{SP}/trl/trainer/grpo_trainer.py", "_generate_and_score_completions"),
                                               (f"{SP}/trl/trainer/grpo_trainer.py", "_move_model_to_vllm"),
                                               (f"{DS}/runtime/zero/partition_parameters.py", "__enter__"),
                                               (f"{DS}/runtime/zero/partition_parameters.py", "all_gather")), "param-gather"),
    "verl rollout weight sync": (stack((f"{SP}/verl/single_controller/base/decorator.py", "inner"),
                                       (f"{SP}/verl/workers/fsdp_workers.py", "generate_sequences"),
                                       (f"{SP}/verl/workers/sharding_manager/fsdp_vllm.py", "__enter__"),
                                       (f"{SP}/vllm/entrypoints/llm.py", "wake_up")), "param-gather"),
    "verl generation after the sync": (stack((f"{SP}/verl/workers/fsdp_workers.py", "generate_sequences"),
                                             (f"{SP}/verl/workers/rollout/vllm_rollout/vllm_rollout.py",
                                              "generate_sequences"),
                                             (f"{SP}/vllm/entrypoints/llm.py", "generate")), "forward"),
    "openrlhf broadcast to vllm": (stack((f"{SP}/openrlhf/trainer/ray/ppo_actor.py", "fit"),
                                         (f"{SP}/openrlhf/trainer/ray/ppo_actor.py", "_broadcast_to_vllm"),
                                         (f"{SP}/torch/distributed/distributed_c10d.py", "broadcast")), "param-gather"),
    "trl grpo generation": (stack((f"{SP}/trl/trainer/grpo_trainer.py", "_generate_and_score_completions"),
                                  (f"{SP}/vllm/entrypoints/llm.py", "generate"),
                                  (f"{SP}/vllm/engine/llm_engine.py", "step")), "forward"),
    "vllm engine construction": (stack((f"{SP}/verl/workers/rollout/vllm_rollout/vllm_rollout.py", "__init__"),
                                       (f"{SP}/vllm/entrypoints/llm.py", "__init__"),
                                       (f"{SP}/vllm/engine/llm_engine.py", "_initialize_kv_caches")), "init"),
    "dpo concatenated_forward": (stack((f"{TF}/trainer.py", "compute_loss"), (f"{SP}/trl/trainer/dpo_trainer.py", "get_batch_loss_metrics"),
                                       (f"{SP}/trl/trainer/dpo_trainer.py", "concatenated_forward")), "forward"),
    # --- failures while importing ---
    "import chain": (stack(("train_sft.py", "<module>"), ("<frozen importlib._bootstrap>", "_find_and_load"),
                           ("/src/coati/dataset/__init__.py", "<module>"), ("/src/coati/dataset/prompt_dataset.py", "<module>")),
                     "init"),
}

# Frames that must give no phase, or not the phase a careless name match would give.
NOT_CASES = {
    "torchtune recipe_main alone holds training too": (stack((f"{SP}/recipes/full_finetune_distributed.py", "recipe_main")), None),
    "torchtune train() is no set-up": (stack((f"{SP}/recipes/full_finetune_distributed.py", "recipe_main"),
                                             (f"{SP}/recipes/full_finetune_distributed.py", "train"), CALL,
                                             MODEL_FWD), "forward"),
    "a recipe's save is the save, not set-up": (stack((f"{SP}/recipes/full_finetune_distributed.py", "train"),
                                                      (f"{SP}/recipes/full_finetune_distributed.py", "save_checkpoint")),
                                                "checkpoint-save"),
    "a user's own step is no optimizer step": (stack(USER, ("/home/u/train.py", "step")), None),
    "colossalai inference engine step": (stack(USER, (f"{SP}/colossalai/inference/core/engine.py", "step")), None),
    "a forward in a collate function is data": (stack(USER, (f"{T}/utils/data/dataloader.py", "__next__"),
                                                      (f"{T}/utils/data/dataloader.py", "_next_data"),
                                                      (f"{T}/utils/data/_utils/fetch.py", "fetch"),
                                                      ("/home/u/collator.py", "__call__"), CALL,
                                                      ("/home/u/tokenizer_model.py", "forward")), "data"),
    "a custom autograd Function's forward is forward, not backward": (stack(
        USER, CALL, (f"{T}/autograd/function.py", "apply"),
        (f"{MG}/megatron/core/tensor_parallel/mappings.py", "forward")), "forward"),
    "a no_grad decorator is not backward": (stack(USER, (f"{T}/utils/_contextlib.py", "decorate_context"),
                                                  (f"{T}/autograd/grad_mode.py", "decorate_context"),
                                                  ("/home/u/eval.py", "evaluate")), None),
    "a user's setup is not strategy setup": (stack(USER, ("/home/u/datamodule.py", "setup")), None),
    "a user's __init__ is not init": (stack(USER, ("/home/u/model.py", "__init__")), None),
    "a Lightning callback's setup is no checkpoint save": (stack(
        (f"{PL}/trainer/trainer.py", "_run"), (f"{PL}/callbacks/model_checkpoint.py", "setup")), None),
    "train_step alone names nothing": (stack((f"{MG}/megatron/training/training.py", "train_step")), None),
    "the inner training loop alone names nothing": (stack((f"{TF}/trainer.py", "_inner_training_loop")), None),
    "the agent's monitor loop mid-training is no init": (stack(
        (f"{T}/distributed/elastic/agent/server/api.py", "_invoke_run"),
        (f"{T}/distributed/elastic/rendezvous/dynamic_rendezvous.py", "num_nodes_waiting"),
        (f"{T}/distributed/elastic/rendezvous/dynamic_rendezvous.py", "run"),
        (f"{T}/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", "_call_store")), None),
    "a closed rendezvous after a peer died is no init": (stack(
        (f"{T}/distributed/elastic/rendezvous/dynamic_rendezvous.py", "run")), None),
    "launcher frames name nothing": (stack((f"{T}/distributed/run.py", "main"),
                                           (f"{T}/distributed/launcher/api.py", "launch_agent")), None),
    "top-level script code is no import": (stack(USER, ("/usr/lib/python3.10/runpy.py", "_run_code"), USER), None),
    "a new_group in a data loader's set-up is data": (stack(USER, ("/x/torchdata/dataloader2/dataloader2.py", "__iter__"),
                                                            ("/x/torchdata/dataloader2/reading_service.py", "initialize"),
                                                            (f"{T}/distributed/distributed_c10d.py", "new_group")), "data"),
    "a GatheredParameters context mid-training is no zero.Init": (stack(
        USER, ("/home/u/ema.py", "update"), (f"{DS}/runtime/zero/partition_parameters.py", "__enter__"),
        (f"{DS}/runtime/zero/partition_parameters.py", "all_gather")), "param-gather"),
    "a serialization helper shared by save and load names neither": (stack(
        (f"{T}/multiprocessing/spawn.py", "_wrap"), (f"{T}/serialization.py", "__init__")), None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_frames_of_each_framework_name_their_phase(name):
    frames, want = CASES[name]
    assert phase_from_frames(frames) == want


@pytest.mark.parametrize("name", sorted(NOT_CASES))
def test_frames_that_must_not_name_the_obvious_phase(name):
    frames, want = NOT_CASES[name]
    assert phase_from_frames(frames) == want


def test_an_inner_frame_beats_an_outer_one_but_an_enclosing_phase_holds_all():
    gather_in_backward = stack(USER, (f"{T}/_tensor.py", "backward"),
                               (f"{DS}/runtime/zero/parameter_offload.py", "_pre_backward_module_hook"))
    assert phase_from_frames(gather_in_backward) == "param-gather"
    assert phase_from_frames([Frame(f"{DS}/runtime/engine.py", 1, "save_checkpoint"), *gather_in_backward]) == "checkpoint-save"
    # the innermost enclosing frame wins among enclosing ones
    assert phase_from_frames(stack((f"{TF}/modeling_utils.py", "from_pretrained"), (f"{T}/serialization.py", "load"))) \
        == "checkpoint-load"


def test_the_shipped_rules_load_and_every_rule_has_a_reference():
    r = load_phase_rules()
    assert r is not None and rules().enclosing and rules().step
    assert {x.phase for x in r.enclosing} == set(ENCLOSING_PHASES)
    assert {x.phase for x in r.step} == set(STEP_PHASES)
    for rule in (*r.enclosing, *r.step, *r.collectives, *r.markers, *r.tasks):
        assert rule.reference.strip()
    assert set(PHASES) >= {x.phase for x in r.collectives} | {x.phase for x in r.tasks}
    assert r.imports == "init"


def test_the_rules_ship_with_the_package():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    data = pyproject["tool"]["setuptools"]["package-data"]["firstfault"]
    assert "analysis/phases.toml" in data and "analysis/signatures/*.toml" in data


BROKEN = '''
version = 2
colour = "red"

[holds]
forward = ["data"]
backward = ["init"]

[[enclosing]]
phase = "forward"
funcs = ["save_checkpoint"]
speed = "fast"

[[step]]
phase = "backward"
reference = "x"

[[step]]
phase = "data"
reference = "y"
funcs = "get_batch"
[step.in_files]
"torch/utils/data/" = []
files = ["torch/utils/data/"]

[[collective]]
ops = ["allgather"]
seq = -1
phase = "param-gather"
reference = "z"

[[marker]]
needles = ["x"]
pattern = "("
reference = "w"

[[marker]]
progress = true
phase = "init"
needles = []
reference = "v"

[[task]]
methods = ["save_checkpoint"]
phase = "saving"
reference = "u"
'''


def test_a_broken_file_reports_every_problem_at_once():
    with pytest.raises(PhaseRulesError) as err:
        parse_phase_rules(BROKEN, "broken.toml")
    problems = err.value.problems
    text = "\n".join(problems)
    for expected in (
        "unknown top-level key 'colour'",
        "version must be 1",
        "holds.backward: must be a list of other step phases",
        "enclosing #0: unknown key 'speed'",
        "enclosing #0: phase 'forward' is not one of",
        "enclosing #0: reference must be a non-empty string",
        "step #0: names no frame",
        "step #1: funcs must be a list of non-empty strings",
        "step #1: in_files 'torch/utils/data/' must name",
        "step #1: in_files key 'files' is no path fragment",
        "collective #0: op 'allgather' is not an OpType name",
        "collective #0: seq must be a sequence number",
        "marker #0: a marker names a phase, or is a progress mark",
        "marker #0: pattern does not compile",
        "marker #1: a progress mark names no phase",
        "marker #1: needles must not be empty",
        "task #0: phase 'saving' is not one of",
    ):
        assert expected in text, (expected, problems)
    assert str(err.value).startswith("broken.toml: ")


def test_invalid_toml_is_one_problem():
    with pytest.raises(PhaseRulesError) as err:
        parse_phase_rules("[[step]\nphase=", "bad.toml")
    assert len(err.value.problems) == 1 and "not valid TOML" in err.value.problems[0]


def test_a_file_path_loads_too(tmp_path):
    p = tmp_path / "phases.toml"
    p.write_text('version = 1\n[[step]]\nphase = "data"\nreference = "r"\nfuncs = ["my_loader"]\n')
    r = load_phase_rules(p)
    assert phase_from_frames(stack(USER, ("/x/y.py", "my_loader")), r) == "data"
    assert phase_from_frames(stack(USER, (f"{T}/optim/adam.py", "step")), r) is None
