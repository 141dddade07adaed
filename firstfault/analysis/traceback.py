"""Python tracebacks in log text: the one grammar of where they start and end, and their frames.

Both readers use it: the agent's ranklog source (which lines it ships as one
``rank.traceback`` record) and the analysis (scan.py on files, records.py on what
the agent shipped), so a traceback is the same lines wherever it is read. Fed one
line at a time per launcher prefix (``split_prefix``), with the prefix removed and
the line ``visible`` (what a terminal shows: after the last ``\\r``, no ANSI codes).
Shapes, all in tests/data/formats, tests/data/real and tests/data/fragments::

    [rank1]: Traceback (most recent call last):
    [rank1]:   File "/work/main/tests/realjobs/train.py", line 226, in <module>
    [rank1]:     record(main)()
    [rank1]: ValueError: feature vector has 17 columns, expected 16 (bad record in batch at step 5)

- plain: ``Traceback (most recent call last):``, indented frame and source lines
  (3.11 ``~~~^^^`` lines too), the exception line (``ValueError: ...``,
  ``KeyboardInterrupt``, ``torch.OutOfMemoryError: ...``), then the rest of a
  multi-line message (pydantic's ValidationError, torchrun's ChildFailedError
  table, ZeRO-3's ``Parameter containing:`` / ``tensor(...)``) up to a blank line,
  a line that starts a log record or another traceback, or MAX_MESSAGE_LINES.
- chained: after the message, blank lines, then ``During handling of the above
  exception, another exception occurred:`` or ``The above exception was the direct
  cause of the following exception:`` continue the same traceback.
- exception groups (``  + Exception Group Traceback ...``): every indented line,
  up to the first line that is not indented.
- rich panels (``╭─── Traceback (most recent call last) ───╮``, ``│`` lines,
  ``╰───╯``), then the exception line.
- a fragment: what people paste from the middle of a traceback, without its
  header. Any frame line (``File "x.py", line 3, in f`` indented or not, or a rich
  ``│ /x.py:3 in f`` line) opens one; it goes on as a traceback does.
- a header glued to the end of other output (a progress bar with no newline):
  ``opening`` says where in the line the traceback begins.
- a frame line a terminal wrapped at its width (``File "/long/pa`` then
  ``th.py", line 3, in f``, the cut anywhere before the function): the next line
  is its rest when the two make one frame line; it stays one frame.

A traceback ends before the first line of its prefix that does not continue it
(``Grammar.feed`` returns END); that line is not part of it. Blank lines after the
message are HELD: part of it only if a chain separator follows. Bounded: the
Assembler keeps at most MAX_LINES lines (the middle dropped with a marker).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from firstfault.analysis.events import Frame
from firstfault.analysis.prefixes import peel

MAX_LINES = 400
MAX_MESSAGE_LINES = 30
HEADER = "Traceback (most recent call last)"
# What feed() says about a line.
TAKEN, HELD, END = 0, 1, 2  # part of it; maybe part of it (blank after the message); not part of it
_BODY, _MESSAGE, _BLANK = 0, 1, 2

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
# The same colour codes as a paste carries them once the escape byte is lost: shown as "^[" (cat -v, a terminal's
# copy of a control character) or as U+FFFD (a byte that was not valid UTF-8 where the text was decoded). Only a
# select-graphic-rendition or erase code ("[36m", "[0m", "[K") is taken: "^[[" opens other text too (a regex).
_PASTED_ANSI = re.compile(r"(?:\^\[|\ufffd)\[[0-9;]*[mK]")
FRAME = re.compile(r'\s*(?:\| )*\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
RICH_FRAME = re.compile(r"│ (?P<file>[^\s│]+?):(?P<line>\d+) in (?P<func>[^\s│]+)")
# rich wraps a frame line longer than its panel: the path and line alone, then "in <function>" on the next line
RICH_PATH = re.compile(r"│ (?P<file>[^\s│]+?\.py):(?P<line>\d+) *│$")
_RICH_FUNC = re.compile(r"│ in (?P<func>[^\s│]+) *│$")
_EXC = re.compile(
    r"(?:\s*\|\s)?(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure|Fault|Group)"
    r"|[A-Za-z_]\w*\.[\w.]*[A-Za-z_]\w*|[A-Z]\w+)(?P<wrapped>\([A-Za-z_][\w.]*\))?(?::\s|:$|$)")
_CHAIN = ("During handling of the above exception, another exception occurred:",
          "The above exception was the direct cause of the following exception:")
# A line that starts a new log record (a logger header, glog and c10 lines, NCCL debug lines, a
# dying process's own words, Ray's report of a task's error no one waited for) rather than continuing an
# exception message.
_RECORD = re.compile(
    r"\[\d{4}-\d\d-\d\d[ T]|\[?[IWEF]\d{4} \d\d:|\d{4}-\d\d-\d\d[ T]\d\d:|\[[A-Z]+\|"
    r"|[\w.-]+:\d+:\d+ \[\d+\] |(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]+:"
    r"|Fatal Python error: |terminate called |(?:Current thread|Thread) 0x|srun: |slurmstepd: "
    r"|Unhandled error \(suppress with ")
# A frame line a terminal or a pager wrapped at its width: ``File "<path>`` cut anywhere before its
# function name (in the path, after the quote, inside ``, line N``), the rest on the next line.
_CUT_FILE = re.compile(r'\s*(?:\| )*\s*File "')


def _unwrapped(cut: str | None, text: str) -> re.Match[str] | None:
    """The frame a wrapped frame line makes with the line after it (None: ``text`` is no such rest).
    A terminal's wrap keeps every character; a paste may add a space or trailing blanks at the cut, or
    drop the blank the cut fell on (``, in`` then ``main``)."""
    if cut is None or not text.strip():
        return None
    return (FRAME.match(cut + text) or FRAME.match(cut.rstrip() + text.lstrip())
            or FRAME.match(cut.rstrip() + " " + text.lstrip()))


def _cut_frame(text: str) -> str | None:
    """``text`` when it opens a frame line but is not a whole one (a wrapped frame line's first part)."""
    return text if _CUT_FILE.match(text) and FRAME.match(text) is None else None


def _rich_unwrapped(before: str, text: str) -> re.Match[str] | None:
    """The frame rich's panel wrapped in two: its path and line on ``before``, "in <function>" on ``text``."""
    path = RICH_PATH.match(before.rstrip())
    func = _RICH_FUNC.match(text.rstrip()) if path is not None else None
    if func is None:
        return None
    return RICH_FRAME.match(f"│ {path.group('file')}:{path.group('line')} in {func.group('func')}")


def ends_frame(before: str, text: str) -> bool:
    """Whether ``text`` ends a frame line: a whole one, or the rest of one a terminal wrapped after ``before``."""
    return FRAME.match(text) is not None or _unwrapped(_cut_frame(before), text) is not None


_GLUED = re.compile(r"(?:\[[A-Za-z_][\w.-]*?\d+\]:[ ]?)*Traceback \(most recent call last\):[ \t]*$")
# Bytes in a chunk that say a traceback may open in it (the agent's cheap pre-check): the
# header, a frame line's ``File "``, rich's frame border ``│`` and its top corner ``╭`` (its
# header may be cut by colour escapes).
_HEADER_B, _FRAME_B, _RICH_B = HEADER.encode(), b'File "', ("│".encode(), "╭".encode())


def split_prefix(line: str) -> tuple[str, str]:
    """(who printed ``line``, the line as printed): the key and the text of prefixes.peel
    (``[rank1]: ``, a Ray worker, a collector's time, ...); "" when nothing leads it. A leading
    task number (``12: ``) is taken for srun's label, as a traceback's lines all carry it."""
    p = peel(line, srun_labels=True)
    return p.key, p.text


# A traceback escaped into one string of a line: a JSON value (torchelastic's error file as torchx or a
# launcher prints it, "py_callstack": "Traceback ...\\n  File \\"...\\" ..."; a JSON logger's exc_info) or
# a Python repr. Its lines are the string's escaped newlines.
ESCAPED_HEADER = HEADER + ":\\n"
ESCAPED_HEADER_B = ESCAPED_HEADER.encode()
_ESCAPES = re.compile(r'\\(["\\\'tn])')
_UNESCAPED = {'"': '"', "\\": "\\", "'": "'", "t": "\t", "n": "\n"}


def escaped_lines(line: str) -> list[str]:
    """``line``, which holds an escaped traceback (ESCAPED_HEADER), as the lines its escaped newlines end,
    the quotes, backslashes and tabs in them unescaped; the first keeps what came before the string."""
    return _ESCAPES.sub(lambda m: _UNESCAPED[m.group(1)], line).split("\n")


def visible(line: str) -> str:
    """What a terminal shows of a line: the part after the last carriage return, no ANSI codes (nor the
    colour codes a paste kept without their escape byte)."""
    if "\r" in line:
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if "^[[" in line or "\ufffd[" in line:
        line = _PASTED_ANSI.sub("", line)
    return line


def may_open(data: bytes) -> bool:
    """Whether a traceback can open anywhere in ``data`` (exact: none opens without the
    header, ``File "``, ``│`` or ``╭``). Short needles are slow to search (~0.06 µs per 100-byte
    line each), so each is looked for only where a one-byte search (``"``) or ``isascii``
    says it can be there: ~0.05 µs a line in all, not 0.14."""
    return (_HEADER_B in data or (b'"' in data and _FRAME_B in data)
            or (not data.isascii() and any(m in data for m in _RICH_B)))


def is_start(text: str) -> bool:
    """True when a line (prefix removed) is a traceback header (plain, exception group or rich)."""
    return (text.startswith(HEADER)
            or text.lstrip(" ").startswith("+ Exception Group Traceback (most recent call last)")
            or (text.startswith("╭") and HEADER in text))


def is_frame(text: str) -> bool:
    """True when a line (prefix removed) is a frame line: ``File "x.py", line 3, in f`` or rich's."""
    return FRAME.match(text) is not None or (text.startswith("│") and (RICH_FRAME.match(text) is not None
                                                                        or RICH_PATH.match(text.rstrip()) is not None))


def opening(text: str) -> int | None:
    """Where a traceback opens in a line (prefix removed): 0 for a header or a frame line, the
    offset of a header glued after other output, None when none opens here."""
    if is_start(text) or is_frame(text):
        return 0
    if HEADER in text:
        m = _GLUED.search(text)
        if m and text[:m.start()].strip(" |+-"):  # not the indented parts of an exception group
            return m.start()
    return None


class Grammar:
    """Where one traceback ends; create it on its opening line (prefix removed)."""

    __slots__ = ("state", "group", "after_frame", "message_lines", "chained", "cut_file")

    def __init__(self, first: str) -> None:
        self.state = _BODY
        self.group = first.lstrip(" ").startswith("+ Exception Group")
        self.after_frame = is_frame(first)
        self.message_lines = 0
        self.chained = False  # a chain separator was the last line that said something
        self.cut_file = _cut_frame(first)  # a frame line wrapped before its function name

    def feed(self, text: str) -> int:
        """TAKEN, HELD or END for the next line of this prefix (prefix removed, visible)."""
        state = self.state
        if self.group:
            return TAKEN if not text or text[0] in " \t" else END
        if state == _BODY:
            after, self.after_frame = self.after_frame, False
            cut, self.cut_file = self.cut_file, None
            if _unwrapped(cut, text) is not None:  # the rest of a wrapped frame line
                self.after_frame = True
                return TAKEN
            self.cut_file = _cut_frame(text)
            if text.startswith(HEADER):  # the chain's next part, or another traceback (ranks interleaved)
                if not self.chained:
                    return END
                self.chained = False
                return TAKEN
            if text:
                self.chained = False
            if not text or text[0] in " \t│╭╰":
                self.after_frame = text.startswith(" ") and FRAME.match(text) is not None
                return TAKEN
            if FRAME.match(text):  # a pasted fragment that lost its indentation
                self.after_frame = True
                return TAKEN
            m = _EXC.match(text)
            if m and m.group("wrapped"):  # Ray's RayTaskError(X): the remote traceback's frames follow
                return TAKEN
            if m:
                self.state, self.message_lines = _MESSAGE, 1
                return TAKEN
            return TAKEN if after else END  # the source line of an unindented frame line
        if not text:
            self.state = _BLANK
            return HELD
        if state == _BLANK:
            if text in _CHAIN:
                self.state, self.chained = _BODY, True
                return TAKEN
            return END
        if (self.message_lines >= MAX_MESSAGE_LINES or _RECORD.match(text) or opening(text) is not None):
            return END
        self.message_lines += 1
        return TAKEN

    step = feed  # what assembly.Assembly calls on any grouping


@dataclass(slots=True)
class Traceback:
    text: str
    frames: tuple[Frame, ...]
    exc_type: str | None
    message: str  # the final exception line(s), e.g. "ValueError: boom"
    fragment: bool = False  # it had no header: pasted from the middle of a traceback


class Assembler:
    """One traceback's text, frames and exception; create it on its opening line."""

    __slots__ = ("_lines", "_held", "_dropped", "_frames", "_exc", "_msg_lines", "_grammar", "_fragment")

    def __init__(self, first: str) -> None:
        self._grammar = Grammar(first)
        self._lines: list[str] = [first]
        self._held: list[str] = []
        self._dropped = 0
        self._frames: list[Frame] = []
        self._exc: str | None = None
        self._msg_lines: list[str] = []
        self._fragment = not is_start(first)
        self._frame(first)

    def _keep(self, text: str) -> None:
        if len(self._lines) < MAX_LINES:
            self._lines.append(text)
        else:
            self._dropped += 1

    def _frame(self, text: str) -> None:
        m = FRAME.match(text) or RICH_FRAME.match(text)
        if m is None and len(self._lines) > 1:
            before = self._lines[-2]  # a frame line wrapped in two: a terminal's, or rich's in its panel
            m = _unwrapped(_cut_frame(before), text) or _rich_unwrapped(before, text)
        if m and len(self._frames) < MAX_LINES:
            self._frames.append(Frame(m.group("file"), int(m.group("line")), m.group("func")))

    def feed(self, text: str) -> bool:
        """Offer the next line of this prefix; False means the traceback ended before it."""
        return self.step(text) != END

    def step(self, text: str) -> int:
        """feed's TAKEN, HELD or END (the grammar's verdict)."""
        g = self._grammar
        before = g.state
        verdict = g.feed(text)
        if verdict == END:
            return END
        if verdict == HELD:
            self._held.append(text)
            return HELD
        for h in self._held:
            self._keep(h)
        self._held.clear()
        self._keep(text)
        if g.group:
            self._frame(text)
            if self._exc is None:
                m = re.match(r"\s*\| (?P<type>[A-Za-z_][\w.]*): ", text)
                if m:
                    self._exc, self._msg_lines = m.group("type"), [text.strip(" |")]
        elif g.state == _MESSAGE and before == _BODY:
            self._exc, self._msg_lines = _EXC.match(text).group("type"), [text]
        elif g.state == _MESSAGE:
            self._msg_lines.append(text)
        else:
            self._frame(text)
        return TAKEN

    @property
    def complete(self) -> bool:
        """True once the exception line has been seen."""
        return self._exc is not None

    def result(self) -> Traceback:
        lines = self._lines
        if self._dropped:
            half = MAX_LINES // 2
            lines = lines[:half] + [f"... [{self._dropped} more traceback lines not kept] ..."] + lines[half:]
        return Traceback(text="\n".join(lines), frames=tuple(self._frames), exc_type=self._exc,
                         message="\n".join(self._msg_lines), fragment=self._fragment)


def assemble(lines: list[str]) -> Traceback | None:
    """The traceback that opens on the first of ``lines`` (prefixes removed), or None."""
    if not lines:
        return None
    at = opening(visible(lines[0]))
    if at is None:
        return None
    asm = Assembler(visible(lines[0])[at:])
    for ln in lines[1:]:
        if not asm.feed(visible(ln)):
            break
    return asm.result()
