r"""Log text is untrusted: how each report format makes it inert for its medium.

A rank's log line can hold anything a program printed: terminal escape sequences
(``\x1b]0;owned\x07``, ``\x1b[2J``), carriage returns that overwrite what a terminal
showed, Unicode bidirectional overrides that reorder what is read (CVE-2021-42574's
"Trojan Source"), Markdown and HTML (``<img src=x onerror=...>``, ``[click](javascript:..)``,
``# heading``). Everything from a log, a path or a peer goes through these before it
reaches a report:

- ``terminal(s)``: every control character (C0 but tab, DEL, C1), every bidirectional
  control and every line or paragraph separator is shown as an escape (``\x1b``,
  ``\r``, ``\n``, ``\u202e``), so printing the result moves no cursor, sets no title,
  reorders nothing and makes no line of its own. ``terminal_lines(s)`` keeps the text's
  own line breaks (split first), escaping each line.
- ``md_text(s)``: for Markdown inside a line (never at its start): ``terminal``, then ``&``,
  ``<`` and ``>`` as HTML entities (no tag, no comment, no entity of the text's own
  survives) and the marks that start inline Markdown backslash-escaped: ``\ ` * _ [ ] |
  ~`` (no emphasis, link, image, code span, strike-through or table cell), ``# $ @``
  (no heading, no math, no @mention pinging someone where it is pasted); newlines as
  spaces.
- ``md_code(s)``: an inline code span that nothing in ``s`` can close (its backtick fence
  longer than any run of backticks inside; ``|`` escaped for table cells).
- ``md_block(s)``: a fenced code block that nothing in ``s`` can close, its lines through
  ``terminal`` (a Markdown file is also read in terminals).
- ``json_text(doc)``: JSON (exact: it parses back to the same strings) in which every
  character ``terminal`` would escape is a ``\uXXXX`` escape, so the document is inert
  when printed too (json itself escapes only C0 controls).
"""

from __future__ import annotations

import json
import re

# C0 controls but tab, DEL, C1; Unicode line/paragraph separators; bidi embeddings,
# overrides, isolates and marks; the byte-order mark / zero-width no-break space
_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e"
                       "\u2066-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\x1b": "\\x1b"}
_MD_MARKS = re.compile(r"([\\`*_\[\]|~#$@])")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _visible(m: re.Match) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def terminal(s: object) -> str:
    """``s`` as text that is inert in a terminal, on one line (see the module docstring)."""
    return _CONTROLS.sub(_visible, "" if s is None else str(s))


def terminal_lines(s: object) -> list[str]:
    """The lines of ``s`` (its own line breaks), each through ``terminal``."""
    return [terminal(ln) for ln in ("" if s is None else str(s)).splitlines()]


def md_text(s: object) -> str:
    """``s`` as inert Markdown text outside code (see the module docstring)."""
    t = terminal(" ".join(("" if s is None else str(s)).splitlines()))
    t = _MD_MARKS.sub(r"\\\1", t)
    return "".join(_ENTITIES.get(c, c) for c in t)


def md_code(s: object) -> str:
    """An inline code span showing ``s`` (one line; table-safe)."""
    t = terminal(s).replace("|", "\\|")
    fence = "`" * (max((len(r) for r in re.findall("`+", t)), default=0) + 1)
    pad = " " if t.startswith("`") or t.endswith("`") or not t.strip() else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def md_block(s: object) -> str:
    """A fenced code block showing the lines of ``s``."""
    text = "\n".join(terminal_lines(s))
    fence = "`" * max(3, max((len(r) for r in re.findall("`+", text)), default=0) + 1)
    return f"{fence}\n{text}\n{fence}"


_JSON_RAW = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def json_text(doc: object, indent: int | None = 2) -> str:
    """``doc`` as JSON, inert in a terminal (see the module docstring)."""
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}",
                         json.dumps(doc, indent=indent, ensure_ascii=False))
