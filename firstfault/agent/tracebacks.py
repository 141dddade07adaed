"""Which rank-log lines make up one Python traceback: the agent's grouping rule. Pure.

The ranklog source ships a whole traceback as one ``rank.traceback`` record; this
module only decides where one starts and ends (the collector's analysis reads its
frames and exception, firstfault/analysis/traceback.py). Lines are text as shipped
(decoded, launcher prefixes still on). Shapes, all in tests/data/formats and
tests/data/real::

    [rank1]: Traceback (most recent call last):
    [rank1]:   File "/work/main/tests/realjobs/train.py", line 226, in <module>
    [rank1]:     record(main)()
    [rank1]: ValueError: feature vector has 17 columns, expected 16 (bad record in batch at step 5)

- plain: ``Traceback (most recent call last):``, indented frame and source lines
  (3.11 ``~~~^^^`` lines too), through the exception line (``ValueError: ...``,
  ``KeyboardInterrupt``, ``torch.OutOfMemoryError: ...``).
- chained: after the exception line, blank lines, then ``During handling of the
  above exception, another exception occurred:`` or ``The above exception was the
  direct cause of the following exception:`` continue the same traceback.
- exception groups (``  + Exception Group Traceback ...``): every indented line,
  up to the first line that is not indented.
- rich panels (``╭─── Traceback (most recent call last) ───╮``, ``│`` lines,
  ``╰───╯``), then the exception line.
- launcher prefixes (``[rank1]:``, ``[default0]:``, stacked): a traceback is
  followed per prefix (``prefix_of``), so the ranks of a torchrun console that
  interleave their tracebacks each get their own.

- faulthandler dumps (``faulthandler.enable``, as torchelastic's ``@record`` sets it, on
  a fatal signal; ``faulthandler.register(SIGTERM)``; ``dump_traceback_later``):
  ``Thread 0x... (most recent call first):`` / ``Current thread 0x... (most recent call
  first):`` blocks of ``  File "...", line N in func`` lines, blank lines between threads
  (``DumpGrouping``; ranklog ships one as ``rank.stacks``). The ``Fatal Python error: ...``
  or ``Timeout (...)!`` line before it stays a line of its own.

A traceback ends before the first line of its prefix that does not continue it;
that line is not part of it (``feed`` returns END). Known issues: a multi-line
exception message (pydantic's ValidationError) keeps only its first line in the
traceback, the rest are lines of their own; a traceback cut off without an
exception line (the process killed while printing) ends at the next unindented
line of its prefix.
"""

from __future__ import annotations

import re

START_MARK = "Traceback (most recent call last)"  # in every start line: a cheap pre-check
DUMP_MARK = "(most recent call first):"  # in every faulthandler thread header
_DUMP_THREAD = re.compile(r"(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")
_PREFIX = re.compile(r"(?:\[[^\]\s]{1,64}\]: ?)*")
_EXC = re.compile(r"[A-Za-z_][\w.]*(?::|$)")
_CHAIN = ("During handling of the above exception, another exception occurred:",
          "The above exception was the direct cause of the following exception:")
_BODY_FIRST = " \t│╭╰"

# What feed() says about a line.
TAKEN, HELD, END = 0, 1, 2  # part of it; maybe part of it (blank after the exception); not part
_BODY, _MESSAGE, _BLANK = 0, 1, 2


def prefix_of(line: str) -> str:
    """The launcher prefixes at the start of ``line`` (``[rank1]: ``), "" if none."""
    return _PREFIX.match(line).group()


def starts(text: str) -> bool:
    """Whether ``text`` (a line without its prefix) opens a traceback."""
    return (text.startswith("Traceback (most recent call last):")
            or text.lstrip(" ").startswith("+ Exception Group Traceback (most recent call last):")
            or (text.startswith("╭") and START_MARK in text))


def starts_dump(text: str) -> bool:
    """Whether ``text`` (a line without its prefix) opens a faulthandler dump."""
    return text.endswith(DUMP_MARK) and _DUMP_THREAD.match(text) is not None


class DumpGrouping:
    """One faulthandler dump being assembled; create it on a thread header line."""

    __slots__ = ("state",)

    def __init__(self, first: str) -> None:
        self.state = _BODY

    def feed(self, text: str) -> int:
        if text.startswith("  File \"") or text == "  <no Python frame>" or text.startswith("  ..."):
            if self.state == _BLANK:
                return END
            self.state = _BODY
            return TAKEN
        if not text:
            self.state = _BLANK
            return HELD
        if starts_dump(text):  # the next thread: the blank lines before it are the dump's
            self.state = _BODY
            return TAKEN
        return END


class Grouping:
    """One traceback being assembled; create it on a start line (without its prefix)."""

    __slots__ = ("state", "group")

    def __init__(self, first: str) -> None:
        self.state = _BODY
        self.group = first.lstrip(" ").startswith("+ Exception Group")

    def feed(self, text: str) -> int:
        """TAKEN, HELD (blank lines after the exception line: part of it only if a chain
        separator follows; END releases them) or END for the next line (prefix removed)."""
        state = self.state
        if state == _BODY:
            if not text or text[0] in _BODY_FIRST or text.startswith("Traceback (most recent call last):"):
                return TAKEN
            if self.group or _EXC.match(text) is None:
                return END
            self.state = _MESSAGE
            return TAKEN
        if not text:
            self.state = _BLANK
            return HELD
        if state == _BLANK and text in _CHAIN:
            self.state = _BODY
            return TAKEN
        return END
