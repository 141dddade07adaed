"""Whose code raised it: the category of an exception no signature knows, from its type and
the owner of the frame that raised it. Pure.

The catalog's last resorts (trait ``generic``: a Python exception, a cut traceback; signatures/99-fallback.toml)
take their category from the words of the exception (memory, NaN, a config key...). Where the
words say nothing, the traceback still says whose code raised it, and that with the type says
most (rules in ``EXCEPTIONS`` below, each with the framework code it was checked against)::

    File "/work/train.py", line 88, in main                    <- the user's frames only above
      engine.save_checkpoint(out)
    File ".../site-packages/deepspeed/runtime/zero/stage_1_and_2.py", line 2071, in state_dict
      ...
    IndexError: list index out of range                         -> framework (a bug, a version mismatch)

    File "/work/train.py", line 41, in collate
      ids = [s["input_ids"] for s in batch]
    KeyError: 'input_ids'                                       -> user-code

    File ".../site-packages/transformers/training_args.py", line 1520, in __post_init__
    ValueError: --load_best_model_at_end requires the save and eval strategy to match ...
                                                                -> config

The frame that raised it is the innermost frame that is none of these (``responsible``):
- the standard library (``lib/python3.X/``, ``<frozen ...>``): whoever called ``json.loads`` or
  ``os.environ[...]`` is responsible (``os.environ``'s KeyError: an environment variable not set,
  config, whoever reads it);
- a library's lookup method (``__getattr__``, ``__getitem__``) for AttributeError/KeyError, and the
  library's own code it calls: the code that asked for the name chose it (``torch.nn.Module.__getattr__``
  raises for every missing attribute, pandas' ``DataFrame.__getitem__`` from ``Index.get_loc``);
- a re-raise: torch's ``ExceptionWrapper.reraise`` (DataLoader workers) and ``torch.multiprocessing``'s
  spawn print the original traceback in the message: its frames are used instead.
An exception from a torch op's Python layer (``torch/nn/functional.py``, ``torch/_tensor.py``, layer
``forward``s in ``torch/nn/modules/``, ``torch/_ops.py``) is a kernel's check of its inputs
(``IndexError: index out of range in self``): no owner is blamed. Nor when the frame is a launcher
or a waiter reporting another process's failure (torchrun's agent, ``mp.spawn``'s join, Ray's
``ray.get``, a launcher's ``CalledProcessError``): the category is ``unknown`` there.

Any other installed package (site-packages) is judged as a framework is: its own logic raising a
coding error is its defect; the array libraries' Python layers (numpy, pandas) are op layers.

A traceback cut before its exception line has no type: its last frame, when a framework's own, says
the failure happened under that framework's call (framework, low); an import chain says config.

These are inferences: a finding whose category comes from here keeps the catalog's cap
(medium for python.exception, low for python.traceback) and says in its links which frame
decided and how to confirm.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from firstfault.analysis.catalog import Match
from firstfault.analysis.events import Event, Frame

# Package directory -> owner, for the packages of distributed training. A path is theirs when a
# directory of that name holds the file, installed (site-packages, dist-packages) or a source
# checkout (``Megatron-LM/megatron/core/...``): the package's own import name.
FRAMEWORKS: dict[str, str] = {
    # (package dir: owner)                                      reference: the import package of
    "torch": "torch",                        # pytorch/pytorch torch/ (1.10-2.9)
    "deepspeed": "deepspeed",                # deepspeedai/DeepSpeed deepspeed/ (0.9-0.19)
    "transformers": "transformers",          # huggingface/transformers src/transformers/ (4.x)
    "accelerate": "accelerate",              # huggingface/accelerate src/accelerate/ (0.20-1.x)
    "peft": "peft",                          # huggingface/peft src/peft/
    "trl": "trl",                            # huggingface/trl trl/
    "safetensors": "safetensors",            # huggingface/safetensors bindings/python/py_src/safetensors/
    "megatron": "megatron",                  # NVIDIA/Megatron-LM megatron/core, megatron/training, megatron/legacy
    "nemo": "nemo",                          # NVIDIA/NeMo nemo/
    "nemo_aligner": "nemo",                  # NVIDIA/NeMo-Aligner nemo_aligner/
    "lightning": "lightning",                # Lightning-AI/pytorch-lightning src/lightning/ (2.x)
    "pytorch_lightning": "lightning",        # src/pytorch_lightning/ (1.x, and the 2.x mirror package)
    "lightning_fabric": "lightning",         # src/lightning_fabric/
    "ray": "ray",                            # ray-project/ray python/ray/
    "vllm": "vllm",                          # vllm-project/vllm vllm/
    "flash_attn": "flash_attn",              # Dao-AILab/flash-attention flash_attn/
    "bitsandbytes": "bitsandbytes",          # bitsandbytes-foundation/bitsandbytes bitsandbytes/
    "apex": "apex",                          # NVIDIA/apex apex/
    "transformer_engine": "transformer_engine",  # NVIDIA/TransformerEngine transformer_engine/
    "colossalai": "colossalai",              # hpcaitech/ColossalAI colossalai/
    "coati": "colossalai",                   # ColossalAI applications/ColossalChat coati/
    "torchtitan": "torchtitan",              # pytorch/torchtitan torchtitan/
    "torchtune": "torchtune",                # pytorch/torchtune torchtune/
    "torchdata": "torch",                    # pytorch/data torchdata/
    "verl": "verl",                          # volcengine/verl verl/
    "openrlhf": "openrlhf",                  # OpenRLHF/OpenRLHF openrlhf/
    "llamafactory": "llamafactory",          # hiyouga/LLaMA-Factory src/llamafactory/
    "mmengine": "mmengine",                  # open-mmlab/mmengine mmengine/
    "fairscale": "fairscale",                # facebookresearch/fairscale fairscale/ (sharded DDP, OSS, FSDP's origin)
    "xformers": "xformers",                  # facebookresearch/xformers xformers/
    "triton": "triton",                      # triton-lang/triton python/triton/
}

# A torch op's Python layer: an exception raised here is a kernel's (or its wrapper's) check of the
# inputs it was given (``IndexError: index out of range in self`` from F.embedding, ``TypeError:
# linear(): argument 'input' ...``), not the library's own logic: whose inputs they were is not said.
# torch/nn/modules/module.py is the dispatch of every Module call (``_call_impl``); layers' forward in
# torch/nn/modules/*.py call torch/nn/functional.py (pytorch 1.10-2.9). DeepSpeed's ZeRO-3 puts its own
# linear in place of torch.nn.functional.linear (deepspeed/runtime/zero/partition_parameters.py Init:
# torch.nn.functional.linear = zero3_linear_wrap, runtime/zero/linear.py, 0.9-0.19): an op's layer too.
OP_LAYER = ("torch/nn/functional.py", "torch/functional.py", "torch/_tensor.py", "torch/nn/modules/",
            "deepspeed/runtime/zero/linear.py",
            "torch/_ops.py", "torch/overrides.py", "torch/_refs/", "torch/_decomp/", "torch/_prims/",
            "torch/serialization.py", "torch/cuda/__init__.py", "torch/autograd/",
            "torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py",
            "torch/utils/_contextlib.py", "torch/_dynamo/eval_frame.py",
            # the array libraries' Python layers check the arrays and frames they were given (numpy's
            # fromnumeric/shape_base wrappers of its C functions, pandas' indexing and reshaping)
            "/numpy/", "/pandas/")

# torch's call of a module (Module._call_impl/_wrapped_call_impl and its hooks' inner): a traceback cut there
# stops above the forward that raised, and a training job's modules are mostly a library's.
MODULE_CALL = ("torch/nn/modules/module.py",)
# Calls of the op layer whose errors are seldom a check of the inputs the caller passed: the collectives (a
# timeout's or NCCL's: the network's or another rank's) and CUDA's set-up (the devices, the driver). A traceback
# cut in one says nothing of whose code was wrong.
NOT_INPUT_CHECKS = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py",
                    "torch/cuda/__init__.py")

# Frames that report another process's (or thread's) failure rather than fail themselves: torchrun's
# agent and launcher (torch/distributed/run.py main, launcher/api.py launch_agent raising
# ChildFailedError, elastic/multiprocessing), mp.spawn's join (torch/multiprocessing/spawn.py:
# ProcessRaisedException, ProcessExitedException "process N terminated with signal SIGKILL"), the
# legacy launcher torch/distributed/launch.py (its <module> runs torchrun's main),
# DeepSpeed's and accelerate's launchers (deepspeed/launcher/, accelerate/commands/launch.py raising
# subprocess.CalledProcessError), Ray's ray.get (ray/_private/worker.py, RayTaskError/ActorDiedError),
# torch's ExceptionWrapper.reraise (torch/_utils.py) when the original traceback is not in the message
# (only that function of the file: "path::function").
REPORTERS = ("torch/distributed/run.py", "torch/distributed/launch.py", "torch/distributed/launcher/", "torch/distributed/elastic/",
             "torch/multiprocessing/spawn.py", "torch/_utils.py::reraise", "deepspeed/launcher/",
             "accelerate/commands/", "ray/_private/worker.py", "ray/_private/client_mode_hook.py",
             "ray/_private/auto_init_hook.py")

# Exceptions that report another process's end, raised where it was seen, not where it happened:
# Ray's driver-side wrappers (python/ray/exceptions.py RayTaskError(<cause>), RayActorError,
# ActorDiedError, WorkerCrashedError, 1.x-2.x), torchelastic's ChildFailedError, torch.multiprocessing's
# ProcessRaisedException/ProcessExitedException, subprocess's CalledProcessError (a launcher's child), and
# BrokenPipeError (EPIPE: the process at the other end of a pipe or socket closed it, as a store's peer that ended).
# The last resort's default (the user's code) never holds for them: the cause is in that process's log.
REPORTS = "reports another process's failure"  # the words of every inference that says so (``reports_another``)
REPORTING = frozenset({"RayTaskError", "RayActorError", "ActorDiedError", "WorkerCrashedError", "ChildFailedError",
                       "ProcessRaisedException", "ProcessExitedException", "CalledProcessError", "BrokenPipeError"})

# Lookup methods: the AttributeError/KeyError they raise names what the caller asked for
# (torch/nn/modules/module.py Module.__getattr__: "'{type}' object has no attribute '{name}'").
LOOKUPS = frozenset({"__getattr__", "__getattribute__", "__getitem__", "__missing__", "__delattr__"})

# The category of (exception type, owner of the frame that raised it); the type without its module.
# "user": raised in the user's own file; "framework": in a framework's own module (FRAMEWORKS) or another
# installed package's.
# Types missing here (RuntimeError, Exception, a library's own types) are decided by owner only where a
# framework's own code raised them (OTHER_TYPES): torch raises RuntimeError from C++ for OOM, CUDA and
# NCCL errors wherever Python called it, and the catalog's signatures and words read those first.
# Checked against the frameworks' code: the Python-level errors below, raised by a framework's own
# logic, are its defects or a version it was not written for (DeepSpeed engine.py __getattr__,
# stage_1_and_2.py state_dict indexing, NotImplementedError of an unsupported combination, a
# KeyError of a model type an older transformers' CONFIG_MAPPING lacks (since 4.3x it is re-raised as
# "ValueError: The checkpoint you are trying to load has model type ... but Transformers does not
# recognize this architecture": config, the environment's version, as below)); a bare assert (no
# message) is an internal invariant. A ValueError from a framework is its validation of a value it
# was given (transformers training_args.py __post_init__, accelerate accelerator.py, torch DDP
# __init__, torch rendezvous.py "environment variable RANK expected, but not set"): config. An
# assert WITH a message is validation too, of arguments (DeepSpeed config.py _batch_assertion,
# Megatron arguments.py) or of the call order (Megatron parallel_state "... group is not
# initialized"): its words decide first (signatures/99-fallback.toml category_rule). Where they name no
# class of failure, the owner does: raised in an argument validator (VALIDATORS) it is config, elsewhere in a
# framework's code a check of that framework's own state (ColossalAI low_level_optim.py step "fp32 param and
# grad have different shape", torch/distributed/checkpoint/filesystem.py read_data "... mismatch sizes ...",
# Megatron global_vars.py "args is not initialized" when another package calls it early): framework.
# What to do first, by the category inferred (user-code keeps the fallback's own).
ACTIONS = {
    "framework": ("It failed inside {owner}'s own code, not yours: compare the installed versions of {owner} and the "
                  "packages it works with (pip list) with the versions it supports, and search its issues for the message."),
    "config": ("Check the argument, setting, environment variable or package the message names against {owner}'s "
               "documentation and the job's environment."),
    "unknown": "This process reports another process's failure: read that process's own error in its log.",
}
# Argument validators: an assertion raised here checks a value the user set (Megatron-LM megatron/training/arguments.py
# validate_args, megatron/arguments.py before 2024; DeepSpeed runtime/config.py DeepSpeedConfig._batch_assertion,
# runtime/engine.py _do_args_sanity_check/_do_sanity_check; a dataclass's __post_init__, as transformers' TrainingArguments
# and TRL's configs validate their fields).
VALIDATORS = frozenset({"validate_args", "_batch_assertion", "_do_args_sanity_check", "_do_sanity_check", "__post_init__"})
_BUGS = ("AttributeError", "KeyError", "IndexError", "TypeError", "NotImplementedError", "NameError",
         "UnboundLocalError", "ZeroDivisionError", "RecursionError", "StopIteration")
EXCEPTIONS: dict[str, dict[str, str]] = {
    **{t: {"user": "user-code", "framework": "framework"} for t in _BUGS},
    "AssertionError": {"user": "user-code", "framework": "framework"},  # bare only: see category()
    "ValueError": {"user": "user-code", "framework": "config"},
}
# Any other type (RuntimeError, OSError and its kin, EOFError, a library's own): raised by a framework's own
# logic (not an op's check of its inputs, OP_LAYER, nor a waiter reporting another process, REPORTERS), with
# words that name no class of failure (the catalog's category_rule came first): the failure happened inside
# that framework, on a path the user's frames do not show (DeepSpeed's fused_adam.py multi_tensor_applier
# "RuntimeError: Size mismatch" on resume, Lightning fabric strategies/fsdp.py save_checkpoint's
# FileExistsError, transformers trainer.py's os.renames of a checkpoint another rank already moved).
# Raised in the user's own file, the type says nothing about whose mistake it is: the catalog's own stays.
OTHER_TYPES = {"framework": "framework"}

_STDLIB = re.compile(r"(?:^|/)lib(?:64)?/python\d[\d.]*/(?!(?:site|dist)-packages/)|^<(?:frozen|string)")
_SITE = re.compile(r"(?:^|/)(?:site|dist)-packages/")
_REPRINTED = re.compile(r"^\s*(?:Original Traceback \(most recent call last\):|-- Process \d+ terminated with the "
                        r"following error:)", re.M)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)', re.M)
# a Python exception's own line, "<qualified type>[: <message>]" (traceback.format_exception_only); identify too
EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?::\s?(?P<msg>.*))?$", re.M)
_CANNOT_IMPORT = re.compile(r"cannot import name '(?P<name>[^']+)' from '(?P<module>[^']+)'")
_NO_MODULE = re.compile(r"No module named '(?P<module>[^']+)'")


@dataclass(frozen=True, slots=True)
class Owner:
    kind: str  # user | framework | library | stdlib
    name: str  # the framework's or library's import name; "" for the user and the standard library


@dataclass(frozen=True, slots=True)
class Inference:
    category: str
    frame: Frame | None  # the frame that decided (None: the import chain, no frame of its own)
    owner: Owner | None
    why: str  # one line for the report: what decided, and how to confirm


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def owner_of(path: str) -> Owner:
    """Whose file ``path`` is: the standard library, a framework (FRAMEWORKS), another installed
    library, else the user's. A file named like a framework (``/work/deepspeed.py``) is the user's:
    only a directory of that name holds a framework's files."""
    p = _norm(path)
    if _STDLIB.search(p):
        return Owner("stdlib", "")
    site = list(_SITE.finditer(p))
    parts = p[site[-1].end():].split("/") if site else p.split("/")
    if site and len(parts) > 1 and parts[0].endswith(".egg"):  # an egg: site-packages/deepspeed-0.9.0-py3.10.egg/deepspeed/
        parts = parts[1:]
    dirs = parts[:-1]  # the file's folders, outermost first
    if site:
        top = dirs[0] if dirs else parts[0].removesuffix(".py")
        name = FRAMEWORKS.get(top)
        return Owner("framework", name) if name else Owner("library", top)
    for d in dirs:  # a source checkout or a vendored copy: the outermost framework folder
        if d in FRAMEWORKS:
            return Owner("framework", FRAMEWORKS[d])
    return Owner("user", "")


