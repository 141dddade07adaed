"""Whose code raised it (firstfault/analysis/ownership.py): the owner of a frame's file, and the
category of a Python exception no signature knows from its type and that owner. Frames written
here from the frameworks' real files and functions (paths and line numbers made up)."""

from __future__ import annotations

import pytest

from firstfault.analysis.events import Frame
from firstfault.analysis.ownership import category, owner_of, reprinted_frames, responsible
from tests.offline.scoring import Case, analyze

SP = "/opt/conda/envs/train/lib/python3.10/site-packages"
DP = "/usr/local/lib/python3.12/dist-packages"


def fr(path: str, line: int, func: str) -> Frame:
    return Frame(path, line, func)


USER_MAIN = fr("/work/sft/train.py", 212, "<module>")
USER_TRAIN = fr("/work/sft/train.py", 180, "main")


@pytest.mark.parametrize("path, kind, name", [
    (f"{SP}/deepspeed/runtime/zero/stage3.py", "framework", "deepspeed"),
    (f"{DP}/transformers/trainer.py", "framework", "transformers"),
    ("/usr/lib/python3/dist-packages/accelerate/accelerator.py", "framework", "accelerate"),
    ("/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", "framework", "megatron"),  # a source checkout
    (f"{DP}/nemo/lightning/pytorch/strategies/megatron_strategy.py", "framework", "nemo"),
    (f"{SP}/pytorch_lightning/trainer/trainer.py", "framework", "lightning"),
    (f"{SP}/lightning/pytorch/loops/fit_loop.py", "framework", "lightning"),
    (f"{SP}/torch/distributed/fsdp/_runtime_utils.py", "framework", "torch"),
    (f"{SP}/ray/_private/worker.py", "framework", "ray"),
    (f"{SP}/verl/third_party/vllm/llm.py", "framework", "verl"),  # a vendored copy belongs to the package that ships it
    ("/home/me/proj/third_party/apex/apex/transformer/tensor_parallel/layers.py", "framework", "apex"),  # vendored in a repo
    (f"{SP}/transformer_engine/pytorch/module/linear.py", "framework", "transformer_engine"),
    ("C:\\Users\\me\\miniconda3\\Lib\\site-packages\\peft\\peft_model.py", "framework", "peft"),
    (f"{SP}/deepspeed-0.9.5-py3.10.egg/deepspeed/runtime/engine.py", "framework", "deepspeed"),
    (f"{SP}/numpy/core/fromnumeric.py", "library", "numpy"),
    (f"{SP}/six.py", "library", "six"),
    ("/opt/conda/envs/train/lib/python3.10/json/decoder.py", "stdlib", ""),
    ("<frozen importlib._bootstrap>", "stdlib", ""),
    # not a framework's: the user's own files, however they are named
    ("/work/sft/train.py", "user", ""),
    ("/home/me/deepspeed.py", "user", ""),  # a script named like the package (it even shadows it)
    ("/home/me/train_megatron.py", "user", ""),
    ("/home/me/my_transformers/model.py", "user", ""),
    ("train.py", "user", ""),
])
def test_owner_of_a_frame_path(path, kind, name):
    o = owner_of(path)
    assert (o.kind, o.name) == (kind, name)


def test_a_framework_bug_type_raised_in_the_framework_is_framework():
    frames = [USER_MAIN, USER_TRAIN,
              fr(f"{SP}/deepspeed/runtime/engine.py", 3120, "save_checkpoint"),
              fr(f"{SP}/deepspeed/runtime/engine.py", 3410, "_save_zero_checkpoint"),
              fr(f"{SP}/deepspeed/runtime/zero/stage_1_and_2.py", 2071, "state_dict"),
              fr(f"{SP}/deepspeed/runtime/zero/stage_1_and_2.py", 2031, "_get_base_optimizer_state")]
    got = category("IndexError", "list index out of range", frames)
    assert got.category == "framework" and got.owner.name == "deepspeed"
    assert "inferred from whose code raised it" in got.why and "stage_1_and_2.py:2031" in got.why
    for t in ("AttributeError", "KeyError", "TypeError", "NotImplementedError", "UnboundLocalError"):
        assert category(t, "x", frames).category == "framework", t


def test_the_same_types_raised_in_the_users_file_are_user_code():
    frames = [USER_MAIN, USER_TRAIN,
              fr(f"{SP}/torch/utils/data/dataloader.py", 631, "__next__"),
              fr(f"{SP}/torch/utils/data/dataloader.py", 675, "_next_data"),
              fr(f"{SP}/torch/utils/data/_utils/fetch.py", 54, "fetch"),
              fr("/work/sft/data.py", 41, "collate")]  # a framework calls the user's code: the user's frame is innermost
    for t in ("KeyError", "TypeError", "IndexError", "AttributeError", "AssertionError", "ValueError"):
        assert category(t, "'input_ids'", frames).category == "user-code", t


def test_a_framework_frame_above_a_user_frame_blames_the_user():
    frames = [fr(f"{SP}/lightning/pytorch/trainer/trainer.py", 538, "fit"),
              fr(f"{SP}/lightning/pytorch/loops/optimization/automatic.py", 318, "_training_step"),
              fr(f"{SP}/lightning/pytorch/strategies/strategy.py", 390, "training_step"),
              fr("/home/me/litmodel.py", 77, "training_step")]
    assert category("KeyError", "'labels'", frames).category == "user-code"


