"""The shell commands of the project's READMEs, as the tests that run them read them.

A README's ```sh blocks hold commands meant to be run as written (one a line; ``\\`` joins
lines; ``#`` starts a comment); ```text blocks hold synopses with placeholders and are not
commands. Tests take each command from here, never from a copy, so a README edit is tested.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READMES = (ROOT / "README.md", *sorted((ROOT / "examples").glob("*/README.md")))
_FENCE = re.compile(r"^```(\w*)\s*$")


def sh_commands(path: Path) -> list[str]:
    """Every command of ``path``'s ```sh blocks, in order, comments and blank lines left out."""
    out, lang, pending = [], None, ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if m := _FENCE.match(line):
            lang = None if lang is not None else m.group(1)
            continue
        if lang != "sh":
            continue
        line = pending + (line.lstrip() if pending else line)
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        code = _strip_comment(line).strip()
        if code:
            out.append(code)
    return out


def _strip_comment(line: str) -> str:
    """The line without a trailing ``# comment`` (a # inside quotes stays)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def all_commands() -> set[tuple[str, str]]:
    """(README path relative to the repository, command) of every README of the project."""
    return {(str(p.relative_to(ROOT)), c) for p in READMES for c in sh_commands(p)}


def command(path: Path, prefix: str) -> str:
    """The command of ``path`` that is ``prefix``, else the one that starts with it."""
    cmds = sh_commands(path)
    found = [c for c in cmds if c == prefix] or [c for c in cmds if c.startswith(prefix)]
    assert len(found) == 1, f"{path}: {len(found)} commands start with {prefix!r}: {found}"
    return found[0]
