"""When no specific signature knows a failure, the last resorts still name it: an exception
line gets its category from its type and words (category_rule), a traceback cut before its
exception line is a failure at low confidence, and neither is ever "high"."""

from __future__ import annotations

import pytest

from firstfault.analysis.catalog import CatalogError, load_catalog, parse_catalog
from tests.offline.scoring import Case, analyze, first_failure_of

CATALOG = load_catalog()


@pytest.mark.parametrize("line, category", [
    ("RuntimeError: CUDA error: out of memory", "gpu-memory"),
    ("torch.OutOfMemoryError: something went wrong", "gpu-memory"),
    ("MemoryError: cannot grow the buffer", "host-memory"),
    ("RuntimeError: DataLoader worker (pid 77) is killed by signal: Killed.", "host-memory"),
    ("RuntimeError: host OOM while pinning the optimizer state", "host-memory"),
    ("RuntimeError: worker was killed due to memory pressure (OOM)", "host-memory"),  # Ray's memory monitor's words
    ("RuntimeError: OOM while allocating the activations", "gpu-memory"),  # an OOM said of nothing: a GPU's
    ("ValueError: loss is nan at step 40", "numerics"),
    ("AssertionError: grad norm is not finite", "numerics"),
    ("OSError: [Errno 28] No space left on device", "storage"),
    ("ConnectionRefusedError: [Errno 111] Connection refused", "network"),
    ("torch.distributed.DistNetworkError: failed to recv, got 0 bytes", "network"),
    ("ModuleNotFoundError: No module named 'flash_attn'", "config"),
    ("FileNotFoundError: [Errno 2] No such file or directory: '/data/train.jsonl'", "config"),
    ("TypeError: forward() got an unexpected keyword argument 'labels'", "config"),
    ("ValueError: num_heads must be divisible by tensor parallel size", "config"),
    # Megatron-LM microbatches.py: micro batch times data-parallel size must divide the global batch
    ("AssertionError: micro_batch_size (4) times data_parallel_size (8) must divide global_batch_size (100)", "config"),
    # transformers modeling_utils.py from_pretrained on a local folder without weights
    ("OSError: Error no file named pytorch_model.bin, model.safetensors, tf_model.h5, model.ckpt.index or "
     "flax_model.msgpack found in directory /models/llama.", "config"),
    # a framework's own check of what it was given states a requirement (torchtune loss patch_tp_plan)
    ("KeyError: '`tp_plan` requires `output` key'", "config"),
    # torch.distributed.pipelining's stage checks its group against the stages it was given
    ("RuntimeError: Pipeline group size 8 cannot be larger than number of stages 4", "config"),
])
def test_an_exception_takes_its_category_from_its_words(line, category):
    assert CATALOG.category_of(line, "user-code") == category
    m = CATALOG.match(line)
    assert m.signature.id != "python.exception" or m.category == category


@pytest.mark.parametrize("line", [
    "KeyError: 'input_ids'",
    "IndexError: index 7 is out of bounds for dimension 0 with size 4",
    "ValueError: infinite generator",  # "inf" only as a word
    "RuntimeError: information missing",
    "RuntimeError: the divide kernel got a zero divisor",  # "divide" alone is no requirement
    # autograd's own words of a tensor that requires grad: the code's in-place op, no setting
    "RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.",
])
def test_words_that_name_no_class_leave_user_code(line):
    m = CATALOG.match(line)
    assert m.signature.id == "python.exception" and m.category == "user-code"


def test_a_category_rule_must_name_a_failure_category():
    bad = '''
[[category_rule]]
category = "cascade"
patterns = ["("]
reason = "x"
'''
    with pytest.raises(CatalogError) as e:
        parse_catalog(bad)
    text = str(e.value)
    assert "not a failure category" in text and "does not compile" in text


CUT = """\
[rank2]: Traceback (most recent call last):
[rank2]:   File "/work/train.py", line 120, in <module>
[rank2]:     main()
[rank2]:   File "/site-packages/transformers/trainer.py", line 1900, in train
[rank2]:     return inner_training_loop(
[rank2]:   File "/site-packages/torch/autograd/__init__.py", line 200, in backward
[rank2]:     Variable._execution_engine.run_backward(
"""


def test_a_traceback_cut_before_its_exception_is_a_low_confidence_failure():
    ff = first_failure_of(CUT)
    assert ff["signature"] == "python.traceback" and ff["rank"] == 2
    assert ff["phase"] == "backward" and ff["confidence"] == "low"


def test_a_bare_exception_line_in_prose_is_never_no_failure():
    text = "I get this after a few steps:\n`[rank1]: RuntimeError: Expected all tensors to be on the same device`\n"
    ff = first_failure_of(text)
    assert ff is not None and ff["rank"] == 1 and ff["confidence"] != "high"


