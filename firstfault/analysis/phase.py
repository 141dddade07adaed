"""The lifecycle phase of a failure: from stack frames, and from hints that are not frames.

The rules are data: ``phases.toml`` next to this module (loaded with
``importlib.resources``, checked once, every problem reported at once), written from
the frameworks' own files and functions: DeepSpeed, PyTorch (DDP, FSDP, FSDP2,
autograd, optimizers, DataLoader), transformers/accelerate, Megatron-Core, NeMo,
Lightning, torchtitan, ColossalAI, verl and OpenRLHF.

Frames. Two kinds of phase. The enclosing ones (construction and ``deepspeed.initialize``,
a checkpoint save or load) hold everything under them: a parameter gather inside
``save_checkpoint`` or inside ``zero.Init`` is still the save or the init, so the innermost
frame of theirs in the stack names the phase. Otherwise the innermost frame of a step's
own parts names it: a ValueError in the user's ``forward`` called from ``engine.forward``
is ``forward``; a CUDA OOM in ``all_gather_coalesced`` under ``fetch_sub_module`` is
``param-gather``; except that a step phase found further out can hold the inner one
(``[holds]``: a forward run by a DataLoader's collate function is ``data``, a forward
recomputed by activation checkpointing inside backward is ``backward``). Generic names
(``step``, ``setup``, ``__init__``, ``save``) only count in the files that give them their
meaning, so a user's own ``step`` is no optimizer step. Last, where neither kind matched, the
``[[fallback]]`` frames (a module moved or cast to a device, a launcher's model loading) name a
phase only because nothing in the step does. Frames are outermost first, as in a
traceback, e.g.::

    File ".../deepspeed/runtime/zero/partitioned_param_coordinator.py", line 341, in fetch_sub_module

Hints that are not frames, each a small pure function (the verdict decides when to use them):
- ``phase_from_collective``: the collective a watchdog or timeout line names
  (``WorkNCCL(SeqNum=1, OpType=BROADCAST, ...)`` -> init; ``OpType=_ALLGATHER_BASE`` in a
  job whose parameters are sharded -> param-gather).
- ``phase_from_marker`` / ``phase_before_failure``: text a job prints while it sets up
  (``Loading checkpoint shards``, ``Initializing distributed: GLOBAL_RANK: 0``, NCCL
  communicator set-up) with no progress line after it -> init.
- ``phase_from_task``: the Ray task that failed (``ray::WorkerDict.actor_rollout_save_checkpoint()``).
- ``phase_hint``: the three in that order, with where the phase came from (for ``phase_from``).
"""

from __future__ import annotations

import importlib.resources
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from firstfault.analysis.events import Frame

PHASES = (
    "init",
    "forward",
    "backward",
    "param-gather",
    "optimizer-step",
    "checkpoint-save",
    "checkpoint-load",
    "data",
    "unknown",
)
ENCLOSING_PHASES = ("init", "checkpoint-save", "checkpoint-load")
STEP_PHASES = ("forward", "backward", "param-gather", "optimizer-step", "data")

_TOP = ("version", "holds", "enclosing", "step", "fallback", "imports", "collective", "marker", "task")
_RULE_KEYS = ("phase", "reference", "funcs", "files", "in_files")
_COLLECTIVE_KEYS = ("ops", "seq", "numel", "sharded", "phase", "reference")
_MARKER_KEYS = ("phase", "progress", "only_before_progress", "ends_in_log", "needles", "pattern", "reference")
_TASK_KEYS = ("methods", "phase", "reference")


class PhaseRulesError(Exception):
    """The phase rules cannot be used; ``problems`` lists every reason found."""

    def __init__(self, source: str, problems: list[str]):
        self.source, self.problems = source, list(problems)
        listing = "\n  ".join(self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s) in the phase rules:\n  {listing}")


@dataclass(frozen=True, slots=True)
class FrameRule:
    phase: str
    funcs: frozenset[str]
    files: tuple[str, ...]
    in_files: tuple[tuple[str, frozenset[str]], ...]  # (path fragment, function names)
    reference: str

    def matches(self, fr: Frame) -> bool:
        if fr.func in self.funcs:
            return True
        path = fr.file.replace("\\", "/")
        if any(frag in path for frag in self.files):
            return True
        return any(fr.func in names and frag in path for frag, names in self.in_files)


