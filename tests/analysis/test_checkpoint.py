"""collector.analysis.checkpoint: the resume verdict from log marks and disk facts (pure)."""

from __future__ import annotations

import pytest

from firstfault.analysis.checkpoint import (
    DiskCheckpoint,
    DiskFile,
    DiskTag,
    SaveMark,
    checkpoint_from_disk,
    checkpoint_report,
)

S = 1_000_000_000  # ns per second
STEP5, STEP10 = "global_step5", "global_step10"


def saves(*tags_at):
    """What 0.19.8 logs on rank 0 for each save: the start line, then the model file."""
    marks = []
    for tag, at in tags_at:
        marks.append(SaveMark(0, tag, "start", at))
        marks.append(SaveMark(0, tag, "file", at + 1, f"/ckpt/{tag}/mp_rank_00_model_states.pt"))
    return marks


def disk_tag(tag, problems=(), ranks=2):
    step = int(tag.removeprefix("global_step")) if tag.startswith("global_step") else None
    files = [DiskFile(f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt", r, "optim", "ok") for r in range(ranks)]
    return DiskTag(tag, step, files, not problems, list(problems), ranks, mtime_ns=step)


def disk(*tags, latest=None, latest_problem=None, world_size=2, world_size_from="given"):
    return DiskCheckpoint("/ckpt", latest, latest_problem, list(tags), world_size, world_size_from, "1/2")


def report(marks, *, failure=None, world=2, progress=None, clean=(), on_disk=None, steps=None, in_save=None):
    return checkpoint_report(
        marks, failure_at_ns=failure, world_size=world, ranks_progress=progress or {},
        clean_exit_ranks=set(clean), disk=on_disk, ranks_steps=steps, ranks_in_save=in_save,
    )


def test_a_rank_still_inside_the_save_when_the_job_failed_makes_it_unsafe():
    # Both ranks stepped after the save of step 5; when the job failed during the save of step 10,
    # rank 0's stack was in it (waiting in its closing barrier for a rank that never came).
    marks = saves((STEP5, 100 * S), (STEP10, 200 * S)) + [SaveMark(0, STEP10, "done", 210 * S)]
    got = report(marks, failure=220 * S, progress={0: 150 * S, 1: 150 * S}, in_save={0: 215 * S})
    assert (got["verdict"], got["default_tag"], got["resume_from"]) == ("unsafe", STEP10, STEP5)
    assert got["reason"] == (
        "global_step10 is not safe to resume from: rank 0 was still inside the save of global_step10 "
        "when the job failed; resume from global_step5 instead."
    )
    assert [(t["tag"], t["complete"], t["verdict"]) for t in got["tags"]] == [
        (STEP10, False, "unsafe"), (STEP5, True, "safe")
    ]


def test_silence_after_a_save_is_no_proof_it_did_not_finish():
    """A rank that logged nothing after the save may have finished it and failed in the next step
    before logging anything (tests/data/real/deepspeed-exception-rank2-of-4): unknown, not unsafe."""
    marks = saves((STEP5, 100 * S), (STEP10, 200 * S)) + [SaveMark(0, STEP10, "done", 210 * S)]
    got = report(marks, failure=220 * S, progress={0: 150 * S, 1: 150 * S})
    assert (got["verdict"], got["resume_from"]) == ("unknown", STEP5)
    assert "do not show whether the save of global_step10 finished on rank 1" in got["reason"]


def test_a_step_after_the_tags_step_shows_the_save_returned():
    got = report(saves((STEP10, 200 * S)), failure=400 * S, steps={0: 11, 1: 12})
    assert (got["verdict"], got["resume_from"]) == ("safe", STEP10)
    assert report(saves((STEP10, 200 * S)), failure=400 * S, steps={0: 10, 1: 12})["verdict"] == "unknown"


def test_one_rank_past_the_torch_engines_closing_barrier_proves_every_rank_wrote():
    """DeepSpeed's save_checkpoint ends in dist.barrier() after every rank's writes (Torch engine):
    one rank that went on shows them all done; not so for an asynchronous engine."""
    torch_marks = [SaveMark(0, STEP10, "start", 200 * S, engine="Torch")]
    got = report(torch_marks, failure=400 * S, world=8, progress={3: 300 * S})
    assert (got["verdict"], got["resume_from"]) == ("safe", STEP10)
    assert "closing barrier" in got["reason"]
    nebula = [SaveMark(0, STEP10, "start", 200 * S, engine="Nebula")]
    assert report(nebula, failure=400 * S, world=8, progress={3: 300 * S})["verdict"] == "unknown"
    assert report(torch_marks, failure=400 * S, world=8, progress={3: 150 * S})["verdict"] == "unknown"


def test_latest_ahead_of_an_unfinished_save_on_disk():
    marks = saves((STEP5, 100 * S), (STEP10, 200 * S))
    missing = "rank 1 optimizer shard missing (zero_pp_rank_1_mp_rank_00_optim_states.pt)"
    on_disk = disk(disk_tag(STEP5), disk_tag(STEP10, [missing], ranks=1), latest=STEP10)
    got = report(marks, failure=220 * S, progress={0: 150 * S, 1: 150 * S}, on_disk=on_disk)
    assert (got["verdict"], got["default_tag"], got["resume_from"], got["latest"]) == ("unsafe", STEP10, STEP5, STEP10)
    assert missing in got["reason"]
    assert got["tags"][0] == {"tag": STEP10, "step": 10, "complete": False, "verdict": "unsafe",
                              "problems": [missing], "evidence": "logs+disk"}


def test_save_finished_everywhere_before_the_failure_is_safe():
    got = report(saves((STEP5, 100 * S), (STEP10, 200 * S)), failure=400 * S, progress={0: 300 * S, 1: 300 * S})
    assert (got["verdict"], got["resume_from"]) == ("safe", STEP10)
    assert got["reason"] == (
        "In the logs the save of global_step10 finished on all 2 ranks before any failure; "
        "no checkpoint directory was inspected."
    )


def test_clean_exit_and_done_marks_count_as_finished():
    marks = saves((STEP10, 200 * S)) + [SaveMark(1, STEP10, "done", 205 * S)]
    assert report(marks, progress={0: 100 * S}, clean={0})["verdict"] == "safe"


def test_a_done_mark_after_the_failure_does_not_count():
    marks = saves((STEP10, 200 * S)) + [SaveMark(1, STEP10, "done", 300 * S)]
    got = report(marks, failure=250 * S, progress={0: 260 * S, 1: 100 * S})
    assert got["verdict"] == "unknown"
    assert "do not show whether the save of global_step10 finished on rank 1" in got["reason"]
    assert report(marks, failure=350 * S, progress={0: 260 * S, 1: 100 * S})["verdict"] == "safe"


@pytest.mark.parametrize(
    "progress,world",
    [({0: 300 * S, 1: None}, 2), ({0: 300 * S}, 2), ({0: 300 * S, 1: 300 * S}, None)],
    ids=["progress-unknown", "rank-absent", "world-unknown"],
)
def test_saves_seen_only_on_rank_0_without_disk_are_unknown(progress, world):
    # Rank 0 stepped after its save; nothing says whether rank 1 finished its shard.
    got = report(saves((STEP10, 200 * S)), failure=400 * S, world=world, progress=progress)
    assert (got["verdict"], got["resume_from"]) == ("unknown", None)
    assert got["reason"].startswith("Whether global_step10 is safe is unknown")
    assert got["tags"][0]["complete"] is None


def test_failure_after_a_save_no_rank_showed_finishing_is_unknown():
    got = report(saves((STEP10, 200 * S)), failure=250 * S, progress={0: 100 * S, 1: 100 * S})
    assert got["verdict"] == "unknown"
    assert "do not show whether the save of global_step10 finished on ranks 0, 1" in got["reason"]


def test_no_failure_and_no_progress_after_the_save_is_unknown_not_unsafe():
    got = report(saves((STEP10, 200 * S)), progress={0: 100 * S, 1: 100 * S})
    assert got["verdict"] == "unknown"


def test_no_evidence_at_all():
    got = report([], world=None)
    assert got == {"verdict": "unknown", "resume_from": None, "default_tag": None, "latest": None,
                   "disk_path": None, "tags": [],
                   "reason": "No checkpoint save was seen in the logs and no checkpoint directory was inspected."}


def test_disk_damage_overrides_logs():
    truncated = "rank 1 optimizer shard truncated (zero_pp_rank_1_mp_rank_00_optim_states.pt)"
    on_disk = disk(disk_tag(STEP5), disk_tag(STEP10, [truncated]), latest=STEP10)
    got = report(saves((STEP5, 100 * S), (STEP10, 200 * S)), failure=400 * S,
                 progress={0: 300 * S, 1: 300 * S}, on_disk=on_disk)
    assert (got["verdict"], got["resume_from"]) == ("unsafe", STEP5)
    assert got["reason"] == (
        "global_step10 is not safe to resume from: " + truncated + "; resume from global_step5 instead."
    )


def test_whole_files_on_disk_decide_when_the_logs_cannot():
    on_disk = disk(disk_tag(STEP10), latest=STEP10)
    got = report(saves((STEP10, 200 * S)), failure=400 * S, progress={0: 300 * S, 1: None}, on_disk=on_disk)
    assert got["verdict"] == "safe"
    assert got["reason"] == (
        "global_step10 has whole files for all 2 ranks on disk, although the logs do not show whether "
        "the save of global_step10 finished on rank 1."
    )


def test_latest_alone_is_not_proof():
    # `latest` names step 10 but the directory has no such tag and the logs saw its save start only.
    on_disk = disk(disk_tag(STEP5), latest=STEP10, latest_problem="`latest` names global_step10, which is not in /ckpt")
    got = report(saves((STEP10, 200 * S)), failure=250 * S, progress={0: 100 * S, 1: 100 * S}, on_disk=on_disk)
    assert (got["verdict"], got["default_tag"], got["resume_from"]) == ("unsafe", STEP10, STEP5)
    assert got["tags"][0]["problems"] == ["not in /ckpt"]


def test_latest_naming_a_tag_nowhere_seen():
    on_disk = disk(disk_tag(STEP5), latest=STEP10, latest_problem="…")
    got = checkpoint_from_disk(on_disk)
    assert got["reason"] == "`latest` names global_step10, which is not in /ckpt; resume from global_step5 instead."
    assert got["verdict"] == "unsafe"


def test_empty_latest_picks_the_newest_and_says_so():
    on_disk = disk(disk_tag(STEP5), disk_tag(STEP10), latest_problem="`latest` is empty")
    got = checkpoint_from_disk(on_disk)
    assert (got["verdict"], got["default_tag"], got["resume_from"]) == ("safe", STEP10, STEP10)
    assert got["reason"] == "global_step10 has whole files for all 2 ranks on disk (`latest` is empty)."


def test_inferred_world_size_smaller_than_the_logs_one_is_a_problem():
    on_disk = disk(disk_tag(STEP10), latest=STEP10, world_size_from="inferred")
    got = report([], world=4, on_disk=on_disk)
    assert got["verdict"] == "unsafe"
    assert got["tags"][0]["problems"] == ["no files for ranks 2, 3 (world size 4 in the logs)"]


def test_disk_only_and_tag_order():
    on_disk = disk(disk_tag("b"), disk_tag("a"), latest="a")
    on_disk.tags[0].mtime_ns, on_disk.tags[1].mtime_ns = 2, 1
    got = checkpoint_from_disk(on_disk)
    assert [t["tag"] for t in got["tags"]] == ["b", "a"]  # newest first
    assert (got["default_tag"], got["resume_from"]) == ("a", "b")


def test_disk_without_tags():
    got = checkpoint_from_disk(disk())
    assert got["verdict"] == "unknown"
    assert got["reason"] == "No checkpoint save was seen in the logs and /ckpt holds no checkpoint tag."


def test_save_mark_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="start"):
        SaveMark(0, STEP10, "finished")
