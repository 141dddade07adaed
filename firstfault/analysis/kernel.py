"""Kernel log parsers: every text form of the kernel ring buffer into Events.

Reads one format per input (``detect_kernel_format`` picks it from the first lines);
real lines from tests/data/kernel/:
  kmsg               ``3,419,923449922,-;Memory cgroup out of memory: Killed process 8333 (python3) ...``
                     (/dev/kmsg, one read() per record, then `` SUBSYSTEM=pci``-style lines)
  dmesg              ``[  923.449306] python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), ...``
                     and dmesg -r ``<3>[  924.000137] NVRM: GPU at PCI:0000:3b:00: GPU-8a47...``
  dmesg-T            ``[Wed Dec  2 11:12:24 2026] oom-kill:constraint=CONSTRAINT_MEMCG,...``
  dmesg-iso          ``2026-12-02T11:12:25,010021+00:00 NVRM: Xid (PCI:0000:3b:00): 13, ...``
  journal-short      ``Dec 02 11:12:25 vm kernel: NVRM: GPU Board Serial Number: 1650121012345`` (-precise too)
  journal-short-iso  ``2026-12-02T11:12:25+0000 vm kernel: ...`` (and -o short-iso-precise)
  journal-json       journalctl -o json, one object per line; MESSAGE a string or a byte list
  journal-export     journalctl -o export: ``KEY=value``, or ``KEY\\n<le64 length><bytes>\\n`` when
                     binary, a blank line after each entry. Feed it bytes lines (``open(p, "rb")``).
Event.fields: format, mono_ns (kernel stamp), seq, flags (kmsg), priority, facility,
SUBSYSTEM, DEVICE, hostname, boot_id, cursor (journal), where the input has them.

Time (occurred_ns, clock, uncertainty_ns):
  kmsg, dmesg: occurred_ns = boot_wall_ns + mono_ns (clock "kmsg", 1 µs +
    boot_uncertainty_ns) only when boot_wall_ns is given, else None.
  dmesg-T, dmesg-iso: clock "line", local time in ``tz`` / the printed offset. dmesg adds
    the whole seconds of its boot time (util-linux record_time), -T also drops the
    stamp's fraction: the true time is in [printed, printed + 2 s) for -T, [printed,
    printed + 1 s) for iso; those are the uncertainties.
  journal-*: __REALTIME_TIMESTAMP, when journald read the record (clock "journal", also
    observed_ns); short formats: whole seconds (1 s) or µs (-precise). short has no
    year: pass ``year`` (None: occurred_ns None); a month going back past December
    starts the next year.

Invariants: ``text`` is the message as printed, nothing interpreted (Xid tables, pids
are the catalog's). kmsg's \\xNN escapes (its transport encoding) are undone, bytes that
are not UTF-8 stay \\xNN; dmesg and journalctl text is kept as they printed it.
Continuation lines belong to their record: kmsg dictionary lines become fields, an
indented dmesg/journalctl line joins the message with "\\n". node: the journal's
_HOSTNAME / short host, else ``node``. Lines not understood are skipped and counted in
ParseStats; input never raises. Pure: no I/O, no clock reads.

Known issues: util-linux 2.38 ``dmesg -r`` prints ``<facility|level>`` for non-kernel
facilities (glibc bug 30563: user.info shows as <7>). journalctl short formats print
``[47B blob data]`` for binary messages and expand tabs.
"""

from __future__ import annotations

import itertools
import json
import re
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo

from firstfault.analysis.events import KIND_KERNEL, Event

FORMATS = ("kmsg", "dmesg", "dmesg-T", "dmesg-iso", "journal-short", "journal-short-iso",
           "journal-json", "journal-export")