@dataclass(frozen=True, slots=True)
class CollectiveRule:
    ops: frozenset[str]
    seq: int | None
    numel: int | None  # the work's NumelIn (a barrier's one element)
    sharded: bool | None
    phase: str
    reference: str


@dataclass(frozen=True, slots=True)
class MarkerRule:
    phase: str | None  # None: a progress mark (training has started)
    needles: tuple[str, ...]
    pattern: re.Pattern[str] | None
    only_before_progress: bool
    reference: str
    ends_in_log: bool = False  # the framework prints where what this opens ends: left open, it is still under way

    def matches(self, text: str) -> bool:
        return any(n in text for n in self.needles) and (self.pattern is None or self.pattern.search(text) is not None)


@dataclass(frozen=True, slots=True)
class TaskRule:
    methods: frozenset[str]
    phase: str
    reference: str


@dataclass(frozen=True, slots=True)
class PhaseRules:
    holds: dict[str, frozenset[str]]
    enclosing: tuple[FrameRule, ...]
    step: tuple[FrameRule, ...]
    collectives: tuple[CollectiveRule, ...]
    markers: tuple[MarkerRule, ...]
    tasks: tuple[TaskRule, ...]
    imports: str | None = None  # the phase of a failure while importing (two innermost frames "<module>")
    fallback: tuple[FrameRule, ...] = ()  # frames that name a phase only where no enclosing or step frame does


# ----------------------------------------------------------------------------- loading


def load_phase_rules(path: str | Path | None = None) -> PhaseRules:
    """The shipped rules (``phases.toml`` next to this module) when ``path`` is None, else the file at ``path``."""
    if path is None:
        text = importlib.resources.files("firstfault.analysis").joinpath("phases.toml").read_text(encoding="utf-8")
        return parse_phase_rules(text, "firstfault/analysis/phases.toml")
    p = Path(path)
    return parse_phase_rules(p.read_text(encoding="utf-8"), str(p))


@lru_cache(maxsize=1)
def rules() -> PhaseRules:
    """The shipped rules, loaded once."""
    return load_phase_rules()


def parse_phase_rules(raw: str, source: str = "<string>") -> PhaseRules:
    """Check the rules' TOML text; every problem is reported at once."""
    try:
        doc = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as e:
        raise PhaseRulesError(source, [f"not valid TOML: {e}"]) from None
    problems: list[str] = [f"unknown top-level key {k!r}" for k in doc if k not in _TOP]
    if doc.get("version") != 1:
        problems.append(f"version must be 1, not {doc.get('version')!r}")
    holds = _holds(doc.get("holds", {}), problems)
    enclosing = tuple(_frame_rules(doc, "enclosing", ENCLOSING_PHASES, problems))
    step = tuple(_frame_rules(doc, "step", STEP_PHASES, problems))
    fallback = tuple(_frame_rules(doc, "fallback", PHASES[:-1], problems))
    collectives = tuple(_collectives(doc, problems))
    markers = tuple(_markers(doc, problems))
    tasks = tuple(_tasks(doc, problems))
    imports = _imports(doc.get("imports"), problems)
    if not enclosing and not step and not any(k in doc for k in ("enclosing", "step")):
        problems.append("no [[enclosing]] or [[step]] rules")
    if problems:
        raise PhaseRulesError(source, problems)
    return PhaseRules(holds, enclosing, step, collectives, markers, tasks, imports, fallback)


def _tables(doc: dict, key: str, problems: list[str]) -> list[tuple[str, dict]]:
    entries = doc.get(key, [])
    if not isinstance(entries, list):
        problems.append(f"{key} must be [[{key}]] tables")
        return []
    out = []
    for i, e in enumerate(entries):
        if isinstance(e, dict):
            out.append((f"{key} #{i}", e))
        else:
            problems.append(f"{key} #{i}: not a table")
    return out


def _strings(where: str, entry: dict, key: str, problems: list[str], required: bool = False) -> tuple[str, ...]:
    v = entry.get(key)
    if v is None:
        if required:
            problems.append(f"{where}: missing key {key!r}")
        return ()
    if not (isinstance(v, list) and all(isinstance(x, str) and x for x in v)):
        problems.append(f"{where}: {key} must be a list of non-empty strings")
        return ()
    if required and not v:
        problems.append(f"{where}: {key} must not be empty")
    return tuple(v)