def test_a_value_a_framework_refuses_is_config():
    frames = [USER_MAIN, USER_TRAIN,
              fr(f"{SP}/transformers/hf_argparser.py", 339, "parse_args_into_dataclasses"),
              fr("<string>", 135, "__init__"),
              fr(f"{SP}/transformers/training_args.py", 1520, "__post_init__")]
    got = category("ValueError", "--load_best_model_at_end requires the save and eval strategy to match", frames)
    assert got.category == "config" and got.owner.name == "transformers"


def test_an_assert_with_a_message_is_left_to_its_words_a_bare_one_is_framework():
    frames = [fr("/workspace/Megatron-LM/pretrain_gpt.py", 250, "<module>"),
              fr("/workspace/Megatron-LM/megatron/training/initialize.py", 70, "initialize_megatron"),
              fr("/workspace/Megatron-LM/megatron/training/initialize.py", 360, "_set_random_seed"),
              fr("/workspace/Megatron-LM/megatron/core/parallel_state.py", 1210, "get_pipeline_model_parallel_rank"),
              fr("/workspace/Megatron-LM/megatron/core/parallel_state.py", 1010, "get_pipeline_model_parallel_group")]
    # words that name no class: a check of megatron's own state, raised in megatron's code (its initialize.py asked)
    got = category("AssertionError", "pipeline_model parallel group is not initialized", frames)
    assert (got.category, got.owner.name) == ("framework", "megatron")
    assert category("AssertionError", "", frames).category == "framework"
    assert category("AssertionError", "AssertionError", frames).category == "framework"  # a traceback's message line
    assert category("AssertionError", "AssertionError: ", frames).category == "framework"
    # ``assert a.shape == (n,), (a.shape, start, end)``: the values compared, no words: as bare
    assert category("AssertionError", "AssertionError: (torch.Size([]), 0, 77856768)", frames).category == "framework"
    assert category("AssertionError", "AssertionError: 4096 != 2048", frames).category == "framework"
    assert category("AssertionError", "AssertionError: expected 4096 got 2048", frames).category == "framework"


def test_an_assert_with_a_message_in_an_argument_validator_is_config():
    """Megatron's validate_args, DeepSpeed's _batch_assertion, a config dataclass's __post_init__ check values the
    user set: an assertion there is config, whatever its words; the same words elsewhere in the framework are a
    check of its own state."""
    validate = [fr("/workspace/Megatron-LM/pretrain_gpt.py", 250, "<module>"),
                fr("/workspace/Megatron-LM/megatron/training/initialize.py", 60, "initialize_megatron"),
                fr("/workspace/Megatron-LM/megatron/training/arguments.py", 561, "validate_args")]
    got = category("AssertionError", "the expert tensor layout disagrees with the router choice", validate)
    assert (got.category, got.frame.func) == ("config", "validate_args") and "validates" in got.why
    state = [USER_MAIN, USER_TRAIN, fr(f"{SP}/colossalai/zero/low_level/low_level_optim.py", 466, "step")]
    got = category("AssertionError", "fp32 param and grad have different shape torch.Size([279245825]) vs "
                   "torch.Size([1025])", state)
    assert (got.category, got.owner.name) == ("framework", "colossalai")
    # not an example: the user's own assertion is the user's code
    assert category("AssertionError", "the batch lost its labels somewhere", [USER_MAIN, USER_TRAIN]).category == \
        "user-code"


def test_a_missing_attribute_blames_whoever_asked_for_it():
    getattr_frame = fr(f"{SP}/torch/nn/modules/module.py", 1695, "__getattr__")
    by_user = [USER_MAIN, USER_TRAIN, getattr_frame]
    assert responsible(by_user, "AttributeError") == USER_TRAIN
    assert category("AttributeError", "'GPT2LMHeadModel' object has no attribute 'module'", by_user).category == "user-code"
    by_framework = [USER_MAIN, fr(f"{SP}/transformers/trainer.py", 1580, "train"),
                    fr(f"{SP}/accelerate/accelerator.py", 1290, "prepare_model"), getattr_frame]
    assert category("AttributeError", "'Llama' object has no attribute 'hf_device_map'", by_framework).category == "framework"


def test_an_ops_input_check_blames_nobody():
    frames = [USER_MAIN, USER_TRAIN,
              fr(f"{SP}/transformers/models/llama/modeling_llama.py", 900, "forward"),
              fr(f"{SP}/torch/nn/modules/module.py", 1501, "_call_impl"),
              fr(f"{SP}/torch/nn/modules/sparse.py", 162, "forward"),
              fr(f"{SP}/torch/nn/functional.py", 2210, "embedding")]
    assert category("IndexError", "index out of range in self", frames) is None


