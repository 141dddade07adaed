"""Whole pasted-log-shaped inputs, written from the frameworks' frame names and the exception
formats (made-up paths and values), run through `firstfault analyze -` in-process: the phase
comes from each framework's frames (firstfault/analysis/phases.toml)."""

from __future__ import annotations

import pytest

from tests.offline.scoring import Case, analyze, first_failure_of

# FSDP (torch 2.4) all-gathers a flat parameter for a forward and runs out of GPU memory
FSDP = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/train_fsdp.py", line 88, in <module>
[rank1]:     main()
[rank1]:   File "/work/train_fsdp.py", line 70, in main
[rank1]:     out = model(batch)
[rank1]:   File "/usr/local/lib/python3.11/dist-packages/torch/nn/modules/module.py", line 1736, in _wrapped_call_impl
[rank1]:     return self._call_impl(*args, **kwargs)
[rank1]:   File "/usr/local/lib/python3.11/dist-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py", line 849, in forward
[rank1]:     args, kwargs = _pre_forward(
[rank1]:   File "/usr/local/lib/python3.11/dist-packages/torch/distributed/fsdp/_runtime_utils.py", line 380, in _pre_forward
[rank1]:     unshard_fn(state, handle)
[rank1]:   File "/usr/local/lib/python3.11/dist-packages/torch/distributed/fsdp/_runtime_utils.py", line 415, in _pre_forward_unshard
[rank1]:     _unshard(state, handle, state._unshard_stream, state._pre_unshard_stream)
[rank1]:   File "/usr/local/lib/python3.11/dist-packages/torch/distributed/fsdp/_runtime_utils.py", line 299, in _unshard
[rank1]:     handle.unshard()
[rank1]:   File "/usr/local/lib/python3.11/dist-packages/torch/distributed/fsdp/_flat_param.py", line 1308, in unshard
[rank1]:     padded_unsharded_flat_param = self._all_gather_flat_param(unsharded_flat_param)
[rank1]:   File "/usr/local/lib/python3.11/dist-packages/torch/distributed/fsdp/_flat_param.py", line 1399, in _all_gather_flat_param
[rank1]:     dist.all_gather_into_tensor(
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.11 GiB memory in use.
"""

# HF Trainer's compute_loss -> the model's forward runs out of memory, a step into training
TRAINER = """\
  3%|▎         | 30/1000 [00:41<22:05,  1.37s/it]
[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/sft.py", line 140, in <module>
[rank0]:     trainer.train()
[rank0]:   File "/usr/local/lib/python3.10/dist-packages/transformers/trainer.py", line 2241, in train
[rank0]:     return inner_training_loop(
[rank0]:   File "/usr/local/lib/python3.10/dist-packages/transformers/trainer.py", line 2548, in _inner_training_loop
[rank0]:     tr_loss_step = self.training_step(model, inputs, num_items_in_batch)
[rank0]:   File "/usr/local/lib/python3.10/dist-packages/transformers/trainer.py", line 3698, in training_step
[rank0]:     loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
[rank0]:   File "/usr/local/lib/python3.10/dist-packages/transformers/trainer.py", line 3759, in compute_loss
[rank0]:     outputs = model(**inputs)
[rank0]:   File "/usr/local/lib/python3.10/dist-packages/torch/nn/modules/module.py", line 1747, in _call_impl
[rank0]:     return forward_call(*args, **kwargs)
[rank0]:   File "/usr/local/lib/python3.10/dist-packages/transformers/models/llama/modeling_llama.py", line 1190, in forward
[rank0]:     logits = logits.float()
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.83 GiB. GPU 0 has a total capacity of 79.15 GiB of which 3.11 GiB is free.
"""

# Megatron-Core's pipeline schedule runs out of memory in backward_step
MEGATRON = """\
 iteration       12/  500000 | consumed samples:          384 | elapsed time per iteration (ms): 912.4 | learning rate: 1.500E-06 |
[rank3]: Traceback (most recent call last):
[rank3]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 280, in <module>
[rank3]:     pretrain(
[rank3]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 386, in pretrain
[rank3]:     iteration, num_floating_point_operations_so_far = train(
[rank3]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 1441, in train
[rank3]:     train_step(forward_step_func,
[rank3]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 754, in train_step
[rank3]:     losses_reduced = forward_backward_func(
[rank3]:   File "/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", line 1492, in forward_backward_pipelining_without_interleaving
[rank3]:     input_tensor_grad = backward_step(
[rank3]:   File "/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", line 366, in backward_step
[rank3]:     custom_backward(output_tensor[0], output_tensor_grad[0])
[rank3]:   File "/workspace/Megatron-LM/megatron/core/pipeline_parallel/schedules.py", line 150, in custom_backward
[rank3]:     Variable._execution_engine.run_backward(
[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has a total capacity of 79.15 GiB of which 912.00 MiB is free.
"""

# a user's training_step, run by Lightning's optimizer closure, has a shape error
LIGHTNING = """\
Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2
Epoch 0:  12%|█▏        | 120/1000 [01:02<07:38,  1.92it/s, v_num=3, loss=0.812]
Traceback (most recent call last):
  File "/home/u/fit.py", line 60, in <module>
    trainer.fit(model, datamodule=dm)
  File "/usr/lib/python3/site-packages/lightning/pytorch/trainer/trainer.py", line 538, in fit
    call._call_and_handle_interrupt(
  File "/usr/lib/python3/site-packages/lightning/pytorch/loops/optimization/automatic.py", line 270, in _optimizer_step
    call._call_lightning_module_hook(
  File "/usr/lib/python3/site-packages/lightning/pytorch/core/module.py", line 1306, in optimizer_step
    optimizer.step(closure=optimizer_closure)
  File "/usr/lib/python3/site-packages/lightning/pytorch/core/optimizer.py", line 153, in step
    step_output = self._strategy.optimizer_step(self._optimizer, closure, **kwargs)
  File "/usr/lib/python3/site-packages/lightning/pytorch/loops/optimization/automatic.py", line 129, in closure
    step_output = self._step_fn()
  File "/usr/lib/python3/site-packages/lightning/pytorch/loops/optimization/automatic.py", line 317, in _training_step
    training_step_output = call._call_strategy_hook(trainer, "training_step", *kwargs.values())
  File "/usr/lib/python3/site-packages/lightning/pytorch/strategies/strategy.py", line 390, in training_step
    return self.lightning_module.training_step(*args, **kwargs)
  File "/home/u/fit.py", line 31, in training_step
    loss = self.criterion(logits, y.view(-1, 17))
RuntimeError: shape '[-1, 17]' is invalid for input of size 64
"""

# FSDP's auto-wrap at construction runs out of memory
FSDP_INIT = """\
[rank2]: Traceback (most recent call last):
[rank2]:   File "/work/train_fsdp.py", line 40, in <module>
[rank2]:     model = FSDP(model, auto_wrap_policy=policy, device_id=local_rank)
[rank2]:   File "/usr/local/lib/python3.11/dist-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py", line 483, in __init__
[rank2]:     _auto_wrap(
[rank2]:   File "/usr/local/lib/python3.11/dist-packages/torch/distributed/fsdp/_wrap_utils.py", line 101, in _auto_wrap
[rank2]:     _recursive_wrap(**recursive_wrap_kwargs, **root_kwargs)  # type: ignore[arg-type]
[rank2]:   File "/usr/local/lib/python3.11/dist-packages/torch/distributed/fsdp/wrap.py", line 561, in _recursive_wrap
[rank2]:     return _wrap(module, wrapper_cls, **kwargs), nonwrapped_numel
[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 500.00 MiB. GPU 2 has a total capacity of 23.69 GiB of which 210.00 MiB is free.
"""


@pytest.mark.parametrize("name, text, rank, category, phase", [
    ('fsdp', FSDP, 1, 'gpu-memory', 'param-gather'),
    ('trainer', TRAINER, 0, 'gpu-memory', 'forward'),
    ('megatron', MEGATRON, 3, 'gpu-memory', 'backward'),
    ('lightning', LIGHTNING, None, 'user-code', 'forward'),
    ('fsdp_init', FSDP_INIT, 2, 'gpu-memory', 'init'),
])
def test_a_pasted_traceback_gets_its_framework_phase(name, text, rank, category, phase):
    rep = analyze(Case(name, ["-"], {}, stdin=text.encode()))
    ff = rep["first_failure"]
    assert ff is not None, name
    assert (ff["rank"], ff["category"], ff["phase"]) == (rank, category, phase)
    assert ff["phase_from"] == "frames"


# Set-up told by its frames: an object's constructor (a config's __post_init__, a model's __init__), with no
# frame of a step or a training loop, and not one of PyTorch's own helper objects.
_BUILT = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/srv/job/run_train.py", line 12, in <module>
[rank0]:     trainer = Trainer(config_file)
[rank0]:   File "/srv/job/lib/trainer.py", line 88, in __init__
[rank0]:     self.config = load_config(config_file)
[rank0]:   File "/srv/job/lib/config.py", line 40, in load_config
[rank0]:     return Config(**raw)
[rank0]:   File "<string>", line 9, in __init__
[rank0]:   File "/srv/job/lib/config.py", line 31, in __post_init__
[rank0]:     assert self.heads % self.tp == 0, "heads must be divisible by the tensor parallel size"
[rank0]: AssertionError: heads must be divisible by the tensor parallel size
"""


def test_an_error_raised_while_the_job_builds_its_objects_is_init():
    ff = first_failure_of(_BUILT)
    assert ff["phase"] == "init"
    assert "__post_init__" in ff["phase_from"]


def test_a_constructor_called_inside_a_training_loop_is_no_set_up():
    text = _BUILT.replace("trainer = Trainer(config_file)", "train_loop(config_file)").replace(
        'line 88, in __init__', 'line 88, in train_loop')
    assert first_failure_of(text)["phase"] != "init"


def test_torch_s_own_reader_object_is_no_set_up():
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/srv/job/resume.py", line 30, in <module>',
        "    state = torch.load(path)",
        '  File "/opt/venv/lib/python3.10/site-packages/torch/serialization.py", line 1004, in load',
        "    with _open_zipfile_reader(opened_file) as opened_zipfile:",
        '  File "/opt/venv/lib/python3.10/site-packages/torch/serialization.py", line 456, in __init__',
        "    super().__init__(torch._C.PyTorchFileReader(name_or_buffer))",
        "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
        "",
    ])
    ff = first_failure_of(text)
    assert ff["phase"] == "checkpoint-load"


_KILLED = ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 4100) of "
           "binary: /usr/bin/python3")


def test_a_bar_glued_before_the_failure_on_its_line_is_what_came_before_it():
    ff = first_failure_of(f"Loading checkpoint shards:  43%|████▎     | 3/7 [00:31<00:41, 10.3s/it]{_KILLED}\n")
    assert (ff["category"], ff["phase"]) == ("host-memory", "init")


def test_a_training_bar_glued_before_the_failure_is_no_set_up():
    ff = first_failure_of(f"Loading checkpoint shards: 100%|██████████| 7/7 [01:10<00:00, 10.0s/it]\n"
                          f"  3%|▎         | 30/1000 [01:00<32:20,  2.00s/it]{_KILLED}\n")
    assert ff["phase"] != "init"


def test_a_kill_right_after_deepspeed_built_its_zero_optimizer_is_init():
    log = "\n".join([
        "Time to load cpu_adam op: 2.31 seconds",
        "Rank: 0 partition count [2] and sizes[(1048576, False)] ",
        "Rank: 1 partition count [2] and sizes[(1048576, False)] ",
        "[2026-01-06 12:08:44,100] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 5120",
        "[2026-01-06 12:08:44,230] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python3', '-u', 'train.py', "
        "'--local_rank=1'] exits with return code = -9",
        "",
    ])
    ff = first_failure_of(log)
    assert ff["phase"] == "init"
    assert "set-up lines" in ff["phase_from"]


def test_a_state_dict_that_does_not_fit_its_model_is_a_checkpoint_load():
    log = "\n".join([
        "Traceback (most recent call last):",
        '  File "/srv/job/resume.py", line 41, in <module>',
        "    model.load_state_dict(state)",
        '  File "/opt/venv/lib/python3.10/site-packages/torch/nn/modules/module.py", line 2153, in load_state_dict',
        "    raise RuntimeError('Error(s) in loading state_dict for {}:\\n\\t{}'.format(",
        "RuntimeError: Error(s) in loading state_dict for GPTModel:",
        "\tsize mismatch for embedding.word_embeddings.weight: copying a param with shape torch.Size([50304, 1024]) "
        "from checkpoint, the shape in current model is torch.Size([50432, 1024]).",
        "",
    ])
    ff = first_failure_of(log)
    assert (ff["signature"], ff["phase"]) == ("torch.state_dict_mismatch", "checkpoint-load")


def test_a_script_s_train_function_around_a_constructor_is_still_set_up():
    outer = ('[rank0]:   File "/srv/job/run_train.py", line 12, in <module>\n'
             "[rank0]:     train(config_file)\n"
             '[rank0]:   File "/srv/job/run_train.py", line 7, in train\n')
    text = _BUILT.replace('[rank0]:   File "/srv/job/run_train.py", line 12, in <module>\n', outer, 1)
    assert outer in text
    assert first_failure_of(text)["phase"] == "init"


CUT_AT_THE_CALL = """[rank1]: Traceback (most recent call last):
[rank1]:   File "/w/sft.py", line 80, in main
[rank1]:     trainer.train()
[rank1]:   File "/env/lib/python3.11/site-packages/transformers/trainer.py", line 2581, in _inner_training_loop
[rank1]:     tr_loss_step = self.training_step(model, inputs, num_items_in_batch)
[rank1]:                    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[rank1]:   File "/env/lib/python3.11/site-packages/transformers/trainer.py", line 3844, in training_step
[rank1]:     {call}
[rank1]:   File "/env/lib/python3.11/site-packa
"""


def test_a_traceback_cut_after_its_innermost_call_takes_the_phase_of_the_call():
    """The cut took the frame the innermost source line called: where phases.toml names that function in every
    framework (backward), it is the phase; the frame's own (training_step: forward) otherwise."""
    ff = first_failure_of(CUT_AT_THE_CALL.replace("{call}", "self.accelerator.backward(loss, **kwargs)"))
    assert (ff["rank"], ff["phase"]) == (1, "backward")
    assert first_failure_of(CUT_AT_THE_CALL.replace("{call}", "loss = loss / 2 if scale else loss"))["phase"] == \
        "forward"
    # not an example: a traceback with its exception line is judged by its frames alone
    whole = CUT_AT_THE_CALL.replace("{call}", "self.accelerator.backward(loss, **kwargs)").replace(
        '[rank1]:   File "/env/lib/python3.11/site-packa\n', "[rank1]: ValueError: bad loss\n")
    assert first_failure_of(whole)["phase"] == "forward"


CUT_IN_A_STEP = """Traceback (most recent call last):
  File "/w/titan/train.py", line 568, in train_step
    loss = self.forward_backward_step(input_dict, labels)
  File "/w/titan/train.py", line 543, in forward_backward_step
    {call}
  File "/usr/local/lib/python3.
"""


@pytest.mark.parametrize("call, phase", [
    ("pred = model_parts[0](inputs, **extra_inputs)", "forward"),  # a module's call: its forward
    ("logits = self.policy(batch)", "forward"),
    ("loss.backward()", "backward"),
    ("model = get_model(cfg)", "unknown"),  # a function that gets a module is no call of one
    ("h = self.layers[3](h)", "unknown"),  # an indexed callee that names no module: nothing said
])
def test_a_step_cut_at_its_call_of_a_module_was_in_the_forward(call, phase):
    """A step that runs forward and backward (torchtitan's forward_backward_step) says neither by its name; a
    traceback cut right under its call of the model was in that call: torch's Module.__call__, a forward."""
    assert first_failure_of(CUT_IN_A_STEP.replace("{call}", call))["phase"] == phase


WRAPPED_AT_80 = """Traceback (most recent call last):
  File "/srv/rl/examples/run_pipeline.py", line 34, in
<module>
    main()
  File "/srv/rl/examples/run_pipeline.py", line 30, in
main
    pipeline.run()
  File "/srv/rl/rl/pipeline/rlvr/vlm_pipeline.py", line 52
4, in run
    {call}
  File "/srv/rl/rl/
"""


@pytest.mark.parametrize("call, phase", [
    ("self.do_checkpoint(global_step=global_step)", "checkpoint-save"),  # ROLL's pipeline saving its workers
    ("metrics = self.compute_rewards(batch)", "unknown"),  # a call phases.toml does not know
])
def test_a_cut_at_a_call_is_read_where_the_terminal_wrapped_every_frame_line(call, phase):
    """A terminal 80 columns wide wrapped each frame line before its function's name; the traceback was cut right
    under the innermost frame's source line, which still names the call the cut took away."""
    assert first_failure_of(WRAPPED_AT_80.replace("{call}", call))["phase"] == phase


@pytest.mark.parametrize("source, phase", [
    ("from aligner.algorithms.dpo import DPOTrainer, dpo_collate", "init"),
    ("import aligner.data as data", "init"),
    ("trainer.fit()", "unknown"),  # not an import: a call phases.toml does not name
    ("importer = make_importer(cfg)", "unknown"),
])
def test_a_script_cut_at_its_import_statement_was_loading_its_code(source, phase):
    """A script's body cut right under an import statement failed in the module that import ran (its frames and
    exception line lost): the job was still loading its code."""
    text = ("Traceback (most recent call last):\n"
            '  File "/w/examples/train_dpo.py", line 22, in <module>\n'
            f"    {source}\n"
            '  File "/w/aligner/algorith\n')
    assert first_failure_of(text)["phase"] == phase


def test_ray_train_s_worker_function_builds_before_it_fits():
    """Ray Train runs the function its users name train_func (train_loop_per_worker) on each worker: it builds the
    Trainer and then fits, so a constructor under it is still set-up; under a fit it is not."""
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/w/job.py", line 44, in train_func',
        "    trainer = pl.Trainer(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()])",
        '  File "/env/lib/python3.11/site-packages/lightning/pytorch/utilities/argparse.py", line 70, in insert_env_defaults',
        "    return fn(self, **kwargs)",
        '  File "/env/lib/python3.11/site-packages/lightning/pytorch/trainer/trainer.py", line 401, in __init__',
        "    self._accelerator_connector = _AcceleratorConnector(",
        '  File "/env/lib/python3.11/site-packages/lightning/pytorch/trainer/connectors/accelerator_connector.py", '
        "line 140, in __init__",
        "    self._check_config_and_set_final_flags(",
        "ValueError: You selected an invalid strategy name: `strategy='ray_ddp'`.",
    ])
    assert first_failure_of(text)["phase"] == "init"
    fitting = text.replace("line 44, in train_func", "line 44, in fit_one_epoch")
    assert first_failure_of(fitting)["phase"] != "init"


def _built_at_top(torch_file: str, exception: str) -> str:
    return ("[rank0]: Traceback (most recent call last):\n"
            '[rank0]:   File "/w/pipe_test.py", line 48, in <module>\n'
            "[rank0]:     stage = build(model, rank)\n"
            f'[rank0]:   File "/env/lib/python3.12/site-packages/torch/{torch_file}", line 138, in __init__\n'
            "[rank0]:     raise RuntimeError(msg)\n"
            f"[rank0]: {exception}\n")


def test_torch_distributed_s_own_objects_are_built_at_set_up():
    """A pipeline stage, DDP or FSDP wrapper raising from its constructor, with no frame of training around it:
    the job was setting up its parallelism. torch's other helper objects (torch.load's zip reader) may be built in
    any step and say nothing."""
    ff = first_failure_of(_built_at_top("distributed/pipelining/stage.py",
                                        "RuntimeError: Pipeline group size 8 cannot be larger than number of stages 4"))
    assert (ff["phase"], ff["category"]) == ("init", "config")
    reader = first_failure_of(_built_at_top("serialization.py", "RuntimeError: PytorchStreamReader failed reading "
                                                                "zip archive: failed finding central directory"))
    assert reader["phase"] != "init"


FAIRSEQ_LOAD = ("2026-05-02 11:00:00 | INFO | fairseq.trainer | Preparing to load checkpoint /ckpt/lm/checkpoint_last.pt\n"
                "{loaded}"
                "Traceback (most recent call last):\n"
                '  File "/env/bin/fairseq-train", line 33, in <module>\n'
                "    sys.exit(cli_main())\n"
                '  File "/env/lib/python3.8/site-packages/torch/m\n')


def test_fairseq_s_load_lines_bound_its_checkpoint_load():
    """fairseq's trainer says when it starts reading a checkpoint and when it has read it; a failure between the two
    (a traceback cut before saying what) came while loading it, one after the end line still in set-up."""
    assert first_failure_of(FAIRSEQ_LOAD.replace("{loaded}", ""))["phase"] == "checkpoint-load"
    loaded = ("2026-05-02 11:02:10 | INFO | fairseq.trainer | Loaded checkpoint /ckpt/lm/checkpoint_last.pt "
              "(epoch 3 @ 12000 updates)\n")
    assert first_failure_of(FAIRSEQ_LOAD.replace("{loaded}", loaded))["phase"] == "init"