def _common(where: str, entry: dict, keys: tuple[str, ...], allowed_phases: Iterable[str], problems: list[str],
            phase_required: bool = True) -> tuple[str, str]:
    problems += [f"{where}: unknown key {k!r}" for k in entry if k not in keys]
    phase, ref = entry.get("phase"), entry.get("reference")
    allowed = tuple(allowed_phases)
    if phase is None and not phase_required:
        pass
    elif phase not in allowed:
        problems.append(f"{where}: phase {phase!r} is not one of {', '.join(allowed)}")
    if not (isinstance(ref, str) and ref.strip()):
        problems.append(f"{where}: reference must be a non-empty string (the framework file and function, releases)")
    return str(phase), str(ref)


def _holds(table: object, problems: list[str]) -> dict[str, frozenset[str]]:
    if not isinstance(table, dict):
        problems.append("holds must be a table of phase = [phases]")
        return {}
    out = {}
    for outer, inner in table.items():
        if outer not in STEP_PHASES:
            problems.append(f"holds: {outer!r} is not a step phase ({', '.join(STEP_PHASES)})")
            continue
        if not (isinstance(inner, list) and all(p in STEP_PHASES and p != outer for p in inner)):
            problems.append(f"holds.{outer}: must be a list of other step phases ({', '.join(STEP_PHASES)})")
            continue
        out[outer] = frozenset(inner)
    return out


def _imports(table: object, problems: list[str]) -> str | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        problems.append("imports must be a table with phase and reference")
        return None
    phase, _ = _common("imports", table, ("phase", "reference"), PHASES[:-1], problems)
    return phase


def _frame_rules(doc: dict, key: str, allowed: tuple[str, ...], problems: list[str]) -> Iterable[FrameRule]:
    for where, e in _tables(doc, key, problems):
        before = len(problems)
        phase, ref = _common(where, e, _RULE_KEYS, allowed, problems)
        funcs = _strings(where, e, "funcs", problems)
        files = _strings(where, e, "files", problems)
        in_files: list[tuple[str, frozenset[str]]] = []
        table = e.get("in_files", {})
        if not isinstance(table, dict):
            problems.append(f"{where}: in_files must be a table of \"path fragment\" = [function names]")
            table = {}
        for frag, names in table.items():
            if not frag or not (isinstance(names, list) and names and all(isinstance(n, str) and n for n in names)):
                problems.append(f"{where}: in_files {frag!r} must name a path fragment and a list of function names")
                continue
            if "/" not in frag and ".py" not in frag:
                problems.append(f"{where}: in_files key {frag!r} is no path fragment (it holds no / and no .py): "
                                "a key after [{kind}.in_files] belongs to that table".replace("{kind}", where.split(" ")[0]))
                continue
            in_files.append((frag, frozenset(names)))
        if not (funcs or files or in_files) and len(problems) == before:
            problems.append(f"{where}: names no frame (funcs, files or in_files)")
        if len(problems) == before:
            yield FrameRule(phase, frozenset(funcs), files, tuple(in_files), ref)


def _collectives(doc: dict, problems: list[str]) -> Iterable[CollectiveRule]:
    for where, e in _tables(doc, "collective", problems):
        before = len(problems)
        phase, ref = _common(where, e, _COLLECTIVE_KEYS, PHASES[:-1], problems)
        ops = _strings(where, e, "ops", problems, required=True)
        problems += [f"{where}: op {op!r} is not an OpType name (upper case)" for op in ops
                     if not re.fullmatch(r"_?[A-Z][A-Z_]*", op)]
        seq, numel, sharded = e.get("seq"), e.get("numel"), e.get("sharded")
        if seq is not None and not (isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0):
            problems.append(f"{where}: seq must be a sequence number")
        if numel is not None and not (isinstance(numel, int) and not isinstance(numel, bool) and numel >= 0):
            problems.append(f"{where}: numel must be a count of elements")
        if sharded is not None and not isinstance(sharded, bool):
            problems.append(f"{where}: sharded must be true or false")
        if len(problems) == before:
            yield CollectiveRule(frozenset(ops), seq, numel, sharded, phase, ref)


