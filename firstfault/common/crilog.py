"""The CRI container log format the kubelet's runtime writes under /var/log/pods. Pure (stdlib).

Where (kubelet: pkg/kubelet/kuberuntime, BuildContainerLogsDirectory and
buildContainerLogsPath; pkg/kubelet/logs/container_log_manager.go for rotation)::

    /var/log/pods/<namespace>_<pod name>_<pod uid>/<container name>/<restart count>.log
    /var/log/pods/<namespace>_<pod name>_<pod uid>/<container name>/<restart count>.log.<YYYYmmdd-HHMMSS>[.gz]
    /var/log/containers/<pod name>_<namespace>_<container name>-<container id>.log  (a symlink to the first)

Rotation renames the file to ``<n>.log.<stamp>`` (Go layout ``20060102-150405``) and asks
the runtime to reopen ``<n>.log``; older rotated files are gzipped (``.gz``). Only
``<n>.log`` is followed (``pod_log_globs``): a renamed file is drained by the tailer
through its open descriptor (firstfault/agent/tail/), so nothing is read twice.

What (the runtime's CRI logger, parsed as the kubelet's ``parseCRILog`` does): one record a
line, ``<time> <stream> <tags> <content>``, time in RFC 3339 with up to nine fraction
digits (Go's RFC3339Nano drops trailing zeros, the zone is ``Z`` or ``+hh:mm``), stream
``stdout`` or ``stderr``, tags split by ``:`` of which the first is ``P`` (partial: the
line goes on in the next record of the same stream) or ``F`` (full: the line ends here).
A line the program wrote longer than the runtime's buffer (containerd: 16 KiB by
default) is split into ``P`` records ending in one ``F``; records of the other stream may
come between them. A made-up example::

    2026-12-03T20:32:39.123456789Z stderr P RuntimeError: CUDA error: an ill
    2026-12-03T20:32:39.123460001Z stdout F step 7 loss 2.31
    2026-12-03T20:32:39.123461Z stderr F egal memory access was encountered

``CriJoiner`` turns records into whole lines: the stderr line above is one line, stamped with
its first record's time, spanning the bytes from its first record's start to its last
record's end. Invariants: never raises on a malformed record (``parse_record`` gives None:
the reader keeps such a line as it is); a joined line is cut at ``max_bytes`` with the
caller's marker, the rest of it dropped, never held.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from typing import NamedTuple

CRI = "cri"
STREAMS = (b"stdout", b"stderr")
ROTATED_STAMP = "%Y%m%d-%H%M%S"  # kubelet's timestampFormat "20060102-150405"
_UID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_POD_LOG = re.compile(r"(?:^|/)(?P<ns>[a-z0-9][a-z0-9-]{0,62})_(?P<pod>[a-z0-9][a-z0-9.-]{0,252})_(?P<uid>" + _UID
                      + r")/(?P<container>[a-z0-9][a-z0-9-]{0,62})/(?P<restart>\d+)\.log"
                      r"(?:\.(?P<rotated>\d{8}-\d{6})(?P<gz>\.gz)?)?$")
_CONTAINER_LINK = re.compile(r"(?:^|/)(?P<pod>[a-z0-9][a-z0-9.-]{0,252})_(?P<ns>[a-z0-9][a-z0-9-]{0,62})_"
                             r"(?P<container>[a-z0-9][a-z0-9-]{0,62})-(?P<id>[0-9a-f]{64})\.log$")
_STAMP = re.compile(rb"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


class PodLog(NamedTuple):
    """What a container log's path says (either directory)."""

    namespace: str
    pod: str
    container: str
    pod_uid: str | None = None  # /var/log/pods only
    restart: int | None = None  # the container's restart count (the file's number)
    rotated: str | None = None  # a rotated file's stamp
    container_id: str | None = None  # /var/log/containers only


def parse_pod_log_path(path: str) -> PodLog | None:
    """The pod, container and restart a container log's path names; None for any other path."""
    m = _POD_LOG.search(path)
    if m:
        return PodLog(m["ns"], m["pod"], m["container"], m["uid"].lower(), int(m["restart"]), m["rotated"])
    m = _CONTAINER_LINK.search(path)
    if m:
        return PodLog(m["ns"], m["pod"], m["container"], container_id=m["id"])
    return None


def pod_log_globs(pods_dir: str) -> list[str]:
    """The glob (``*`` parts only) of every live container log under a /var/log/pods directory."""
    base = pods_dir.rstrip("/")
    return [f"{base}/*_*_*/*/*.log"]


def stamp_ns(text: bytes) -> int | None:
    """RFC 3339 (up to nanoseconds, ``Z`` or an offset) -> ns since the epoch; None if not one."""
    m = _STAMP.match(text)
    if m is None:
        return None
    y, mo, d, h, mi, s, frac, zone = m.groups()
    try:
        base = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s)).toordinal()
    except ValueError:
        return None
    secs = (base - 719163) * 86400 + int(h) * 3600 + int(mi) * 60 + int(s)
    if zone != b"Z":
        off = int(zone[1:3]) * 3600 + int(zone[4:6]) * 60
        secs -= off if zone[:1] == b"+" else -off
    return secs * 1_000_000_000 + (int(frac.ljust(9, b"0")) if frac else 0)


