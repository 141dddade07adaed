"""The phase of a failure whose own line carries no frames, taken from frames told elsewhere in
the same paste (failure_phase.phase_of): its own rank's traceback cut above the exception line,
then the other ranks' errors of the same moment (the ranks of a job run the same step). The
texts are written from the frame names of transformers/accelerate and Megatron-Core and
PyTorch's exception formats; paths and values are made up."""

from __future__ import annotations

from tests.offline.scoring import Case, analyze

# HF Trainer's step on rank 2, its traceback printed on the line of tqdm's bar: the paste cut it
# after accelerate's backward, and the out-of-memory line came after a blank line, without the
# rank prefix.
OOM_BELOW_CUT_TRACEBACK = """\
  0%|          | 0/247 [00:00<?, ?it/s][rank2]: Traceback (most recent call last):
[rank2]:   File "/work/sft.py", line 61, in <module>
[rank2]:     trainer.train()
[rank2]:   File "/opt/env/lib/python3.11/site-packages/transformers/trainer.py", line 2245, in train
[rank2]:     return inner_training_loop(
[rank2]:   File "/opt/env/lib/python3.11/site-packages/transformers/trainer.py", line 2560, in _inner_training_loop
[rank2]:     tr_loss_step = self.training_step(model, inputs, num_items_in_batch)
[rank2]:   File "/opt/env/lib/python3.11/site-packages/transformers/trainer.py", line 3782, in training_step
[rank2]:     self.accelerator.backward(loss, **kwargs)
[rank2]:   File "/opt/env/lib/python3.11/site-packages/accelerate/accelerator.py", line 2454, in backward
[rank2]:     loss.backward(**kwargs)
[rank2]:

torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 23.50 GiB of which 80.00 MiB is free.
"""

# Megatron-Core's distributed checkpoint save: rank 2's line is its exception alone, rank 1's
# traceback (cut before its own exception line) shows where the ranks were.
BARE_EXCEPTION_DURING_SAVE = """\
[rank2]:     raise EOFError
[rank2]: EOFError
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/pretrain.py", line 29, in <module>
[rank1]:     pretrain(cfg, forward_step)
[rank1]:   File "/work/megatron/training/training.py", line 410, in pretrain
[rank1]:     save_checkpoint(iteration, model, optimizer, opt_param_scheduler)
[rank1]:   File "/work/megatron/core/dist_checkpointing/serialization.py", line 425, in save
[rank1]:     sharded_strategy.save(sharded_state_dict, checkpoint_dir)
"""

BARE_EXCEPTION_ALONE = """\
[rank2]:     raise EOFError
[rank2]: EOFError
"""


def _first(name: str, text: str) -> dict:
    ff = analyze(Case(name, ["-"], {}, stdin=text.encode()))["first_failure"]
    assert ff is not None, name
    return ff


def test_an_exception_line_below_its_rank_s_cut_traceback_takes_that_traceback_s_phase():
    ff = _first("oom-below-cut", OOM_BELOW_CUT_TRACEBACK)
    assert (ff["rank"], ff["category"], ff["phase"]) == (2, "gpu-memory", "backward")
    # the cut traceback is printed right under the line its header shares with the bar: judge.told_above
    # reads it as that error's own, so the frames are the failure's
    assert ff["phase_from"] == "frames" and "its traceback follows it" in ff["evidence"][0]["linked_by"]
    # printed further away, among other ranks' lines, it is the rank's traceback told elsewhere
    apart = OOM_BELOW_CUT_TRACEBACK.replace("[rank2]:   File \"/work/sft.py\"",
                                            "[rank0]: step 3\n[rank1]: step 3\n[rank0]: step 4\n"
                                            "[rank2]:   File \"/work/sft.py\"", 1)
    ff = _first("oom-below-cut-apart", apart)
    assert (ff["rank"], ff["category"], ff["phase"]) == (2, "gpu-memory", "backward")
    assert "cut above the exception line" in ff["phase_from"]


def test_a_rank_without_frames_takes_the_phase_of_the_other_ranks_errors():
    ff = _first("eof-during-save", BARE_EXCEPTION_DURING_SAVE)
    assert (ff["rank"], ff["phase"]) == (2, "checkpoint-save")
    assert "other ranks' errors" in ff["phase_from"]


def test_no_frames_anywhere_leave_the_phase_unknown():
    ff = _first("eof-alone", BARE_EXCEPTION_ALONE)
    assert (ff["rank"], ff["phase"]) == (2, "unknown")


# TRL's create_reference_model refusing ZeRO-3 (trl/models/modeling_base.py) on rank 0, its traceback pasted from
# its last frame; rank 7's traceback of the same moment, cut, runs through the trainer's constructor.
REFUSED_IN_A_CONSTRUCTOR = """\
[rank0]:     self.ref_model = create_reference_model(model)
[rank0]:   File "/env/lib/python3.10/site-packages/trl/models/modeling_base.py", line 624, in create_reference_model
[rank0]:     raise ValueError(
[rank0]: ValueError: DeepSpeed ZeRO-3 is enabled and is not compatible with `create_reference_model()`.
[rank7]: Traceback (most recent call last):
[rank7]:   File "/w/rlhf.py", line 207, in main
[rank7]:     trainer = trainer_cls(model, ref_model, args)
[rank7]:   File "/w/trainers/dpo_trainer.py", line 26, in __init__
[rank7]:     super().__init__(*args, **kwargs)
"""


def test_a_rank_whose_frames_say_nothing_takes_set_up_from_another_rank_s_constructor():
    ff = _first("refused-in-constructor", REFUSED_IN_A_CONSTRUCTOR)
    assert (ff["rank"], ff["phase"]) == (0, "init")
    assert "other ranks' errors" in ff["phase_from"]
    stepping = REFUSED_IN_A_CONSTRUCTOR.replace("trainer = trainer_cls(model, ref_model, args)", "trainer.train()") \
        .replace('dpo_trainer.py", line 26, in __init__', 'dpo_trainer.py", line 26, in fit')
    assert _first("refused-in-fit", stepping)["phase"] != "init"