def test_any_other_type_is_framework_only_where_a_framework_s_own_code_raised_it():
    step = [USER_MAIN, USER_TRAIN, fr(f"{SP}/deepspeed/runtime/engine.py", 2213, "step"),
            fr(f"{SP}/deepspeed/ops/adam/fused_adam.py", 191, "step"),
            fr(f"{SP}/deepspeed/ops/adam/multi_tensor_apply.py", 17, "__call__")]
    got = category("RuntimeError", "Size mismatch", step)
    assert got.category == "framework" and got.frame == step[-1] and "deepspeed's own code" in got.why
    save = [USER_MAIN, fr(f"{SP}/transformers/trainer.py", 3245, "_save_checkpoint"),
            fr("/opt/conda/lib/python3.10/os.py", 272, "renames")]  # the standard library's frame is skipped
    assert category("OSError", "[Errno 39] Directory not empty", save).frame == save[1]
    # not examples: the user's own file, an op's input check, a launcher reporting a child, no frames
    assert category("RuntimeError", "something went wrong", [USER_MAIN, USER_TRAIN]) is None
    assert category("RuntimeError", "expected scalar type Float but found Half",
                    [USER_MAIN, fr(f"{SP}/torch/nn/functional.py", 2210, "linear")]) is None
    launcher = [fr(f"{SP}/torch/distributed/run.py", 800, "main"),
                fr(f"{SP}/torch/distributed/launcher/api.py", 260, "launch_agent")]
    assert category("ChildFailedError", "", launcher).category == "unknown"
    assert category("RuntimeError", "something went wrong", []) is None


def test_an_installed_library_s_own_logic_is_judged_as_a_framework_s():
    """A package outside FRAMEWORKS, installed: a coding error raised in its own code is its defect (a
    library's module reaching for an attribute of the wrapper it was handed)."""
    frames = [USER_MAIN, USER_TRAIN, fr(f"{SP}/rlkit/algos/bcq.py", 189, "inner_update"),
              fr(f"{SP}/rlkit/models/imitators.py", 192, "compute_vae_error"),
              fr(f"{SP}/torch/nn/modules/module.py", 1614, "__getattr__")]
    got = category("AttributeError", "'DistributedDataParallel' object has no attribute 'encoder'", frames)
    assert (got.category, got.frame.func, got.owner.name) == ("framework", "compute_vae_error", "rlkit")
    assert "rlkit's own code" in got.why
    assert category("ValueError", "unsupported observation shape", frames[:-1]).category == "config"


def test_a_lookup_entered_from_outside_blames_whoever_asked_even_when_deeper_code_raised():
    """pandas' DataFrame.__getitem__ raises a missing column's KeyError from Index.get_loc below it: the
    name came from the caller."""
    frames = [USER_MAIN, fr(f"{SP}/pandas/core/frame.py", 3761, "__getitem__"),
              fr(f"{SP}/pandas/core/indexes/base.py", 3655, "get_loc")]
    got = category("KeyError", "'text'", frames)
    assert (got.category, got.frame) == ("user-code", USER_MAIN)
    # not an example: the same library's own code, not entered through a lookup, raising a KeyError
    inner = [USER_MAIN, fr(f"{SP}/rlkit/data/buffer.py", 40, "sample"), fr(f"{SP}/rlkit/data/buffer.py", 71, "_take")]
    assert category("KeyError", "'obs'", inner).category == "framework"


def test_an_array_library_s_python_layer_checks_its_inputs_and_blames_nobody():
    frames = [USER_MAIN, USER_TRAIN, fr(f"{SP}/numpy/core/shape_base.py", 289, "vstack"),
              fr(f"{SP}/numpy/core/overrides.py", 180, "concatenate")]
    assert category("ValueError", "all the input array dimensions except for the concatenation axis must match "
                    "exactly", frames) is None


def test_an_unset_environment_variable_is_config():
    frames = [USER_MAIN, USER_TRAIN, fr("/opt/conda/envs/train/lib/python3.10/os.py", 680, "__getitem__")]
    got = category("KeyError", "'LOCAL_RANK'", frames)
    assert got.category == "config" and "environment variable" in got.why


def test_a_reraised_exception_is_judged_by_its_original_frames():
    message = ("Caught KeyError in DataLoader worker process 0.\n"
               "Original Traceback (most recent call last):\n"
               f'  File "{SP}/torch/utils/data/_utils/worker.py", line 308, in _worker_loop\n'
               "    data = fetcher.fetch(index)\n"
               f'  File "{SP}/torch/utils/data/_utils/fetch.py", line 51, in fetch\n'
               "    data = [self.dataset[idx] for idx in possibly_batched_index]\n"
               '  File "/work/sft/data.py", line 30, in __getitem__\n'
               '    return self.rows[i]["prompt"]\n'
               "KeyError: 'prompt'")
    main_frames = [USER_MAIN, USER_TRAIN, fr(f"{SP}/torch/utils/data/dataloader.py", 1371, "_process_data"),
                   fr(f"{SP}/torch/_utils.py", 694, "reraise")]
    assert [f.func for f in reprinted_frames(message)] == ["_worker_loop", "fetch", "__getitem__"]
    # the user's own __getitem__ raised it: the user's code (only a library's lookup is skipped past)
    got = category("KeyError", message, main_frames)
    assert got.category == "user-code" and "data.py:30" in got.why


