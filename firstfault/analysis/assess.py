"""Assess: what the decided failure leaves behind: the checkpoint to resume from, and memory by
lifecycle phase. Pure.

The checkpoint rules (checkpoint.py) read each rank's saves, progress and exits (rankstate.py)
and the failure's time; a save that had started and that training had not left when the job
failed (``saving``) is a phase source (failure_phase.py). The memory report (memory.py) reads
what its watcher kept of the events and the failure's time; its ``phase_at_failure`` (the phase
DeepSpeed's marks open around the failure) is a phase source too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from firstfault.analysis.checkpoint import DiskCheckpoint, checkpoint_report
from firstfault.analysis.memory import MemoryWatcher, memory_report
from firstfault.analysis.rankstate import RankState, saving_since
from firstfault.analysis.verdict import Decision


@dataclass(frozen=True, slots=True)
class Assessment:
    """The assess stage's output."""

    checkpoint: dict  # the report's ``checkpoint`` object (REPORT.md)
    saved: frozenset[str]  # checkpoint tags found whole
    saving: int | None  # start of a checkpoint save training had not left, or None
    memory: dict  # the report's ``memory`` object (REPORT.md)


def assess(dec: Decision, state: RankState, mem: MemoryWatcher, *, pids: Mapping[int, int],
           rank_nodes: Mapping[int, str | None], disk: DiskCheckpoint | None) -> Assessment:
    """The checkpoint's safety and memory by phase, around the decided failure."""
    activity = state.activity
    clean = {r for r, ex in activity.exits.items() if ex.get("code") == 0}
    ckpt = checkpoint_report(
        activity.saves, failure_at_ns=dec.failure_ns, world_size=dec.world, ranks_progress=activity.alive,
        clean_exit_ranks=clean, disk=disk, ranks_in_save=activity.in_save,
        ranks_steps={r: max(activity.steps.get(r, 0), activity.reached.get(r, 0)) for r in {*activity.steps, *activity.reached}})
    saved = frozenset(t["tag"] for t in ckpt["tags"] if t["verdict"] == "safe")
    memory = memory_report(mem, pids=pids, rank_nodes=rank_nodes,
                           failed=dec.named is not None or dec.inference is not None, failure_ns=dec.failure_ns,
                           failure_unc_ns=dec.first.ev.uncertainty_ns if dec.first else 0,
                           local_is_global=len({n for n in rank_nodes.values() if n}) <= 1, saved=saved)
    saving = saving_since(activity.saves, activity.alive, set(saved))
    return Assessment(ckpt, saved, None if saving is not None and _left_save(memory, saving) else saving, memory)


def _left_save(memory: dict, saving_ns: int) -> bool:
    """Whether DeepSpeed's phase marks (memory.phases: ``Engine before forward``...) show training
    in another phase after the save that began at ``saving_ns``: rank 0 prints them, and the ranks
    train in lockstep, so the save was over for the job."""
    return any(b["phase"] != "checkpoint-save" and b["start_ms"] * 1_000_000 > saving_ns for b in memory["phases"])
