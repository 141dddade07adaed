"""Where a command's text goes: standard output, or a file replaced whole (never half written).

A file that cannot be written is an ``OutputError`` naming it and why, in one line (the
commands print it and exit 1); ``check_target`` says so before a long analysis is done
for nothing."""

from __future__ import annotations

import os
import sys


class OutputError(Exception):
    """The output file cannot be written: the message names it and says why."""


def check_target(path: str | None) -> None:
    """OutputError now if ``path``'s folder is missing or not writable (None: stdout, fine)."""
    if not path:
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