def test_a_reraise_without_its_original_and_a_launcher_say_unknown():
    spawn = [fr("/work/ddp/main.py", 90, "<module>"),
             fr(f"{SP}/torch/multiprocessing/spawn.py", 240, "spawn"),
             fr(f"{SP}/torch/multiprocessing/spawn.py", 197, "start_processes"),
             fr(f"{SP}/torch/multiprocessing/spawn.py", 140, "join")]
    got = category("Exception", "process 1 terminated with signal SIGKILL", spawn)
    assert got is None or got.category == "unknown"
    got = category("TypeError", "boom", spawn)
    assert got.category == "unknown" and "reports another process's failure" in got.why
    torchrun = [fr("/opt/conda/bin/torchrun", 8, "<module>"),
                fr(f"{SP}/torch/distributed/elastic/multiprocessing/errors/__init__.py", 346, "wrapper"),
                fr(f"{SP}/torch/distributed/run.py", 794, "main"),
                fr(f"{SP}/torch/distributed/launcher/api.py", 263, "launch_agent")]
    assert category(None, "", torchrun).category == "unknown"
    reraise = [USER_MAIN, fr(f"{SP}/torch/utils/data/dataloader.py", 1371, "_process_data"),
               fr(f"{SP}/torch/_utils.py", 694, "reraise")]
    assert category("KeyError", "Caught KeyError in DataLoader worker process 0.", reraise).category == "unknown"
    unpickle = [USER_MAIN, fr(f"{SP}/torch/serialization.py", 1025, "load"), fr(f"{SP}/torch/_utils.py", 200, "_rebuild_tensor_v2")]
    got = category("TypeError", "boom", unpickle)  # torch/_utils.py's other functions report nobody's failure
    assert got is not None and got.category != "unknown"


def test_import_errors():
    user_imports = [fr("/work/sft/train.py", 7, "<module>")]
    assert category("ModuleNotFoundError", "No module named 'flash_attn'", user_imports).category == "config"
    assert category("ImportError", "cannot import name 'LlamaFlashAttention2' from "
                    "'transformers.models.llama.modeling_llama'", user_imports).category == "config"
    framework_imports = [fr("/work/sft/train.py", 3, "<module>"),
                         fr(f"{SP}/peft/__init__.py", 22, "<module>"),
                         fr(f"{SP}/peft/tuners/lora/model.py", 26, "<module>")]
    got = category("ImportError", "cannot import name 'Conv1D' from 'transformers.pytorch_utils'", framework_imports)
    assert got.category == "framework" and got.owner.name == "peft"
    got = category("ModuleNotFoundError", "No module named 'torch._six'",
                   [USER_MAIN, fr(f"{SP}/deepspeed/runtime/utils.py", 19, "<module>")])
    assert got.category == "framework"
    assert category("ModuleNotFoundError", "No module named 'sentencepiece'",
                    [USER_MAIN, fr(f"{SP}/transformers/models/llama/tokenization_llama.py", 25, "<module>")]
                    ).category == "config"  # a package absent: the environment


def test_a_cut_traceback_is_judged_by_a_framework_frame_only():
    into_framework = [USER_MAIN, USER_TRAIN, fr(f"{SP}/transformers/trainer.py", 2240, "train"),
                      fr(f"{SP}/transformers/trainer.py", 2548, "_inner_training_loop")]
    got = category(None, "", into_framework)
    assert got.category == "framework" and "exception line is missing" in got.why
    assert category(None, "", [USER_MAIN, USER_TRAIN]) is None  # the paste may stop above the raising frame
    imports = [fr("/work/chat/train_sft.py", 7, "<module>"), fr(f"{SP}/coati/dataset/__init__.py", 1, "<module>"),
               fr(f"{SP}/coati/dataset/prompt_dataset.py", 8, "<module>")]
    assert category(None, "", imports).category == "config"
    assert category(None, "", []) is None


def test_a_traceback_cut_inside_torch_s_call_of_a_module_stops_above_a_library_s_forward():
    """torch's op layer blames nobody where its own check raised; a paste cut in Module._call_impl stops above the
    forward that raised, which a training job's modules mostly are a library's: framework, as a guess. A cut in a
    collective's call (distributed_c10d) still says nothing: its error is a timeout's or NCCL's."""
    calling = [USER_MAIN, USER_TRAIN, fr(f"{SP}/torch/nn/modules/module.py", 1553, "_wrapped_call_impl"),
               fr(f"{SP}/torch/nn/modules/module.py", 1562, "_call_impl")]
    got = category(None, "", calling)
    assert got.category == "framework" and "module's forward" in got.why
    waiting = [USER_MAIN, USER_TRAIN, fr(f"{SP}/torch/distributed/distributed_c10d.py", 2501, "all_reduce")]
    assert category(None, "", waiting) is None
    # with its exception line, the op layer's own check blames nobody, as before
    assert category("RuntimeError", "mat1 and mat2 shapes cannot be multiplied", calling) is None


