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

    Thread 3794 (idle): "MainThread"                     (py-spy dump --native)
        clock_nanosleep (libc.so.6)
        time_sleep (libpython3.11.so.1.0)
        forward (hang.py:7)

    Thread 0x00007f063b8786c0 (most recent call first):   (faulthandler)
      File "/w/fh_dump.py", line 5 in data_loader_worker
    Current thread 0x00007f063c5ddb80 (most recent call first):

Frames are kept outermost first, as in a traceback (both tools print the
innermost first), thread after thread, the main thread's last (faulthandler's
``Current thread``, py-spy's ``"MainThread"``): where the process is, for the
phase, is read from the end. Fed line by line like traceback.Assembler.
"""

from __future__ import annotations

import re

from firstfault.analysis.events import Frame
from firstfault.analysis.traceback import END, HELD, MAX_LINES, TAKEN, Traceback

_PYSPY_PROCESS = re.compile(r"Process (?P<pid>\d+): ")
_PYSPY_THREAD = re.compile(r'Thread (?P<tid>\d+) \((?:idle|active|active\+gil|gil)\)(?:: "(?P<name>[^"]*)")?')
_FH_THREAD = re.compile(r"(?P<current>Current thread|Thread) (?P<tid>0x[0-9a-f]+) \(most recent call first\):")
_PYSPY_FRAME = re.compile(r"\s+(?P<func>\S+) \((?P<file>[^():]+):(?P<line>\d+)\)")
# ``py-spy dump --native``: a native frame names its library, no line
# (``    clock_nanosleep (libc.so.6)``, ``    0x7f6dfd0a3f16 (libc.so.6)``): kept in the text only
_PYSPY_NATIVE = re.compile(r"\s{4}\S.* \([^():\s]+\)")
_FH_FRAME = re.compile(r'\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')

# Frames that mean "waiting in a collective or for a peer".
COLLECTIVE_FUNCS = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_to_all", "all_to_all_single", "broadcast",
    "barrier", "monitored_barrier", "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter",
    "send", "recv", "isend", "irecv", "wait", "synchronize", "_all_gather_base", "allreduce_bucket",
})
COLLECTIVE_FILES = ("distributed_c10d.py", "deepspeed/comm/", "torch/distributed/distributed_c10d")


DUMP_MARK = "(most recent call first):"  # in every faulthandler thread header: the agent's cheap pre-check
_DUMP_THREAD = re.compile(r"(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")


def starts_dump(text: str) -> bool:
    """Whether ``text`` (a line without its prefix) opens a faulthandler dump (``faulthandler.enable``,
    as torchelastic's ``@record`` sets it, on a fatal signal; ``register(SIGTERM)``; ``dump_traceback_later``).
    The ``Fatal Python error: ...`` or ``Timeout (...)!`` line before it stays a line of its own."""
    return text.endswith(DUMP_MARK) and _DUMP_THREAD.match(text) is not None


class DumpGrouping:
    """Where one faulthandler dump in a rank log ends (the agent ships it as one ``rank.stacks``
    record): thread headers and their ``  File "...", line N in func`` lines, blank lines between
    threads; like traceback.Grammar, feed() says TAKEN, HELD or END. Create it on a thread header."""

    __slots__ = ("blank",)

    def __init__(self, first: str) -> None:
        self.blank = False

    def feed(self, text: str) -> int:
        if text.startswith("  File \"") or text == "  <no Python frame>" or text.startswith("  ..."):
            if self.blank:
                return END
            return TAKEN
        if not text:
            self.blank = True
            return HELD
        if starts_dump(text):  # the next thread: the blank lines before it are the dump's
            self.blank = False
            return TAKEN
        return END

    step = feed  # what assembly.Assembly calls on any grouping


def is_start(text: str) -> bool:
    """True when a line opens a stack dump."""
    return bool(_PYSPY_PROCESS.match(text) or _FH_THREAD.match(text) or _PYSPY_THREAD.match(text))


def in_collective(frames: tuple[Frame, ...]) -> bool:
    """True when any frame is a collective call or inside torch.distributed's collectives."""
    return any(f.func in COLLECTIVE_FUNCS or any(x in f.file for x in COLLECTIVE_FILES) for f in frames)


class Assembler:
    """One dump: a py-spy process (all its threads) or a faulthandler dump (all threads)."""

    __slots__ = ("_lines", "_threads", "pid", "_blank", "_main")

    def __init__(self, first: str) -> None:
        self._lines = [first]
        self._threads: list[list[Frame]] = []
        self._main: int | None = None  # index of the main thread's frames
        m = _PYSPY_PROCESS.match(first)
        self.pid = int(m.group("pid")) if m else None
        self._blank = False
        if not m:
            self._thread(first)

    def _thread(self, header: str) -> None:
        self._threads.append([])
        if header.startswith("Current thread") or '"MainThread"' in header:
            self._main = len(self._threads) - 1

    def feed(self, text: str) -> bool:
        """Offer the next line; False means the dump ended before it."""
        return self.step(text) != END

    def step(self, text: str) -> int:
        """feed's TAKEN or END (a blank line is taken: two end the dump)."""
        if not text.strip():
            if self._blank:
                return END  # two blank lines: over
            self._blank = True
            return TAKEN
        self._blank = False
        if _PYSPY_THREAD.match(text) or _FH_THREAD.match(text):
            self._thread(text)
        elif text.startswith("Python v") and len(self._lines) == 1:
            pass
        else:
            m = _PYSPY_FRAME.fullmatch(text) or _FH_FRAME.match(text)
            if not m and self._threads and _PYSPY_NATIVE.fullmatch(text):
                pass
            elif not m or not self._threads:
                return END
            else:
                # py-spy 0.4 names functions by qualified name (``Batches.__next__``,
                # ``record.<locals>.wrap.<locals>.wrapper``); a traceback's is the last part
                func = m.group("func").rsplit(".", 1)[-1] or m.group("func")
                self._threads[-1].append(Frame(m.group("file"), int(m.group("line")), func))
        if len(self._lines) < MAX_LINES:
            self._lines.append(text)
        return TAKEN

    @property
    def complete(self) -> bool:
        return any(self._threads)

    def result(self) -> Traceback:
        order = [t for i, t in enumerate(self._threads) if i != self._main]
        if self._main is not None:
            order.append(self._threads[self._main])
        frames = tuple(f for thread in order for f in reversed(thread))
        first = self._lines[0]
        return Traceback(text="\n".join(self._lines), frames=frames, exc_type=None, message=first)
