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

Call site (report.py, the ``_inferred`` branch), given the lines the findings kept before the
earliest cascade of the same stream (report._before(casc[0], findings))::

    marked = phase_while_waiting(before)  # between ``waited`` and ``said``
    phase = (... else waited or marked or said or ("unknown", "no evidence"))
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
    phase = phase_before_failure(lines, phase_rules)
    if phase is None:
        return None
    return phase, WHY.get(phase, "marker lines before the ranks waited")