def in_places(path: str, places: Sequence[str]) -> bool:
    """Whether ``path`` (any separator) holds one of ``places``, parts of paths such as "torch/distributed/"."""
    p = _norm(path)
    return any(x in p for x in places)


def _reports(f: Frame) -> bool:
    """A frame of REPORTERS (``path`` or ``path::function``)."""
    p = _norm(f.file)
    return any(x in p if "::" not in x else (x.split("::")[0] in p and f.func == x.split("::")[1]) for x in REPORTERS)


def reprinted_frames(message: str) -> tuple[Frame, ...]:
    """The frames of an original traceback a re-raise prints in its message (torch's DataLoader
    ``Original Traceback (most recent call last):``, mp.spawn's ``-- Process 0 terminated with the
    following error:``), outermost first; () when the message holds none."""
    m = _REPRINTED.search(message or "")
    if not m:
        return ()
    return tuple(Frame(x.group("file"), int(x.group("line")), x.group("func"))
                 for x in _FRAME.finditer(message, m.end()))


def _reprinted_exception(message: str) -> tuple[str | None, str]:
    m = _REPRINTED.search(message or "")
    if not m:
        return None, ""
    last = None
    for last in EXCEPTION_LINE.finditer(message, m.end()):
        pass
    return (last.group("type"), last.group("msg") or "") if last else (None, "")


