"""Why the survivors' collectives timed out, where the log says it though no rank failed. Pure.

When every error is a collective timeout (a hang: hang.py infers where the job stood still), two
kinds of line can still tell what the rank the others waited for was doing, as general facts of how
the frameworks behave. Input: the judged Findings (their traits are the catalog's, signatures/
99-phase-markers.toml); output: a ``Cause`` or None. Rules, tried in this order:

0. The timeout itself is too short (``timeout_too_short``): the shortest ``Timeout(ms)=N`` a watchdog line
   names is under TOO_SHORT_MS (10 s). No rank needs to have done anything wrong: a communicator's set-up, the
   first step's compilation or one slow rank's step takes longer than that, so the first collective that
   waits that long fails on every rank (a timedelta built from the wrong unit, an int read as ms, a
   test's setting left in). config, medium; the phase is the collective's (phase.py).
   Example: "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE,
   NumelIn=1, NumelOut=1, Timeout(ms)=1) ran for 61 milliseconds before timing out." -> config, medium.
1. Work alone outlasted the timeout (``work_outlasted``): the latest progress of a rank is a bar of
   work other than training (trait ``work-bar``: data preparation, tokenising, map/filter, evaluation),
   and its elapsed time (tqdm's ``[27:15<23:13, ...]``: 27 min 15 s) reaches WORK_SHARE of the
   collective timeout the watchdog names (``Timeout(ms)=1800000``; where no line names it,
   init_process_group's default, 30 min). The other ranks waited in a collective while that rank
   worked alone: a timeout too short for that work (category config), in the phase of the work (the
   signature's: data, or forward for an evaluation). Medium when the bar ran to the timeout or past
   it, low when only near it; never high (the bar is the rank's last print, not its stack). Not a
   training bar (that rank was training: the training bar, read after the work bar, replaces it as
   the rank's latest progress), nor a bar far below the timeout.
   Example: "Tokenizing train set:  94%|#########4| 63/67 [29:12<01:51, 27.8s/it]" with "[Rank 2]
   Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=1,
   NumelOut=1, Timeout(ms)=1800000) ran for 1800008 milliseconds before timing out." -> config, data, low.
2. A save began as the others started waiting (``save_outlasted``): a line that says a checkpoint save
   began (trait ``save-begins``: a framework's start line or the job's own "Saving ... checkpoint"),
   timed, printed within SAVE_NEAR of when the collective began (the watchdog's time less its timeout:
   the others entered it as the save began, as in ``if rank == 0: save(); barrier()``), with no timed
   progress line after it. The ranks waited for the save: most often it
   outlasted the timeout (one rank writing the whole state, slow or full storage), so storage, in
   checkpoint-save, low. Untimed lines are not ordered, so a paste without times says nothing here.
   Example: "10:28:25 ... Saving latest checkpoint ..." and "10:48:25 ... Watchdog caught collective
   operation timeout: WorkNCCL(..., Timeout(ms)=1200000) ran for 1200027 milliseconds" -> storage,
   checkpoint-save, low.
3. Training had ended (``after_training``): a trainer's own end-of-training line (trait
   ``training-ended``: Lightning's "`Trainer.fit` stopped: `max_epochs=3` reached.", the HF Trainer's
   "Training completed. ...") not printed after the timeout. A rank went on to code after training
   (a test, a prediction or a save on rank 0 only; a collective some ranks call and others do not)
   while the others waited: user-code, low.

Where both are timed, the bar must have been printed while the collective waited (within the
timeout before the watchdog fired, less the clocks' uncertainty). In a paste the order of blocks
says little (a watchdog line pasted above the bar it interrupted), so untimed lines are not ordered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from firstfault.analysis.findings import Finding
from firstfault.analysis.parse import elapsed_s
from firstfault.analysis.phase import collective_op, gather_ops

DEFAULT_TIMEOUT_MS = 30 * 60 * 1000  # torch.distributed init_process_group's default timeout (NCCL and gloo)
WORK_SHARE = 0.8  # a bar at this share of the timeout or more was running when the watchdog fired
TOO_SHORT_MS = 10 * 1000  # a collective timeout under 10 s: shorter than a set-up or a slow step can be relied on
# (a minute or less is sometimes chosen to fail fast; under 10 s no real job's collectives all fit)
SAVE_NEAR_S = 30  # a save begun within this of when a collective began is what the collective waited for
# what to do first about a hang in a checkpoint save (this rule's, and report.py's for a save under way)
SAVE_OUTLASTED_ACTION = ("Time the save on the saving rank(s) (its write throughput and size on the checkpoint storage) "
                         "against the collective timeout, and check every rank enters the same save path (no collective "
                         "only under rank 0); then save sharded or asynchronously, or raise the timeout around the save.")


SAVE_GATHER_ACTION = ("Call the save on every rank (an FSDP or ZeRO-3 state_dict, save_model, save_checkpoint gathers "
                      "from all ranks; a save under `if rank == 0` leaves rank 0 waiting in the gather), and check from "
                      "each rank's last lines that all of them reached it.")


@dataclass(frozen=True, slots=True)
class Cause:
    """What the rank the others waited for was doing, and what that makes of the hang."""

    kind: str  # timeout-too-short | work-outlasted | save-outlasted | save-gather | after-training
    category: str
    phase: str | None  # the phase of the work, None when the line names none
    confidence: str  # low | medium
    evidence: Finding  # the line that says it (its signature's reference is the rule's source)
    summary: str  # a sentence the report adds to the hang's
    action: str

    @property
    def phase_from(self) -> str:
        """Where ``phase`` comes from, for the report's phase_from."""
        return {"work-outlasted": "the work one rank did alone while the others waited (progress bar)",
                "save-outlasted": "a checkpoint save began as the others started waiting, and no progress followed",
                "save-gather": "a checkpoint save began as the ranks started waiting in its gather"
                }.get(self.kind, self.kind)


