"""Where a command's text goes: standard output, or a file replaced whole (never half written)."""

from __future__ import annotations

import os
import sys


def write_output(text: str, path: str | None) -> None:
    """``text`` to ``path`` through a temporary file and a rename, or to stdout when ``path`` is None."""
    if not path:
        sys.stdout.write(text)
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
