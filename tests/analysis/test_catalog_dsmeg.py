"""DeepSpeed's cross-rank agreement checks, the local rank it is handed, and Megatron's set-up
lines: the catalog's lines for them, written from the frameworks' format strings, their near
misses, and small pasted logs run through the whole analysis.

Every line below is ours, filled in from a format string with made-up values (ids, pids, hosts)."""

from __future__ import annotations

import pytest

from firstfault.analysis.catalog import load_catalog
from tests.analysis.catalog_lines import assert_line
from tests.offline.scoring import first_failure_of

CATALOG = load_catalog()

# deepspeed/runtime/zero/utils.py assert_ints_same_as_other_ranks, both wordings
DISAGREE_OLD = "RuntimeError: disagreement between rank0 and rank{r}: rank0: [4, 5, 6, 7], rank{r}: [4, 6, 5, 7]"
DISAGREE_NEW = ("RuntimeError: Detected a disagreement on list contents between rank0 and rank{r}: \n list length: 4"
                "\n rank0: [4, 5, 6, 7] \n rank{r}: [4, 6, 5, 7]")
# deepspeed/runtime/engine.py _configure_with_arguments and _do_args_sanity_check
LOCAL_CONFLICT = ("AssertionError: LOCAL_RANK ({env}) != OMPI_COMM_WORLD_LOCAL_RANK ({ompi}), not sure how to proceed "
                  "as we're seeing conflicting local rank info.")
LOCAL_MISSING = ("AssertionError: DeepSpeed requires the LOCAL_RANK environment variable, it is set by the deepspeed "
                 "launcher, deepspeed.init_distributed, or the torch's launcher. If using a different launcher please "
                 "ensure LOCAL_RANK is set prior to initializing deepspeed.")

LINES = [
    (DISAGREE_OLD.format(r=3), "deepspeed.zero3_rank_disagreement", "root", "framework", {"rank": "3"}),
    ("[rank6]: " + DISAGREE_NEW.format(r=6).splitlines()[0], "deepspeed.zero3_rank_disagreement", "root", "framework",
     {"rank": "6"}),
    (LOCAL_CONFLICT.format(env=0, ompi=2), "deepspeed.local_rank_conflict", "root", "config",
     {"env_local": "0", "ompi_local": "2"}),
    (LOCAL_MISSING, "deepspeed.local_rank_conflict", "root", "config", {}),
    ("> building train, validation, and test datasets for GPT ...", "megatron.setup_marker", "context", "unknown",
     {"marker": "building train, validation, and test datasets"}),
    ("[after dataloaders are built] datetime: 2026-12-03 08:00:41 ", "megatron.setup_marker", "context", "unknown",
     {"marker": "[after dataloaders are built]"}),
]


@pytest.mark.parametrize("text,sig,role,category,facts", LINES, ids=[x[1] + str(i) for i, x in enumerate(LINES)])
def test_format_lines(text, sig, role, category, facts):
    assert_line(CATALOG, text, sig, role, category, facts)


@pytest.mark.parametrize("text,forbidden", [
    # the f-strings themselves, as a traceback prints the raising source line
    ('        raise RuntimeError(f"disagreement between rank0 and rank{dist.get_rank()}: "',
     "deepspeed.zero3_rank_disagreement"),
    ('            assert ompi_local_rank == local_rank, f"LOCAL_RANK ({local_rank}) != OMPI_COMM_WORLD_LOCAL_RANK '
     '({ompi_local_rank}), " \\', "deepspeed.local_rank_conflict"),
    # a script that reads os.environ["LOCAL_RANK"] itself: its own KeyError, not DeepSpeed's check
    ("KeyError: 'LOCAL_RANK'", "deepspeed.local_rank_conflict"),
    # Megatron's calls that print the set-up lines, and the line that says training started
    ('    print_rank_0("> building train, validation, and test datasets for GPT ...")', "megatron.setup_marker"),
    ("    print_datetime('after dataloaders are built')", "megatron.setup_marker"),
    ("[before the start of training step] datetime: 2026-12-03 08:00:42 ", "megatron.setup_marker"),
])
def test_near_misses(text, forbidden):
    m = CATALOG.match(text)
    assert m is None or m.signature.id != forbidden, text