def test_a_cut_traceback_takes_its_category_from_words_around_it():
    text = "Host memory grows until the OOM killer fires in engine.step\n```\n" + CUT.replace("backward", "step") + "```\n"
    ff = first_failure_of(text)
    assert ff["signature"] == "python.traceback" and ff["category"] == "host-memory"
    assert ff["confidence"] == "low" and "text's words" in ff["evidence"][0]["linked_by"]


def test_words_alone_are_never_the_failure():
    ff = first_failure_of("we saw NaN once last week, unrelated\nall good now\n")
    assert ff is None


def _table(rank: int, code: int, pid: int) -> str:
    return (f"[{rank}]:\n  time      : 2026-03-05_07:01:51\n  host      : node-a\n"
            f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: {pid})\n"
            "  error_file: <N/A>\n  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n")


def test_a_nonzero_exit_is_the_failure_when_nothing_says_more():
    """torchrun's failure table alone (ChildFailedError.format_msg): the Root Cause entry's rank."""
    text = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 40 + "\ntrain.py FAILED\n"
            + "-" * 40 + "\nFailures:\n" + _table(1, 1, 501) + _table(2, 1, 502) + "-" * 40
            + "\nRoot Cause (first observed failure):\n" + _table(0, 1, 500) + "=" * 40 + "\n")
    ff = first_failure_of(text)
    assert ff["rank"] == 0 and ff["confidence"] == "low" and ff["category"] == "unknown"
    assert "exit is the only sign" in ff["evidence"][0]["linked_by"]


RICH = """\
│ /opt/conda/lib/python3.10/site-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py:391 in __init__ │
│                                                                                                              │
│ ❱  391 │   │   │   _auto_wrap(auto_wrap_kwargs, fsdp_kwargs, FullyShardedDataParallel)                       │
│                                                                                                              │
"""


def test_a_rich_traceback_cut_before_its_exception_is_a_failure():
    ff = first_failure_of(RICH)
    assert ff["signature"] == "python.traceback" and ff["confidence"] == "low"


INTERLEAVED = """\
Traceback (most recent call last):
  File "train.py", line 134, in <module>
Traceback (most recent call last):
  File "train.py", line 116, in train
    model_engine.step()
  File "/site-packages/deepspeed/runtime/engine.py", line 2070, in _take_model_step
    self.optimizer.step()
"""


def test_a_header_inside_a_traceback_starts_another_and_lends_its_phase():
    """Two ranks' tracebacks interleaved without prefixes: the second header is no source line;
    the cut first part takes its phase from the rest of the traceback."""
    rep = analyze(Case("interleaved", ["-"], {}, stdin=INTERLEAVED.encode()))
    assert len(rep["distinct_failures"]) == 2
    ff = rep["first_failure"]
    assert ff["phase"] == "optimizer-step" and ff["phase_from"] == "frames of the rest of the cut traceback"


def test_a_chained_traceback_stays_one():
    text = ("Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n    g()\nKeyError: 'x'\n\n"
            "During handling of the above exception, another exception occurred:\n\n"
            "Traceback (most recent call last):\n  File \"a.py\", line 3, in h\n    f()\nValueError: bad\n")
    rep = analyze(Case("chain", ["-"], {}, stdin=text.encode()))
    assert [g["text"].splitlines()[-1] for g in rep["distinct_failures"]] == ["ValueError: bad"]


def test_a_doubled_backslash_in_a_literal_toml_pattern_is_refused():
    bad = r'''
[[category_rule]]
category = "config"
patterns = ['must\\bbe']
reason = "x"
'''
    with pytest.raises(CatalogError) as e:
        parse_catalog(bad)
    assert "one backslash is the regex's" in str(e.value)


def test_a_wrapping_exception_line_continues_with_the_remote_frames():
    """Ray's RayTaskError(X): the worker's own frames and exception follow the wrapper's line."""
    from firstfault.analysis import traceback as tb
    res = tb.assemble([
        "Traceback (most recent call last):",
        '  File "/app/main.py", line 64, in main',
        "    ray.get(ref)",
        "ray.exceptions.RayTaskError(ValueError): ray::Worker.step() (pid=11, ip=10.0.0.5)",
        '  File "/app/worker.py", line 9, in step',
        "    check(batch)",
        "ValueError: empty batch",
    ])
    assert res.exc_type == "ValueError" and [f.func for f in res.frames][-1] == "step"


def test_a_shape_requirement_is_the_users_code_not_config():
    assert CATALOG.category_of("RuntimeError: mat2 must be a matrix, got 1-D tensor", "user-code") == "user-code"