LEVELS = ("EMERG", "ALERT", "CRIT", "ERROR", "WARNING", "NOTICE", "INFO", "DEBUG")
MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}
_S, _US = 1_000_000_000, 1_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_DETECT_LINES = 50
_MAX_BINARY = 1 << 26  # a longer "binary field" is taken for garbage
_ISO = r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d"
# host, identifier[pid]: a host name starts with a letter or digit, a program's name with a letter or
# "_" (so an ISO-stamped log line, "2026-02-18T10:48:25.681Z [rank7]:[E218 10:48:25..." or a second
# stamp "2026-02-18 10:28:25,496 - root", is no journal line)
_HOST = r" ([A-Za-z0-9][\w.-]*) ([A-Za-z_][^\s:\[]*)(?:\[\d+\])?: ?"
_RX = {  # the header of a line; the message is what follows the match
    "kmsg": re.compile(r"(\d+),(\d+),(\d+),([^;,]*)([^;]*);(.*)"),  # prio,seq,usec,flags[,k=v...];text
    "dmesg": re.compile(r"(?:<(\d+)>)?\[\s*(\d+)\.(\d{1,9})\] ?"),
    "dmesg-T": re.compile(r"\[[A-Z][a-z]{2} ([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\] ?"),
    "dmesg-iso": re.compile(_ISO + r",\d{6}[+-]\d\d:?\d\d) ?"),
    "journal-short": re.compile(r"([A-Z][a-z]{2}) ([ \d]?\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?" + _HOST),
    "journal-short-iso": re.compile(_ISO + r"(?:\.(\d{1,9}))?(?:Z|[+-]\d\d:?\d\d))" + _HOST),
}
_EXPORT_LINE = re.compile(r"_{0,2}[A-Z][A-Z0-9_]*=")
_KEY = re.compile(rb"[A-Za-z0-9_]+")
_ESC = re.compile(rb"\\x([0-9a-fA-F]{2})")
_SKIP = object()  # a well-formed record that is not a kernel message; also: end of input


@dataclass
class ParseStats:
    """What one parse_kernel_log call saw; fill it by passing ``stats=``."""

    fmt: str | None = None
    lines: int = 0  # input items read
    events: int = 0
    bad_lines: int = 0  # lines (export: fields, entries) not understood, skipped
    bad_linenos: list[int] = field(default_factory=list)  # the first 10 of them
    skipped: int = 0  # understood but not kernel messages ("-- Boot --", other identifiers)
    missing_seq: int = 0  # kmsg records absent between the sequence numbers seen

    def bad(self, lineno: int) -> None:
        self.bad_lines += 1
        if len(self.bad_linenos) < 10:
            self.bad_linenos.append(lineno)


@dataclass
class _Ctx:
    """One parse: its arguments, its stats, the state carried from line to line."""

    fmt: str | None
    node: str | None
    boot_wall_ns: int | None
    boot_uncertainty_ns: int
    year: int | None
    tz: tzinfo
    stats: ParseStats
    stream: str
    last_month: int = 0
    last_seq: int | None = None


def _text(raw) -> str:
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw)


def _bytes(raw) -> bytes:
    if isinstance(raw, bytes):
        return raw
    try:
        return str(raw).encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that surrogateescape did not make
        return str(raw).encode("utf-8", "surrogatepass")


def unescape_kmsg(s: str) -> str:
    """Undo /dev/kmsg's \\xNN escapes (bytes that are not UTF-8 stay escaped)."""
    if "\\x" not in s:
        return s
    return _ESC.sub(lambda m: bytes([int(m.group(1), 16)]), _bytes(s)).decode("utf-8", "backslashreplace")


def _ns(dt: datetime, frac: str | None = None) -> int:
    """Epoch ns of an aware datetime, plus the digits of a decimal fraction it lacks."""
    return (dt - _EPOCH) // timedelta(microseconds=1) * _US + (int(frac.ljust(9, "0")[6:9]) if frac else 0)


def _local(ctx: _Ctx, y, mo, d, h, mi, s, frac=None) -> int:
    return _ns(datetime(int(y), mo, int(d), int(h), int(mi), int(s), int((frac or "0").ljust(6, "0")[:6]),
                        tzinfo=ctx.tz), frac)


