"""Give the calling thread its Python name in the kernel too (``/proc/PID/task/TID/comm``).

Python 3.11 leaves every thread named after the process, so ``top -H``, ``ps -L`` and
``/proc`` cannot tell the agent's ranklog thread from its shipper. prctl(PR_SET_NAME)
names the calling thread; the kernel keeps 15 bytes. Best effort: a libc without
prctl leaves the name as it was.
"""

import ctypes
import ctypes.util
import threading

PR_SET_NAME = 15
COMM_BYTES = 15

try:
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):  # not glibc/musl on Linux
    _prctl = None


def name_this_thread(name: str | None = None) -> None:
    """Name the calling OS thread ``name`` (default: its Python name), cut to 15 bytes."""
    if _prctl is None:
        return
    raw = (name or threading.current_thread().name).encode("utf-8", "replace")[:COMM_BYTES]
    _prctl(PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)
