"""The phase a job was in when its ranks started waiting (a hang): a checkpoint save that
began and never ended, a load, or set-up. Pure.

The hang inference (report._inferred) names a phase from a stack dump, from DeepSpeed's
timed save marks (facts.saving_since: marks with a time of their own), from the collective
the survivors waited in, or from the survivors' signatures. A pasted console has none of
those times: there the order of the lines is what is known. The set-up and checkpoint
markers of phases.toml ([[marker]]) read that order: a save's start line ("Saving model
checkpoint to ...", "saving checkpoint at iteration ...", DeepSpeed's "is about to be
saved!") names checkpoint-save until its end line ("successfully saved checkpoint ...",
"Finished saving the checkpoint") or training progress lets it go.

Only a save or load whose framework prints its end (markers with ``ends_in_log``: Megatron,
torchtitan, torchtune, accelerate, DeepSpeed's loads) counts here. DeepSpeed 0.17.1 and later
and the HF Trainer print nothing when a save ends, and a hang in the step after it (as the real
run tests/data/real/torchrun-hang-rank1-of-2 shows: a data loader blocked in step 3 after a
finished save at step 2) reads exactly like a hang in the save.

Read by failure_phase.hang_phase over the lines the findings kept before the earliest cascade
of its stream (failure_phase.before), after the collective the survivors waited in and before
the one phase their errors belong to.
"""

from __future__ import annotations

from collections.abc import Iterable

from firstfault.analysis.phase import PhaseRules, phase_before_failure

WHY = {
    "checkpoint-save": "a checkpoint save began before the ranks waited, and neither its end nor progress followed",
    "checkpoint-load": "a checkpoint load began before the ranks waited, and neither its end nor progress followed",
    "init": "set-up lines before the ranks waited, with no training progress after them",
}


def phase_while_waiting(lines: Iterable[str], phase_rules: PhaseRules | None = None) -> tuple[str, str] | None:
    """(the phase, where it came from) that the marker lines printed before the ranks started
    waiting name (``lines``: the text before the first cascade, oldest first), or None when no
    marker is open at that point (none seen, or progress or a save's end came after it)."""
    phase = phase_before_failure(lines, phase_rules, ended_only=True)
    if phase is None:
        return None
    return phase, WHY.get(phase, "marker lines before the ranks waited")