def test_zero3_disagreement_names_the_rank_the_message_names_without_a_bet():
    """The raising rank is the one the message names (dist.get_rank()), even with no line prefix; the order
    differs on that rank for the model's own reasons as often as for DeepSpeed's: medium at most."""
    ff = first_failure_of("Epoch 0:   0%|          | 0/500 [00:00<?, ?it/s]\n" + DISAGREE_OLD.format(r=5) + "\n")
    assert ff is not None
    assert (ff["signature"], ff["rank"], ff["category"]) == ("deepspeed.zero3_rank_disagreement", 5, "framework")
    assert ff["confidence"] == "medium"


def test_local_rank_conflict_in_deepspeed_initialize_is_config_at_init():
    text = f"""\
Traceback (most recent call last):
  File "/work/train.py", line 40, in <module>
    engine, *_ = deepspeed.initialize(model=model, config=cfg)
  File "/opt/venv/lib/python3.10/site-packages/deepspeed/__init__.py", line 193, in initialize
    engine = DeepSpeedEngine(args=args,
  File "/opt/venv/lib/python3.10/site-packages/deepspeed/runtime/engine.py", line 262, in __init__
    self._configure_with_arguments(args, mpu)
  File "/opt/venv/lib/python3.10/site-packages/deepspeed/runtime/engine.py", line 1061, in _configure_with_arguments
    assert ompi_local_rank == local_rank, f"LOCAL_RANK ({{local_rank}}) != OMPI_COMM_WORLD_LOCAL_RANK ({{ompi_local_rank}}), " \\
{LOCAL_CONFLICT.format(env=0, ompi=1)}
"""
    ff = first_failure_of(text)
    assert (ff["signature"], ff["category"], ff["phase"]) == ("deepspeed.local_rank_conflict", "config", "init")


# UCX's signal handler line (ucs/debug/debug.c: "Caught signal %d (%s: %s)"), the way a native crash shows in
# NGC containers; Megatron's set-up lines before it (training.py, pretrain_gpt.py)
SEGV = "[gpu-node-4:4242:0:4300] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x8)\n"
SETUP = """\
[after model, optimizer, and learning rate scheduler are built] datetime: 2026-12-03 08:00:12 
> building train, validation, and test datasets for GPT ...
INFO:megatron.core.datasets.gpt_dataset:Build and save the GPTDataset train indices
"""


def test_a_crash_while_megatron_builds_its_datasets_is_init():
    ff = first_failure_of(SETUP + SEGV)
    assert ff is not None
    assert ff["phase"] == "init"
    assert ff["phase_from"].startswith("set-up lines")


def test_a_crash_after_megatron_started_training_is_not_set_up():
    text = SETUP + "[after dataloaders are built] datetime: 2026-12-03 08:00:41 \ndone with setup ...\ntraining ...\n" \
        "[before the start of training step] datetime: 2026-12-03 08:00:42 \n" + SEGV
    ff = first_failure_of(text)
    assert ff is not None
    assert ff["phase"] != "init"


# --- a traceback pasted without its head --------------------------------------------------------------------------