def responsible(frames: Sequence[Frame], exc_type: str | None = None) -> Frame | None:
    """The frame whose code raised it: the innermost that is not the standard library, nor (for
    AttributeError/KeyError) a library's or framework's code entered through one of its lookup
    methods (LOOKUPS); None without frames."""
    short = (exc_type or "").rsplit(".", 1)[-1]
    owners = [owner_of(f.file) for f in frames]
    for i in reversed(range(len(frames))):
        if owners[i].kind == "stdlib":
            continue
        if short in ("AttributeError", "KeyError") and owners[i].kind != "user" and _looked_up(frames, owners, i):
            continue  # a library's lookup reports the name its caller asked for (a user's own is the user's code)
        return frames[i]
    return None


def _looked_up(frames: Sequence[Frame], owners: Sequence[Owner], i: int) -> bool:
    """Whether frame ``i`` runs inside a lookup of its own package: a frame of the same owner
    from there outward, with nothing but the standard library between, is a lookup method
    (pandas' ``DataFrame.__getitem__`` raises its KeyError from ``Index.get_loc`` below it)."""
    for f, o in zip(reversed(frames[:i + 1]), reversed(owners[:i + 1])):
        if o.kind == "stdlib":
            continue
        if o != owners[i]:
            return False
        if f.func in LOOKUPS:
            return True
    return False


