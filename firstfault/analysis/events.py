"""The typed inputs of the analysis: one Event per observation.

Every reader (log files offline, records stored by the collector) turns what it
read into Events; the analysis (catalog, timeline, verdict, checkpoint) works on
Events only and never does I/O. An Event is frozen and made whole: a reader passes
its finished ``fields`` to the constructor (the scanner holds an untimed line until
the next stamp bounds it), and a stage that learns more of an Event (its placed
time, its rank) makes a new one (``dataclasses.replace``).

Time: ``occurred_ns`` is when the thing happened on the (corrected) wall clock,
``observed_ns`` when a reader saw it (file mtime, the agent's receipt time). They
are never mixed: an Event without a timestamp of its own has ``occurred_ns`` None
until the timeline estimates it, and ``clock`` says where ``occurred_ns`` came
from (one of CLOCKS). ``uncertainty_ns`` bounds the error of ``occurred_ns``
(whole-second timestamps carry 1 s, kmsg time converted with an estimated boot
time carries that estimate's error, clock-corrected nodes their offset bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Where an occurred time came from: the line's own timestamp, the kernel's
# monotonic stamp (kmsg, dmesg), the systemd journal, the agent's receipt, or a
# file's modification time.
CLOCKS = ("line", "kmsg", "journal", "agent", "file-mtime")

# What an Event is.
KIND_LINE = "line"  # one log line
KIND_TRACEBACK = "traceback"  # a whole Python traceback, chained parts included
KIND_STACK = "stack"  # a stack dump of a live process (py-spy dump, faulthandler)
KIND_KERNEL = "kernel"  # one kernel message (continuation lines joined)
KIND_RECORD = "record"  # a structured record (torchelastic error.json, agent samples)
KIND_FLIGHT_RECORDER = "flight_recorder"  # one rank's Flight Recorder dump: fields["dump"] (frdump.FRDump)
KIND_STREAM = "stream.summary"  # the last Event of a scanned stream: fields first_ns, last_ns, lines


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a Python traceback: ``File "path", line N, in func``."""

    file: str
    line: int
    func: str


@dataclass(frozen=True, slots=True)
class Event:
    """One observation: a log line, an assembled traceback or a kernel message.

    ``text`` is the message with transport prefixes (``[rank1]:``,
    ``[default0]:``, srun labels, glog headers are kept: the catalog matches on
    the text as the program printed it, minus only the prefixes a launcher
    added). ``origin`` names where it was read (``path:lineno`` or
    ``node/stream/seq``) so a report can point at it; ``seq`` orders Events of
    one stream when times tie.
    """

    text: str
    source: str  # ranklog | kernel | launcher | agent
    kind: str = KIND_LINE
    node: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    job: str | None = None
    occurred_ns: int | None = None
    observed_ns: int | None = None
    clock: str | None = None  # one of CLOCKS, None while occurred_ns is unknown
    uncertainty_ns: int = 0
    origin: str = ""
    stream: str = ""  # the file or agent stream this came from
    seq: int = 0
    level: str | None = None  # INFO, WARNING, ERROR, ... where the line says
    frames: tuple[Frame, ...] = ()  # tracebacks: innermost exception's frames, outermost first
    exc_type: str | None = None  # tracebacks: the final exception's type name
    fields: dict = field(default_factory=dict)
