"""Is the last checkpoint safe to resume from? The report's ``checkpoint`` object.

Pure: combines what the logs say about each save (SaveMark) with what
firstfault/offline/checkpoint_files.py found on disk (DiskCheckpoint); no I/O.

Log lines seen (DeepSpeed 0.19.8, rank 0 only, no completion line at INFO)::

    [Rank 0] [Torch] Checkpoint global_step10 is about to be saved!        -> what="start"
    [Rank 0] Saving model checkpoint: <dir>/global_step10/mp_rank_00_model_states.pt  -> what="file"

Rules:

- A save of tag T starts at t, the earliest time of its start/file marks.
- It finished on rank r when r logged a "done" mark for T (at or before
  ``failure_at_ns``), or reached a later step than T's (``global_stepN``: the save is
  called after step N; a progress line of step M > N, or an error whose frames are in
  a training step after r's step-N line in r's own log), or showed life outside a save
  after t whenever it showed it (an error or a stack dump whose frames are not in a
  save, by the lower bound of its time: a line placed by its neighbours in a console
  where ranks interleave proves nothing within its uncertainty), or exited cleanly (a
  rank exits after its saves return). It is complete in the logs when it finished on
  every rank of the world size, or when one rank went on past it and the save was
  DeepSpeed's synchronous Torch engine's: ``save_checkpoint`` ends in a
  ``dist.barrier()`` after every rank's writes (DeepSpeed 0.9.0 to 0.19.8), so one
  rank past it shows every rank wrote its files. Not for the asynchronous (Nebula,
  decoupled) engines, whose writes go on after it.
- It did not finish in the logs when the job failed while a rank was still inside
  it (the stack of its error or its dump in the save, after t and before the next
  save began) and no rank went on past it. A rank that logged nothing after t may
  have finished the save all the same (the job may have failed in the next step
  before any progress line): that is unknown, never "did not finish". Anything else
  (a rank's progress unknown, no failure time, no world size) is unknown: saves
  seen only on rank 0 prove nothing about the other ranks. The world size is
  the one given (from the logs), else the disk's; never guessed from which ranks
  logged, since the logs of rank 0 alone would make a world of one.
- ``latest`` alone is never proof: rank 0 writes it without waiting for the others.
- The disk decides where it was inspected: any problem (missing, truncated, corrupt,
  unreadable file) makes a tag unsafe whatever the logs say; whole files for every
  rank make it safe even when the logs cannot show the save finishing; a tag the
  logs saw but the directory lacks cannot be resumed. Known issue: a tag name
  reused by a later save (not global_stepN) can leave whole but stale shards.
- The default pick is what ``latest`` names, else the newest tag (by step for
  global_stepN tags, else by time). ``verdict`` is that tag's: safe | unsafe |
  unknown; ``resume_from`` the newest tag that is safe; ``reason`` one sentence.

Besides REPORT.md's fields the object carries ``default_tag`` (the pick),
``latest``, ``disk_path``, and per tag (newest first) ``step``, ``verdict``,
``evidence`` (logs | disk | logs+disk); a tag's ``complete`` is null when unknown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

WHATS = ("start", "file", "done")
STEP_TAG = re.compile(r"global_step(\d+)")


# What firstfault/offline/checkpoint_files.py finds on disk.
@dataclass(frozen=True, slots=True)
class DiskFile:
    """One checkpoint file: ``status`` is ok | missing | empty | truncated |
    not-zip | not-torch | corrupt | unreadable; ``rank`` the data-parallel rank
    that writes it."""

    name: str
    rank: int | None
    kind: str  # model | optim | other
    status: str
    size_bytes: int | None = None
    mtime_ns: int | None = None
    detail: str = ""


@dataclass(slots=True)
class DiskTag:
    tag: str
    step: int | None
    files: list[DiskFile]
    complete: bool
    problems: list[str]
    world_size_seen: int  # highest data-parallel rank with a file in this tag + 1
    mtime_ns: int | None = None


@dataclass(slots=True)
class DiskCheckpoint:
    path: str
    latest: str | None  # what `latest` names; None when absent, empty or unreadable
    latest_problem: str | None
    tags: list[DiskTag]  # oldest first
    world_size: int | None = None
    world_size_from: str | None = None  # given | inferred | None (no shards at all)
    zero_stage: str = "unknown"  # "1/2" | "3" | "0" | "unknown", from the file names
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SaveMark:
    """One log line about saving checkpoint ``tag`` (``rank`` None when unknown)."""

    rank: int | None
    tag: str
    what: str  # start | file | done
    at_ns: int | None = None
    path: str | None = None
    engine: str | None = None  # the checkpoint engine the line names (Torch, Nebula), where it does

    def __post_init__(self) -> None:
        if self.what not in WHATS:
            raise ValueError(f"SaveMark.what must be one of {WHATS}, not {self.what!r}")


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _log_status(tag, start_ns, marks, world, progress, clean, failure_ns, steps=None,
                in_save=None, next_ns=None) -> tuple[str, str]:
    """(complete | incomplete | unknown, what the logs show) for one tag; ``next_ns``: when the
    next save started (a rank seen inside a save after it was in that one)."""

    def before_failure(at: int | None) -> bool:
        return at is not None and (failure_ns is None or at <= failure_ns)

    step = int(m[1]) if (m := STEP_TAG.fullmatch(tag)) else None
    steps = steps or {}
    done = {m.rank for m in marks if m.what == "done" and (m.at_ns is None or before_failure(m.at_ns))}
    engines = {m.engine for m in marks if m.engine}

    def went_on(rank: int) -> bool:  # the rank returned from the save (whenever it showed it)
        last = progress.get(rank)
        return (rank in clean or (step is not None and steps.get(rank, -1) > step)
                or (start_ns is not None and last is not None and last > start_ns))

    past = [r for r in sorted(set(progress) | set(steps) | set(clean)) if went_on(r)]
    if world is not None and all(r in done or went_on(r) for r in range(world)):
        return "complete", f"the save of {tag} finished on all {world} ranks"
    if past and engines == {"Torch"}:
        return "complete", (f"{_ranks(past[:3])} went on past the save of {tag}, whose closing barrier every rank "
                            "enters only after writing its files")
    stuck = sorted(r for r, at in (in_save or {}).items()
                   if start_ns is not None and at >= start_ns and (next_ns is None or at < next_ns))
    if stuck and failure_ns is not None and not past:
        return "incomplete", (f"{_ranks(stuck)} {'was' if len(stuck) == 1 else 'were'} still inside the save of "
                              f"{tag} when the job failed")
    if world is None:
        return "unknown", "the world size is unknown"
    unknown = [r for r in range(world) if r not in done and not went_on(r)]
    return "unknown", f"the logs do not show whether the save of {tag} finished on {_ranks(unknown)}"


def _disk_problems(dtag: DiskTag, disk: DiskCheckpoint, world_size: int | None) -> list[str]:
    problems = list(dtag.problems)
    if (
        world_size
        and disk.world_size_from == "inferred"
        and disk.zero_stage in ("1/2", "3")
        and dtag.world_size_seen < world_size
    ):
        missing = list(range(dtag.world_size_seen, world_size))
        problems.append(f"no files for {_ranks(missing)} (world size {world_size} in the logs)")
    return problems


def checkpoint_report(
    marks: Sequence[SaveMark],
    *,
    failure_at_ns: int | None,
    world_size: int | None,
    ranks_progress: Mapping[int, int | None],
    clean_exit_ranks: set[int],
    disk: DiskCheckpoint | None,
    ranks_steps: Mapping[int, int] | None = None,
    ranks_in_save: Mapping[int, int] | None = None,
) -> dict:
    """The report's ``checkpoint`` object from log marks and the disk (either may be empty).

    ``ranks_progress``: each rank's last sign of life outside a save (ns); ``ranks_steps``:
    the last training step each rank reached; ``ranks_in_save``: when each rank was last seen
    inside a save (its stack at an error or in a dump)."""
    by_tag: dict[str, list[SaveMark]] = {}
    for m in marks:
        by_tag.setdefault(m.tag, []).append(m)
    on_disk = {t.tag: t for t in disk.tags} if disk else {}
    world = world_size or (disk.world_size if disk else None)
    rows = []
    begun = {t: min((m.at_ns for m in ms if m.what != "done" and m.at_ns is not None), default=None)
             for t, ms in by_tag.items()}
    for tag in dict.fromkeys([*on_disk, *by_tag]):
        tmarks = by_tag.get(tag, [])
        start_ns = begun.get(tag)
        next_ns = min((b for b in begun.values() if b is not None and start_ns is not None and b > start_ns),
                      default=None)
        log, log_says = (
            _log_status(tag, start_ns, tmarks, world, ranks_progress, clean_exit_ranks, failure_at_ns, ranks_steps,
                        ranks_in_save, next_ns)
            if tmarks
            else (None, "")
        )
        dtag = on_disk.get(tag)
        if disk is not None and dtag is None:
            verdict, problems = "unsafe", [f"not in {disk.path}"]
        elif dtag is not None:
            problems = _disk_problems(dtag, disk, world_size)
            verdict = "unsafe" if problems else "safe"
        else:
            problems = [log_says] if log == "incomplete" else []
            verdict = {"complete": "safe", "incomplete": "unsafe"}.get(log, "unknown")
        step = int(m[1]) if (m := STEP_TAG.fullmatch(tag)) else None
        when = start_ns if start_ns is not None else (dtag.mtime_ns if dtag else None)
        rows.append(
            dict(tag=tag, step=step, when=when, verdict=verdict, problems=problems, log=log, log_says=log_says,
                 evidence="+".join(e for e, has in (("logs", tmarks), ("disk", dtag)) if has))
        )
    if all(r["step"] is not None for r in rows):
        rows.sort(key=lambda r: r["step"])
    else:
        rows.sort(key=lambda r: r["when"] or 0)
    return _assemble(rows, disk, world)


def _assemble(rows: list[dict], disk: DiskCheckpoint | None, world: int | None) -> dict:
    latest = disk.latest if disk else None
    latest_note = f" ({disk.latest_problem})" if disk and disk.latest_problem and not latest else ""
    safe = [r["tag"] for r in rows if r["verdict"] == "safe"]
    resume_from = safe[-1] if safe else None
    tags = [
        {"tag": r["tag"], "step": r["step"], "complete": {"safe": True, "unsafe": False}.get(r["verdict"]),
         "verdict": r["verdict"], "problems": r["problems"], "evidence": r["evidence"]}
        for r in reversed(rows)
    ]
    base = {"latest": latest, "disk_path": disk.path if disk else None, "tags": tags}
    if not rows:
        where = f"{disk.path} holds no checkpoint tag" if disk else "no checkpoint directory was inspected"
        reason = f"No checkpoint save was seen in the logs and {where}."
        return {"verdict": "unknown", "resume_from": None, "reason": reason, "default_tag": None, **base}
    instead = f"resume from {resume_from} instead" if resume_from else "no earlier checkpoint is safe by the evidence"
    if latest and all(r["tag"] != latest for r in rows):
        reason = f"`latest` names {latest}, which is not in {disk.path}; {instead}."
        return {"verdict": "unsafe", "resume_from": resume_from, "reason": reason, "default_tag": latest, **base}
    pick = next((r for r in rows if r["tag"] == latest), rows[-1])
    tag, verdict = pick["tag"], pick["verdict"]
    if verdict == "unsafe":
        reason = f"{tag} is not safe to resume from{latest_note}: {pick['problems'][0]}; {instead}."
    elif verdict == "safe" and pick["evidence"] == "logs":
        # Logs alone (no disk): there is no `latest` to mention.
        reason = f"In the logs {pick['log_says']} before any failure; no checkpoint directory was inspected."
    elif verdict == "safe":
        ranks = f"all {world} ranks" if world else "every rank seen"
        but = f", although {pick['log_says']}" if pick["log"] in ("incomplete", "unknown") else ""
        reason = f"{tag} has whole files for {ranks} on disk{latest_note}{but}."
    else:
        reason = f"Whether {tag} is safe is unknown: {pick['log_says']} and no checkpoint directory was inspected."
    return {"verdict": verdict, "resume_from": resume_from, "reason": reason, "default_tag": tag, **base}


def checkpoint_from_disk(disk: DiskCheckpoint) -> dict:
    """The ``checkpoint`` object from the disk alone (no logs)."""
    return checkpoint_report(
        (), failure_at_ns=None, world_size=None, ranks_progress={}, clean_exit_ranks=set(), disk=disk
    )
