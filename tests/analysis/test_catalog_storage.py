"""Storage and checkpoints: the catalog against lines written from the format strings of the
sources (torch serialization and caffe2/serialize/inline_container.cc, safetensors, the HF Hub
and transformers, DeepSpeed, Megatron-LM/Core, torch.distributed.checkpoint, accelerate,
Lightning, torchtune, torchtitan, glibc's strerror), the phase markers of a save or a load
under way, and small pasted logs through the whole analysis.

Every line here is written from a format string with made-up values (paths, ranks, sizes);
none is copied from a user's log.
"""

from __future__ import annotations

import pytest

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.phase import load_phase_rules, phase_before_failure
from firstfault.analysis.save_phase import phase_while_waiting
from tests.analysis.catalog_lines import assert_line
from tests.offline.scoring import first_failure_of

CATALOG = load_catalog()
RULES = load_phase_rules()

# (line, signature id, role, category, the facts it must carry)
LINES = [
    # torch.save: the writer's messages, old ([enforce fail at ...]) and new
    ("RuntimeError: [enforce fail at inline_container.cc:325] . PytorchStreamWriter failed writing file data/41: "
     "file write failed", "torch.save_write_failed", "root", "storage", {"entry": "data/41", "reason": "file write failed"}),
    ("[rank3]: RuntimeError: PytorchStreamWriter failed writing central directory for archive model_states: "
     "file write failed", "torch.save_write_failed", "root", "storage", {"what": "writing central directory"}),
    ("RuntimeError: [enforce fail at inline_container.cc:603] . unexpected pos 1183424 vs 1183312",
     "torch.save_write_failed", "root", "storage", {"pos": "1183424", "expected": "1183312"}),
    # torch.save could not open its file: the category follows the strerror's words
    ("RuntimeError: [enforce fail at inline_container.cc:747] . open file failed with strerror: No such file or "
     "directory", "torch.save_open_failed", "root", "config", {}),
    ("RuntimeError: [enforce fail at inline_container.cc:747] . open file failed with strerror: Disk quota exceeded",
     "torch.save_open_failed", "root", "storage", {}),
    ("RuntimeError: Parent directory /scratch/run4/ckpt does not exist.", "torch.save_open_failed", "root", "config",
     {"path": "/scratch/run4/ckpt"}),
    # torch.load of a damaged archive or of something else
    ("RuntimeError: PytorchStreamReader failed reading zip archive: not a ZIP archive", "torch.load_corrupt_archive",
     "root", "storage", {"reason": "not a ZIP archive"}),
    ("[rank0]: RuntimeError: PytorchStreamReader failed reading file data/94502528: file read failed",
     "torch.load_corrupt_archive", "root", "storage", {"entry": "data/94502528"}),
    ("_pickle.UnpicklingError: invalid load key, '\\x00'.", "torch.load_not_a_checkpoint", "root", "storage", {}),
    ("_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, to do so you have two options, "
     "do those steps only if you trust the source of the checkpoint. \n\tWeightsUnpickler error: Unsupported global: "
     "GLOBAL numpy.core.multiarray._reconstruct was not an allowed global by default.",
     "torch.load_weights_only", "root", "config", {"global": "numpy.core.multiarray._reconstruct"}),
    # safetensors, both wordings
    ("safetensors_rust.SafetensorError: Error while deserializing header: InvalidHeaderDeserialization",
     "safetensors.corrupt_header", "root", "storage", {"reason": "InvalidHeaderDeserialization"}),
    ("safetensors._safetensors_rust.SafetensorError: Error while deserializing header: header too small",
     "safetensors.corrupt_header", "root", "storage", {"reason": "header too small"}),
    # the Hub
    ("OSError: We couldn't connect to 'https://hf-mirror.example' to load the files, and couldn't find them in the "
     "cached files.", "hf.hub_unreachable", "root", "network", {"endpoint": "https://hf-mirror.example"}),
    ("OSError: Cannot find the requested files in the disk cache and outgoing traffic has been disabled. To enable "
     "hf.co look-ups and downloads online, set 'local_files_only' to False.", "hf.hub_offline_cache_miss", "root",
     "config", {}),
    ("OSError: Can't load config for 'bert-base-chinese'. If you were trying to load it from "
     "'https://huggingface.co/models', make sure you don't have a local directory with the same name.",
     "hf.cant_load_pretrained", "root", "config", {"what": "config", "name": "bert-base-chinese"}),
    # DeepSpeed
    ("[rank2]: deepspeed.runtime.zero.utils.ZeRORuntimeException: The checkpoint being loaded used a DP world size of "
     "4 but the current world size is 8. Automatic adjustment of ZeRO's optimizer state partitioning with a new world "
     "size is not currently supported.", "deepspeed.zero_dp_world_size_changed", "root", "config",
     {"ckpt_dp": "4", "dp": "8"}),
    ("ValueError: Expected 16 of '*_optim_states.pt' under '/ckpt/global_step900' but found 15 files. Possibly due to "
     "an overwrite of an old checkpoint, or a checkpoint didn't get saved by one or more processes.",
     "deepspeed.checkpoint_incomplete", "root", "storage", {"expected": "16", "found": "15"}),
    ("[2026-04-01 08:00:00,000] [ERROR] [engine.py:3190:_create_checkpoint_file] Failed saving model checkpoint to "
     "/ro/ckpt with tag global_step50", "deepspeed.checkpoint_dir_failed", "root", "storage",
     {"path": "/ro/ckpt", "tag": "global_step50"}),
    # Megatron
    ("megatron.core.dist_checkpointing.core.CheckpointingException: Global shape mismatch for loaded "
     "(torch.Size([4096])) and expected ((8192,)) tensor for key decoder.final_layernorm.weight",
     "megatron.dist_ckpt_shape_mismatch", "root", "config", {"key": "decoder.final_layernorm.weight"}),
    ("megatron.core.dist_checkpointing.core.CheckpointingException: Checkpoint directory /ckpt/llama/iter_0000100 "
     "does not exist", "megatron.dist_checkpoint_not_found", "root", "config", {"path": "/ckpt/llama/iter_0000100"}),
    # resuming from nothing
    ("ValueError: Can't find a valid checkpoint at /out/checkpoint-42", "hf.resume_checkpoint_missing", "root",
     "config", {"path": "/out/checkpoint-42"}),
    # errno lines as Python prints them
    ("OSError: [Errno 122] Disk quota exceeded", "storage.quota_exceeded", "root", "storage", {}),
    ("PermissionError: [Errno 30] Read-only file system: '/data/out/checkpoint-10'", "storage.read_only_fs", "root",
     "storage", {"path": "/data/out/checkpoint-10"}),
    ("OSError: [Errno 116] Stale file handle", "storage.stale_file_handle", "root", "storage", {}),
    ("OSError: [Errno 5] Input/output error: '/lustre/ckpt/iter_0002000/__0_1.distcp'", "storage.eio", "root",
     "storage", {}),
    # DCP: the rank inside the message; the category from its own error's words
    ("torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([3])\n"
     "Traceback (most recent call last): (RANK 3)\n"
     "  File \"/opt/torch/distributed/checkpoint/utils.py\", line 201, in reduce_scatter\n"
     "    local_data = map_fun()\n"
     "KeyError: 'model.layers.0.mlp.gate_proj.weight'",
     "dcp.checkpoint_exception", "root", "unknown", {"rank": "3", "ranks": "3"}),
    # ... and the cause inside it wins where the catalog knows it
    ("torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0, 1])\n"
     "Traceback (most recent call last): (RANK 0)\n"
     "  File \"/opt/torch/distributed/checkpoint/filesystem.py\", line 451, in write_data\n"
     "    _write_files_from_queue(\n"
     "OSError: [Errno 28] No space left on device",
     "storage.enospc", "root", "storage", {}),
]


