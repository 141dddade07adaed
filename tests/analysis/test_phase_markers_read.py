"""phases.toml's [[marker]] rules read the text before a failure, and a line reaches them only as
a finding: every marker needle must be read by a signature of the catalog, or the marker never
fires (a kill while loading a model named no phase because its set-up line was never read)."""

from firstfault.analysis.catalog import shipped
from firstfault.analysis.phase import rules
from tests.offline.scoring import first_failure_of

# NCCL's INFO lines come by the thousand with NCCL_DEBUG=INFO; the set-up ones the marker's pattern
# keeps are read by 40-nccl's nccl.comm_setup needles ("- Init START", "] [send] via NET/")
NOT_READ = {"NCCL INFO"}


def _read(needle: str, words: set[str]) -> bool:
    """A line holding ``needle`` holds a read needle: one inside it, or one that extends it where the
    framework always prints the longer form (tqdm's "Loading checkpoint shards:")."""
    return any(w in needle or needle in w for w in words)


def test_every_marker_needle_is_read_by_the_catalog():
    words = {n for s in shipped().signatures for n in s.needles}
    unread = [n for m in rules().markers for n in m.needles if n not in NOT_READ and not _read(n, words)]
    assert unread == []


LOAD_THEN_KILL = """\
[INFO|modeling_utils.py:3034] 2026-01-06 12:08:42,985 >> loading weights file /models/m/model.safetensors.index.json
[2026-01-06 12:09:53,592] [INFO] [launch.py:318:sigkill_handler] Killing subprocess 4211
"""

TRAIN_THEN_KILL = LOAD_THEN_KILL.replace(
    "[2026-01-06 12:09:53", " 12%|#         | 120/1000 [01:02<07:36,  1.93it/s]\n[2026-01-06 12:09:53")

EVAL_THEN_RELOAD_THEN_KILL = (
    LOAD_THEN_KILL.splitlines()[0] + "\n"
    + "{'loss': 1.2345, 'grad_norm': 0.91, 'learning_rate': 1.9e-05, 'epoch': 0.12}\n"
    + LOAD_THEN_KILL)


def test_a_kill_after_a_set_up_line_is_in_init():
    got = first_failure_of(LOAD_THEN_KILL)
    assert got["phase"] == "init" and "set-up" in got["phase_from"]


def test_a_progress_bar_after_set_up_means_training_had_started():
    assert first_failure_of(TRAIN_THEN_KILL)["phase"] != "init"


def test_the_latest_set_up_line_counts_a_second_load_after_training_is_init_again():
    got = first_failure_of(EVAL_THEN_RELOAD_THEN_KILL)
    assert got["phase"] == "init"


# verl's checkpoint manager, each rank's shard lines (fsdp_checkpoint_manager.py save_checkpoint), behind Ray's
# prefix; the driver's bar of the steps done before that save, printed after them; a worker's death
VERL_SAVE_THEN_DEATH = """\
(WorkerDict pid=1435285) [rank-1]: Saving model to /ckpt/global_step_60/actor/model_world_size_4_rank_1.pt
(WorkerDict pid=1435285) [rank-1]: Saving optim to /ckpt/global_step_60/actor/optim_world_size_4_rank_1.pt
Training Progress:  98%|#########8| {done}/60 [10:03:47<10:14, 614.03s/it]
(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot the \
problem, check the logs for the dead worker. RayTask ID: ffd0 Worker ID: 21a1 Node ID: 90bf Worker IP address: \
10.0.0.5 Worker port: 10003 Worker PID: 24215 Worker exit type: SYSTEM_ERROR Worker exit detail: Worker \
unexpectedly exits with a connection error code 2. End of file.
"""


def test_verl_s_shard_save_lines_are_read_and_a_bar_before_the_save_is_no_progress_past_it():
    """Each rank's "Saving model to" line begins its part of the save (read by checkpoint.save_said); the
    driver's bar counting 59 of 60 steps done was drawn before the save of step 60 began."""
    ff = first_failure_of(VERL_SAVE_THEN_DEATH.replace("{done}", "59"))
    assert (ff["signature"], ff["phase"]) == ("ray.worker_died", "checkpoint-save")


def test_a_bar_past_the_save_s_step_ends_it():
    ff = first_failure_of(VERL_SAVE_THEN_DEATH.replace("{done}", "61").replace("/60 [", "/80 ["))
    assert (ff["signature"], ff["phase"]) == ("ray.worker_died", "unknown")
