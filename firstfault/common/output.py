"""Where a command's text goes: standard output, or a file replaced whole (never half written).

A path that is no regular file (``/dev/null``, ``/dev/stdout``, a FIFO) is written as it is:
replacing it would put a regular file where a device was. A file that cannot be written is
an ``OutputError`` naming it and why, in one line (the commands print it and exit 1);
``check_target`` says so before a long analysis is done for nothing."""

from __future__ import annotations

import os
import stat
import sys


class OutputError(Exception):
    """The output file cannot be written: the message names it and says why."""


def check_target(path: str | None) -> None:
    """OutputError now if ``path``'s folder is missing or not writable (None: stdout, fine)."""
    if not path:
        return
    if _special(path):
        if not os.access(path, os.W_OK):
            raise OutputError(f"cannot write {path}: not writable")
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OutputError(f"cannot write {path}: no folder {folder}")
    if os.path.isdir(path):
        raise OutputError(f"cannot write {path}: it is a folder; give a file name")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {path}: {folder} is not writable")


def write_output(data: str | bytes, path: str | None) -> None:
    """``data`` to ``path`` through a temporary file and a rename, or to stdout when ``path`` is None."""
    if not path:
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
        else:
            sys.stdout.write(data)
        return
    if _special(path):
        try:
            with open(path, "wb") as f:
                f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
        except OSError as e:
            raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
        return
    tmp = f"{path}.tmp"
    try:
        if isinstance(data, bytes):
            with open(tmp, "wb") as f:
                f.write(data)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # never made, or not ours to remove: the error below says what failed
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None


def _special(path: str) -> bool:
    """Whether ``path`` exists and is neither a regular file nor a folder (a device, a FIFO, a socket)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)