def _op_caller(frames: Sequence[Frame]) -> tuple[Frame, Owner] | None:
    """The frame that called into torch's op layer (OP_LAYER) where a traceback stops, when that frame is a
    framework's or another installed package's own: the inputs the op refused were that package's. None where the
    caller is the user's file (its inputs, or a paste cut above the frame that raised) or not in the text."""
    for f in reversed(frames):
        o = owner_of(f.file)
        if o.kind == "stdlib" or in_places(f.file, OP_LAYER):
            continue
        return (f, o) if o.kind in PACKAGES else None
    return None


def _env_lookup(frames: Sequence[Frame], short: str) -> bool:
    """os.environ[...] raised it: CPython Lib/os.py _Environ.__getitem__ ``raise KeyError(key) from None``."""
    return short == "KeyError" and bool(frames) and frames[-1].func == "__getitem__" \
        and _norm(frames[-1].file).endswith("/os.py") and owner_of(frames[-1].file).kind == "stdlib"


def _imports_only(frames: Sequence[Frame]) -> bool:
    """The two innermost frames (the standard library's importlib skipped) are module bodies: it
    failed while importing (phases.toml [imports], the same reading)."""
    own = [f for f in frames if owner_of(f.file).kind != "stdlib"]
    return len(own) >= 2 and own[-1].func == "<module>" and own[-2].func == "<module>"