def timeout_cause(findings: Iterable[Finding]) -> Cause | None:
    """The cause the log shows for a hang whose errors are all collective timeouts (the module's
    rules, in order); None when no collective timed out or no line says more."""
    findings = list(findings)
    timeouts = [f for f in findings if f.has("collective-timeout")]
    if not timeouts:
        return None
    return (timeout_too_short(timeouts) or work_outlasted(findings, timeouts) or save_outlasted(findings, timeouts)
            or after_training(findings, timeouts))


def _shortest_named(timeouts: Iterable[Finding]) -> tuple[int, Finding] | None:
    """(the shortest collective timeout a line names, that line), or None where no line names one."""
    named = [(int(ms), t) for t in timeouts if (ms := t.match.groups.get("timeout_ms") or "").isdigit()]
    return min(named, key=lambda x: x[0]) if named else None


def collective_timeout_ms(timeouts: Iterable[Finding]) -> tuple[int, bool]:
    """(the collective timeout the lines name, the shortest; whether a line named it) or the default."""
    shortest = _shortest_named(timeouts)
    return (shortest[0], True) if shortest else (DEFAULT_TIMEOUT_MS, False)


def timeout_too_short(timeouts: list[Finding]) -> Cause | None:
    """Rule 0: the shortest collective timeout a line names is under TOO_SHORT_MS."""
    shortest = _shortest_named(timeouts)
    if shortest is None or shortest[0] >= TOO_SHORT_MS:
        return None
    ms, line = shortest
    summary = (f"The collective timeout is set to {ms} ms (as the timed-out line says): shorter than a "
               "communicator's set-up or one slow step can be relied on to take, so the first collective that waits "
               "that long fails on every rank, whatever the ranks were doing.")
    action = ("Find where the job sets the timeout (init_process_group(timeout=timedelta(...)), ddp_timeout in HF "
              "TrainingArguments, DDPStrategy(timeout=...), TORCH_NCCL_*/NCCL timeout variables, a launcher's flag) "
              "and give it minutes, not milliseconds: a timedelta built from the wrong unit is the usual cause.")
    return Cause("timeout-too-short", "config", None, "medium", line, summary, action)


def _while_waiting(bar: Finding, run_s: int, t: Finding, timeout_ms: int) -> bool:
    """The bar was running while ``t``'s collective waited: where both are timed, it started before the
    watchdog fired and was printed after the collective began; untimed lines are not ordered."""
    a, b = bar.ev.occurred_ns, t.ev.occurred_ns
    if a is None or b is None:
        return True
    slack = bar.ev.uncertainty_ns + t.ev.uncertainty_ns
    return a - run_s * 10**9 <= b + slack and a >= b - timeout_ms * 10**6 - slack


def work_outlasted(findings: list[Finding], timeouts: list[Finding]) -> Cause | None:
    """Rule 1: the longest bar of work other than training that reaches WORK_SHARE of the timeout."""
    timeout_ms, named = collective_timeout_ms(timeouts)
    bars = [(run, f) for f in findings if f.has("work-bar") and (run := elapsed_s(f.match.groups.get("elapsed")))
            is not None and run * 1000 >= WORK_SHARE * timeout_ms
            and any(_while_waiting(f, run, t, timeout_ms) for t in timeouts)]
    if not bars:
        return None
    run, bar = max(bars, key=lambda x: x[0])
    who = f"Rank {bar.ev.rank}" if bar.ev.rank is not None else "A rank"
    desc = (bar.match.groups.get("desc") or "").strip()
    what = f"its progress bar{f' ({desc!r})' if desc else ''}"
    limit = f"{timeout_ms / 60000:g} min" + ("" if named else " (init_process_group's default: no line names it)")
    summary = (f"{who} was at work other than training while the others waited in a collective: {what} had run "
               f"{bar.match.groups['elapsed']} against a collective timeout of {limit}. Most likely that work, on one "
               "rank, outlasted the timeout (inferred, not seen).")
    action = ("Compare the work's time with the collective timeout: raise the timeout above it "
              "(init_process_group(timeout=...), ddp_timeout in HF TrainingArguments, DDPStrategy(timeout=...) in "
              "Lightning), or do the work on every rank or before init_process_group (prepare and cache it once, "
              "then load it), so that no rank waits in a collective while one works.")
    phases = bar.match.signature.phases
    return Cause("work-outlasted", "config", phases[0] if phases else None,
                 "medium" if run * 1000 >= timeout_ms else "low", bar, summary, action)