def _prio(prio: int, fields: dict) -> str:
    fields["priority"], fields["facility"] = prio & 7, prio >> 3
    return LEVELS[prio & 7]


def _head(ctx: _Ctx, m: re.Match) -> dict | object:
    """Event attributes from a line's header (``text`` defaults to the rest of the line)."""
    f, g, fields = ctx.fmt, m.groups(), {"format": ctx.fmt}
    attrs: dict = {"fields": fields}
    if f in ("kmsg", "dmesg"):
        if f == "kmsg":
            seq = int(g[1])
            if ctx.last_seq is not None and seq > ctx.last_seq + 1:
                ctx.stats.missing_seq += seq - ctx.last_seq - 1
            ctx.last_seq = fields["seq"] = attrs["seq"] = seq
            fields["flags"] = g[3]
            for key, _, value in (kv.partition("=") for kv in g[4].split(",") if kv):
                fields[key] = value  # e.g. caller=T123 with CONFIG_PRINTK_CALLER
            attrs.update(level=_prio(int(g[0]), fields), text=unescape_kmsg(g[5]))
            mono = int(g[2]) * _US
        else:
            attrs["level"] = _prio(int(g[0]), fields) if g[0] else None
            mono = int(g[1]) * _S + int(g[2].ljust(9, "0"))
        fields["mono_ns"] = mono
        if ctx.boot_wall_ns is not None:
            attrs.update(occurred_ns=ctx.boot_wall_ns + mono, clock="kmsg",
                         uncertainty_ns=_US + ctx.boot_uncertainty_ns)
        return attrs
    if f == "dmesg-T":
        t = _local(ctx, g[5], MONTHS[g[0]], *g[1:5])
        return {**attrs, "occurred_ns": t, "clock": "line", "uncertainty_ns": 2 * _S}
    if f == "dmesg-iso":
        return {**attrs, "occurred_ns": _ns(datetime.fromisoformat(g[0])), "clock": "line", "uncertainty_ns": _S}
    frac, host, ident = (g[5], g[6], g[7]) if f == "journal-short" else g[1:4]
    if ident != "kernel":
        return _SKIP
    if f == "journal-short-iso":
        t = _ns(datetime.fromisoformat(g[0]), frac)
    else:  # no year in the line
        month = MONTHS[g[0]]
        if ctx.year is not None and month < ctx.last_month - 6:
            ctx.year += 1  # Dec -> Jan
        ctx.last_month = month
        t = None if ctx.year is None else _local(ctx, ctx.year, month, *g[1:6])
    fields["hostname"] = attrs["node"] = host
    return {**attrs, "occurred_ns": t, "observed_ns": t, "clock": None if t is None else "journal",
            "uncertainty_ns": 10 ** (9 - len(frac)) if frac else _S}


def _event(ctx: _Ctx, lineno: int, attrs: dict, text: str) -> Event:
    ctx.stats.events += 1
    attrs.setdefault("seq", ctx.stats.events)
    attrs["node"] = attrs.get("node") or ctx.node
    return Event(text=text, source="kernel", kind=KIND_KERNEL, origin=f"{ctx.stream or 'kernel'}:{lineno}",
                 stream=ctx.stream, **attrs)