# A shell's report of a child ended by SIGABRT (glibc strsignal "Aborted"): alone it is a death of
# unknown cause; after a collective timeout it is PyTorch's watchdog taking the process down.
TIMED_OUT = ("[rank1]:[E1203 10:11:12.345678901 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
             "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) "
             "ran for 600011 milliseconds before timing out.\n")


def test_a_shell_s_aborted_alone_is_a_death_of_unknown_cause():
    got = first_failure_of("run.sh: line 9: 51234 Aborted                 (core dumped) python train.py\n")
    assert (got["signature"], got["category"]) == ("process.shell_signal", "unknown")
    assert got["confidence"] != "high"


def test_a_shell_s_aborted_after_a_collective_timeout_is_the_watchdog_s_doing():
    got = first_failure_of(TIMED_OUT + "Aborted (core dumped)\n")
    assert got["category"] == "cascade"


STEPS_SKIPPED = "".join(
    f"[2026-12-02 10:20:0{i},118] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
    f"Attempted loss scale: {2 ** (20 - i)}, reducing to {2 ** (19 - i)}\n" for i in range(5))


@pytest.mark.parametrize("title", ["# DeepSpeed Loss Overflow", "# [deepspeed] OVERFLOW!",
                                   "# fp16 gradients overflow on every step"])
def test_a_title_that_names_an_overflow_is_the_failure_when_the_log_only_skips_steps(title):
    """Steps skipped while the loss scale falls are loss scaling at work, no failure by themselves; a title that
    says the loss or the gradients overflowed is the failure the person asks about: numerics, at the optimizer
    step where the gradients are checked, low."""
    ff = first_failure_of(f"{title}\n\n{STEPS_SKIPPED}")
    assert (ff["signature"], ff["category"], ff["phase"], ff["confidence"]) == \
        ("text.overflow_mention", "numerics", "optimizer-step", "low")


def test_steps_skipped_under_no_such_title_are_no_failure():
    assert first_failure_of(STEPS_SKIPPED) is None
    assert first_failure_of(f"# Stack overflow in the tokenizer\n\n{STEPS_SKIPPED}") is None
    # a failure of the log's own comes before the title's words
    crash = STEPS_SKIPPED + "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    assert first_failure_of(f"# DeepSpeed Loss Overflow\n\n{crash}")["signature"] == "cuda.oom"


LOADED_THEN_NOTHING = ("Loading checkpoint shards: 100%|██████████| 8/8 [19:40<00:00, 147.57s/it]\n"
                       "Loading extension module cpu_adam...\nTime to load cpu_adam op: 60.97 seconds\n")


@pytest.mark.parametrize("title", ["# Training process got killed without any error", "# 训练时进程被kill掉了"])
def test_a_title_that_says_a_process_was_killed_is_a_guess_of_host_memory(title):
    """A worker killed with nothing in its own output: the person's title is all that says it died, and a SIGKILL
    with no word of the process's own is most often the kernel's OOM killer; the set-up lines before it (shards
    loaded, an optimizer op built, no step) give the phase."""
    ff = first_failure_of(f"{title}\n\n{LOADED_THEN_NOTHING}")
    assert (ff["signature"], ff["category"], ff["phase"], ff["confidence"]) == \
        ("text.killed_mention", "host-memory", "init", "low")


def test_killed_in_a_title_says_nothing_of_a_cut_traceback_s_exception():
    """A traceback is an error the process raised, not a kill: words that a process was killed do not give its
    category, nor do words that name no kill ("How to kill a hung job")."""
    cut = ('Traceback (most recent call last):\n  File "/w/run.py", line 30, in main\n    pipeline.run()\n'
           '  File "/w/pipe.py", line 52, in run\n    self.do_checkpoint(global_step=step)\n  File "/w/pi\n')
    assert first_failure_of(f"# 两个任务并行导致任务被杀\n\n{cut}")["category"] == "unknown"
    assert first_failure_of(f"# How to kill a hung job?\n\n{LOADED_THEN_NOTHING}") is None


def test_hydra_s_word_that_the_job_raised_is_the_failure_when_its_exception_is_cut():
    """Hydra writes "Error executing job with overrides: [...]" before it raises the job's exception again (verl's,
    NeMo's entry points): with the exception itself cut from the paste, that is the failure, of an unknown kind."""
    text = ("(main_task pid=186) step:0 - val/test_score/gsm8k:0.41\n"
            "Error executing job with overrides: ['algorithm.adv_estimator=grpo', 'data.train_batch_size=32']\n")
    ff = first_failure_of(text)
    assert (ff["signature"], ff["category"], ff["confidence"]) == ("hydra.job_failed", "unknown", "low")
    # not an example: the exception under it is the failure
    raised = text + "ValueError: batch of 32 does not split among 48 workers\n"
    assert first_failure_of(raised)["signature"] != "hydra.job_failed"
