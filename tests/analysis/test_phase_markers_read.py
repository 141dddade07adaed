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