def _said(message: str, exc_type: str | None) -> str:
    """The message without the exception line's own ``Type:`` (a traceback's message starts with it)."""
    text = (message or "").strip()
    for t in filter(None, (exc_type, (exc_type or "").rsplit(".", 1)[-1])):
        if text == t or text.startswith(t + ":"):
            return text[len(t):].lstrip(":").strip()
    return text


_VALUE_WORDS = frozenset({"None", "True", "False", "torch", "Size", "tensor", "dtype", "device", "cuda", "cpu",
                          "float", "float16", "float32", "bfloat16", "half", "int", "int64", "nan", "inf"})


def _explains(said: str) -> bool:
    """Whether an assertion's message is words that explain it (validation: "micro batch size must ...") and not
    only the values it compared (``assert a.shape == b, (a.shape, 0, n)`` prints "(torch.Size([]), 0, 77856768)")."""
    words = [w for w in re.findall(r"[A-Za-z_]{3,}", said) if w not in _VALUE_WORDS]
    return len(words) >= 2


def _where(f: Frame, o: Owner) -> str:
    who = "your own code" if o.kind == "user" else f"{o.name}'s own code"
    return f"{who} ({_norm(f.file).rsplit('/', 3)[-1] if o.kind == 'user' else _tail(f.file)}:{f.line}, in {f.func})"


def _tail(path: str) -> str:
    p = _norm(path)
    site = list(_SITE.finditer(p))
    return p[site[-1].end():] if site else p


