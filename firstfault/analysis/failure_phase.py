"""The failure's phase, decided once, with where it came from. Pure.

Every source the report may take a phase from is here, in the order they are trusted
(``failure_phase``):

- a failure a line names (``phase_of``): its own frames; the frames of the same failure told
  elsewhere, or of its rank's traceback cut above the exception line; a constructor its frames
  pass through with no training frame; the hints that are not frames (phase.phase_hint, then an
  NCCL error of a communicator's set-up: ``nccl_setup``); a worker's exit status 2 with nothing
  else said (judge.exit_failure: a rejected command line) is init; the signature's one phase; a
  checkpoint save under way; the stacks of the ranks that waited for it, else of the other ranks'
  errors; of a traceback pasted from its middle, a heading's save, load or set-up over the step its
  frames show (``headed``);
- an inferred hang (``hang_phase``): the stack dump of the rank that stopped; a checkpoint save
  under way; what the others waited for (timeout_cause.py: the work one rank did alone, a save
  begun as they started waiting); the
  collective the survivors waited in; a save, load or set-up begun before they
  waited and never ended (save_phase); the step their own tracebacks show them waiting in (one
  phase for all of them); the one phase their errors belong to; then the frames where the Flight
  Recorder saw that rank's last collective called;
- last, for a failure a line names whose phase is still unknown: the phase DeepSpeed's own marks
  (memory_breakdown) open around the failure's time (bands.marked_phase, read by the memory
  report); then the phase a heading of the text names (an issue's title: "Save checkpoint error
  when using FSDP2", "NCCL timeout during compute_log_prob": judge.phase_heading), the words of
  the person who saw the whole log, where no line of it says more.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

from firstfault.analysis.bands import MARKED_PHASES
from firstfault.analysis.events import KIND_TRACEBACK, Event, Frame
from firstfault.analysis.findings import Finding
from firstfault.analysis.flight_recorder import FRAnalysis
from firstfault.analysis.hang import Inference
from firstfault.analysis.judge import USAGE, heading_phase, phase_heading
from firstfault.analysis.lasterror import CLIMBED, climbs_setup
from firstfault.analysis.ownership import in_places, owner_of
from firstfault.analysis.phase import (
    COLLECTIVE_HINT,
    ENCLOSING_PHASES,
    collective_op,
    phase_from_frames,
    phase_from_task,
    phase_from_task_words,
    phase_hint,
    progress_before,
)
from firstfault.analysis.rankstate import RankState
from firstfault.analysis.save_phase import phase_while_waiting
from firstfault.analysis.traceback import ends_frame
from firstfault.analysis.verdict import Decision

Phase = tuple[str, str]  # (phase, where it came from)


def failure_phase(dec: Decision, state: RankState, findings: list[Finding], saving: int | None,
                  sharded: bool | None, marked: str | None = None, marks_from: str | None = None) -> Phase | None:
    """The phase of the decided failure (None: nothing failed). ``saving``: the start of a
    checkpoint save under way (rankstate.saving_since); ``sharded``: ZeRO-3 (all-gathers gather
    parameters); ``marked``: the phase DeepSpeed's marks put the failure's time in (memory report)."""
    if dec.inference is not None:
        dump = state.dumps.at_hang.get(dec.inference.rank) if dec.inference.rank is not None else None
        waiting = before(dec.cascades[0], findings) if dec.cascades else []
        work = (dec.cause.phase, dec.cause.phase_from) if dec.cause is not None and dec.cause.phase else None
        return hang_phase(dec.inference, dec.cascades, dump, dec.flight, saving, sharded, waiting, work)
    if dec.first is not None:
        peers = [h for h in state.errors if h.role == "cascade" and h.ev.frames] or \
            [h for h in state.errors if h.ev.frames and h.ev.rank is not None and h.ev.rank != dec.first.ev.rank]
        got = headed(dec.first, phase_of(dec.first, saving, peers, state.errors, before(dec.first, findings), sharded),
                     findings)
    elif dec.exited is not None:
        got = phase_of(dec.exited, saving, [], (), before(dec.exited, findings), sharded)  # set-up lines before it
    else:
        return None
    if got[0] == "unknown" and (told := _task_above(dec.first or dec.exited, findings)) is not None:
        return told
    if got[0] == "unknown" and (told := _task_reported_next(dec.first or dec.exited, findings)) is not None:
        return told
    if got[0] == "unknown" and (told := oom_task(dec.first or dec.exited, findings)) is not None:
        return told
    if got[0] == "unknown" and marked in MARKED_PHASES:
        return marked, f"DeepSpeed's phase marks (memory_breakdown) in {marks_from}"
    if got[0] == "unknown" and (said := phase_heading(findings)) is not None:
        return heading_phase(said), f"the text's title says so: {said.ev.text.strip()[:120]}"
    return got


def _task_above(f: Finding, findings: Iterable[Finding]) -> Phase | None:
    """The phase of the Ray task whose header stands above ``f``, a traceback: Ray prints a worker's remote
    traceback under "ray::Actor.method() (pid=N, ...)" in place of Python's header (a catalog line that names
    the rank of the next traceback), so the task it names is the one the frames below ran in."""
    if f.ev.kind != KIND_TRACEBACK:
        return None
    above = [h for h in findings if h.ev.stream == f.ev.stream and h.ev.seq < f.ev.seq
             and (h.ev.kind == KIND_TRACEBACK or h.match.signature.names_rank_of == "next-traceback")]
    header = max(above, key=lambda h: h.ev.seq, default=None)
    if header is None or header.ev.kind == KIND_TRACEBACK:
        return None
    p = phase_from_task(header.ev.text)
    return (p, "the Ray task whose remote traceback it is") if p is not None else None


def _task_reported_next(f: Finding, findings: Iterable[Finding]) -> Phase | None:
    """The phase of the Ray task whose error its stream reports right after ``f``, a traceback whose own task
    header was cut above it. Ray prints such a report (an unhandled error, a RayTaskError) as the task's header,
    its remote traceback and the exception; the workers of a group run the same method together, so the reports
    of their failures follow one another (verl's generate_sequences on every worker, each out of memory in turn)."""
    if f.ev.kind != KIND_TRACEBACK:
        return None
    nxt = min((h for h in findings if h.ev.stream == f.ev.stream and h.ev.seq > f.ev.seq), key=lambda h: h.ev.seq,
              default=None)
    if nxt is None or nxt.match.signature.names_rank_of != "next-traceback":
        return None
    p = phase_from_task(nxt.ev.text)
    return (p, "the Ray task its stream reports next (a group's workers run the same method and fail in turn)") \
        if p is not None else None


OOM_REPORT_LINES = 16  # Ray's OOM kill report: its lines, "PID\tMEM(GB)\tCOMMAND" and the ten rows


def oom_task(f: Finding, findings: Iterable[Finding]) -> Phase | None:
    """The phase of the task a Ray OOM kill report names: the killed task's own name
    (``name=WorkerDict.actor_rollout_compute_log_prob``), else the task of the biggest process in
    the node's top memory users printed under the report (trait ``memory-user``). Ray kills the
    task scheduled last, often not the one that filled the memory (a driver's ``main_task`` beside
    workers that gather a checkpoint's state): the biggest process shows what the job was doing."""
    if not f.has("oom-kill"):
        return None
    near = [h for h in findings if h.ev.stream == f.ev.stream and 0 <= h.ev.seq - f.ev.seq <= OOM_REPORT_LINES]
    for h in near:
        if h.has("oom-kill") and (task := h.match.groups.get("ray_task")) \
                and (p := phase_from_task_words(task)) is not None:
            return p, f"the task Ray's memory monitor killed ({task})"
    rows = [h for h in near if h.has("memory-user") and not h.match.groups["ray_task"].startswith("IDLE")]
    if not rows:
        return None
    top = max(rows, key=lambda h: float(h.match.groups["mem_gb"]))
    task = top.match.groups["ray_task"]
    p = phase_from_task_words(task)
    return (p, f"the task of the node's biggest process when Ray killed a worker ({task}, "
               f"{top.match.groups['mem_gb']} GB)") if p is not None else None


HEADING_NAMED = "the failure the text's heading names (the traceback's outer frames are cut off)"


def headed(f: Finding, got: Phase, findings: Iterable[Finding]) -> Phase:
    """A traceback pasted from its middle lost its outer frames, which may hold its step in a save, a load or
    set-up (phases.toml [[enclosing]]): when its own frames give a step's phase and a heading (an issue's title:
    prose) says the job failed in one of those, the heading's phase is the one. The frames that are there win
    when they name an enclosing phase themselves."""
    if not f.ev.fields.get("fragment") or got[1] != "frames" or got[0] in ENCLOSING_PHASES:
        return got
    said = next((p for h in findings if h.ev.fields.get("prose") and h.has("mention")
                 and (p := heading_phase(h)) in ENCLOSING_PHASES), None)
    return (said, HEADING_NAMED) if said is not None else got


def hang_phase(inf: Inference, cascades: list[Finding], dump: Event | None, flight: FRAnalysis | None,
               saving: int | None, sharded: bool | None, waiting: Iterable[str] = (), work: Phase | None = None) -> Phase:
    """Where the ranks stood when the job hung. ``waiting``: the lines kept before the first
    survivor's error, oldest first (a save or load begun there and never ended: save_phase); ``work``:
    (the phase, where it came from) of what the others waited for (timeout_cause.py: the work one rank
    did alone, a save begun as they started waiting), which is where the job stood, not the collective
    the others waited in."""
    dump_phase = dump and phase_from_frames(dump.frames)
    # the collective they waited in; survivors stuck in different collectives were at different places
    mixed = len({op for c in cascades if (op := collective_op(c.ev.text))}) > 1
    waited = next((h for c in cascades if (h := phase_hint(c.ev.text, (), sharded))
                   and not (mixed and h[1] == COLLECTIVE_HINT)), None)
    hinted = {c.match.signature.phases[0] for c in cascades if len(c.match.signature.phases) == 1}
    said = (hinted.pop(), "the phase the survivors' errors belong to") if len(hinted) == 1 else None
    got = ((dump_phase, "stack dump") if dump_phase else ("checkpoint-save", "checkpoint save under way")
           if saving is not None else work or waited or phase_while_waiting(waiting) or survivors_step(cascades)
           or said or inf.phase or ("unknown", "no evidence"))
    rank = inf.rank
    if flight and rank is not None and got[0] == "unknown":  # where its last collective was called
        ph = phase_from_frames([Frame(f.file, f.line, f.func) for f in reversed(flight.frames_of(rank))])
        if ph:
            return ph, "Flight Recorder frames"
    return got


def survivors_step(cascades: Iterable[Finding]) -> Phase | None:
    """The step the survivors' own tracebacks show them in when their wait failed (a collective
    called from ``loss.backward()``, a save's gather), where every traceback that shows one shows the
    same: the ranks of a job run the same step, so that is where the job stood. Survivors in
    different steps say nothing."""
    shown = {p for c in cascades if c.ev.frames and (p := phase_from_frames(c.ev.frames))}
    return (shown.pop(), "the survivors' tracebacks (where they waited)") if len(shown) == 1 else None


def before(f: Finding, findings: Iterable[Finding], most: int = 2000) -> list[str]:
    """The lines of ``f``'s stream that the findings kept before it, oldest first (at most ``most``):
    what was printed before the failure, for the phase hints of set-up lines. A heading (prose: a
    person's words above a paste, e.g. an issue's title naming the failure) speaks of the whole log
    below it: every line of its stream, headings left out."""
    prose = bool(f.ev.fields.get("prose"))
    lines = sorted((h.ev.seq, h.ev.text) for h in findings if h.ev.stream == f.ev.stream
                   and (h.ev.seq < f.ev.seq or (prose and not h.ev.fields.get("prose"))))
    return [t for _, t in lines[-most:]]


# NCCL's communicator constructors (nccl.h), named by the callers that report their failure: Horovod's
# and TensorFlow's "ncclCommInitRank failed: unhandled system error", cupy's NcclError, vLLM's pynccl
_COMM_INIT = re.compile(r"\bnccl(?:CommInitRank(?:Config|Scalable)?|CommInitAll|CommSplit|GetUniqueId)\b")


# A process group's watchdog reporting an error NCCL raised in its own threads (after the collective was
# enqueued): ProcessGroupNCCL's checkForNCCLErrors/ncclCommWatchdog (1.8-2.9), its abort of the communicator.
_ASYNC = re.compile(r"found async exception|[Ww]atchdog|communicator was aborted|Some NCCL operations have failed")
# A collective's own NCCL call named by its caller (Horovod's, TensorFlow's, cupy's "ncclAllReduce failed: ..."):
# the communicator was made, the call failed.
_COLLECTIVE_CALL = re.compile(
    r"\bnccl(?:AllReduce|Broadcast|Bcast|Reduce|AllGather|ReduceScatter|AllToAll|Send|Recv)\b")


def nccl_setup(f: Finding, parts: Iterable[Finding], before: Iterable[str] = ()) -> Phase | None:
    """``init`` when ``f`` is an NCCL failure whose own words name a communicator constructor
    (``ncclCommInitRank failed: ...``), or NCCL's back trace passes through its communicator
    set-up (lasterror.climbs_setup: init.cc): a trace line of the same stream, or one told in
    the links of ``f`` or of another error of its stream (the trace under it, lasterror.CLIMBED: the
    processes of a paste that fail together in NCCL's set-up print one trace each). PyTorch makes a
    group's communicator at its first collective (DDP's broadcast in its constructor, a barrier, a
    group's first call): the job's set-up, whatever step it came in. Last, an error of a kind only
    that set-up returns (the catalog's trait ``comm-setup``: a socket or shared-memory call, a topology
    check, a buffer NCCL allocates), raised at the collective's call rather than reported by the
    watchdog or named as the collective's own NCCL call, with no training progress before it in its
    stream (``before``)."""
    if not (f.sig.startswith("nccl.") or "nccl" in f.ev.text.lower()):
        return None
    if (m := _COMM_INIT.search(f.ev.text)) is not None:
        return "init", f"the error names NCCL's communicator set-up ({m.group(0)})"
    if any(link.startswith(CLIMBED) for link in f.links) or any(
            p.ev.stream == f.ev.stream and (climbs_setup(p) or any(link.startswith(CLIMBED) for link in p.links))
            for p in parts):
        return "init", "NCCL's error back trace passes through its communicator set-up (init.cc)"
    if (f.has("comm-setup") and _ASYNC.search(f.ev.text) is None and _COLLECTIVE_CALL.search(f.ev.text) is None
            and not progress_before(before)):
        return "init", ("NCCL returns this error from a communicator's set-up, which PyTorch runs at a group's first "
                        "collective, and no training progress came before it (inferred: a group first used later in "
                        "training fails the same way)")
    return None


# A frame of an object's constructor (a dataclass's generated __init__ calls __post_init__), and the words of a
# function that runs training, evaluation or generation (a step's phases are phases.toml's; these say only
# that set-up was over). A function named just ``train`` says nothing: it is the usual name of a script's whole
# job, its set-up and then its loop (ColossalAI's and many examples' ``def train(args)``); nor do the names Ray
# Train's documentation gives the function each worker runs, which builds the trainer and then fits
# (TorchTrainer(train_loop_per_worker=...), its examples' ``train_func`` and ``train_fn``).
_CONSTRUCTORS = ("__init__", "__post_init__")
# torch.distributed's and DDP's own objects (DistributedDataParallel, FSDP, a pipeline stage, a device mesh): built
# once, as the job sets up its parallelism (torch/nn/parallel/distributed.py, torch/distributed/, 1.x-2.9)
TORCH_DISTRIBUTED = ("torch/distributed/", "torch/nn/parallel/distributed.py")
_WHOLE_JOB = frozenset({"train_func", "train_fn", "train_loop_per_worker"})
_RUNNING = re.compile(r"\w+train|train\w+|fit|step|epoch|loop|evaluat|predict|generat|rollout|forward|backward", re.I)


def _constructing(frames: Sequence[Frame]) -> Frame | None:
    """The constructor frame of the job's code or a framework's a traceback passes through when none of its
    frames runs training (``_RUNNING``): the failure came while the job built its objects (a config's
    check, a model's layers, a trainer, a Ray actor, torch.distributed's wrappers and stages), which is its
    set-up. Not the standard library's nor PyTorch's own helper objects (torch.load's zip reader), which any
    step may build. None otherwise."""
    if any(_RUNNING.search(f.func) for f in frames if f.func not in _CONSTRUCTORS and f.func not in _WHOLE_JOB):
        return None
    return next((f for f in reversed(frames) if f.func in _CONSTRUCTORS
                 and (o := owner_of(f.file)).kind != "stdlib"
                 and (o.name != "torch" or in_places(f.file, TORCH_DISTRIBUTED))), None)


IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError")


def _top_level_import(f: Finding) -> bool:
    """An ImportError raised by a module's own body (its innermost frame of code, not the standard library's
    importlib, is ``<module>``): an import statement at the top of a file, run as the job loads its code.
    The same error raised inside a step has that step's frames outside it (phase_from_frames read them first)."""
    short = (f.ev.exc_type or "").rsplit(".", 1)[-1]
    own = [fr.func for fr in f.ev.frames if not fr.file.startswith("<frozen") and "importlib" not in fr.file]
    return short in IMPORT_ERRORS and bool(own) and own[-1] == "<module>"


# The call a source line makes: "loss.backward()", "self.accelerator.backward(loss)", "out = model.forward(x)".
_CALL = re.compile(r"(?:[\w.\[\]]+(?:\s*,\s*[\w.]+)*\s*=\s*)?(?:return\s+|await\s+)?(?:[\w.]+\.)?(?P<callee>[A-Za-z_]\w*)"
                   r"(?P<index>\[[^\]\n]*\])?\(")
# A callee that names a module object ("model(x)", "self.policy(batch)", "model_parts[0](inputs)"): calling it runs
# torch's Module.__call__, a forward. Not a function that gets, builds or loads one ("get_model(cfg)").
_MODULE = re.compile(r"^(?!(?:get|build|load|create|init|make|setup|save|prepare|wrap|unwrap|compile|convert)_)"
                     r"(?:[a-z]+_)?(?:model|module|net|network|encoder|decoder|backbone|policy|actor|critic)s?"
                     r"(?:_parts?|_chunks?)?$")
# An import statement: the module it names runs its body below the line.
_IMPORT = re.compile(r"(?:from\s+\.*[\w.]*\s+import\s|import\s+[\w.]+\s*(?:$|,|\bas\b))")
_MARKS = frozenset("^~ ")  # the caret lines Python 3.11+ prints under a frame's source line


def _with_call(f: Finding) -> Sequence[Frame]:
    """A traceback's frames and, where it was cut right after its innermost frame's source line, the function that
    line calls: the frame the cut took away ("self.accelerator.backward(loss)" under training_step was the backward;
    "pred = model_parts[0](inputs)", a module's call, was a forward; "from pkg.algos import Trainer", the body of the
    module it imports). Only its name is known, so only phases.toml's ``funcs`` can read it."""
    frames = f.ev.frames
    if not frames or not f.has("cut-traceback"):
        return frames
    lines = f.ev.text.split("\n")
    last = max((i for i, ln in enumerate(lines) if ends_frame(lines[i - 1] if i else "", ln)), default=None)
    if last is None:
        return frames
    source = next((s for ln in lines[last + 1:] if (s := ln.strip()) and not set(s) <= _MARKS), None)
    if source is not None and _IMPORT.match(source):
        return (*frames, Frame("", 0, "<module>"))  # the module it imports: its body ran below (phase.importing)
    m = _CALL.match(source) if source is not None and not source.startswith("File ") else None
    if m is None:
        return frames
    if _MODULE.match(m.group("callee")):
        return (*frames, Frame("", 0, "_call_impl"))  # the module's call: a forward
    return frames if m.group("index") else (*frames, Frame("", 0, m.group("callee")))


def phase_of(f: Finding, saving_since: int | None, peers: list[Finding], parts: Iterable[Finding] = (),
             before: Iterable[str] = (), sharded: bool | None = None) -> tuple[str, str]:
    """The phase of a failure and where that came from.

    In order: its own frames; the frames of the same failure told elsewhere (``parts``: the rest
    of a traceback cut into pieces, the same signature's traceback on the same rank); a constructor
    its frames pass through with no frame of training (``_constructing``); the hints that are not
    frames (phase.phase_hint: a Ray task, the collective a timeout names, set-up lines in ``before``,
    or a bar glued before the failure on its own line, with no progress after them; then
    ``nccl_setup``); the signature's one phase hint; a checkpoint save
    under way when it happened; the stacks of the ranks that waited for it (a rank killed without
    a stack was in the phase whose collective the others waited in), else, where none waited, of the
    other ranks' errors (``peers`` holds those then: the ranks of a job run the same step).
    """
    p = phase_from_frames(_with_call(f))
    if p:
        return p, "frames"
    # a bar printed without its newline, the failure glued after it, is the last thing before the failure
    before = [*before, f.ev.text.split("\n", 1)[0]]
    if _top_level_import(f):
        return "init", "an import at the top of a module failed: the job was still loading its code"
    for part in parts:
        if part is f or part.ev.rank != f.ev.rank or not part.ev.frames:
            continue
        same = part.sig == f.sig if f.ev.rank is not None else part.ev.stream == f.ev.stream
        if (same or (f.has("cut-traceback") and part.has("cut-traceback") and part.ev.stream == f.ev.stream)) \
                and (p := phase_from_frames(part.ev.frames)):
            return p, "frames of the same failure told elsewhere" if not f.has("cut-traceback") else \
                "frames of the rest of the cut traceback"
    if f.ev.rank is not None and not f.has("cut-traceback"):  # its rank's traceback cut above its exception line
        cut = next((p for part in parts if part.ev.rank == f.ev.rank and part.has("cut-traceback")
                    and part.ev.frames and (p := phase_from_frames(part.ev.frames))), None)
        if cut:
            return cut, "frames of its rank's traceback, cut above the exception line"
    if (built := _constructing(f.ev.frames)) is not None:
        where = built.file.rsplit("/", 1)[-1]
        return "init", f"raised while an object was built ({built.func} in {where}), no step under way"
    hinted = phase_hint(f.ev.text, before, sharded) or nccl_setup(f, parts, before)
    if hinted:
        return hinted
    if f.has("cut-traceback"):  # a cut traceback's own words are missing: the failure a heading names
        named = next((h for h in parts if h.ev.fields.get("prose") and h.role == "root"
                      and len(h.match.signature.phases) == 1), None)
        if named is not None:
            return named.match.signature.phases[0], "the failure the text names in words"
    if USAGE in f.links:  # judge.exit_failure: a command line is read before anything else runs
        return "init", "exit status 2: a command line the script rejects ends it at start"
    hints = f.match.signature.phases
    if len(hints) == 1:
        return hints[0], "signature"
    if saving_since is not None and f.ev.occurred_ns is not None and f.ev.occurred_ns >= saving_since:
        return "checkpoint-save", "checkpoint save under way"
    waited = Counter(ph for g in peers if g.ev.rank != f.ev.rank
                     and (ph := phase_from_frames(g.ev.frames) or ("init" if _constructing(g.ev.frames) else None)))
    if waited:
        who = "the ranks waiting for it" if all(g.role == "cascade" for g in peers) else \
            "the other ranks' errors (ranks run the same step)"
        return waited.most_common(1)[0][0], f"stacks of {who}"
    if hints:
        return hints[0], "signature"
    return "unknown", "no evidence"