@pytest.mark.parametrize("line,sid,role,category,facts", LINES, ids=[f"{s}-{i}" for i, (_, s, *_r) in enumerate(LINES)])
def test_line(line, sid, role, category, facts):
    assert_line(CATALOG, line, sid, role, category, facts)


# Near misses: (line, the signature it must not be)
NOT = [
    # the source of a format string, a comment, a warning that is not the failure
    ('    CAFFE_THROW("PytorchStreamReader failed ", what, info, ": ", mz_zip_get_error_string(err));',
     "torch.load_corrupt_archive"),
    ('                "Weights only load failed. This file can still be loaded, to do so you have two options, "',
     "torch.load_weights_only"),
    ("[WARNING] [engine.py:2900:_checkpoint_tag_validation] [rank=1] The checkpoint tag name 'x1' is not consistent "
     "across all ranks. Including rank unique information in checkpoint tag could cause issues when restoring with "
     "different world sizes.", "deepspeed.checkpoint_tag_inconsistent"),
    # the reader asking for a record another format holds is no damaged file
    ("RuntimeError: PytorchStreamReader failed locating file data.pkl: file not found", "torch.load_corrupt_archive"),
    # a DataLoader worker's shared memory and NCCL's /dev/shm are memory, not the checkpoint disk
    ("RuntimeError: unable to write to file </torch_4410_2231099118_0>: No space left on device (28)",
     "storage.enospc"),
    ("gpu-2:4410:4477 [0] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device",
     "storage.enospc"),
    # a worker's pickled arguments, not torch.load
    ("Traceback (most recent call last):\n  File \"/usr/lib/python3.10/multiprocessing/spawn.py\", line 126, in _main\n"
     "    self = reduction.pickle.load(from_parent)\nEOFError: Ran out of input", "torch.load_not_a_checkpoint"),
    # prose that quotes an error is not the error
    ("what does \"failed reading zip archive: failed finding central directory\" mean?", "torch.load_corrupt_archive"),
    ("Loading model from scratch", "checkpoint.load_begins"),
]