def category(exc_type: str | None, message: str, frames: Sequence[Frame]) -> Inference | None:
    """The category of an exception from its type and whose code raised it, or None when that
    says nothing (no frames, a type not in EXCEPTIONS, an op's input check, a framework's explained
    assertion outside its validators). A traceback cut before its exception line (``exc_type`` None)
    is judged by its innermost frame alone, and only when that frame is a framework's or another
    installed package's own (the failure happened under that framework's call;
    a paste may stop above the frame that raised, so a user's frame there says nothing), or when
    it ends in module bodies (an import: config)."""
    inner = reprinted_frames(message)
    if inner:  # a re-raise: the original traceback's frames and exception
        t, msg = _reprinted_exception(message)
        frames, exc_type, message = inner, t or exc_type, msg if t else message
    short = (exc_type or "").rsplit(".", 1)[-1]
    if _env_lookup(frames, short):
        return Inference("config", frames[-1], Owner("stdlib", ""),
                         f"KeyError from os.environ: an environment variable the job reads is not set ({message.strip()[:60]}); "
                         "confirm with env on that node")
    if short in ("ImportError", "ModuleNotFoundError"):
        return _import(short, message, frames)
    if short == "TypeError" and CALL_MISMATCH.search(message):
        return _call_mismatch(frames)
    if exc_type is None and _imports_only(frames):
        return Inference("config", None, None, "the traceback ends in module bodies (an import) and its exception line is "
                         "missing: most often a package missing or at another version; confirm with the exception line "
                         "and pip list on that node")
    f = responsible(frames, exc_type)
    if f is None:
        return None
    o = owner_of(f.file)
    if _reports(f) and o.kind == "framework":
        return Inference("unknown", f, o, f"raised where {o.name} {REPORTS} ({_tail(f.file)}, "
                         "in " f"{f.func}): the cause is in that process's own log")
    if exc_type is None and in_places(f.file, MODULE_CALL):  # cut inside a module's call: a library's forward ran below
        return Inference("framework", f, o, f"inferred from where the paste stops: inside torch's call of a module's "
                         f"forward ({_where(f, o)}), whose frames and exception line are missing; in a training job "
                         "most modules are a library's (transformers, the framework's layers): find that line to confirm")
    if o.kind != "user" and in_places(f.file, OP_LAYER):
        caller = _op_caller(frames) if exc_type is None and not in_places(f.file, NOT_INPUT_CHECKS) else None
        if caller is None:
            return None
        c, co = caller
        return Inference("framework", c, co, f"inferred from whose code made the call: the traceback stops in torch's "
                         f"{_tail(f.file)} ({f.func}), called from {_where(c, co)}, and its exception line is missing; "
                         "an op's check of inputs a framework passed is most often that framework's defect or version: "
                         "find that line to confirm")
    if exc_type is None:  # a cut traceback: whose code was running is all there is
        if o.kind == "user":  # the paste may stop above the frame that raised: a user frame says nothing
            return None
        return Inference("framework", f, o, f"inferred from whose code raised it: the traceback's innermost frame is in {_where(f, o)} "
                         "and its exception line is missing; find that line to confirm")
    rule = EXCEPTIONS.get(short, OTHER_TYPES)
    if short == "AssertionError" and _explains(_said(message, exc_type)) and o.kind != "user" and f.func in VALIDATORS:
        return Inference("config", f, o, f"inferred from where it was raised: an assertion in {_where(f, o)}, which "
                         f"validates the arguments and settings it was given; check the value it names against "
                         f"{o.name}'s documentation to confirm")
    cat = rule.get("user" if o.kind == "user" else "framework")
    if cat is None:
        return None
    if o.kind == "user":
        how = "reproduce that step on one rank to confirm"
    elif cat == "config":
        how = f"check the value it names against {o.name}'s documentation to confirm"
    else:
        how = (f"most often a defect of {o.name} or a version of it the calling code was not written for; "
               "confirm with pip list against the versions the framework pins, or its issue tracker")
    return Inference(cat, f, o, f"inferred from whose code raised it: {short} raised in {_where(f, o)}; {how}")


# An OS error of a rename, replace or link: CPython's OSError str with both paths, "[Errno 2] No such file or
# directory: 'a' -> 'b'" (Objects/exceptions.c OSError_str, filename2). The source was gone or the target in
# the way: another process (a rank on another node sharing the folder) moved it first. Raised by a
# framework's own save (transformers trainer.py _save_checkpoint's os.rename of tmp-checkpoint-N, 4.36),
# that is its defect, not a path the user gave; by the user's code, the words (config) stay.
RENAMED = re.compile(r"\[Errno \d+\] [^:\n]+: '[^'\n]*' -> '")

# A call whose arguments the callee does not take (CPython's TypeError texts of a signature mismatch):
# raised at the caller's frame, before the callee runs.
CALL_MISMATCH = re.compile(r"unexpected keyword argument|missing \d+ required (?:positional|keyword-only) argument"
                           r"|takes (?:from )?\d+ (?:to \d+ )?positional arguments? but \d+ (?:were|was) given"
                           r"|got multiple values for argument")