def _line_records(ctx: _Ctx, items: Iterable) -> Iterator[Event]:
    rx, st = _RX[ctx.fmt], ctx.stats
    pend = None  # the record being read: (lineno, attrs, [text lines], header length) or _SKIP
    for lineno, raw in enumerate(itertools.chain(items, [_SKIP]), 1):
        line = "" if raw is _SKIP else _text(raw).rstrip("\r\n")
        m = rx.match(line)
        if (m or raw is _SKIP) and pend not in (None, _SKIP):
            yield _event(ctx, pend[0], pend[1], "\n".join(pend[2]))
        if raw is _SKIP:  # end of input
            return
        st.lines += 1
        if m:
            try:
                attrs = pend = _head(ctx, m)
            except (ValueError, OverflowError, KeyError, OSError):  # e.g. a date that does not exist
                st.bad(lineno)
                pend = None
                continue
            if attrs is _SKIP:
                st.skipped += 1
            else:
                pend = (lineno, attrs, [attrs.pop("text", line[m.end():])], m.end())
        elif line[:1] == " " and pend is _SKIP:
            continue  # an indented line of a record that is not the kernel's
        elif line[:1] == " " and pend is not None and ctx.fmt == "kmsg":  # " KEY=value"
            key, eq, value = line[1:].partition("=")
            if eq and key:
                pend[1]["fields"][key] = unescape_kmsg(value)
            else:
                st.bad(lineno)
        elif line[:1] == " " and pend is not None:  # dmesg, journalctl: a further message line
            n = pend[3]
            pend[2].append(line[n:] if line[:n].isspace() else line.lstrip(" "))
        elif line.startswith("-- ") and ctx.fmt.startswith("journal"):
            st.skipped += 1  # "-- Boot 5c1f... --", "-- No entries --"
        elif line.strip():
            st.bad(lineno)


def _value(v) -> str | None:
    """A json/export value as text: byte lists decoded; a field given several times: the first."""
    if isinstance(v, list) and v and isinstance(v[0], (list, str)):
        v = v[0]
    if isinstance(v, list) and all(isinstance(b, int) and 0 <= b < 256 for b in v):
        v = bytes(v)
    if isinstance(v, bytes):
        return v.decode("utf-8", "backslashreplace")
    return v if isinstance(v, str) else None


def _int(v: str | None) -> int | None:
    return int(v) if v and v.isascii() and v.isdigit() and len(v) < 30 else None


def _journal_entry(ctx: _Ctx, lineno: int, obj: dict) -> Iterator[Event]:
    """The Event of one journal entry (json object or export fields), if it is the kernel's."""
    e = {k: _value(v) for k, v in obj.items() if isinstance(k, str)}
    if e.get("_TRANSPORT") not in (None, "kernel"):
        ctx.stats.skipped += 1
        return
    if e.get("MESSAGE") is None:
        ctx.stats.bad(lineno)
        return
    fields: dict = {"format": ctx.fmt}
    for src, dst, scale in (("_SOURCE_MONOTONIC_TIMESTAMP", "mono_ns", _US), ("PRIORITY", "priority", 1),
                            ("SYSLOG_FACILITY", "facility", 1)):
        if (n := _int(e.get(src))) is not None:
            fields[dst] = n * scale
    for src, dst in (("_KERNEL_SUBSYSTEM", "SUBSYSTEM"), ("_KERNEL_DEVICE", "DEVICE"), ("_BOOT_ID", "boot_id"),
                     ("_HOSTNAME", "hostname"), ("__CURSOR", "cursor")):
        if e.get(src) is not None:
            fields[dst] = e[src]
    t = None if (rt := _int(e.get("__REALTIME_TIMESTAMP"))) is None else rt * _US
    yield _event(ctx, lineno, {
        "fields": fields, "level": LEVELS[fields["priority"] & 7] if "priority" in fields else None,
        "node": e.get("_HOSTNAME"), "occurred_ns": t, "observed_ns": t,
        "clock": None if t is None else "journal", "uncertainty_ns": 0 if t is None else _US}, e["MESSAGE"])


def _json_records(ctx: _Ctx, items: Iterable) -> Iterator[Event]:
    for lineno, raw in enumerate(items, 1):
        ctx.stats.lines += 1
        if not (line := _text(raw).strip()):
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            yield from _journal_entry(ctx, lineno, obj)
        else:
            ctx.stats.bad(lineno)