def _markers(doc: dict, problems: list[str]) -> Iterable[MarkerRule]:
    for where, e in _tables(doc, "marker", problems):
        before = len(problems)
        progress = e.get("progress", False)
        if not isinstance(progress, bool):
            problems.append(f"{where}: progress must be true or false")
        phase, ref = _common(where, e, _MARKER_KEYS, PHASES[:-1], problems, phase_required=not progress)
        if progress and "phase" in e:
            problems.append(f"{where}: a progress mark names no phase")
        if not progress and "phase" not in e:
            problems.append(f"{where}: a marker names a phase, or is a progress mark (progress = true)")
        only = e.get("only_before_progress", False)
        if not isinstance(only, bool):
            problems.append(f"{where}: only_before_progress must be true or false")
        ends = e.get("ends_in_log", False)
        if not isinstance(ends, bool):
            problems.append(f"{where}: ends_in_log must be true or false")
        needles = _strings(where, e, "needles", problems, required=True)
        pattern = None
        raw = e.get("pattern")
        if raw is not None:
            try:
                pattern = re.compile(raw) if isinstance(raw, str) else None
                if pattern is None:
                    problems.append(f"{where}: pattern must be a string")
            except re.error as err:
                problems.append(f"{where}: pattern does not compile: {err}")
        if len(problems) == before:
            yield MarkerRule(None if progress else phase, needles, pattern, bool(only), ref, bool(ends))


def _tasks(doc: dict, problems: list[str]) -> Iterable[TaskRule]:
    for where, e in _tables(doc, "task", problems):
        before = len(problems)
        phase, ref = _common(where, e, _TASK_KEYS, PHASES[:-1], problems)
        methods = _strings(where, e, "methods", problems, required=True)
        if len(problems) == before:
            yield TaskRule(frozenset(methods), phase, ref)


# ----------------------------------------------------------------------------- frames


def _scan(frames: Sequence[Frame], table: tuple[FrameRule, ...], holds: dict[str, frozenset[str]]) -> str | None:
    found = None
    for fr in reversed(frames):  # innermost first
        for rule in table:
            if rule.matches(fr):
                if found is None or found in holds.get(rule.phase, ()):
                    found = rule.phase
                break
    return found


def phase_from_frames(frames: Sequence[Frame], phase_rules: PhaseRules | None = None) -> str | None:
    """The phase the frames show (outermost first, as in a traceback), or None."""
    r = phase_rules or rules()
    found = _scan(frames, r.enclosing, {}) or _scan(frames, r.step, r.holds) or _scan(frames, r.fallback, {})
    if found is None and r.imports is not None and importing(frames):
        return r.imports
    return found


def importing(frames: Sequence[Frame]) -> bool:
    """Whether the frames show an import under way: the two innermost frames of code are module bodies
    (an import statement and the module it runs), or the innermost is one with importlib's loader frames
    inside it (the module it was importing cut off). A paste cut inside the last frame line may keep
    only the start of its name ("<modul")."""
    own = [i for i, fr in enumerate(frames) if not fr.file.startswith("<frozen")]
    if not own or not _module_body(frames[own[-1]].func):
        return False
    if len(own) >= 2 and _module_body(frames[own[-2]].func):
        return True
    return any(fr.file.startswith("<frozen importlib") for fr in frames[own[-1] + 1:])


def _module_body(func: str) -> bool:
    return func == "<module>" or (len(func) >= 4 and "<module>".startswith(func))


# ----------------------------------------------------------------------------- hints

_WORK = re.compile(r"(?:SeqNum=(?P<seq>\d+),\s*)?OpType=(?P<op>_?[A-Z][A-Z_]*)(?:,\s*NumelIn=(?P<numel>\d+))?")


def collective_op(text: str) -> str | None:
    """The collective a watchdog or timeout line names (``OpType=NAME``), or None."""
    m = _WORK.search(text)
    return m.group("op") if m else None


def phase_from_collective(text: str, sharded: bool | None = None, phase_rules: PhaseRules | None = None) -> str | None:
    """The phase the collective named in a watchdog/timeout line points at, or None.

    ``text`` holds ``OpType=NAME`` (and maybe ``SeqNum=N``), as ProcessGroupNCCL's WorkNCCL
    prints them. ``sharded``: True when the job shards its parameters (ZeRO-3, FSDP, FSDP2),
    False or None when it does not or is not known (then an all-gather says nothing).
    """
    m = _WORK.search(text)
    if m is None:
        return None
    op, seq = m.group("op"), int(m.group("seq")) if m.group("seq") else None
    numel = int(m.group("numel")) if m.group("numel") else None
    for rule in (phase_rules or rules()).collectives:
        if op not in rule.ops:
            continue
        if (rule.seq is not None and seq != rule.seq) or (rule.numel is not None and numel != rule.numel):
            continue
        if rule.sharded is not None and rule.sharded is not (sharded is True):
            continue
        return rule.phase
    return None


