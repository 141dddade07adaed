"""Rank-log line formats: launcher prefixes, rank labels and timestamps.

Pure functions over one line of text (already decoded). What they recognise,
each seen in real runs (tests/data/real, tests/data/formats):

- torchrun ``--tee`` prefix, local rank: ``[default0]:`` (``[<role><local_rank>]:``)
- PyTorch's worker prefix, global rank: ``[rank1]: RuntimeError: ...``; both stack:
  ``[default0]:[rank0]: Traceback (most recent call last):``
- srun ``--label``: ``12: <text>`` (only when the caller says the stream is labelled,
  since ``12: ...`` is ambiguous on its own)
- DeepSpeed logger: ``[2026-12-02 10:11:59,782] [INFO] [logging.py:123:log_dist] [Rank 0] msg``
- glog (torchelastic agent, c10): ``E1202 10:12:00.462000 4242 torch/.../api.py:1002] msg``, and
  c10's bracketed form (ProcessGroupNCCL, TCPStore): ``[E1203 09:20:10.220000 4000 ProcessGroupNCCL.cpp:632] msg``
- HF transformers logging: ``[INFO|trainer.py:2345] 2026-12-02 10:00:00,123 >> msg``
- ISO-8601 at line start (Python logging's default asctime, many tools):
  ``2026-12-02 10:00:00,123 - INFO - msg`` / ``2026-12-02T10:00:00.123Z ...``
- NCCL debug lines: ``gpu-07:24215:24290 [1] NCCL INFO ...`` (host, pid, tid, CUDA
  device), which name the node and the pid.

Timestamps without a zone are local time of the node that wrote them: the
caller passes that zone (``tz``); glog lines carry no year: the caller passes it.
Invariant: nothing here raises on odd input; unknown shapes give None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo

from firstfault.analysis.prefixes import Peeled, peel

_SRUN = re.compile(r"\s*(?P<label>\d+): ")

_DS = re.compile(
    r"\[(?P<d>\d{4}-\d\d-\d\d) (?P<t>\d\d:\d\d:\d\d)(?:[,.](?P<f>\d{1,9}))?\] \[(?P<level>[A-Z]+)\]"
)
_GLOG = re.compile(
    r"(?P<level>[IWEF])(?P<mo>\d\d)(?P<dd>\d\d) (?P<t>\d\d:\d\d:\d\d)\.(?P<f>\d{1,9}) +(?P<pid>\d+) [^\]\s]+:\d+\] "
)
# c10's own log lines (PyTorch C++: ProcessGroupNCCL, TCPStore), bracketed, the thread id only in some versions:
# "[E1203 09:20:10.220000 4000 ProcessGroupNCCL.cpp:632] " or "[W1202 11:25:07.464507372 TCPStore.cpp:138] "
_C10 = re.compile(
    r"\[(?P<level>[IWEF])(?P<mo>\d\d)(?P<dd>\d\d) (?P<t>\d\d:\d\d:\d\d)\.(?P<f>\d{1,9})(?: +(?P<pid>\d+))? [^\]\s]+:\d+\] "
)
_HF = re.compile(
    r"\[(?P<level>[A-Z]+)\|[^\]]+\] (?P<d>\d{4}-\d\d-\d\d) (?P<t>\d\d:\d\d:\d\d)(?:[,.](?P<f>\d{1,9}))? >> "
)
_ISO = re.compile(
    r"(?P<d>\d{4}-\d\d-\d\d)[ T](?P<t>\d\d:\d\d:\d\d)(?:[,.](?P<f>\d{1,9}))?(?P<z>Z|[+-]\d\d:?\d\d)?\b"
)
_SYSLOG = re.compile(r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) (?P<dd>[ \d]\d) (?P<t>\d\d:\d\d:\d\d)\b")
_MONTH_NUMBER = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}
# NCCL's origin prefix "host:pid:tid [cudaDev] ", then on WARN lines (debug.cc ncclDebugLog) the
# "file:line " of the call, sometimes with its function, before "NCCL".
_NCCL = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
                   r"(?:[\w./+-]+:\d+(?: \(\w+\))? )?NCCL ")
_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "FATAL"}


Prefixes = Peeled  # what a line's prefixes said, and its text without them (prefixes.py)


def strip_prefixes(line: str, *, srun_labels: bool = False, labels: frozenset[str] | set[str] = frozenset()) -> Peeled:
    """Remove the prefixes launchers, collectors and pastes put in front of one line (prefixes.peel)."""
    return peel(line, srun_labels=srun_labels, labels=labels)


@dataclass(frozen=True, slots=True)
class Stamp:
    """A timestamp read from a line: wall ns, its resolution, and what else the header said."""

    ns: int
    uncertainty_ns: int
    level: str | None = None
    pid: int | None = None


def _frac_ns(frac: str | None) -> tuple[int, int]:
    """Nanoseconds of a fractional-second string and the resolution it implies."""
    if not frac:
        return 0, 1_000_000_000
    return int(frac.ljust(9, "0")[:9]), 10 ** (9 - min(len(frac), 9))


def _to_ns(year: int, month: int, day: int, hms: str, frac: str | None, tz: tzinfo) -> tuple[int, int] | None:
    try:
        h, mi, s = (int(x) for x in hms.split(":"))
        dt = datetime(year, month, day, h, mi, s, tzinfo=tz)
    except ValueError:
        return None
    sub, res = _frac_ns(frac)
    return int(dt.timestamp()) * 1_000_000_000 + sub, res


def _zone(z: str | None, default: tzinfo) -> tzinfo:
    if not z:
        return default
    if z == "Z":
        return timezone.utc
    return datetime.strptime(z.replace(":", ""), "%z").tzinfo or default


def parse_stamp(text: str, *, year: int, tz: tzinfo = timezone.utc) -> Stamp | None:
    """The timestamp a line starts with (after prefixes), or None."""
    if not text:
        return None
    c = text[0]
    if c == "[":
        st = _ds_fast(text, tz)
        if st is not None:
            return st
        m = _DS.match(text)
        if m:
            d = m.group("d")
            r = _to_ns(int(d[:4]), int(d[5:7]), int(d[8:10]), m.group("t"), m.group("f"), tz)
            return Stamp(r[0], r[1], m.group("level")) if r else None
        m = _HF.match(text)
        if m:
            d = m.group("d")
            r = _to_ns(int(d[:4]), int(d[5:7]), int(d[8:10]), m.group("t"), m.group("f"), tz)
            return Stamp(r[0], r[1], m.group("level")) if r else None
        m = _C10.match(text)
        if m:
            r = _to_ns(year, int(m.group("mo")), int(m.group("dd")), m.group("t"), m.group("f"), tz)
            if r:
                return Stamp(r[0], r[1], _LEVELS[m.group("level")], int(m.group("pid")) if m.group("pid") else None)
        return None
    if c in "IWEF":
        m = _GLOG.match(text)
        if m:
            r = _to_ns(year, int(m.group("mo")), int(m.group("dd")), m.group("t"), m.group("f"), tz)
            if r:
                return Stamp(r[0], r[1], _LEVELS[m.group("level")], int(m.group("pid")))
        return None
    if c in "JFMASOND":
        m = _SYSLOG.match(text)  # syslog / journald short: "Feb 18 10:48:25", no year, local time
        if m:
            r = _to_ns(year, _MONTH_NUMBER[m.group("mon")], int(m.group("dd")), m.group("t"), None, tz)
            return Stamp(r[0], r[1]) if r else None
        return None
    if c.isdigit():
        m = _ISO.match(text)
        if m:
            d = m.group("d")
            r = _to_ns(int(d[:4]), int(d[5:7]), int(d[8:10]), m.group("t"), m.group("f"), _zone(m.group("z"), tz))
            return Stamp(r[0], r[1]) if r else None
    return None


_MINUTES: dict[tuple[str, tzinfo], int] = {}  # "YYYY-MM-DD HH:MM" -> epoch seconds, per zone


def _ds_fast(text: str, tz: tzinfo) -> Stamp | None:
    """The DeepSpeed logger stamp ``[YYYY-MM-DD HH:MM:SS,mmm] [LEVEL]`` without regex or datetime.

    Scanning a big log parses one stamp per interesting line; whole minutes are
    cached, so this is string slicing and one dict lookup. None: not this shape.
    """
    if len(text) < 28 or text[20] != "," or text[24] != "]" or text[11] != " " or text[25:27] != " [":
        return None
    minute = text[1:17]
    base = _MINUTES.get((minute, tz))
    if base is None:
        r = _to_ns(*_ymd(minute), minute[11:16] + ":00", None, tz) if minute[4] == "-" and minute[7] == "-" else None
        if r is None:
            return None
        base = r[0] // 1_000_000_000
        if len(_MINUTES) > 100_000:
            _MINUTES.clear()
        _MINUTES[(minute, tz)] = base
    sec, ms = text[18:20], text[21:24]
    if not (sec.isdigit() and ms.isdigit()):
        return None
    end = text.find("]", 27)
    level = text[27:end] if end > 0 else None
    return Stamp((base + int(sec)) * 1_000_000_000 + int(ms) * 1_000_000, 1_000_000, level)


def _ymd(minute: str) -> tuple[int, int, int]:
    try:
        return int(minute[:4]), int(minute[5:7]), int(minute[8:10])
    except ValueError:
        return 0, 0, 0


@dataclass(frozen=True, slots=True)
class NcclOrigin:
    host: str
    pid: int
    device: int


def parse_nccl_origin(text: str) -> NcclOrigin | None:
    """Host, pid and CUDA device of an NCCL debug line (``host:pid:tid [dev] [file:line ]NCCL ...``)."""
    m = _NCCL.match(text)
    if not m:
        return None
    return NcclOrigin(m.group("host"), int(m.group("pid")), int(m.group("dev")))


def looks_srun_labelled(lines: list[str]) -> bool:
    """True when most non-empty lines of a sample carry an srun ``--label`` prefix."""
    sample = [ln for ln in lines if ln.strip()][:50]
    if len(sample) < 3:
        return False
    hits = sum(1 for ln in sample if _SRUN.match(ln))
    return hits >= 0.9 * len(sample)


_ELAPSED = re.compile(r"^(?:(\d+):)?(\d+):(\d\d)$")  # tqdm format_interval: "MM:SS" or "H:MM:SS"


def elapsed_s(text: str | None) -> int | None:
    """Seconds of a tqdm bar's elapsed time ("27:15" -> 1635, "1:02:03" -> 3723); None when unreadable."""
    m = _ELAPSED.match(text or "")
    if m is None:
        return None
    h, mins, s = (int(x) if x else 0 for x in m.groups())
    return (h * 60 + mins) * 60 + s