@pytest.mark.parametrize("line,sid", NOT, ids=[s for _, s in NOT])
def test_not(line, sid):
    m = CATALOG.match(line)
    assert m is None or m.signature.id != sid


def test_context_marks_blame_nothing():
    for sid in ("checkpoint.save_begins", "checkpoint.save_file_written", "checkpoint.save_finished",
                "checkpoint.load_begins", "checkpoint.load_finished"):
        assert CATALOG.get(sid).role == "context", sid


# ---------------------------------------------------------------------------------- markers

SAVE_START = [
    "[INFO|trainer.py:3984] 2026-05-02 10:12:00,101 >> Saving model checkpoint to /out/checkpoint-100",
    "saving checkpoint at iteration     500 to /ckpt in torch_dist format",
    "INFO:torchtune.utils._logging:Saving checkpoint. This may take some time. Retrieving full model state dict...",
    "[titan] 2026-05-02 10:12:00,101 - root - INFO - Saving the checkpoint (or staging if async is enabled).",
    "[2026-12-02 10:12:00,101] [INFO] [logging.py:123:log_dist] [Rank 0] [Torch] Checkpoint global_step10 is about "
    "to be saved!",
    "Epoch 1, global step 300: 'val_acc' reached 0.81000 (best 0.81000), saving model to '/o/e1.ckpt' as top 3",
    "05/02/2026 10:12:00 - INFO - accelerate.accelerator - Saving current state to /out/step_10",
]
SAVE_END = [
    "  successfully saved checkpoint from iteration     500 to /ckpt [ t 1/2, p 1/1 ]",
    "[titan] 2026-05-02 10:12:09,000 - root - INFO - Finished saving the checkpoint (or staging if async is enabled)"
    "in 8.90 seconds.",
    "INFO:torchtune.utils._logging:Saving checkpoint took 12.50 secs",
    "05/02/2026 10:12:40 - INFO - accelerate.checkpointing - Random states saved in /out/step_10/random_states_0.pkl",
]


@pytest.mark.parametrize("start", SAVE_START)
def test_a_save_start_names_checkpoint_save_until_its_end(start):
    assert phase_before_failure([start], RULES) == "checkpoint-save"
    # a file written inside the save keeps it open
    assert phase_before_failure(
        [start, "[INFO|modeling_utils.py:3044] 2026-05-02 10:12:30,000 >> Model weights saved in /o/model.safetensors"],
        RULES) == "checkpoint-save"


@pytest.mark.parametrize("end", SAVE_END)
def test_a_save_end_lets_the_phase_go(end):
    assert phase_before_failure([SAVE_START[0], end], RULES) is None


def test_progress_after_a_save_lets_it_go():
    assert phase_before_failure([SAVE_START[1], " iteration      510/  500000 | lm loss: 3.1E+00 |"], RULES) is None


def test_load_lines():
    assert phase_before_failure(["[INFO|trainer.py:2480] 2026-05-02 11:00:00,000 >> Loading model from "
                                 "/out/run1/checkpoint-500."], RULES) == "checkpoint-load"
    assert phase_before_failure([" loading distributed checkpoint from /ckpt at iteration 500"], RULES) == \
        "checkpoint-load"
    # once loaded, the job is still setting up until training shows progress
    assert phase_before_failure([" loading distributed checkpoint from /ckpt at iteration 500",
                                 "  successfully loaded checkpoint from /ckpt [ t 1/2, p 1/1 ] at iteration 500"],
                                RULES) == "init"


def test_a_format_string_is_no_marker():
    assert phase_before_failure(['        logger.info(f"Saving model checkpoint to {output_dir}")'], RULES) is None