def gather_ops(phase_rules: PhaseRules | None = None) -> frozenset[str]:
    """ProcessGroupNCCL's OpType names of an all-gather: the collectives phases.toml's param-gather rule names
    (the gathers of sharded parameters or state)."""
    return frozenset().union(*(r.ops for r in (phase_rules or rules()).collectives if r.phase == "param-gather"))


PROGRESS = "progress"  # what phase_from_marker says of a line that shows training under way
COLLECTIVE_HINT = "the collective it timed out in"  # phase_hint's word for a phase from phase_from_collective


def phase_from_marker(text: str, phase_rules: PhaseRules | None = None) -> str | None:
    """The phase one line's marker names (e.g. ``init``), ``PROGRESS`` for a line that shows
    training under way, or None. A line that holds both is the phase marker's."""
    progress = False
    for rule in (phase_rules or rules()).markers:
        if rule.matches(text):
            if rule.phase is not None:
                return rule.phase
            progress = True
    return PROGRESS if progress else None


def phase_before_failure(lines: Iterable[str], phase_rules: PhaseRules | None = None,
                         ended_only: bool = False) -> str | None:
    """The phase the last marker in ``lines`` (the text before a failure, oldest first) names
    when no progress line follows it, else None. Markers marked ``only_before_progress``
    (NCCL communicator set-up) count only while no progress has been seen at all.
    ``ended_only``: of the checkpoint markers only those whose end the framework prints
    (``ends_in_log``): for a silence, where a start without its end line means something. A bar that counts
    fewer steps done than the save's own step (its folder's: global_step60) was drawn before the save began,
    though printed after it (a driver's bar beside its workers' save lines): no progress past the save."""
    r = phase_rules or rules()
    current, seen_progress, saving_step = None, False, None
    for line in lines:
        named = next((m.phase for m in r.markers if m.phase is not None
                      and not (ended_only and m.phase.startswith("checkpoint") and not m.ends_in_log)
                      and not (m.only_before_progress and seen_progress) and m.matches(line)), None)
        if named is not None:
            current = named
            saving_step = _step_of(_SAVED_STEP, line) if named == "checkpoint-save" else None
        elif any(m.phase is None and m.matches(line) for m in r.markers):
            if saving_step is not None and (done := _step_of(_BAR_DONE, line)) is not None and done < saving_step:
                continue  # a bar of the steps before the save's (another process's, printed late): not past it
            current, seen_progress = None, True
    return current


# The step a save is of, from the folder it writes (DeepSpeed's and verl's global_step60, HF's checkpoint-60,
# Megatron's iter_0000060), and the steps a tqdm bar counts done ("59/60 [").
_SAVED_STEP = re.compile(r"(?:global_step_?|checkpoint-|iter_)(\d+)\b")
_BAR_DONE = re.compile(r"\|\s*(\d+)/\d+ \[")


def _step_of(rx: re.Pattern[str], line: str) -> int | None:
    m = rx.search(line)
    return int(m.group(1)) if m else None


def progress_before(lines: Iterable[str], phase_rules: PhaseRules | None = None) -> bool:
    """Whether any of ``lines`` (the text before a failure) is a progress mark: training had started."""
    marks = [m for m in (phase_rules or rules()).markers if m.phase is None]
    return any(m.matches(line) for line in lines for m in marks)


_TASK = re.compile(r"ray::(?:[A-Za-z_]\w*\.)?(?P<method>[A-Za-z_]\w*)\(\)")


def phase_from_task(text: str, phase_rules: PhaseRules | None = None) -> str | None:
    """The phase of the Ray task named in ``text`` (``ray::Actor.method()``), or None.

    verl's fused workers prefix the method with the role (``actor_rollout_generate_sequences``,
    ``ref_compute_ref_log_prob``): a method matches a rule's name or ends with ``_`` + it. When
    the text names several tasks (``ray::g() ... At least one of the input arguments for this
    task could not be computed: ray.exceptions.RayTaskError: ray::f()``), the last is the cause.
    """
    found = _TASK.findall(text)
    if not found:
        return None
    return _task_phase(found[-1], phase_rules or rules())