# ZeRO-3 releasing a parameter (partition_parameters.py free_param: assert not param.ds_active_sub_modules,
# param.ds_summary()); the frames say param-gather, unless an outer frame (a save) holds them
RELEASE = """\
[rank1]:   File "/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/partition_parameters.py", line 1490, \
in _partition
[rank1]:     self._partition_param(param, has_been_updated=has_been_updated)
[rank1]:   File "/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/partition_parameters.py", line 301, \
in free_param
[rank1]:     assert not param.ds_active_sub_modules, param.ds_summary()
[rank1]: AssertionError: {'id': 7, 'status': 'AVAILABLE', 'numel': 4096, 'ds_numel': 4096, 'shape': (64, 64), \
'ds_shape': (64, 64), 'requires_grad': True, 'grad_shape': None, 'persist': False, 'active_sub_modules': {3}}
"""
HEAD = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/train.py", line 50, in <module>
[rank1]:     loss = engine(batch)
"""
SAVE = """\
[rank1]:   File "/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/engine.py", line 3505, in save_checkpoint
[rank1]:     self._save_zero_checkpoint(save_dir, tag)
"""


def test_a_step_phase_from_a_headless_traceback_is_no_bet():
    """The paste starts in the middle of the traceback: the frames above it, cut off, may be a save or a load
    that holds the gather. The rank and the category stand; the answer is not high."""
    whole, headless = first_failure_of(HEAD + RELEASE), first_failure_of(RELEASE)
    assert (whole["phase"], whole["confidence"]) == ("param-gather", "high")
    assert (headless["signature"], headless["rank"], headless["category"]) == ("deepspeed.zero3_param_status", 1,
                                                                              "framework")
    assert (headless["phase"], headless["phase_from"], headless["confidence"]) == ("param-gather", "frames", "medium")


def test_an_enclosing_phase_in_a_headless_traceback_keeps_its_confidence():
    """A save among the frames that are there is the phase whatever the cut frames were."""
    ff = first_failure_of(SAVE + RELEASE)
    assert (ff["phase"], ff["confidence"]) == ("checkpoint-save", "high")


# --- Transformer Engine: no attention backend for these inputs -----------------------------------------------------

@pytest.mark.parametrize("line", [
    "[rank2]: Exception: No dot product attention support for the provided inputs!",  # TE 1.x
    "ValueError: No dot product attention backend is available for the provided inputs. Please run with NVTE_DEBUG=1 "
    "NVTE_DEBUG_LEVEL=2 to find out the reasons for disabling all backends.",  # TE 1.13-2.x
])
def test_te_no_attention_backend_is_config(line):
    assert_line(CATALOG, line, "transformer_engine.no_attention_backend", "root", "config", {})


def test_te_no_attention_backend_is_not_its_raising_source_line():
    m = CATALOG.match('                "No dot product attention backend is available for the provided inputs. Please"')
    assert m is None or m.signature.id != "transformer_engine.no_attention_backend"


def test_te_no_attention_backend_in_a_megatron_forward_names_rank_config_and_forward():
    text = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/workspace/pretrain_gpt.py", line 230, in forward_step
[rank1]:     output_tensor = model(tokens, position_ids, attention_mask, labels=labels)
[rank1]:   File "/usr/local/lib/python3.12/dist-packages/megatron/core/transformer/attention.py", line 620, in forward
[rank1]:     core_attn_out = self.core_attention(query, key, value, attention_mask)
[rank1]:   File "/usr/local/lib/python3.12/dist-packages/transformer_engine/pytorch/attention/dot_product_attention/\
dot_product_attention.py", line 1290, in forward
[rank1]:     raise ValueError(
[rank1]: ValueError: No dot product attention backend is available for the provided inputs. Please run with \
NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2 to find out the reasons for disabling all backends.
"""
    ff = first_failure_of(text)
    assert (ff["signature"], ff["rank"], ff["category"], ff["phase"]) == (
        "transformer_engine.no_attention_backend", 1, "config", "forward")


# --- set-up refusals: a quantized model on another GPU (accelerate), fp16 with bf16 (DeepSpeed) ----------------------