# Owners whose code is an installed package's (a named framework or any other library): a defect in it, or
# two of them at versions that do not go together, is no fault of the user's script.
PACKAGES = ("framework", "library")


def _call_mismatch(frames: Sequence[Frame]) -> Inference | None:
    """A call with arguments the callee does not take, made by an installed package's own code: two packages
    at versions that do not go together (framework), as an import a framework's module makes of a
    name another package lacks. Made by the user's code, the words (config) stay."""
    f = responsible(frames, "TypeError")
    o = owner_of(f.file) if f is not None else None
    if f is None or o is None or o.kind not in PACKAGES:
        return None
    return Inference("framework", f, o, f"inferred from whose code made the call: {_where(f, o)} passes arguments the "
                     "callee does not take, most often two packages at versions that do not go together; confirm with "
                     f"pip list against the versions {o.name} pins")


def _import(short: str, message: str, frames: Sequence[Frame]) -> Inference:
    """An import that failed: a package missing (config: the environment), or a name or submodule
    another installed package lacks. Imported by an installed package's own module, that is a version
    interaction between two packages (framework); imported by the user's code, the environment
    holds a version the script was not written for (config)."""
    f = responsible(frames, short)
    o = owner_of(f.file) if f is not None else None
    missing = _NO_MODULE.search(message)
    partial = _CANNOT_IMPORT.search(message) or (missing and "." in missing.group("module")
                                                 and missing.group("module").split(".")[0] in FRAMEWORKS)
    if partial and o is not None and o.kind in PACKAGES:
        return Inference("framework", f, o, f"{short} in {_where(f, o)}: an installed package lacks what {o.name} imports, "
                         "a version mismatch between the two; confirm with pip list against the versions it pins")
    return Inference("config", f, o, f"{short}: the environment lacks a package or the version the code imports; "
                     "confirm with pip list on that node")


# An exception no signature knows, shown without a frame of its traceback (a paste of the last line only):
# its words said nothing and no frame says whose code raised it, so the fallback's category is a guess.
UNOWNED = ("no frame of its traceback is in the text, so whose code raised it is not known (a guess: low); its "
           "traceback's innermost frames settle it: the user's file, a framework's, or an op's input check")
# The same for a type that says the code itself is wrong (_CODING, a bare assert): whoever wrote the code that raised
# it. A KeyError names a key the code was given (a dataset's column, a config's entry), a ZeroDivisionError or
# StopIteration a value or the data's end, as often as a defect: those keep the fallback's guess. Under a
# training framework most frames of a step are the framework's (the user's script calls trainer.train() or
# engine.step() and the rest runs in its code), and in public threads' tracebacks that show their frames these types
# were raised in a framework's or library's own code more often than in the user's file: framework is the guess.
_CODING = frozenset(_BUGS) - {"KeyError", "ZeroDivisionError", "StopIteration"}
# RuntimeError is what torch's C++ checks (TORCH_CHECK: a shape, a size, a split that does not fit) and the
# frameworks' own checks raise; a user's script rarely raises it itself. Shown without frames and with words that
# name no class, the frameless ones of the fresh threads (shape mismatches in an optimizer step, a sequence split,
# a rollout engine's refit) were labelled framework in every case read: the same guess as a coding error's, at low.
_LIBRARY_RAISED = frozenset({"RuntimeError"})
UNOWNED_BUG = ("no frame of its traceback is in the text, so whose code raised it is not known (a guess: low); this type "
               "is a coding error, and in a training job most of the code that runs is the frameworks': its "
               "traceback's innermost frames settle it, the user's file or a framework's")
UNOWNED_TYPE = ("no frame of its traceback is in the text, so whose code raised it is not known (a guess: low); its type, "
                "{exc}, is {owner}'s own, which its own code raises (a script seldom raises a library's exception "
                "class): its traceback's innermost frames settle it")
UNOWNED_RUNTIME = ("no frame of its traceback is in the text, so whose code raised it is not known (a guess: low); "
                   "RuntimeError is what torch's checks and the frameworks' own raise, seldom a script itself: its "
                   "traceback's innermost frames settle it, the user's file, a framework's, or an op's input check")
# A call whose arguments the callee does not take (CALL_MISMATCH), with no frame to say who made it: with frames,
# a framework's call is two packages at versions that do not go together (framework) and the user's is the script
# written for another version (config). Without them the guess is the first, at low: a private function's name
# (``_write_item()``) or a worker's wrapper (``Worker failure:``, ``Call to collective_rpc method failed:``) often
# says a library made the call.
UNOWNED_CALL = ("a call whose arguments the callee does not take, and no frame of its traceback in the text says whose "
                "call it was (a guess: low): most often one package calling another at a version it was not written "
                "for; the traceback's innermost frames settle it")
