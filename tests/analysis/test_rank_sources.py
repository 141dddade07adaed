"""Where a failure's rank comes from when its own lines carry no prefix: a launcher line that
names the rank of the traceback below it, the same failure said again by a rank; and no
"high" answer whose category is unknown. Inputs are written from the tools' formats."""

from __future__ import annotations

from tests.offline.scoring import Case, analyze, first_failure_of

SPAWN = """\
Traceback (most recent call last):
  File "train.py", line 281, in <module>
    mp.spawn(run, nprocs=4, args=(cfg,))
  File "/usr/lib/python3/site-packages/torch/multiprocessing/spawn.py", line 160, in join
    raise ProcessRaisedException(msg, error_index, failed_process.pid)
torch.multiprocessing.spawn.ProcessRaisedException:

-- Process 2 terminated with the following error:
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/torch/multiprocessing/spawn.py", line 69, in _wrap
    fn(i, *args)
  File "/work/train.py", line 140, in run
    batch = next(it)
KeyError: 'pixel_values'
"""


def test_mp_spawn_names_the_rank_of_the_traceback_below_it():
    ff = first_failure_of(SPAWN)
    assert ff["rank"] == 2 and ff["category"] == "user-code"
    assert "KeyError" in ff["evidence"][0]["text"]


# torch before 1.4: spawn.py's join raised a plain Exception; here the paste stops inside the child's traceback
SPAWN_CUT = """Traceback (most recent call last):
  File "train.py", line 62, in main
    trainer.fit(model)
  File "/env/lib/python3.7/site-packages/torch/multiprocessing/spawn.py", line 118, in join
    raise Exception(msg)
Exception:
-- Process 1 terminated with the following error:
Traceback (most recent call last):
  File "/env/lib/python3.7/site-packages/torch/multiprocessing/spawn.py", line 19, in _wrap
    fn(i, *args)
  File "/env/lib/python3.7/site-packages/pytorch_lightning/trainer/ddp_mixin.py", line 181, in ddp_train
    self.run_pretrain_routine(model)
  File "/env/lib/python3.7/site-packages/pytorch_lightning/trainer/trainer.py", line 415, in run_pretrain_routine
    self.configure_checkpoint_callback()
"""


def test_the_parents_report_yields_to_the_childs_own_traceback_even_cut():
    """mp.spawn's parent raises where it reports a child's failure; the child's traceback below is the
    failure, of the rank the banner names, though the paste lost its exception line."""
    ff = first_failure_of(SPAWN_CUT)
    assert (ff["rank"], ff["signature"], ff["confidence"]) == (1, "python.traceback", "low")
    assert ff["category"] == "framework"  # cut inside Lightning's own code


def test_the_parents_report_alone_is_still_the_failure():
    ff = first_failure_of(SPAWN_CUT.split("-- Process")[0])
    assert (ff["rank"], ff["signature"], ff["category"]) == (None, "python.exception", "unknown")


def test_a_launcher_line_names_only_the_next_traceback():
    text = SPAWN + "\nTraceback (most recent call last):\n  File \"/work/other.py\", line 3, in f\n    g()\nValueError: later\n"
    rep = analyze(Case("t", ["-"], {}, stdin=text.encode()))
    later = [g for g in rep["distinct_failures"] if "later" in g["text"]]
    assert later and later[0]["ranks"] == []


def test_the_same_failure_said_without_a_rank_first_is_the_ranked_ones():
    text = ("The job dies with: RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered\n")
    ff = first_failure_of(text)
    assert ff["rank"] == 3 and ff["signature"] == "cuda.illegal_memory_access"


def test_an_unknown_category_is_never_high_confidence():
    ff = first_failure_of("[rank9]: RuntimeError: CUDA error: unspecified launch failure\n")
    assert ff["rank"] == 9 and ff["category"] == "unknown" and ff["confidence"] != "high"


def test_the_report_says_where_the_rank_came_from():
    assert first_failure_of("[rank4]: ValueError: bad shape\n")["rank_from"] == "line prefix"
    assert first_failure_of(SPAWN)["rank_from"] == "launcher line above the traceback"


def test_a_line_of_an_exception_message_names_the_rank_above_it():
    text = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
            "This error indicates that your module has parameters that were not used in producing loss.\n"
            "Parameter indices which did not receive grad for rank 5: 40 41\n")
    ff = first_failure_of(text)
    assert ff["signature"] == "torch.ddp_unused_parameters" and ff["rank"] == 5 and ff["phase"] == "forward"


def test_a_heading_is_a_persons_words_and_the_logs_own_line_goes_first():
    """A Markdown heading naming the error (an issue's title) is weaker than the log: the rank's own
    (cut) traceback is the failure, and takes its category from the heading's words."""
    text = ("# RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one\n"
            "[rank0]: Traceback (most recent call last):\n"
            '[rank0]:   File "/w/tools/train.py", line 104, in <module>\n'
            "[rank0]:     main()\n")
    ff = first_failure_of(text)
    assert ff["rank"] == 0 and ff["signature"] == "python.traceback" and ff["category"] == "user-code"


def test_a_failure_without_a_rank_is_the_only_failed_workers():
    """An old torch prints no rank prefix; torchrun's agent line names the one worker that exited 1."""
    text = ("Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n    engine = init()\n"
            "AssertionError: Check batch related parameters. train_batch_size is not equal to "
            "micro_batch_per_gpu * gradient_acc_step * world_size 256 != 4 * 8 * 1\n"
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 9180) of binary: /usr/bin/python3\n")
    ff = first_failure_of(text)
    assert ff["rank"] == 0 and ff["rank_from"] == "launcher summary (the only rank that failed)"
    assert ff["confidence"] != "high"


def test_two_failed_workers_name_no_rank():
    text = ("ValueError: bad\n"
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 9180) of binary: /usr/bin/python3\n"
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 1 (pid: 9181) of binary: /usr/bin/python3\n")
    assert first_failure_of(text)["rank"] is None