def _export_records(ctx: _Ctx, items: Iterable) -> Iterator[Event]:
    buf, entry, lineno, start, st = bytearray(), {}, 1, 1, ctx.stats
    for raw in items:
        st.lines += 1
        chunk = _bytes(raw)
        buf += chunk if chunk.endswith(b"\n") else chunk + b"\n"
        while (nl := buf.find(b"\n")) >= 0:
            line, used = bytes(buf[:nl]), nl + 1
            key, eq, value = line.partition(b"=")
            if not line:  # end of entry
                yield from _journal_entry(ctx, start, entry) if entry else ()
                entry, start = {}, lineno + 1
            elif eq and _KEY.fullmatch(key):
                entry[key.decode()] = value
            elif eq or not _KEY.fullmatch(line):
                st.bad(lineno)
            else:  # binary field: name, le64 length, data, newline
                if len(buf) < nl + 9:
                    break
                end = nl + 9 + struct.unpack_from("<Q", buf, nl + 1)[0]
                if end - nl - 9 <= _MAX_BINARY and len(buf) <= end:
                    break  # wait for the rest of the value
                if end - nl - 9 > _MAX_BINARY or buf[end] != 0x0A:
                    st.bad(lineno)  # not a binary field after all: drop the name line, resync
                else:
                    entry[line.decode()], used = bytes(buf[nl + 9:end]), end + 1
            lineno += buf.count(b"\n", 0, used)
            del buf[:used]
    if buf.strip(b"\n"):
        st.bad(lineno)  # a binary value cut short
    yield from _journal_entry(ctx, start, entry) if entry else ()


def detect_kernel_format(first_lines: Iterable[str | bytes]) -> str | None:
    """The FORMATS name most of the first non-blank lines fit, or None if none fits."""
    score = dict.fromkeys(FORMATS, 0)
    for raw in itertools.islice(first_lines, _DETECT_LINES):
        line = _text(raw).rstrip("\r\n")
        for fmt, rx in _RX.items():
            score[fmt] += bool(rx.match(line))
        score["journal-export"] += bool(_EXPORT_LINE.match(line))
        try:
            score["journal-json"] += line.startswith("{") and isinstance(json.loads(line), dict)
        except (ValueError, RecursionError):
            pass
    best = max(FORMATS, key=score.__getitem__)  # ties: the earlier in FORMATS
    return best if score[best] else None


def parse_kernel_log(lines: Iterable[str | bytes], *, fmt: str | None = None, node: str | None = None,
                     boot_wall_ns: int | None = None, boot_uncertainty_ns: int = 0, year: int | None = None,
                     tz: tzinfo = timezone.utc, stream: str = "", stats: ParseStats | None = None
                     ) -> Iterator[Event]:
    """Events (source "kernel", kind "kernel") from one kernel log in one of FORMATS.

    ``fmt`` None: detected from the first lines (none fits: every non-blank line is bad).
    ``boot_wall_ns``: wall time of boot (ns) to turn kmsg/dmesg monotonic stamps into
    occurred_ns, ``boot_uncertainty_ns`` its error. ``year``, ``tz``: journal-short has no
    year; dmesg -T and journal-short print local time. ``stream`` names the input in
    Event.origin ("stream:lineno") and Event.stream. ``stats`` is filled as it goes.
    An unknown ``fmt`` name raises ValueError at once; input lines never raise.
    """
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"unknown kernel log format {fmt!r}; known: {', '.join(FORMATS)}")
    ctx = _Ctx(fmt, node, boot_wall_ns, boot_uncertainty_ns, year, tz,
               stats if stats is not None else ParseStats(), stream)
    return _parse(ctx, iter(lines))


def _parse(ctx: _Ctx, it: Iterator) -> Iterator[Event]:
    if ctx.fmt is None:
        head = list(itertools.islice(it, _DETECT_LINES))
        ctx.fmt, it = detect_kernel_format(head), itertools.chain(head, it)
    ctx.stats.fmt = ctx.fmt
    if ctx.fmt is None:
        for lineno, raw in enumerate(it, 1):
            ctx.stats.lines += 1
            if _text(raw).strip():
                ctx.stats.bad(lineno)
        return
    yield from {"journal-json": _json_records, "journal-export": _export_records}.get(
        ctx.fmt, _line_records)(ctx, it)
