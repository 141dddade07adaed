"""Memory figures in log lines, and the lines that name a lifecycle point. Pure.

Each parser takes one line's text (launcher prefixes already stripped) and returns
what it says, in bytes, or None. Real shapes (tests/data/real/torchrun-oom-memory-rank1-of-2):

DeepSpeed ``see_memory_usage`` (deepspeed/runtime/utils.py; ``print`` in 0.19, the
logger in other releases, which adds its ``[utils.py:N:see_memory_usage]`` header).
The message line names the point (runtime/engine.py with ``"memory_breakdown": true``:
``Engine before forward`` ... ``Engine after step``; ``DeepSpeed Engine: ...`` at
initialize; ZeRO's ``Before initializing optimizer states`` ...), then::

    MA 0.36 GB         Max_MA 0.36 GB         CA 0.36 GB         Max_CA 0 GB
    CPU Virtual Memory:  used = 1.9 GB, percent = 8.1%

(GB there is 1024**3 bytes; MA/CA are the accelerator's allocated/reserved memory,
the process' RSS under DS_ACCELERATOR=cpu; CPU Virtual Memory is the whole node's.)

DeepSpeed progress (utils/timer.py): ``... MemAllocated=0.38GB, MaxMemAllocated=0.38GB``.

``torch.cuda.memory_summary()`` (torch/cuda/memory.py), rows of a 75-wide table::

    |===========================================================================|
    |                  PyTorch CUDA memory summary, device ID 0                 |
    | Allocated memory      |  12345 KiB |  23456 KiB |  99999 KiB |  87654 KiB |
    | GPU reserved memory   |  40960 KiB |  40960 KiB |  40960 KiB |      0 B   |

The CUDA OOM message (c10/cuda/CUDACachingAllocator.cpp; ``capacty`` in some 2.1
releases; the ``(GPU 0; ... total capacity; ...)`` form before 2.1)::

    CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.10 GiB of which
    1.02 GiB is free. Process 24215 has 78.07 GiB memory in use. Of the allocated memory 75.31 GiB is
    allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated.

The kernel's memcg OOM report (mm/memcontrol.c, mm/oom_kill.c)::

    memory: usage 1048576kB, limit 1048576kB, failcnt 1451
    Memory cgroup out of memory: Killed process 16582 (python3) total-vm:1981788kB, anon-rss:1053296kB, file-rss:103868kB, shmem-rss:0kB, ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1 << 30
_UNITS = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50,
          "kB": 1 << 10, "GB": 1 << 30}

# Literal strings that make a rank-log line worth reading for memory (scan.Needles).
NEEDLES = (
    "Max_MA ", "CPU Virtual Memory:", "MemAllocated=", "| Allocated memory ", "| GPU reserved memory ",
    "PyTorch CUDA memory summary, device ID",
    "Engine before ", "Engine after ", "DeepSpeed Engine: ",
    "initializing optimizer states", "initializing ZeRO optimizer", "Stage 3 initialize ",
    "DeepSpeedZeRoOffload initialize ", "GatheredParameters",
)

_SEE = re.compile(r"\bMA (?P<ma>[\d.]+) GB\s+Max_MA (?P<max_ma>[\d.]+) GB\s+CA (?P<ca>[\d.]+) GB\s+Max_CA (?P<max_ca>[\d.]+) GB")
_VM = re.compile(r"CPU Virtual Memory:\s+used = (?P<used>[\d.]+) GB, percent = (?P<pct>[\d.]+)%")
_PROGRESS = re.compile(r"MemAllocated=(?P<ma>[\d.]+)GB, MaxMemAllocated=(?P<max>[\d.]+)GB")
_SUMMARY = re.compile(r"^\|\s*(?P<what>Allocated memory|GPU reserved memory)\s+\|\s*(?P<cur>\d+) (?P<cu>B|KiB|MiB|GiB|TiB|PiB)\s*"
                      r"\|\s*(?P<peak>\d+) (?P<pu>B|KiB|MiB|GiB|TiB|PiB)\s*\|")
_SUMMARY_DEVICE = re.compile(r"PyTorch CUDA memory summary, device ID (?P<gpu>\d+)")
_SIZE = r"[\d.]+ (?:bytes|KiB|MiB|GiB|TiB|PiB)"
_OOM = re.compile(
    rf"out of memory\. Tried to allocate (?P<want>{_SIZE})\. GPU (?P<gpu>\d+) has a total capac(?:i)?ty of (?P<total>{_SIZE})"
    rf"(?: of which (?P<free>{_SIZE}) is free\.)?.*?Of the allocated memory (?P<alloc>{_SIZE}) is allocated by PyTorch, "
    rf"and (?P<unalloc>{_SIZE}) is reserved by PyTorch but unallocated", re.S)
_OOM_OLD = re.compile(
    rf"out of memory\. Tried to allocate (?P<want>{_SIZE}) \(GPU (?P<gpu>\d+); (?P<total>{_SIZE}) total capacity; "
    rf"(?P<alloc>{_SIZE}) already allocated; (?P<free>{_SIZE}) free; (?P<reserved>{_SIZE}) reserved in total by PyTorch\)")
_MEMCG = re.compile(r"^memory: usage (?P<usage>\d+)kB, limit (?P<limit>\d+)kB, failcnt \d+")
_KILLED = re.compile(r"Killed process (?P<pid>\d+) \([^)]*\) total-vm:\d+kB, anon-rss:(?P<anon>\d+)kB, "
                     r"file-rss:(?P<file>\d+)kB, shmem-rss:(?P<shmem>\d+)kB")

# see_memory_usage messages -> (phase, "open" | "close"); checked in order, first hit wins.
_POINTS = (
    ("Engine before forward", "forward", "open"), ("Engine after forward", "forward", "close"),
    ("Engine before backward", "backward", "open"), ("Engine after backward", "backward", "close"),
    ("Engine before step", "optimizer-step", "open"), ("Engine after step", "optimizer-step", "close"),
    ("before GatheredParameters", "param-gather", "open"), ("after GatheredParameters", "param-gather", "close"),
    ("DeepSpeed Engine: ", "init", "open"), ("initializing optimizer states", "init", "open"),
    ("initializing ZeRO optimizer", "init", "open"), ("Stage 3 initialize ", "init", "open"),
    ("DeepSpeedZeRoOffload initialize ", "init", "open"),
)


def _size(s: str) -> int:
    num, unit = s.split()
    return int(float(num) * _UNITS[unit])


@dataclass(frozen=True, slots=True)
class Figure:
    """One memory figure: ``series`` (memory.SERIES), bytes, and what bounds it."""

    series: str
    value: int
    limit: int | None = None
    peak: int | None = None  # the highest value since the last figure, where the line says
    gpu: int | None = None
    pid: int | None = None  # the process it belongs to, where the line names it (kernel)


def figures(text: str) -> list[Figure]:
    """The memory figures one line holds (an empty list for most lines)."""
    out: list[Figure] = []
    if "Max_MA " in text and (m := _SEE.search(text)):
        out.append(Figure("allocated", int(float(m["ma"]) * GIB), peak=int(float(m["max_ma"]) * GIB)))
        out.append(Figure("reserved", int(float(m["ca"]) * GIB)))
    elif "CPU Virtual Memory:" in text and (m := _VM.search(text)):
        used = int(float(m["used"]) * GIB)
        pct = float(m["pct"])
        out.append(Figure("host_used", used, limit=int(used * 100 / pct) if pct > 0 else None))
    elif "MemAllocated=" in text and (m := _PROGRESS.search(text)):
        out.append(Figure("allocated", int(float(m["ma"]) * GIB), peak=int(float(m["max"]) * GIB)))
    elif text.startswith("|") and (m := _SUMMARY.match(text)):
        series = "allocated" if m["what"] == "Allocated memory" else "reserved"
        out.append(Figure(series, int(m["cur"]) * _UNITS[m["cu"]], peak=int(m["peak"]) * _UNITS[m["pu"]]))
    elif "out of memory" in text and (m := _OOM.search(text)):
        alloc, total = _size(m["alloc"]), _size(m["total"])
        out.append(Figure("allocated", alloc, limit=total, gpu=int(m["gpu"])))
        out.append(Figure("reserved", alloc + _size(m["unalloc"]), limit=total, gpu=int(m["gpu"])))
    elif "out of memory" in text and (m := _OOM_OLD.search(text)):
        total = _size(m["total"])
        out.append(Figure("allocated", _size(m["alloc"]), limit=total, gpu=int(m["gpu"])))
        out.append(Figure("reserved", _size(m["reserved"]), limit=total, gpu=int(m["gpu"])))
    elif text.startswith("memory: usage ") and (m := _MEMCG.match(text)):
        out.append(Figure("cgroup", int(m["usage"]) << 10, limit=int(m["limit"]) << 10))
    elif "Killed process " in text and (m := _KILLED.search(text)):
        rss = (int(m["anon"]) + int(m["file"]) + int(m["shmem"])) << 10
        out.append(Figure("rss", rss, pid=int(m["pid"])))
    return out


def summary_device(text: str) -> int | None:
    """The GPU a ``torch.cuda.memory_summary()`` table that starts here is about."""
    m = _SUMMARY_DEVICE.search(text)
    return int(m["gpu"]) if m else None


def point(text: str) -> tuple[str, str, str] | None:
    """(phase, "open" | "close", message) when the line is a see_memory_usage message that names a point."""
    if len(text) > 200:
        return None
    for needle, phase, what in _POINTS:
        if needle in text:
            return phase, what, text.strip()
    return None