@pytest.mark.parametrize("text,sig", [
    # accelerate accelerator.py prepare_model, 0.21-1.x wording and 0.19-0.20 wording
    ("[rank3]: ValueError: You can't train a model that has been loaded in 8-bit or 4-bit precision on a different "
     "device than the one you're training on. Make sure you loaded the model on the correct device using for example "
     "`device_map={'':torch.cuda.current_device()}` or `device_map={'':torch.xpu.current_device()}`",
     "accelerate.prepare_config"),
    ("ValueError: You can't train a model that has been loaded in 8-bit precision on a different device than the one "
     "you're training on. Make sure you loaded the model on the correct device using for example "
     "`device_map={'':torch.cuda.current_device() or device_map={'':torch.xpu.current_device()}`",
     "accelerate.prepare_config"),
    # deepspeed/runtime/config.py _do_error_check
    ("AssertionError: bfloat16 and fp16 modes cannot be simultaneously enabled", "deepspeed.config_validation"),
])
def test_setup_refusals_are_config(text, sig):
    assert_line(CATALOG, text, sig, "root", "config", {})


def test_setup_refusal_source_lines_are_not_failures():
    for text in ("                            \"You can't train a model that has been loaded in 8-bit or 4-bit precision "
                 "on a different device than the one \"",
                 "            and self.bfloat16_config.enabled), 'bfloat16 and fp16 modes cannot be simultaneously "
                 "enabled'"):
        m = CATALOG.match(text)
        assert m is None or m.role != "root", text


def test_a_quantized_model_on_the_wrong_gpu_names_the_rank_and_init():
    ff = first_failure_of("[rank1]: Traceback (most recent call last):\n"
                 "[rank1]:   File \"/work/sft.py\", line 61, in <module>\n"
                 "[rank1]:     trainer = SFTTrainer(model=model, args=args, train_dataset=ds)\n"
                 "[rank1]:   File \"/opt/venv/lib/python3.11/site-packages/accelerate/accelerator.py\", line 1472, in "
                 "prepare_model\n"
                 "[rank1]:     raise ValueError(\n"
                 "[rank1]: ValueError: You can't train a model that has been loaded in 8-bit or 4-bit precision on a "
                 "different device than the one you're training on. Make sure you loaded the model on the correct "
                 "device using for example `device_map={'':torch.cuda.current_device()}` or "
                 "`device_map={'':torch.xpu.current_device()}`\n")
    assert (ff["signature"], ff["rank"], ff["category"], ff["phase"]) == ("accelerate.prepare_config", 1, "config",
                                                                          "init")


# an issue's title above the paste (a Markdown heading: prose), naming the phase the job failed in
SAVE_TITLE = "# Training fails when saving checkpoints with ZeRO-3\n\n"


def test_a_headless_traceback_under_a_heading_that_names_a_save_is_the_save():
    """The frames of the save are above the cut; the title says the job failed saving: the save is the phase,
    at medium (a person's words, and frames that are not there)."""
    ff = first_failure_of(SAVE_TITLE + RELEASE)
    assert (ff["signature"], ff["rank"], ff["category"]) == ("deepspeed.zero3_param_status", 1, "framework")
    assert (ff["phase"], ff["confidence"]) == ("checkpoint-save", "medium")
    assert "heading" in ff["phase_from"]


def test_a_whole_traceback_keeps_its_frames_phase_whatever_the_heading_says():
    ff = first_failure_of(SAVE_TITLE + HEAD + RELEASE)
    assert (ff["phase"], ff["phase_from"]) == ("param-gather", "frames")


def test_a_headless_traceback_whose_phase_is_not_from_its_frames_is_no_bet_either():
    """One user frame only: the phase comes from the signature's hint, and the cut frames could still hold a save."""
    user_frame = ("[rank1]:   File \"/work/train.py\", line 77, in run\n"
                  "[rank1]:     engine.step()\n")
    ff = first_failure_of(user_frame + RELEASE.splitlines(keepends=True)[-1])
    assert (ff["rank"], ff["category"]) == (1, "framework")
    assert ff["confidence"] == "medium"


# deepspeed/launcher/runner.py main(): the passwordless-ssh check, the command a string (older releases,
# shell=True) or a shlex.split list; Python's CalledProcessError prints "Command '{cmd}' returned non-zero ..."
SSH_STR = ("subprocess.CalledProcessError: Command 'ssh -o PasswordAuthentication=no {h} hostname' "
           "returned non-zero exit status {c}.")