def test_a_traceback_cut_in_torch_s_op_layer_is_judged_by_who_called_it():
    """Cut inside torch.load or a functional op, the traceback shows whose code passed the inputs: a framework's
    (accelerate loading an FSDP state) makes it a framework's failure at a guess; the user's own call says nothing.
    A collective's call or CUDA's set-up says nothing either: their errors are a timeout's, NCCL's, the devices'."""
    loading = [USER_MAIN, USER_TRAIN, fr(f"{SP}/accelerate/accelerator.py", 3685, "load_state"),
               fr(f"{SP}/accelerate/utils/fsdp_utils.py", 197, "load_fsdp_model"),
               fr(f"{SP}/torch/serialization.py", 1484, "load")]
    got = category(None, "", loading)
    assert got.category == "framework" and got.frame.func == "load_fsdp_model" and "torch's" in got.why
    assert category(None, "", [USER_MAIN, USER_TRAIN, fr(f"{SP}/torch/serialization.py", 1484, "load")]) is None
    collective = [USER_MAIN, fr(f"{SP}/lightning/pytorch/strategies/ddp.py", 308, "reduce"),
                  fr(f"{SP}/torch/distributed/c10d_logger.py", 83, "wrapper"),
                  fr(f"{SP}/torch/distributed/distributed_c10d.py", 2501, "all_reduce")]
    assert category(None, "", collective) is None
    cuda = [USER_MAIN, fr(f"{SP}/accelerate/state.py", 201, "__init__"), fr(f"{SP}/torch/cuda/__init__.py", 399,
                                                                              "set_device")]
    assert category(None, "", cuda) is None
    # with its exception line, the op's check blames nobody, whoever called it
    assert category("RuntimeError", "PytorchStreamReader failed reading zip archive", loading) is None


# ---------------------------------------------------------------------------------------------
# Whole pasted logs, through `firstfault analyze -`.

def _paste(text: str) -> dict:
    rep = analyze(Case("paste", ["-"], {}, stdin=text.encode()))
    return rep["first_failure"]


def test_paste_attribute_error_inside_deepspeed_is_framework():
    log = f"""[2026-11-02 10:00:01,112] [INFO] [engine.py:1400:_configure_zero_optimizer] Creating ZeRO stage 3 optimizer
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/sft/train.py", line 212, in <module>
[rank1]:     main()
[rank1]:   File "/work/sft/train.py", line 180, in main
[rank1]:     engine.step()
[rank1]:   File "{SP}/deepspeed/runtime/engine.py", line 2213, in step
[rank1]:     self._take_model_step(lr_kwargs)
[rank1]:   File "{SP}/deepspeed/runtime/zero/stage3.py", line 2101, in step
[rank1]:     self._post_step(timer_names)
[rank1]:   File "{SP}/deepspeed/runtime/zero/stage3.py", line 2030, in _post_step
[rank1]:     self.persistent_parameters[0].all_gather(self.persistent_parameters)
[rank1]: AttributeError: 'NoneType' object has no attribute 'all_gather'
"""
    ff = _paste(log)
    assert (ff["rank"], ff["category"], ff["phase"]) == (1, "framework", "optimizer-step")
    assert ff["confidence"] in ("low", "medium")
    assert "inferred from whose code raised it" in ff["evidence"][0].get("linked_by", "")
    assert "deepspeed's own code" in ff["first_action"] and "your own code" not in ff["first_action"]


def test_paste_runtime_error_raised_inside_deepspeed_s_optimizer_is_framework():
    log = f"""[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/sft/train.py", line 212, in <module>
[rank0]:     main()
[rank0]:   File "{SP}/deepspeed/runtime/engine.py", line 2213, in step
[rank0]:     self._take_model_step(lr_kwargs)
[rank0]:   File "{SP}/deepspeed/ops/adam/fused_adam.py", line 191, in step
[rank0]:     multi_tensor_applier(self.multi_tensor_adam, self._dummy_overflow_buf, [g_32, p_32, m_32, v_32],
[rank0]:   File "{SP}/deepspeed/ops/adam/multi_tensor_apply.py", line 17, in __call__
[rank0]:     return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)
[rank0]: RuntimeError: Size mismatch
"""
    ff = _paste(log)
    assert (ff["rank"], ff["category"], ff["phase"]) == (0, "framework", "optimizer-step")
    assert ff["confidence"] != "high"
    assert "deepspeed's own code" in ff["first_action"]


def test_paste_key_error_in_the_users_collate_is_user_code():
    log = """[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/sft/train.py", line 212, in <module>
[rank0]:     main()
[rank0]:   File "/work/sft/train.py", line 150, in main
[rank0]:     batch = collate(samples)
[rank0]:   File "/work/sft/train.py", line 41, in collate
[rank0]:     ids = [s["input_ids"] for s in samples]
[rank0]: KeyError: 'input_ids'
"""
    ff = _paste(log)
    assert (ff["rank"], ff["category"]) == (0, "user-code")
    assert ff["confidence"] != "high"


def test_paste_value_error_from_training_args_is_config():
    log = f"""Traceback (most recent call last):
  File "/work/sft/train.py", line 30, in <module>
    args = parser.parse_args_into_dataclasses()
  File "{SP}/transformers/hf_argparser.py", line 339, in parse_args_into_dataclasses
    obj = dtype(**inputs)
  File "<string>", line 135, in __init__
  File "{SP}/transformers/training_args.py", line 1520, in __post_init__
    raise ValueError(
ValueError: --load_best_model_at_end requires the save and eval strategy to match, but found
- Evaluation strategy: IntervalStrategy.NO
- Save strategy: IntervalStrategy.STEPS
"""
    ff = _paste(log)
    assert ff["category"] == "config" and ff["phase"] == "init" and ff["confidence"] != "high"


