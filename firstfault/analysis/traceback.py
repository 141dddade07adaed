"""Assemble multi-line Python tracebacks into one piece of text with its frames.

Fed one line at a time (launcher prefixes already stripped), for one stream and
one rank. Shapes handled, all captured in tests/data/formats:

- plain: ``Traceback (most recent call last):``, ``  File "x.py", line 3, in f``,
  source lines, 3.11 caret lines (``~~~^^^``), then ``ValueError: boom``; an
  exception message may go on over further lines (pydantic's ValidationError).
- chained: a blank line, ``During handling of the above exception, another
  exception occurred:`` or ``The above exception was the direct cause of the
  following exception:``, a blank line, the next ``Traceback ...``.
- exception groups: ``  + Exception Group Traceback (most recent call last):``
  with ``  | `` indented parts.
- rich: a box from ``╭─── Traceback (most recent call last) ───╮`` to ``╰───╯``
  with ``│ /path/x.py:10 in func`` frame lines, then the exception line.

``feed`` says whether it consumed the line; a line it did not consume ends the
traceback and belongs to the caller. Bounded: at most MAX_LINES lines are kept
(the middle is dropped with a marker), so a runaway recursion can not grow memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from firstfault.analysis.model import Frame

MAX_LINES = 400
MAX_MESSAGE_LINES = 30

_FRAME = re.compile(r'\s*(?:\| )*\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_RICH_FRAME = re.compile(r"│ (?P<file>[^\s│]+?):(?P<line>\d+) in (?P<func>[^\s│]+)")
_EXC = re.compile(r"(?:\s*\|\s)?(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure|Fault|Group)|[A-Za-z_][\w]*\.[\w.]*[A-Za-z_]\w*|[A-Z]\w+)(?::\s|:$|$)")
_CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_STARTS = ("Traceback (most recent call last):",)


def is_start(text: str) -> bool:
    """True when a line opens a traceback (plain, exception group or rich)."""
    return (
        text.startswith("Traceback (most recent call last)")
        or text.lstrip().startswith("+ Exception Group Traceback (most recent call last)")
        or (text.startswith("╭") and "Traceback" in text)
    )


@dataclass(slots=True)
class Traceback:
    text: str
    frames: tuple[Frame, ...]
    exc_type: str | None
    message: str  # the final exception line(s), e.g. "ValueError: boom"


class Assembler:
    """State machine for one traceback; create it on a start line."""

    __slots__ = ("_lines", "_dropped", "_frames", "_state", "_exc", "_msg_lines", "_group")

    def __init__(self, first: str) -> None:
        self._lines: list[str] = [first]
        self._dropped = 0
        self._frames: list[Frame] = []
        self._exc: str | None = None
        self._msg_lines: list[str] = []
        self._group = first.lstrip().startswith("+ Exception Group")
        # body: inside frames; message: after the exception line; blank: a blank
        # line after the message (a chain separator may follow)
        self._state = "body"

    def _keep(self, text: str) -> None:
        if len(self._lines) < MAX_LINES:
            self._lines.append(text)
        else:
            self._dropped += 1

    def _frame(self, text: str) -> None:
        m = _FRAME.match(text) or _RICH_FRAME.match(text)
        if m and len(self._frames) < MAX_LINES:
            self._frames.append(Frame(m.group("file"), int(m.group("line")), m.group("func")))

    def feed(self, text: str) -> bool:
        """Offer the next line; False means the traceback ended before it."""
        if self._group:
            if text.startswith((" ", "\t")) or not text:
                self._frame(text)
                if self._exc is None:
                    m = re.match(r"\s*\| (?P<type>[A-Za-z_][\w.]*): ", text)
                    if m:
                        self._exc = m.group("type")
                        self._msg_lines = [text.strip(" |")]
                self._keep(text)
                return True
            return False
        state = self._state
        if state == "body":
            if not text:
                self._keep(text)
                return True
            c = text[0]
            if c in " \t│╭╰":
                self._frame(text)
                self._keep(text)
                return True
            if text.startswith(_STARTS):
                self._keep(text)
                return True
            m = _EXC.match(text)
            if m:
                self._exc = m.group("type")
                self._msg_lines = [text]
                self._keep(text)
                self._state = "message"
                return True
            return False
        if state == "message":
            if not text:
                self._state = "blank"
                return True
            if is_start(text) or _looks_like_record(text) or len(self._msg_lines) >= MAX_MESSAGE_LINES:
                return False
            self._msg_lines.append(text)
            self._keep(text)
            return True
        # state == "blank": only a chain separator (or another blank) continues
        if not text:
            return True
        if text in _CHAIN:
            self._keep("")
            self._keep(text)
            self._state = "body"
            return True
        return False

    @property
    def complete(self) -> bool:
        """True once the exception line has been seen."""
        return self._exc is not None

    def result(self) -> Traceback:
        lines = self._lines
        if self._dropped:
            half = MAX_LINES // 2
            lines = lines[:half] + [f"... [{self._dropped} more traceback lines not kept] ..."] + lines[half:]
        return Traceback(
            text="\n".join(lines),
            frames=tuple(self._frames),
            exc_type=self._exc,
            message="\n".join(self._msg_lines),
        )


_RECORD_START = re.compile(r"\[\d{4}-\d\d-\d\d |[IWEF]\d{4} \d\d:|\d{4}-\d\d-\d\d[ T]\d\d:|\[[A-Z]+\|")


def _looks_like_record(text: str) -> bool:
    """A line that starts a new log record (a logger header) rather than continuing a message."""
    return _RECORD_START.match(text) is not None