def test_phase_while_waiting():
    assert phase_while_waiting([SAVE_START[2]], RULES)[0] == "checkpoint-save"
    assert phase_while_waiting([SAVE_START[2], SAVE_END[2]], RULES) is None
    assert phase_while_waiting([], RULES) is None


@pytest.mark.parametrize("start", [SAVE_START[0], SAVE_START[4], SAVE_START[5]])
def test_a_save_whose_end_is_never_printed_says_nothing_of_a_silence(start):
    """The HF Trainer, DeepSpeed 0.17.1+ and Lightning print no end of a save: a hang after a save
    that finished reads like a hang in it, so the silence names no phase (a failure line right
    after the start still does: phase_before_failure)."""
    assert phase_before_failure([start], RULES) == "checkpoint-save"
    assert phase_while_waiting([start], RULES) is None
    # the set-up before it still counts for a silence that began before training
    assert phase_while_waiting([" loading distributed checkpoint from /ckpt at iteration 500"], RULES)[0] == \
        "checkpoint-load"


# ------------------------------------------------------------------------- whole pasted logs


def test_deepspeed_save_on_a_full_disk():
    text = "\n".join([
        "[2026-12-02 10:12:00,101] [INFO] [logging.py:123:log_dist] [Rank 0] [Torch] Checkpoint global_step200 is "
        "about to be saved!",
        "[2026-12-02 10:12:00,103] [INFO] [logging.py:123:log_dist] [Rank 0] Saving model checkpoint: "
        "/ckpt/run1/global_step200/mp_rank_00_model_states.pt",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/work/train.py", line 88, in <module>',
        "[rank1]:     engine.save_checkpoint(args.save_dir)",
        '[rank1]:   File "/usr/lib/python3/dist-packages/deepspeed/runtime/engine.py", line 3150, in save_checkpoint',
        "[rank1]:     self._save_zero_checkpoint(save_dir, tag)",
        '[rank1]:   File "/usr/lib/python3/dist-packages/torch/serialization.py", line 652, in save',
        "[rank1]:     _save(obj, opened_zipfile, pickle_module, pickle_protocol, _disable_byteorder_record)",
        "[rank1]: RuntimeError: [enforce fail at inline_container.cc:603] . unexpected pos 8585216 vs 8585104",
    ]) + "\n"
    ff = first_failure_of(text)
    assert (ff["rank"], ff["category"], ff["phase"]) == (1, "storage", "checkpoint-save")


def test_megatron_save_over_quota_without_frames_is_the_save():
    text = "\n".join([
        " iteration     1990/  500000 | consumed samples:      1018880 | lm loss: 3.012345E+00 | loss scale: 1.0 |",
        "saving checkpoint at iteration    2000 to /ckpt/gpt in torch_dist format",
        "[rank5]: OSError: [Errno 122] Disk quota exceeded",
    ]) + "\n"
    ff = first_failure_of(text)
    assert (ff["rank"], ff["category"], ff["phase"]) == (5, "storage", "checkpoint-save")


def test_a_failure_after_the_save_ended_is_not_the_save():
    text = "\n".join([
        "saving checkpoint at iteration    2000 to /ckpt/gpt in torch_dist format",
        "  successfully saved checkpoint from iteration    2000 to /ckpt/gpt [ t 1/4, p 1/2 ]",
        "[rank2]: OSError: [Errno 5] Input/output error: '/data/shard_0117.bin'",
    ]) + "\n"
    ff = first_failure_of(text)
    assert (ff["rank"], ff["category"]) == (2, "storage")
    assert ff["phase"] != "checkpoint-save"


def test_resume_from_a_truncated_safetensors_file():
    text = "\n".join([
        "[INFO|trainer.py:2480] 2026-05-02 11:00:00,000 >> Loading model from /out/run1/checkpoint-500.",
        "[rank1]: safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer",
    ]) + "\n"
    ff = first_failure_of(text)
    assert (ff["rank"], ff["category"], ff["phase"]) == (1, "storage", "checkpoint-load")


def test_hub_unreachable_at_start_is_network_init():
    text = "\n".join([
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/work/train.py", line 40, in <module>',
        "[rank0]:     model = AutoModelForCausalLM.from_pretrained(args.model)",
        '[rank0]:   File "/usr/lib/python3/dist-packages/transformers/utils/hub.py", line 441, in cached_file',
        "[rank0]:     raise EnvironmentError(",
        "[rank0]: OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the "
        "cached files and it looks like org/model-7b is not the path to a directory containing a file named "
        "config.json.",
    ]) + "\n"
    ff = first_failure_of(text)
    assert (ff["rank"], ff["category"], ff["phase"]) == (0, "network", "init")