def test_paste_cut_traceback_inside_megatron_is_framework_at_low():
    log = """[rank3]: Traceback (most recent call last):
[rank3]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 270, in <module>
[rank3]:     pretrain(
[rank3]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 360, in pretrain
[rank3]:     iteration, num_floating_point_operations_so_far = train(
[rank3]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 1290, in train
[rank3]:     train_step(forward_step_func,
[rank3]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 720, in train_step
[rank3]:     losses_reduced = forward_backward_func(
"""
    ff = _paste(log)
    assert (ff["rank"], ff["category"], ff["confidence"]) == (3, "framework", "low")


def test_paste_cut_traceback_in_the_users_file_stays_unknown():
    log = """Traceback (most recent call last):
  File "/work/sft/train.py", line 212, in <module>
    main()
  File "/work/sft/train.py", line 150, in main
    loss = step(batch)
"""
    ff = _paste(log)
    assert ff["category"] == "unknown"


def test_paste_bare_assert_inside_deepspeed_is_framework():
    log = f"""[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/sft/train.py", line 180, in main
[rank0]:     loss = engine(batch)
[rank0]:   File "{SP}/deepspeed/runtime/zero/partitioned_param_coordinator.py", line 300, in fetch_sub_module
[rank0]:     assert param.ds_status == ZeroParamStatus.AVAILABLE
[rank0]: AssertionError
"""
    ff = _paste(log)
    assert (ff["rank"], ff["category"], ff["phase"]) == (0, "framework", "param-gather")


def test_paste_assert_with_a_message_inside_colossalai_is_colossalai_s():
    log = """[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/rm/train_reward_model.py", line 58, in train
[rank1]:     optim.step()
[rank1]:   File "/env/lib/python3.10/site-packages/colossalai/zero/low_level/low_level_optim.py", line 466, in step
[rank1]:     assert param_shape == grad_shape, f"fp32 param and grad have different shape {param_shape} vs {grad_shape}"
[rank1]: AssertionError: fp32 param and grad have different shape torch.Size([2048]) vs torch.Size([16])
"""
    ff = _paste(log)
    assert (ff["category"], ff["confidence"], ff["rank"]) == ("framework", "medium", 1)
    # a size that does not divide is a setting, whoever asserts it
    divides = log.replace("fp32 param and grad have different shape torch.Size([2048]) vs torch.Size([16])",
                          "World size 8 is not divisible by tp_size 1 * pp_size 3")
    assert _paste(divides)["category"] == "config"


def test_paste_ray_task_error_is_judged_by_the_remote_frames():
    log = f"""Traceback (most recent call last):
  File "/work/rl/main_ppo.py", line 60, in main
    trainer.fit()
  File "{SP}/verl/trainer/ppo/ray_trainer.py", line 900, in fit
    out = self.actor_rollout_wg.update_actor(batch)
  File "{SP}/ray/_private/worker.py", line 2755, in get
    values, debugger_breakpoint = worker.get_objects(object_refs, timeout=timeout)
  File "{SP}/ray/_private/worker.py", line 906, in get_objects
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(KeyError): ray::WorkerDict.actor_rollout_update_actor() (pid=4242, ip=10.0.0.5)
  File "{SP}/verl/workers/actor/dp_actor.py", line 300, in update_policy
    old_log_prob = data["old_log_probs"]
  File "{SP}/verl/protocol.py", line 250, in __getitem__
    return self.batch[item]
KeyError: 'old_log_probs'
"""
    ff = _paste(log)
    assert ff["category"] == "framework" and "verl" in ff["first_action"]


def test_paste_launcher_reporting_a_child_is_not_the_users_code():
    log = f"""Traceback (most recent call last):
  File "/opt/conda/lib/python3.8/runpy.py", line 194, in _run_module_as_main
    return _run_code(code, main_globals, None,
  File "{SP}/torch/distributed/launch.py", line 340, in <module>
    main()
  File "{SP}/torch/distributed/launch.py", line 326, in main
    sigkill_handler(signal.SIGTERM, None)  # not coming back
  File "{SP}/torch/distributed/launch.py", line 301, in sigkill_handler
    raise subprocess.CalledProcessError(returncode=last_return_code, cmd=cmd)
subprocess.CalledProcessError: Command '['/opt/conda/bin/python', '-u', 'train.py', '--local_rank=1']' returned non-zero exit status 1.
"""
    ff = _paste(log)
    assert ff is None or ff["category"] != "user-code"


def test_paste_words_beat_the_owner():
    log = f"""[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/sft/train.py", line 180, in main
[rank0]:     engine.backward(loss)
[rank0]:   File "{SP}/deepspeed/runtime/engine.py", line 2020, in backward
[rank0]:     self.optimizer.backward(loss)
[rank0]: AssertionError: grad norm is not finite
"""
    ff = _paste(log)
    assert ff["category"] == "numerics"


# Exceptions that report another process's end (ownership.REPORTING), pasted with or without frames
REPORTED = [
    "ray.exceptions.RayTaskError(ActorDiedError): ray::TaskRunner.run() (pid=20877, ip=10.0.0.4, "
    "actor_id=0009f2, repr=<main_ppo.TaskRunner object at 0x7f00>)",
    "subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py', '--lr', '3e-4']' returned non-zero exit status 1.",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED (see the summary above)",
    f"""Traceback (most recent call last):
  File "/work/rl/main.py", line 41, in run
    output = ray.get(refs)
  File "{SP}/ray/_private/worker.py", line 2822, in get
    values, debugger_breakpoint = worker.get_objects(object_refs, timeout=timeout)
ray.exceptions.RayActorError: The actor died because of an error raised in its creation task""",
    # EPIPE: the process at the pipe's or socket's other end closed it (a c10d store's peer that ended)
    "[rank1]: BrokenPipeError: [Errno 32] Broken pipe",
]