# verl's driver calls a worker group's method (``self.ref_policy_wg.compute_ref_log_prob(batch)``) through
# the proxy that verl/single_controller/ray/base.py func_generator builds: ``func`` (verl 0.1-0.2),
# ``Functor.__call__`` (0.3+). The traceback's source line above the proxy's frame names the method.
_WG_CALL = re.compile(
    r"\.(?P<method>[A-Za-z_]\w*)\([^\n]*\n(?:[ \t]*[~^]+[ \t]*\n)?[ \t]*"
    r'File "[^"\n]*single_controller/ray/base\.py", line \d+, in (?:func|__call__)\n')


def _task_phase(method: str, r: PhaseRules) -> str | None:
    for rule in r.tasks:
        if any(method == n or method.endswith("_" + n) for n in rule.methods):
            return rule.phase
    return None


_IDENT = re.compile(r"(?<![\w.])(?:ray::)?(?:[A-Za-z_]\w*\.)?(?P<method>[A-Za-z_]\w*_\w+)(?![\w.])")


def phase_from_task_words(text: str, phase_rules: PhaseRules | None = None) -> str | None:
    """The phase of the Ray task or worker method that ``text``, a person's words (an issue's
    title: "TimeOutError when ray::WorkerDict.critic_init_model", "NCCL timeout during
    compute_log_prob"), names as an identifier, without the call's parentheses ``phase_from_task``
    needs; None when it names none, or names methods of different phases. Only snake_case
    identifiers count (every task rule's name has an underscore): a plain word is no method."""
    r = phase_rules or rules()
    found = {p for m in _IDENT.finditer(text) if (p := _task_phase(m.group("method"), r)) is not None}
    return found.pop() if len(found) == 1 else None


def phase_from_worker_call(text: str, phase_rules: PhaseRules | None = None) -> str | None:
    """The phase of the worker group method verl's driver called (the task rules' names), or None.

    The innermost such call in a traceback is the one that failed (``ray.get`` in the proxy raises
    the workers' error: an ActorDiedError, a RayTaskError)."""
    found = [m.group("method") for m in _WG_CALL.finditer(text)]
    return _task_phase(found[-1], phase_rules or rules()) if found else None


# what the marker lines before a failure were, by the phase they name (phase_hint's words for the report)
_MARKED = {"init": "set-up lines", "checkpoint-save": "lines of a save under way",
           "checkpoint-load": "lines of a load under way"}


# An AttributeError of a method the object lacks (Python's "'X' object has no attribute 'name'"): the call of that
# method failed, so where the task rules know its name (verl's compute_log_prob, save_checkpoint) it is the phase
_MISSING_METHOD = re.compile(r"AttributeError: '[\w.]+' object has no attribute '(?P<method>[A-Za-z_]\w*)'")


def phase_hint(failure_text: str, before: Iterable[str] = (), sharded: bool | None = None,
               phase_rules: PhaseRules | None = None) -> tuple[str, str] | None:
    """The phase the hints that are not frames give, and where it came from (for ``phase_from``), or None.

    In order: the Ray task named in ``failure_text``; the worker group method verl's driver called in
    it (``phase_from_worker_call``), or one an AttributeError says its object lacks (the task rules'
    names); the collective named in it (a watchdog
    or timeout line; ``sharded`` as for ``phase_from_collective``); the set-up markers in
    ``before`` (the text printed before the failure, oldest first) with no progress after them.
    """
    r = phase_rules or rules()
    if (p := phase_from_task(failure_text, r)) is not None:
        return p, "the Ray task that failed"
    if (p := phase_from_worker_call(failure_text, r)) is not None:
        return p, "the worker group method the driver called"
    if (m := _MISSING_METHOD.search(failure_text)) is not None and (p := _task_phase(m.group("method"), r)) is not None:
        return p, f"the worker method the caller asked for and its object lacks ({m.group('method')})"
    if (p := phase_from_collective(failure_text, sharded, r)) is not None:
        return p, COLLECTIVE_HINT
    if (p := phase_before_failure(before, r)) is not None:
        return p, f"{_MARKED.get(p, 'lines naming the phase')} before it, with no training progress after them"
    return None