def save_outlasted(findings: list[Finding], timeouts: list[Finding]) -> Cause | None:
    """Rule 2: the latest save start, timed, within SAVE_NEAR of when a timed-out collective began, with no
    timed progress after it. A save long before (the job went on) or long after (the others were already
    waiting for something else) says nothing."""
    timeout_ms, _ = collective_timeout_ms(timeouts)
    fired = [t.ev.occurred_ns for t in timeouts if t.ev.occurred_ns is not None]
    saves = [f for f in findings if f.has("save-begins") and f.ev.occurred_ns is not None]
    if not fired or not saves:
        return None
    save = max(saves, key=lambda f: f.ev.occurred_ns)
    at, first = save.ev.occurred_ns, min(fired)
    began = first - timeout_ms * 10**6  # when the first collective to time out began waiting
    slack = SAVE_NEAR_S * 10**9 + save.ev.uncertainty_ns + max(t.ev.uncertainty_ns for t in timeouts)
    if abs(at - began) > slack:
        return None
    if any(f.has("progress") and f.ev.occurred_ns is not None and at < f.ev.occurred_ns <= first for f in findings):
        return None  # training went on after the save
    lead = round((began - at) / 1e9)
    when = (f"{lead} s before" if lead > 0 else f"{-lead} s after" if lead < 0 else "as") + " the collective began"
    kind, category, what, action = save_wait(timeouts)
    summary = f"A checkpoint save began {when} ({save.ev.text.strip()[:100]}), and nothing showed training go on: {what}"
    return Cause(kind, category, "checkpoint-save", "low", save, summary, action)


def save_wait(timeouts: Iterable[Finding]) -> tuple[str, str, str, str]:
    """(Cause kind, category, what most likely happened, first action) of ranks that timed out while a checkpoint
    save was under way. Waiting in a barrier or an all-reduce, they waited for the rank(s) writing the save, which most
    often outlasted the timeout (one rank writing the whole state, slow or full storage): storage. Waiting in an
    all-gather, they were inside the save's own gather of the sharded state (an FSDP full state dict, ZeRO-3's
    consolidation), which every rank must enter: a rank did not (the save called under ``if rank == 0``, a rank
    still elsewhere): user-code. Both inferred, not seen."""
    ops = sorted({op for t in timeouts if (op := collective_op(t.ev.text))})
    if ops and set(ops) <= gather_ops():  # inside the save's own gather of sharded state
        return ("save-gather", "user-code", f"the ranks that reported timed out inside the save's own gather of the sharded state "
                             f"({', '.join(ops)}), which every rank must enter, and a rank did not (the save called on "
                             "some ranks only, as under `if rank == 0`, or a rank still elsewhere) (inferred, not seen).",
                SAVE_GATHER_ACTION)
    named = _shortest_named(timeouts)
    limit = f" of {named[0] / 60000:g} min" if named else ""
    return ("save-outlasted", "storage", f"the ranks waited for the save, which most likely outlasted the collective timeout{limit} "
                       "(inferred, not seen).", SAVE_OUTLASTED_ACTION)


def _printed_after(f: Finding, t: Finding) -> bool:
    """``f`` was printed after ``t``: later in the same stream, or later in time where both are timed."""
    if f.ev.stream == t.ev.stream:
        return f.ev.seq > t.ev.seq
    a, b = f.ev.occurred_ns, t.ev.occurred_ns
    return a is not None and b is not None and a > b + f.ev.uncertainty_ns + t.ev.uncertainty_ns


def after_training(findings: list[Finding], timeouts: list[Finding]) -> Cause | None:
    """Rule 2: a trainer said training ended, not after every timeout."""
    ended = next((f for f in findings if f.has("training-ended")
                  and not all(_printed_after(f, t) for t in timeouts)), None)
    if ended is None:
        return None
    said = ended.ev.text.strip().replace("`", "")[:120]
    summary = (f"Training had ended before the collective timed out ({said}). Most likely a "
               "rank went on to code after training (a test, a prediction or a save run on rank 0 only, a barrier or "
               "a collective that only some ranks reach) while the others waited in a collective (inferred, not seen).")
    action = ("Read the code that runs after fit/train and note which ranks run it: every collective there "
              "(trainer.test or validate, a barrier, an all_reduce, a metric logged with sync_dist, a sharded save) "
              "must run on every rank; run rank-0-only work on every rank or after destroy_process_group, and "
              "confirm with a stack dump of each rank while it hangs (py-spy dump --pid).")
    return Cause("after-training", "user-code", None, "low", ended, summary, action)