@pytest.mark.parametrize("text", REPORTED)
def test_a_report_of_another_process_s_end_is_not_the_users_code(text):
    ff = analyze(Case("paste", ["-"], {}, stdin=(text + "\n").encode()))["first_failure"]
    assert ff["category"] == "unknown"
    assert ff["confidence"] != "high"


def test_the_remote_exception_under_the_wrapper_is_still_judged_on_its_own():
    text = ("ray.exceptions.RayTaskError(ValueError): ray::WorkerDict.generate() (pid=24215, ip=10.0.0.5)\n"
            '  File "/work/rl/worker.py", line 12, in generate\n'
            '    raise ValueError("prompt longer than max_prompt_length")\n'
            "ValueError: prompt longer than max_prompt_length\n")
    ff = analyze(Case("paste", ["-"], {}, stdin=text.encode()))["first_failure"]
    assert ff["category"] == "user-code"


def test_a_call_a_framework_makes_with_arguments_its_callee_does_not_take_is_framework():
    # Megatron-Bridge's instantiate_utils builds a model provider with a keyword another release renamed
    frames = [fr("/opt/nemo-rl/nemo_rl/models/policy/megatron_policy_worker.py", 420, "__init__"),
              fr("/opt/Megatron-Bridge/src/megatron/bridge/utils/instantiate_utils.py", 243, "instantiate_node")]
    msg = "TypeError: Llama31ModelProvider.__init__() got an unexpected keyword argument 'pipeline_model_parallel_split_rank'"
    got = category("TypeError", msg, frames)
    assert got.category == "framework" and "versions" in got.why
    two = "TypeError: forward() takes 2 positional arguments but 3 were given"
    assert category("TypeError", two, frames).category == "framework"


def test_paste_a_call_mismatch_without_frames_is_guessed_framework():
    """A wrapper's message quoting a call whose arguments the callee does not take, and no frame: most often one
    package calling another at a version it was not written for (a guess, low); the frames settle it."""
    ff = _paste("[rank4]: RuntimeError: Worker failure: _write_item() missing 1 required positional argument: "
                "'serialization_format'\n")
    assert (ff["category"], ff["confidence"]) == ("framework", "low")
    assert "whose call it was" in ff["evidence"][0]["linked_by"] and "pip list" in ff["first_action"]
    ff = _paste("Exception: Call to collective_rpc method failed: load_weights() got an unexpected keyword argument "
                "'weight_name'\n")
    assert (ff["category"], ff["confidence"]) == ("framework", "low")
    # not examples: a report of another process's end keeps its words; a config error's words with no call in them
    # keep their category
    assert _paste("subprocess.CalledProcessError: Command 'prep --foo' returned non-zero exit status 1: got an "
                  "unexpected keyword argument 'foo'\n")["category"] == "config"
    assert _paste("ValueError: the tensor parallel size must be divisible by the head count\n")["category"] == "config"


def test_a_call_or_an_import_an_installed_library_makes_is_judged_as_a_framework_s():
    """Any installed package's own code, named framework or not: open_clip calling a torch function by a keyword an
    older release lacks, diffusers importing a name huggingface_hub dropped, are two packages' versions."""
    frames = [USER_MAIN, fr(f"{SP}/open_clip/transformer.py", 88, "forward")]
    got = category("TypeError", "TypeError: scaled_dot_product_attention() got an unexpected keyword argument 'scale'", frames)
    assert got.category == "framework" and got.owner.kind == "library"
    imports = [USER_MAIN, fr(f"{SP}/diffusers/utils/dynamic_modules_utils.py", 28, "<module>")]
    got = category("ImportError", "cannot import name 'cached_download' from 'huggingface_hub'", imports)
    assert got.category == "framework" and got.owner.name == "diffusers"
    # not examples: the standard library calling a callable the user gave it; a package absent
    stdlib = [USER_MAIN, fr("/usr/lib/python3.11/threading.py", 975, "run")]
    assert category("TypeError", "TypeError: worker() missing 1 required positional argument: 'q'", stdlib) is None
    assert category("ModuleNotFoundError", "No module named 'triton'", imports).category == "config"


def test_the_same_call_made_by_the_user_s_code_is_left_to_its_words():
    frames = [fr("/work/train.py", 30, "main")]
    msg = "TypeError: TrainingArguments.__init__() got an unexpected keyword argument 'evaluation_strategy'"
    assert category("TypeError", msg, frames) is None