UNOWNED_CALL_ACTION = ("Find which package makes the call the message names (the traceback's innermost frames) and "
                       "compare pip list with the versions it pins: two packages at versions that do not go together "
                       "is the most common cause; if the call is in your own code, fix it for the installed version.")
UNOWNED_ACTION = ("Find this exception's traceback in the rank's whole log (the lines above its last line): its innermost "
                  "frame says whose code raised it, yours or a framework's, and so where to fix it.")


class _Finding(Protocol):
    ev: Event
    match: Match
    links: list[str]
    cap: str | None


F = TypeVar("F", bound=_Finding)


def reports_another(f: F) -> bool:
    """Whether ``owned`` found ``f`` to be a process's report of another's failure (a launcher's, Ray's,
    mp.spawn's exception), not a failure of its own."""
    return f.category == "unknown" and any(REPORTS in link for link in f.links)


def owned(f: F) -> F:
    """``f`` with the category whose code raised it says, where the catalog's last resort matched
    (a signature with the trait ``generic``: a Python exception no signature knows, a traceback cut
    before its exception line, ``cut-traceback``) and its words said nothing; an import error's
    words say config, its owner may say framework, and so may the owner of a call with arguments
    its callee does not take; an exception that reports another process's end
    (REPORTING) is unknown, frames or none. The call site: every finding as it is made
    (findings.read_findings)."""
    sig = f.match.signature
    if "generic" not in sig.traits:
        return f
    groups = f.match.groups
    cut = "cut-traceback" in sig.traits
    exc = None if cut else (groups.get("exc_type") or f.ev.exc_type)
    short = (exc or "").rsplit(".", 1)[-1]
    message = f.ev.fields.get("message") or groups.get("message") or ""
    said = f.match.category != sig.category  # the words named a class of failure (memory, NaN, a config key)
    # where the words say config, whose code it was may still say more: an import, a call with arguments the
    # callee does not take, a rename (no such file) another process raced
    # a TypeError's words, or a wrapper's that quotes them (not a report of another process's end: its words stay)
    mismatch = CALL_MISMATCH.search(message) is not None and short not in REPORTING
    refined = short in ("ImportError", "ModuleNotFoundError") or mismatch or RENAMED.search(message) is not None
    if said and not refined:
        return f  # the words say more
    if short in REPORTING:
        why = f"{short} {REPORTS} where it was seen: the cause is in that process's own log"
        return replace(f, match=replace(f.match, category="unknown"), links=[*f.links, why])
    if not f.ev.frames:  # only the exception line: no owner to refine the words, nor to replace the guess
        if mismatch:
            unowned = replace(f.match, category="framework", signature=replace(sig, first_action=UNOWNED_CALL_ACTION))
            return replace(f, match=unowned, cap="low", links=[*f.links, UNOWNED_CALL])
        if said:
            return f
        unowned = replace(f.match, signature=replace(sig, first_action=UNOWNED_ACTION))
        if short in _CODING or (short == "AssertionError" and not _explains(_said(message, exc))):
            return replace(f, match=replace(unowned, category="framework"), cap="low", links=[*f.links, UNOWNED_BUG])
        if short in _LIBRARY_RAISED:
            return replace(f, match=replace(unowned, category="framework"), cap="low",
                           links=[*f.links, UNOWNED_RUNTIME])
        if (defined := FRAMEWORKS.get((exc or "").split(".", 1)[0])) is not None and "." in (exc or ""):
            return replace(f, match=replace(unowned, category="framework"), cap="low",
                           links=[*f.links, UNOWNED_TYPE.format(exc=exc, owner=defined)])
        return replace(f, match=unowned, cap="low", links=[*f.links, UNOWNED])
    got = category(exc, message, f.ev.frames)
    if got is None or got.category == f.match.category:
        return f
    match = replace(f.match, category=got.category)
    action = ACTIONS.get(got.category)
    if action:  # the fallback's own first action reads the user's code: not where this points
        who = got.owner.name if got.owner is not None and got.owner.name else "the library"
        match = replace(match, signature=replace(sig, first_action=action.replace("{owner}", who)))
    return replace(f, match=match, links=[*f.links, got.why])


__all__ = ["EXCEPTIONS", "FRAMEWORKS", "REPORTING", "Inference", "Owner", "category", "owned", "owner_of",
           "reprinted_frames", "responsible"]
