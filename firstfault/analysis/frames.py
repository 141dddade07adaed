"""The failing frame of a traceback: the innermost frame in the user's own code, and the
frame that raised. Pure.

A frame is the framework's when its file lies in an installed package or the standard
library (``site-packages/``, ``dist-packages/``, ``lib/pythonX.Y/``, ``<frozen ...>``), or in
a framework's own tree (``torch/``, ``deepspeed/``, ...: a source checkout); every other file
is the user's. For ``File "/work/train.py", line 12, in backward`` under
``File ".../site-packages/torch/_tensor.py", line 626, in backward`` the failing frame is
``train.py`` line 12 and the raising one ``torch/_tensor.py`` line 626.

A failure without frames is often one that could print none: a process killed by SIGKILL (the
kernel's OOM killer, the scheduler) or dead by a fault in native code. ``no_frame_reason`` says
so, and how to get the stack next time, instead of leaving the line blank.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from firstfault.analysis.events import Frame

_FRAMEWORK = re.compile(
    r"(?:^|/)(?:site-packages|dist-packages|lib/python\d[\d.]*|lib64/python\d[\d.]*)/"
    r"|^<(?:frozen|string)"
    r"|(?:^|/)(?:torch|deepspeed|transformers|accelerate|megatron|apex|triton|pydantic|numpy)/")


def is_user_frame(f: Frame) -> bool:
    return not _FRAMEWORK.search(f.file.replace("\\", "/"))


def _frame(f: Frame) -> dict:
    return {"file": f.file, "line": f.line, "function": f.func}


def failing_frame(frames: Sequence[Frame]) -> dict | None:
    """``{file, line, function, in_user_code, raising: {file, line, function}}`` of frames listed
    outermost first (a traceback's order): the innermost user frame (else the raising one);
    None without frames."""
    if not frames:
        return None
    raising = frames[-1]
    user = next((f for f in reversed(frames) if is_user_frame(f)), None)
    return {**_frame(user or raising), "in_user_code": user is not None, "raising": _frame(raising)}


# Why a process that died by this signal printed no Python traceback, and how to see where it was.
_NO_FRAME = {
    "SIGKILL": "SIGKILL ends a process before Python can print anything; the stacks of the ranks that "
               "waited for it (py-spy dump; the agent's stacks source takes them on a hang) show where the job stood",
    "SIGSEGV": "it died in native code, where Python prints no traceback; with PYTHONFAULTHANDLER=1 the next "
               "run prints every thread's Python stack at the fault",
    "SIGBUS": "it died in native code, where Python prints no traceback; with PYTHONFAULTHANDLER=1 the next "
              "run prints every thread's Python stack at the fault",
    "SIGABRT": "it aborted in native code, where Python prints no traceback; with PYTHONFAULTHANDLER=1 the next "
               "run prints every thread's Python stack at the abort",
    "SIGILL": "it died in native code, where Python prints no traceback; PYTHONFAULTHANDLER=1 prints the stack",
    "SIGFPE": "it died in native code, where Python prints no traceback; PYTHONFAULTHANDLER=1 prints the stack",
}


def no_frame_reason(signal: str | None, oom_kill: bool) -> str | None:
    """Why a failure shows no frame, for a death by ``signal`` (``SIGKILL``...) or an OOM killer's
    kill (``oom_kill``: always SIGKILL); None when nothing explains it (the log may be cut)."""
    return _NO_FRAME.get("SIGKILL" if oom_kill else signal or "")
