"""The failing frame of a traceback: the innermost frame in the user's own code, and the
frame that raised. Pure.

A frame is the framework's when its file lies in an installed package or the standard
library (``site-packages/``, ``dist-packages/``, ``lib/pythonX.Y/``, ``<frozen ...>``), or in
a framework's own tree (``torch/``, ``deepspeed/``, ...: a source checkout); every other file
is the user's. For ``File "/work/train.py", line 12, in backward`` under
``File ".../site-packages/torch/_tensor.py", line 626, in backward`` the failing frame is
``train.py`` line 12 and the raising one ``torch/_tensor.py`` line 626.
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