def test_corrupt_checkpoint_at_resume_with_frames():
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/work/train.py", line 120, in <module>',
        "    trainer.train(resume_from_checkpoint=True)",
        '  File "/usr/lib/python3/dist-packages/transformers/trainer.py", line 2301, in _load_from_checkpoint',
        "    state_dict = torch.load(weights_file, map_location=\"cpu\")",
        '  File "/usr/lib/python3/dist-packages/torch/serialization.py", line 1025, in load',
        "    with _open_zipfile_reader(opened_file) as opened_zipfile:",
        "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
    ]) + "\n"
    ff = first_failure_of(text)
    assert (ff["category"], ff["phase"]) == ("storage", "checkpoint-load")


def test_a_worker_killed_while_the_trainer_saves():
    text = "\n".join([
        "{'loss': 1.2034, 'grad_norm': 0.51, 'learning_rate': 1e-05, 'epoch': 0.5}",
        "[INFO|trainer.py:3984] 2026-05-02 10:12:00,101 >> Saving model checkpoint to /out/run1/checkpoint-500",
        "E1202 11:57:01.000000 140 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -9) "
        "local_rank: 0 (pid: 3301) of binary: /usr/bin/python3",
    ]) + "\n"
    ff = first_failure_of(text)
    assert (ff["rank"], ff["phase"]) == (0, "checkpoint-save")
    assert ff["confidence"] != "high"


def test_trainer_staging_rename_race():
    m = CATALOG.match("[rank8]: FileNotFoundError: [Errno 2] No such file or directory: "
                      "'/out/tmp-checkpoint-1000' -> '/out/checkpoint-1000'")
    assert (m.signature.id, m.category) == ("hf.trainer_checkpoint_rename", "framework")
    assert m.groups["src"] == "/out/tmp-checkpoint-1000"


def test_a_missing_zero_shard_on_resume_is_the_jobs_setup_on_that_rank():
    # transformers Trainer.train -> deepspeed_load_checkpoint -> DeepSpeed engine.load_checkpoint -> torch.load,
    # on the rank whose shard the save did not write (format strings of the frames and of open()'s error)
    tb = ["Traceback (most recent call last):",
          '  File "/opt/app/train.py", line 60, in <module>',
          "    trainer.train(resume_from_checkpoint=True)",
          '  File "/usr/lib/python3.10/site-packages/transformers/trainer.py", line 2398, in _inner_training_loop',
          "    deepspeed_load_checkpoint(",
          '  File "/usr/lib/python3.10/site-packages/deepspeed/runtime/engine.py", line 2900, in load_checkpoint',
          "    success = self._load_zero_checkpoint(",
          '  File "/usr/lib/python3.10/site-packages/torch/serialization.py", line 231, in _open_file_like',
          "    return _open_file(name_or_buffer, mode)",
          "FileNotFoundError: [Errno 2] No such file or directory: "
          "'/out/checkpoint-400/global_step400/zero_pp_rank_5_mp_rank_00_optim_states.pt'"]
    log = "\n".join(f"[rank5]: {line}" for line in tb) + "\n"
    ff = first_failure_of(log)
    assert (ff["signature"], ff["category"], ff["phase"], ff["rank"]) == (
        "deepspeed.checkpoint_shard_missing", "config", "checkpoint-load", 5)
    # not-example: a data file that is not there stays what the generic rules say, not a checkpoint shard
    other = log.replace("/out/checkpoint-400/global_step400/zero_pp_rank_5_mp_rank_00_optim_states.pt",
                        "/data/train.json")
    assert first_failure_of(other)["signature"] != "deepspeed.checkpoint_shard_missing"


# A paste under a Markdown heading that names the failure, then the log's own line of it (Megatron's
# async checkpoint writer, filesystem_async.py): the log's line is the evidence, and its logger names
# the save it failed in.
HEADED_SAVE_FAILURE = """\
# Checkpoint save fails: [Errno 5] Input/output error
saving checkpoint at iteration     400 to /ckpt/run1
ERROR:megatron.core.dist_checkpointing.strategies.filesystem_async:Local process 0 encountered an error: [Errno 5] Input/output error
"""


def test_the_logs_own_line_is_the_evidence_not_the_heading_that_names_it():
    ff = first_failure_of(HEADED_SAVE_FAILURE)
    assert ff["signature"] == "storage.eio" and ff["category"] == "storage"
    assert ff["evidence"][0]["text"].startswith("ERROR:megatron.core.dist_checkpointing")
    assert ff["phase"] == "checkpoint-save"
