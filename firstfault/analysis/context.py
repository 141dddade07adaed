"""What a DeepSpeed bug report needs, read from the logs (REPORT.md ``context``).

DeepSpeed prints its resolved configuration at initialize, one attribute per
line, from ``DeepSpeedConfig.print`` (deepspeed/runtime/config.py)::

    [2026-12-02 10:11:59,790] [INFO] [config.py:678:print]   zero_config .................. stage=2 contiguous_gradients=True ... offload_param=None offload_optimizer=None ...
    [2026-12-02 10:11:59,790] [INFO] [config.py:678:print]   gradient_accumulation_steps .. 1

and its version from ``deepspeed.initialize``::

    [2026-12-02 10:11:58,100] [INFO] [logging.py:107:log_dist] [Rank 0] DeepSpeed info: version=0.19.8, git-hash=unknown, git-branch=unknown

The DeepSpeed launcher logs the command of every rank it starts
(``process 4242 spawned with command: [...]``, launcher/launch.py) and the
runner its whole command (``cmd = ...``). torchrun prints glog lines from
``torch/distributed/elastic``. Everything here is pure: ``Context.feed`` takes
the text of one line at a time; ``NEEDLES`` are the strings that make a line
worth feeding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

CONFIG_NEEDLE = ":print]   "  # DeepSpeedConfig.print: one resolved config key per line
# Lines only ZeRO stage 3 prints: the engine builds DeepSpeedZeRoOffload (deepspeed/runtime/zero/
# parameter_offload.py) for stage 3 alone, and its __init__ logs them: "Parameter Offload: Total persistent
# parameters: N in M params" (0.9-0.17), "Parameter Offload - Persistent parameters statistics: param_count = N,
# numel = M" (0.18+), see_memory_usage("DeepSpeedZeRoOffload initialize [begin]") (0.9+).
ZERO3_NEEDLES = ("Parameter Offload: Total persistent parameters", "Parameter Offload - Persistent parameters statistics",
                 "DeepSpeedZeRoOffload initialize")
NEEDLES = (
    CONFIG_NEEDLE,
    "DeepSpeed info: version=",
    "spawned with command:",
    "] cmd = ",
    "torch/distributed/elastic/",
    "torch version ",
    "deepspeed install path",
    "ProcessGroupNCCL initialization options: ",
    " nranks ",
    *ZERO3_NEEDLES,
)

# "  {key} {dots} {value}" with 29 - len(key) dots: none (two spaces) for long keys
_ATTR = re.compile(r":print\]\s+(?P<key>\w+) \.* ?(?P<val>.*)$")
_DS_VERSION = re.compile(r"DeepSpeed info: version=(?P<v>[^\s,]+)")
_TORCH_VERSION = re.compile(r"torch version \.+ (?P<v>\S+)")
_CUDA_VERSION = re.compile(r"torch cuda version \.+ (?P<v>\S+)")
_NCCL_VERSION = re.compile(r"NCCL version (?P<v>[\d.]+[^\s]*)")
_PY_VERSION = re.compile(r"/python(?P<v>3\.\d+)/")
_SPAWN = re.compile(r"spawned with command: (?P<cmd>\[.*\])")
_RUNNER_CMD = re.compile(r"\] cmd = (?P<cmd>.+)$")
_KV = re.compile(r"(\w+)=(\S+)")
# The world size as PyTorch and NCCL print it: ProcessGroupNCCL's options (torch 2.x, every process
# group: the largest is the world) and NCCL's init line ("comm 0x.. rank 3 nranks 8 cudaDev 3 ...").
_PG_SIZE = re.compile(r"ProcessGroupNCCL initialization options: (?:NCCL version: [^,]+, )?size: (?P<n>\d+)")
_NRANKS = re.compile(r"\bcomm 0x[0-9a-f]+ rank \d+ nranks (?P<n>\d+) ")

# The REPORT.md context keys that come from the resolved DeepSpeed config.
_CONFIG_KEYS = ("zero_stage", "offload_optimizer", "offload_param", "precision",
                "gradient_accumulation_steps", "train_micro_batch_size_per_gpu",
                "offload_optimizer_pin_memory", "offload_param_pin_memory")
_PRECISION = {"fp16_enabled": "fp16", "float16_config": "fp16", "bfloat16_enabled": "bf16", "bfloat16_config": "bf16"}
# What a bug report asks for that logs alone never carry.
_ALWAYS_MISSING = ("deepspeed.env_report output", "nvidia-smi memory before initialization")


def _value(v: str):
    v = v.strip()
    if v in ("None", "null"):
        return None
    if v in ("True", "False"):
        return v == "True"
    try:
        return int(v)
    except ValueError:
        return v


# "offload_param=DeepSpeedZeroOffloadParamConfig(device='nvme', nvme_path=PosixPath('/x'), ..., pin_memory=True)"
_SECTION = re.compile(r"\w+\((?:[^()]|\([^()]*\))*\)")
_PIN = re.compile(r"\bpin_memory=(True|False)\b")


def _offload_section(val: str, key: str) -> tuple[str | None, bool | None]:
    """(device, pin_memory) of one offload section of the printed zero_config; (None, None) without offload."""
    if f"{key}=" not in val:
        return None, None
    rest = val.split(f"{key}=", 1)[1]
    m = _SECTION.match(rest)
    if not m:
        return None, None
    pin = _PIN.search(m.group(0))
    return _offload(m.group(0)), None if pin is None else pin.group(1) == "True"


def _offload(val: str) -> str | None:
    """'device='cpu' nvme_path=None ...' or 'None' -> 'cpu' | 'nvme' | None."""
    m = re.search(r"device=(?:<OffloadDeviceEnum\.)?'?(?P<d>\w+)", val)
    if not m:
        return None
    d = m.group("d").split(".")[-1]
    return None if d in ("none", "None") else d


@dataclass(slots=True)
class Context:
    versions: dict = field(default_factory=lambda: {
        "deepspeed": None, "torch": None, "cuda": None, "nccl": None, "python": None})
    launcher: str | None = None
    launch_command: str | None = None
    world_size: int | None = None  # DeepSpeed's resolved config says
    seen_size: int | None = None  # the largest process group PyTorch or NCCL reported
    config: dict = field(default_factory=dict)
    sharded_by: str | None = None  # a line only ZeRO-3 prints (ZERO3_NEEDLES): the job shards its parameters

    def feed_paths(self, text: str) -> None:
        """Learn the Python version from the file paths of a traceback."""
        if self.versions["python"] is None:
            m = _PY_VERSION.search(text)
            if m:
                self.versions["python"] = m.group("v")

    def feed(self, text: str) -> None:
        """Learn what one line says (a line holding one of NEEDLES)."""
        if self.sharded_by is None and any(n in text for n in ZERO3_NEEDLES):
            self.sharded_by = text.strip()[:160]
            return
        m = _ATTR.search(text)
        if m:
            self._attr(m.group("key"), m.group("val"))
            return
        v = self.versions
        for key, rx in (("deepspeed", _DS_VERSION), ("torch", _TORCH_VERSION),
                        ("cuda", _CUDA_VERSION), ("nccl", _NCCL_VERSION), ("python", _PY_VERSION)):
            if v[key] is None:
                m = rx.search(text)
                if m:
                    v[key] = m.group("v")
        m = _RUNNER_CMD.search(text)
        if m and "runner.py" in text:
            self.launcher = "deepspeed"
            self.launch_command = m.group("cmd").strip()
            return
        m = _SPAWN.search(text)
        if m:
            self.launcher = self.launcher or "deepspeed"
            if self.launch_command is None:
                self.launch_command = m.group("cmd")
            return
        if "torch/distributed/elastic/" in text and self.launcher is None:
            self.launcher = "torchrun"
        m = _PG_SIZE.search(text) or _NRANKS.search(text)
        if m:
            self.seen_size = max(self.seen_size or 0, int(m.group("n")))

    def _attr(self, key: str, val: str) -> None:
        c = self.config
        if key == "zero_config":
            kv = dict(_KV.findall(val))
            if "stage" in kv:
                c["zero_stage"] = _value(kv["stage"])
            for key in ("offload_param", "offload_optimizer"):
                c[key], c[f"{key}_pin_memory"] = _offload_section(val, key)
        elif key == "zero_optimization_stage":
            c.setdefault("zero_stage", _value(val))
        elif key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu", "train_batch_size"):
            c[key] = _value(val)
        elif key == "world_size":
            ws = _value(val)
            if isinstance(ws, int):
                self.world_size = ws
        elif key in _PRECISION:
            # 0.19: "float16_config ... enabled=False auto_cast=..."; older: "fp16_enabled ... False"
            on = _value(val) is True or val.strip().startswith("enabled=True")
            if on:
                c["precision"] = _PRECISION[key]
            else:
                c.setdefault("precision", None)
                c.setdefault("_precision_seen", set()).add(_PRECISION[key])

    def to_report(self, *, world_size: int | None = None, launcher: str | None = None) -> dict:
        """The report's ``context`` object, with what is missing listed."""
        c = dict(self.config)
        seen = c.pop("_precision_seen", set())
        if c.get("precision") is None and {"fp16", "bf16"} <= seen:
            c["precision"] = "fp32"
        out = {
            "versions": dict(self.versions),
            "launcher": self.launcher or launcher,
            "launch_command": self.launch_command,
            "world_size": self.world_size or world_size or self.seen_size,
        }
        for key in _CONFIG_KEYS:
            out[key] = c.get(key)
        missing = [f"{k} version" for k, v in self.versions.items() if v is None]
        if out["launch_command"] is None:
            missing.append("launcher command")
        if out["world_size"] is None:
            missing.append("world size")
        if "zero_stage" not in c:
            missing.append("resolved DeepSpeed config (DeepSpeed prints it at initialize on rank 0)")
        missing.extend(_ALWAYS_MISSING)
        out["missing"] = missing
        return out