SSH_LIST = ("subprocess.CalledProcessError: Command '['ssh', '-o', 'PasswordAuthentication=no', {p}'{h}', 'hostname']' "
            "returned non-zero exit status {c}.")
# megatron/training/checkpointing.py check_checkpoint_args._compare
CKPT_ARGS = "AssertionError: {a} value from checkpoint ({c}) is not equal to the input argument value ({v})."


@pytest.mark.parametrize("text,sig,facts", [
    (SSH_STR.format(h="10.9.8.7", c=255), "deepspeed.runner_ssh_check_failed", {"host": "10.9.8.7", "exitcode": "255"}),
    (SSH_LIST.format(p="", h="node-b", c=255), "deepspeed.runner_ssh_check_failed", {"host": "node-b"}),
    (SSH_LIST.format(p="'-p', '2022', ", h="node-b", c=1), "deepspeed.runner_ssh_check_failed",
     {"host": "node-b", "exitcode": "1"}),
    (CKPT_ARGS.format(a="pipeline_model_parallel_size", c=2, v=4), "megatron.checkpoint_args_mismatch",
     {"arg": "pipeline_model_parallel_size", "ckpt": "2", "value": "4"}),
])
def test_launch_and_checkpoint_config_lines(text, sig, facts):
    assert_line(CATALOG, text, sig, "root", "config", facts)


@pytest.mark.parametrize("text,forbidden", [
    # the master-address lookup that follows the check runs another ssh command: not this check
    ("subprocess.CalledProcessError: Command '['ssh', 'node-b', 'hostname', '-I']' returned non-zero exit status 255.",
     "deepspeed.runner_ssh_check_failed"),
    # someone's own ssh command in a shell script, without the failure
    ("ssh -o PasswordAuthentication=no node-b hostname", "deepspeed.runner_ssh_check_failed"),
    # the source line as a traceback prints it
    ("        error_message = '{} value from checkpoint ({}) is not equal to the ' \\",
     "megatron.checkpoint_args_mismatch"),
])
def test_launch_and_checkpoint_near_misses(text, forbidden):
    m = CATALOG.match(text)
    assert m is None or m.signature.id != forbidden, text


def test_ssh_check_traceback_cut_before_deepspeeds_own_error_is_config_at_init():
    """A paste that stops at the CalledProcessError (before 'was not reachable via ssh') is still the launch
    refusing to start, not a user's exception."""
    text = ("Traceback (most recent call last):\n"
            '  File "/opt/venv/lib/python3.10/site-packages/deepspeed/launcher/runner.py", line 470, in main\n'
            "    subprocess.check_call(safe_ssh_cmd, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)\n"
            '  File "/usr/lib/python3.10/subprocess.py", line 369, in check_call\n'
            "    raise CalledProcessError(retcode, cmd)\n"
            + SSH_LIST.format(p="", h="node-b", c=255) + "\n")
    ff = first_failure_of(text)
    assert ff is not None
    assert (ff["signature"], ff["category"], ff["phase"]) == ("deepspeed.runner_ssh_check_failed", "config", "init")


def test_megatron_checkpoint_args_mismatch_is_config_at_checkpoint_load():
    text = ("[rank0]: Traceback (most recent call last):\n"
            '[rank0]:   File "/workspace/megatron/training/checkpointing.py", line 900, in _compare\n'
            "[rank0]:     assert checkpoint_value == args_value, error_message\n"
            "[rank0]: " + CKPT_ARGS.format(a="tensor_model_parallel_size", c=1, v=2) + "\n")
    ff = first_failure_of(text)
    assert ff is not None
    assert (ff["signature"], ff["category"], ff["phase"]) == ("megatron.checkpoint_args_mismatch", "config",
                                                              "checkpoint-load")
