"""Assemble stack dumps of a live process: py-spy dump and faulthandler.

A hung job's ranks are often dumped (``py-spy dump --pid``, ``faulthandler``
on SIGUSR1 or a timeout, torchelastic's dump before SIGTERM). The rank whose
stack is elsewhere than in a collective is the one the others wait for. Shapes,
captured in tests/data/formats::

    Process 3794: /usr/bin/python -u ddp_hang.py          (py-spy dump)
    Python v3.11.7 (/usr/bin/python3.11)

    Thread 3794 (idle): "MainThread"
        load_next_batch (ddp_hang.py:15)
        main (ddp_hang.py:23)

    Thread 0x00007f063b8786c0 (most recent call first):   (faulthandler)
      File "/w/fh_dump.py", line 5 in data_loader_worker
    Current thread 0x00007f063c5ddb80 (most recent call first):

Frames are kept outermost first, as in a traceback (both tools print the
innermost first). Fed line by line like traceback.Assembler.
"""

from __future__ import annotations

import re

from firstfault.analysis.model import Frame
from firstfault.analysis.traceback import MAX_LINES, Traceback

_PYSPY_PROCESS = re.compile(r"Process (?P<pid>\d+): ")
_PYSPY_THREAD = re.compile(r'Thread (?P<tid>\d+) \((?:idle|active|active\+gil|gil)\)(?:: "(?P<name>[^"]*)")?')
_FH_THREAD = re.compile(r"(?P<current>Current thread|Thread) (?P<tid>0x[0-9a-f]+) \(most recent call first\):")
_PYSPY_FRAME = re.compile(r"\s+(?P<func>\S+) \((?P<file>[^():]+):(?P<line>\d+)\)")
_FH_FRAME = re.compile(r'\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')

# Frames that mean "waiting in a collective or for a peer".
COLLECTIVE_FUNCS = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_to_all", "all_to_all_single", "broadcast",
    "barrier", "monitored_barrier", "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter",
    "send", "recv", "isend", "irecv", "wait", "synchronize", "_all_gather_base", "allreduce_bucket",
})
COLLECTIVE_FILES = ("distributed_c10d.py", "deepspeed/comm/", "torch/distributed/distributed_c10d")


def is_start(text: str) -> bool:
    """True when a line opens a stack dump."""
    return bool(_PYSPY_PROCESS.match(text) or _FH_THREAD.match(text) or _PYSPY_THREAD.match(text))


def in_collective(frames: tuple[Frame, ...]) -> bool:
    """True when any frame is a collective call or inside torch.distributed's collectives."""
    return any(f.func in COLLECTIVE_FUNCS or any(x in f.file for x in COLLECTIVE_FILES) for f in frames)


class Assembler:
    """One dump: a py-spy process (all its threads) or a faulthandler dump (all threads)."""

    __slots__ = ("_lines", "_threads", "pid", "_blank")

    def __init__(self, first: str) -> None:
        self._lines = [first]
        self._threads: list[list[Frame]] = []
        m = _PYSPY_PROCESS.match(first)
        self.pid = int(m.group("pid")) if m else None
        self._blank = False
        if not m:
            self._threads.append([])

    def feed(self, text: str) -> bool:
        """Offer the next line; False means the dump ended before it."""
        if not text.strip():
            if self._blank:
                return False  # two blank lines: over
            self._blank = True
            return True
        self._blank = False
        if _PYSPY_THREAD.match(text) or _FH_THREAD.match(text):
            self._threads.append([])
        elif text.startswith("Python v") and len(self._lines) == 1:
            pass
        else:
            m = _PYSPY_FRAME.fullmatch(text) or _FH_FRAME.match(text)
            if not m or not self._threads:
                return False
            self._threads[-1].append(Frame(m.group("file"), int(m.group("line")), m.group("func")))
        if len(self._lines) < MAX_LINES:
            self._lines.append(text)
        return True

    @property
    def complete(self) -> bool:
        return any(self._threads)

    def result(self) -> Traceback:
        frames = tuple(f for thread in self._threads for f in reversed(thread))
        first = self._lines[0]
        return Traceback(text="\n".join(self._lines), frames=frames, exc_type=None, message=first)