def test_paste_a_rename_inside_a_frameworks_save_is_framework_not_a_missing_path():
    """CPython prints both paths of a failed rename: the source was gone (another rank moved it first) in
    the framework's own save, whatever the words 'No such file' say; the same in the user's code stays config."""
    frames = f"""Traceback (most recent call last):
  File "/work/sft/train.py", line 212, in <module>
    trainer.train()
  File "{SP}/transformers/trainer.py", line 1914, in _inner_training_loop
    self._maybe_log_save_evaluate(tr_loss, model, trial, epoch, ignore_keys_for_eval)
  File "{SP}/transformers/trainer.py", line 2383, in _save_checkpoint
    os.rename(staging_output_dir, output_dir)
"""
    err = "FileNotFoundError: [Errno 2] No such file or directory: '/ckpt/step_100.partial' -> '/ckpt/step_100'\n"
    ff = _paste(frames + err)
    assert (ff["category"], ff["phase"]) == ("framework", "checkpoint-save")
    cut = _paste(frames + err[:90] + "\n")  # a paste cut inside the second path
    assert cut["category"] == "framework"
    mine = _paste("""Traceback (most recent call last):
  File "/work/sft/train.py", line 212, in <module>
    os.rename(tmp, final)
""" + err)
    assert mine["category"] == "config"
    missing = _paste(frames.replace("os.rename(staging_output_dir, output_dir)", "open(path)")
                     + "FileNotFoundError: [Errno 2] No such file or directory: '/data/train.jsonl'\n")
    assert missing["category"] == "config"


def test_paste_an_exception_line_alone_is_a_guess_of_whose_code():
    """Only the last line: no frame says whose code raised it, so the fallback's category is low and the
    first action is to find the traceback; with its frames the same exception keeps medium."""
    alone = _paste("[rank2]: IndexError: pop from an empty deque\n")
    assert (alone["rank"], alone["confidence"]) == (2, "low")
    assert "traceback" in alone["first_action"] and "whose code" in alone["first_action"]
    assert "not known" in alone["evidence"][0]["linked_by"]
    framed = _paste("""[rank2]: Traceback (most recent call last):
[rank2]:   File "/work/sft/train.py", line 41, in collate
[rank2]:     ids.popleft()
[rank2]: IndexError: pop from an empty deque
""")
    assert (framed["category"], framed["confidence"]) == ("user-code", "medium")
    # a coding error's type alone: framework, as a guess (low), with the frames named as what settles it
    assert alone["category"] == "framework" and "most of the code that runs" in alone["evidence"][0]["linked_by"]
    # RuntimeError, what torch's checks and the frameworks' raise (a script seldom does): framework, as a guess
    runtime = _paste("[rank2]: RuntimeError: Split sizes doesn't match total dim 0 size\n")
    assert (runtime["category"], runtime["confidence"]) == ("framework", "low")
    assert "seldom a script itself" in runtime["evidence"][0]["linked_by"]
    # not examples: a type that is no coding error keeps the fallback's own guess, and so does an assert
    # whose words explain it (validation)
    assert _paste("[rank2]: ValueError: something went wrong here\n")["category"] == "user-code"
    assert _paste("[rank2]: KeyError: 'input_ids'\n")["category"] == "user-code"  # a key the code was given
    assert _paste("[rank2]: AssertionError: micro batch size must be divisible by the world size\n")["category"] == \
        "config"
    bare = _paste("[rank2]: AssertionError\n")
    assert (bare["category"], bare["confidence"]) == ("framework", "low")
    # not an example: words that name a class of failure are no guess of whose code
    assert _paste("[rank2]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")["confidence"] != "low"


def test_paste_a_library_s_own_exception_type_alone_is_guessed_its_own():
    """A type qualified by a framework's package (triton's compiler, flash-attention's) is raised by that package's code:
    framework, as a guess (low), with the frames named as what settles it. A type of the user's own module, or a
    library type whose words name a class of failure, is not that guess."""
    triton = _paste("[default0]:triton.compiler.errors.CompilationError: at 33:21:\n")
    assert (triton["category"], triton["confidence"]) == ("framework", "low")
    assert "triton's own" in triton["evidence"][0]["linked_by"]
    flash = _paste("[rank3]: flash_attn.bert_padding.IndexFirstAxisError: bad index\n")
    assert (flash["rank"], flash["category"], flash["confidence"]) == (3, "framework", "low")
    assert _paste("mytrainer.errors.ShardError: shard 7 is empty\n")["category"] == "user-code"
    assert _paste("transformers.utils.SomeError: No space left on device\n")["category"] == "storage"


def test_deepspeeds_zero3_linear_is_an_ops_layer_its_caller_chose_the_inputs():
    """ZeRO-3 puts its own linear in place of F.linear: a shape error under it is the op's check of the weight
    the caller passed (here the user's code, touching a partitioned weight outside its module's forward)."""
    frames = [USER_MAIN, fr("/w/train.py", 137, "forward"), fr("/w/train.py", 122, "probe_scale"),
              fr(f"{SP}/deepspeed/runtime/zero/linear.py", 149, "zero3_linear_wrap"),
              fr(f"{SP}/torch/autograd/function.py", 625, "apply"),
              fr(f"{SP}/deepspeed/runtime/zero/linear.py", 90, "forward")]
    assert category("RuntimeError", "mat2 must be a matrix, got 1-D tensor", frames) is None


def test_paste_an_import_error_line_alone_keeps_what_its_words_say():
    """Not an example of the guess above: an ImportError's words say config without any frame."""
    ff = _paste("ImportError: cannot import name 'LlamaTokenizer' from 'transformers' (/env/transformers/__init__.py)\n")
    assert (ff["category"], ff["confidence"]) == ("config", "medium")
    assert "whose code raised it is not known" not in ff["evidence"][0].get("linked_by", "")