class CriRecord(NamedTuple):
    time_ns: int
    stream: str  # "stdout" | "stderr"
    partial: bool  # tag P: the line goes on in the stream's next record
    content: bytes


def parse_record(line: bytes) -> CriRecord | None:
    """One CRI log record (the line without its newline); None if it is not one."""
    a = line.find(b" ")
    b = line.find(b" ", a + 1) if a > 0 else -1
    c = line.find(b" ", b + 1) if b > 0 else -1
    if c < 0:
        if b > 0 and line[b + 1:] in (b"F", b"P"):  # an empty line: some runtimes drop the last space
            c = len(line)
        else:
            return None
    stream = line[a + 1:b]
    if stream not in STREAMS:
        return None
    ns = stamp_ns(line[:a])
    if ns is None:
        return None
    tag = line[b + 1:c].split(b":", 1)[0]
    return CriRecord(ns, stream.decode(), tag == b"P", line[c + 1:])


class Joined(NamedTuple):
    """One whole line: its content, first record's time, stream, and byte span in the file."""

    content: bytes
    time_ns: int
    stream: str
    start: int  # where its first record starts
    end: int  # where its last record ends (the byte after its newline)
    records: int  # how many records it was made of


class _Open:
    __slots__ = ("parts", "size", "time_ns", "start", "records")

    def __init__(self, time_ns: int, start: int) -> None:
        self.parts: list[bytes] = []
        self.size, self.time_ns, self.start, self.records = 0, time_ns, start, 0


class CriJoiner:
    """Records of one file in order -> whole lines (per stream, ``P``... joined to its ``F``).

    ``feed(line, start, end)`` returns the lines it completed (zero or one; a record that
    is no CRI record comes back as a line of its own, stream ``""``, time 0);
    ``held_start()`` is where the oldest line still open starts (a reader must not commit
    past it); ``flush()`` returns the open lines as they are (the file ended: rotated or
    gone). ``cut(head, total)`` gives the form of a line longer than ``max_bytes``.
    """

    def __init__(self, max_bytes: int, cut: Callable[[bytes, int], bytes]) -> None:
        self.max_bytes, self.cut = max_bytes, cut
        self._open: dict[str, _Open] = {}

    def feed(self, line: bytes, start: int, end: int) -> list[Joined]:
        rec = parse_record(line)
        if rec is None:
            return [Joined(line, 0, "", start, end, 1)]
        o = self._open.get(rec.stream)
        if o is None:
            if not rec.partial:  # the common case: one record, one line
                return [Joined(rec.content, rec.time_ns, rec.stream, start, end, 1)]
            o = self._open[rec.stream] = _Open(rec.time_ns, start)
        o.records += 1
        room = self.max_bytes - sum(map(len, o.parts))
        if room > 0:
            o.parts.append(rec.content[:room])
        o.size += len(rec.content)
        if rec.partial:
            return []
        del self._open[rec.stream]
        return [self._line(o, rec.stream, end)]

    def held_start(self) -> int | None:
        return min((o.start for o in self._open.values()), default=None)

    def flush(self, end: int) -> list[Joined]:
        out = [self._line(o, s, end) for s, o in sorted(self._open.items(), key=lambda kv: kv[1].start)]
        self._open.clear()
        return out

    def _line(self, o: _Open, stream: str, end: int) -> Joined:
        content = b"".join(o.parts)
        if o.size > self.max_bytes:
            content = self.cut(content, o.size)
        return Joined(content, o.time_ns, stream, o.start, end, o.records)


def join_lines(lines: list[bytes], max_bytes: int, cut: Callable[[bytes, int], bytes]) -> list[Joined]:
    """Every whole line of a CRI log file's records (offsets count a newline after each)."""
    j, out, pos = CriJoiner(max_bytes, cut), [], 0
    for line in lines:
        out += j.feed(line, pos, pos + len(line) + 1)
        pos += len(line) + 1
    return out + j.flush(pos)


def format_stamp(ns: int) -> str:
    """ns since the epoch -> RFC 3339 in UTC with nine fraction digits."""
    secs, frac = divmod(ns, 1_000_000_000)
    return datetime.fromtimestamp(secs, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def _full(x: Joined) -> bytes:
    if not x.stream:
        return x.content
    return b"%s %s F %s" % (format_stamp(x.time_ns).encode(), x.stream.encode(), x.content)


def rejoin(chunks: Iterable[bytes], max_bytes: int, cut: Callable[[bytes, int], bytes]) -> Iterator[bytes]:
    """A CRI log file's bytes (in any chunks) -> the same log with each split line one full record
    again (``<time> <stream> F <whole line>``, time of its first record), for readers of whole files
    (``firstfault analyze`` on /var/log/pods); lines that are no CRI record pass as they are."""
    j, rest, pos = CriJoiner(max_bytes, cut), b"", 0
    for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        out = []
        for line in lines:
            out += j.feed(line, pos, pos + len(line) + 1)
            pos += len(line) + 1
        if out:
            yield b"\n".join(map(_full, out)) + b"\n"
    out = (j.feed(rest, pos, pos + len(rest)) if rest else []) + j.flush(pos + len(rest))
    if out:
        yield b"\n".join(map(_full, out)) + b"\n"
