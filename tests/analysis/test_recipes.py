"""torchtune's set-up lines (signatures/63-recipes.toml, phases.toml's marker): a failure after them
and before any training progress is in set-up (init). Lines from the recipes' log.info format
strings; the traceback's paths are made up."""

from __future__ import annotations

from tests.offline.scoring import first_failure_of

SETUP = """\
INFO:torchtune.utils._logging:Instantiating model and loading checkpoint took 3.21 secs
INFO:torchtune.utils._logging:Optimizer is initialized.
INFO:torchtune.utils._logging:Loss is initialized.
"""

CUT = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/recipes/lora_finetune_distributed.py", line 1041, in <module>
[rank1]:     sys.exit(recipe_main())
"""

# the recipes' training loop: tqdm with the desc f"{curr_epoch + 1}|{self.global_step}|Loss: {loss}"
PROGRESS = "1|5|Loss: 1.2345: 5%|▌         | 5/100 [00:10<03:10,  2.00s/it]\n"




def test_a_failure_after_torchtune_set_up_lines_is_in_init():
    ff = first_failure_of(SETUP + CUT)
    assert ff["rank"] == 1
    assert ff["phase"] == "init" and ff["phase_from"].startswith("set-up lines")


def test_a_failure_after_training_progress_is_not_in_init():
    ff = first_failure_of(SETUP + PROGRESS + CUT)
    assert ff["phase"] != "init"
