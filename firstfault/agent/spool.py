"""The agent's durable, bounded, crash-safe record queue: sources -> spool -> shipper.

Every record is written here before it counts as accepted; the shipper reads what
is here after the collector's high mark, sends it, and trims the spool when the
collector acks. This docstring is the on-disk specification, format version 1;
firstfault/agent/spoolfile.py holds its pure side (encode, check, scan, resync, gap records).

Directory
    meta        JSON, always replaced whole (meta.tmp, fsync, rename, fsync dir):
                ``{"format": 1, "node": "gpu-07", "stream": "0f3c6d1e9a2b4c58",
                "created_ns": 1796206319782000000, "acked_seq": 41, "next_seq": 97,
                "pending_gaps": []}`` ``stream`` is random hex made with the spool.
                ``acked_seq`` (or null) is a lower bound of what the collector has
                stored and ``next_seq`` one of the seqs given out: both are saved at
                open, when an ack deletes a segment and at close, not on every
                append or ack (the collector's welcome high_seq is the authority).
                ``pending_gaps`` holds gaps found at open until they are written.
    lock        flock(LOCK_EX) by the one process that has the spool open.
    <first_seq:020d>.seg   segments, e.g. ``00000000000000000001.seg``. The name
                is the next seq when the segment was created: its entries all have
                seq >= the name, the previous segment's all < it. Only the newest
                (active) segment is written; the others are closed and fsynced.
    *.tmp       a replacement half written when a crash came; deleted at open.

Entry (a segment is entries back to back and nothing else; integers big-endian)
    0   len  u32  payload bytes, 2 .. 16 MiB
    4   crc  u32  CRC-32 (zlib.crc32, IEEE) of the entry without this field:
                  the 4 len bytes, the 8 seq bytes, then the payload
    8   seq  u64  seq of the entry's first record; record i has seq + i
    16  payload   msgpack array ``[count, source[], kind[], message[],
                  occurred_ns[], observed_ns[], boot_id[], mono_ns[], job[], rank[],
                  local_rank[], pid[], severity[], fields[]]``: count (1..1000)
                  records as the wire batch columns (firstfault/wire.py), in wire order,
                  each a list of count values; node and stream are the spool's
                  (meta), not stored per record.
    An entry is one append() call (split at 1000 records or a quarter segment):
    columns cost ~0.3 µs a record to decode where a map per record costs ~0.7
    (knowledge/PERF.md), and the read side hands columns to the wire batch as is.

Invariants
    1. seqs strictly increase along the entries of all segments and across
       restarts; an entry holds count consecutive seqs. A seq given out that
       will never be read is named by a gap record (below), except the seqs of
       a torn tail (an append that never returned): those may be given out again.
    2. Readers (the shipper) never see past the durable horizon: with fsync
       "always" or "interval" everything a reader gets is fsynced, so no crash can
       take back a seq the collector holds and hand it to a new record.
    3. The segments' bytes never exceed max_bytes.
    4. Every segment but the newest ends at an entry boundary and is fsynced.

Durability (``fsync``)
    "always"    fsync before append() returns: an accepted record survives power
                loss; costs an fsync (~ms) per append, so append in batches.
    "interval"  a flusher thread fsyncs what was appended, at once when the last
                fsync is fsync_interval_ms old, else when it is (one fsync an
                interval at most); append returns once the bytes are written (a
                process crash loses nothing); a power loss may lose the last
                interval of accepted records, and readers see records only after
                their fsync (up to one interval and an fsync late).
    "never"     the OS writes back when it likes; readers see records at once. For
                tests and benchmarks: after a power loss seqs the collector already
                holds may be reused and new records dropped as duplicates.

Recovery at open (never fatal; every finding logged)
    1. Meta missing or unreadable: a new stream; a different node: a new stream
       (the backlog is resent under the new (node, stream)); seqs continue.
    2. Every segment is scanned, oldest first. An entry is valid when its len is
       in bounds and within the file, its crc matches, its count decodes, its seq
       is above the previous entry's last seq (and >= the segment name) and its
       last seq is below the next segment's name.
    3. When nothing valid follows an invalid entry of the newest segment and it
       is a torn tail (an append cut short: header cut, len past the end of the
       file, or only zero bytes left), the tail is truncated away. It was never
       visible to a reader, so no gap (with "interval", a power cut may tear
       accepted records that were not yet fsynced: that mode's trade-off).
    4. Any other invalid bytes are skipped: the scan resyncs at the next offset
       where a valid entry starts (first at the bad entry's own len, then at any
       offset whose seq is less than 2**24 past the last good seq). What was
       skipped is lost: a gap record, reason "corrupt", seqs last good + 1 ..
       next valid - 1 (or the next segment's name - 1). When nothing valid
       follows in the newest segment only a bound is known: at most bytes / 15
       records (a record takes >= 15 payload bytes) above the bad header's seq
       (if within 2**32 of the last good one) or else the last good seq;
       dropped_records nil; seqs continue past that bound, so no seq that may
       have been shipped is given out again. The segment is rewritten without
       the bad bytes (tmp + rename).
       Gaps are saved in meta before files are repaired and cleared after their
       records are written: a crash in between repeats a gap, never loses one.
    5. Closed segments all <= acked_seq, and closed empty ones, are deleted.
    6. The next seq is 1 + the highest of: last valid seq, newest segment name -
       1, acked_seq, meta next_seq - 1, the last seq of every gap. Every segment is fsynced (not
       with "never"), so what a killed process left in the page cache is durable
       before a reader sees it.

Gap record: source "agent", kind "agent.gap", severity 4, observed_ns = written at,
occurred_ns = when the loss happened (nil for "corrupt": found, not happened).
It says that no record with seq first_seq..last_seq will be sent (again): those
the collector lacks are lost. Fields: reason ("overflow" | "corrupt" |
"disk_full"), dropped_records (int; nil when only a bound is known),
dropped_bytes, first_seq, last_seq, from_ns and to_ns (observed_ns of the first
and last lost records, as known; nil if unknown). A gap is itself a record that
an overflow may drop: the gap written for a dropped segment also names the
ranges of the gaps that were in it (first_seq and from_ns reach back, counts
add up), so no loss goes unnamed and there is one gap per drop. Ranges may
overlap: take their union.

Bounded: before an entry would take the segments past max_bytes, whole segments
are deleted oldest first (the active one is rolled first if it is the only one)
and one gap (reason "overflow") names their unacked seqs and observed range.
Disk full (ENOSPC/EDQUOT on write or segment creation): the partial write is
truncated away, the records are not accepted and append raises SpoolFullError
(the daemon logs it, rate-limited, and goes on: there is nothing to retry). Their
seqs are spent and one gap (reason "disk_full", merged over a streak) is written
before the next entry that fits. A crash before that loses the gap: the seqs were
never visible, and are reused.

Threads: one writer (append, close) and one reader (read_after, read_batch_after,
read_frame_after, ack) may call at once; one lock guards the index and every write. Readers
do their file reads and decoding outside it, on bytes below the horizon, which
never change; a segment deleted under a reader (ack, overflow) is skipped.

Example: one record (source "ranklog", kind "rank.line", message "step 1",
observed_ns 1796206319790113000, the other columns nil or default) appended as
seq 1 is this 74-byte entry (len 58, crc 0xccc142e1, seq 1, then the payload)::

    00 00 00 3a cc c1 42 e1 00 00 00 00 00 00 00 01   len | crc | seq
    9e 01 91 a7 72 61 6e 6b 6c 6f 67 91 a9 72 61 6e   [1, ["ranklog"], ["ran
    6b 2e 6c 69 6e 65 91 a6 73 74 65 70 20 31 91 c0   k.line"], ["step 1"], [nil],
    91 cf 18 ed 68 21 92 66 c0 e8 91 c0 91 c0 91 c0   [1796206319790113000], [nil] x3,
    91 c0 91 c0 91 c0 91 06 91 80                     [nil] x3, [6], [{}]]

Known issues: a gap may name records a reader had already read when their
segment was dropped; bytes that go bad after open are found by the reader's crc
check (a gap, once) and again by the next open's scan (a repeated gap, not a
lost one); resync does not find a valid entry 2**24 or more seqs past the last
good one (its bytes count as lost); the bound of a corrupt newest tail assumes
its seqs had no holes since the last meta save.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable, Iterable, Iterator

import msgpack

from firstfault import wire
from firstfault.agent.osthread import name_this_thread
from firstfault.agent.spoolfile import (
    COLUMNS, ENTRY_MAX_RECORDS, FORMAT_VERSION, HEADER, HEADER_BYTES, MIN_RECORD_BYTES, OBSERVED,
    array_elements, column_elements, encode_entry, entry_at, gap_ok, gap_row, gaps_in,
    observed_range, pack_column, resync, scan,
)
from firstfault.wire import BatchColumns, Record, WireError

log = logging.getLogger(__name__)

MIN_SEGMENT_BYTES = 4096
DEFAULT_SEGMENT_BYTES = 8 * 1024 * 1024
DEFAULT_READ_BYTES = 4 * 1024 * 1024
GAP_RESERVE_BYTES = 2048  # room kept for the gap record an overflow writes
FSYNC_MODES = ("always", "interval", "never")
_row = attrgetter(*COLUMNS)
_SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class SpoolError(Exception):
    """Base of the spool's errors."""


class SpoolFullError(SpoolError):
    """The disk is full: these records were not accepted; a gap will name them."""

    def __init__(self, message: str, *, dropped_records: int, accepted_seq: int | None) -> None:
        super().__init__(message)
        self.dropped_records = dropped_records
        self.accepted_seq = accepted_seq  # last seq of this append that was written


class InvalidRecordError(SpoolError):
    """A record breaks the wire limits or cannot be encoded; nothing was written."""


@dataclass(frozen=True, slots=True)
class SpoolStats:
    bytes: int  # segment bytes on disk
    segments: int
    records: int  # records on disk, acked or not
    unacked_records: int  # approximate where seqs have holes
    oldest_unacked_seq: int | None
    last_seq: int | None  # last seq written
    acked_seq: int | None
    dropped_records: int  # lost to overflow since open
    corrupt_ranges: int  # bad byte ranges found since open
    disk_full_errors: int
    disk_full_records: int
    gaps_written: int
    pending_gaps: int
    fsyncs: int


class _Segment:
    __slots__ = ("base", "path", "size", "first_seq", "last_seq", "records", "first_ns",
                 "last_ns", "carried")

    def __init__(self, base: int, path: str) -> None:
        self.base, self.path, self.size, self.records = base, path, 0, 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.carried: dict[str, Any] | None = None  # the gaps written in it, merged

    def carry(self, g: dict[str, Any]) -> None:
        """Remember a gap record written here: dropping this segment must name its range."""
        c = self.carried
        self.carried = dict(g) if c is None else _merge(c, g)


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One gap naming both ranges (and what lies between)."""
    def lo(k):
        return min((v for v in (a[k], b[k]) if v is not None), default=None)

    def hi(k):
        return max((v for v in (a[k], b[k]) if v is not None), default=None)
    n = (None if a["dropped_records"] is None or b["dropped_records"] is None
         else a["dropped_records"] + b["dropped_records"])
    return {**a, "dropped_records": n, "dropped_bytes": a["dropped_bytes"] + b["dropped_bytes"],
            "first_seq": lo("first_seq"), "last_seq": hi("last_seq"), "from_ns": lo("from_ns"),
            "to_ns": hi("to_ns")}


# --- parsing: pure functions over a segment's bytes ----------------------------









def _seqs(ranges: list[range]) -> range | list[int]:
    contiguous = all(a.stop == b.start for a, b in zip(ranges, ranges[1:]))
    return (range(ranges[0].start, ranges[-1].stop) if contiguous
            else [s for r in ranges for s in r])






















def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- the spool -----------------------------------------------------------------

class Spool:
    """A directory of segments; the module docstring is the on-disk spec.

    ``Spool(path, node=, max_bytes=, segment_bytes=None (max_bytes / 8, at most
    8 MiB), fsync="always" | "interval" | "never", fsync_interval_ms=100,
    validate=True)`` opens (recovers) or creates the spool.

    Writer: ``append(records) -> last seq`` (InvalidRecordError,
    SpoolFullError), ``close()``. Reader: ``read_batch_after(seq, max_records,
    max_bytes) -> wire.BatchColumns | None`` (what a batch carries, no Records),
    ``read_frame_after(...) -> (seqs, framed batch) | None`` (the same, as wire bytes),
    ``read_after(...) -> list[Record]``, ``watch(fn)`` (fn() when more is readable),
    ``ack(seq)``.
    ``stats() -> SpoolStats`` from anywhere.

    validate=True runs the wire format's own checks (firstfault/wire.py) on every
    append, so a bad record fails at its source instead of wedging the shipper.
    A column whose packed bytes are one value's bytes repeated (a source's name,
    a path's job, rank and fields) is checked as that one value: the collector
    decodes exactly it n times. Turn it off only when the records are checked
    once elsewhere.
    """

    def __init__(self, path: str | os.PathLike, *, node: str, max_bytes: int,
                 segment_bytes: int | None = None, fsync: str = "always",
                 fsync_interval_ms: int = 100, validate: bool = True) -> None:
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_MODES)}, got {fsync!r}")
        if segment_bytes is None:
            segment_bytes = max(MIN_SEGMENT_BYTES, min(DEFAULT_SEGMENT_BYTES, max_bytes // 8))
        if segment_bytes < MIN_SEGMENT_BYTES or max_bytes < 2 * segment_bytes:
            raise ValueError(f"need segment_bytes >= {MIN_SEGMENT_BYTES} and max_bytes >= 2 "
                             f"segments; got segment_bytes={segment_bytes} max_bytes={max_bytes}")
        if not wire._NAME[0](node):
            raise ValueError(f"node must be a non-empty name of at most "
                             f"{wire.MAX_NAME_BYTES} bytes, got {node!r}")
        if fsync == "interval" and fsync_interval_ms <= 0:
            raise ValueError(f"fsync_interval_ms must be > 0, got {fsync_interval_ms}")
        self.path, self.node = os.fspath(path), node
        self.max_bytes, self.segment_bytes = max_bytes, segment_bytes
        self.fsync, self.fsync_interval_ms, self.validate = fsync, fsync_interval_ms, validate
        self._entry_limit = min(4 * 1024 * 1024, segment_bytes // 4)
        self._dirty = threading.Event()  # written since the flusher's last look
        self._lock = threading.Lock()
        self._watcher: Callable[[], None] | None = None
        self._closed = False
        self._segs: list[_Segment] = []
        self._fd = -1
        self._next_seq = 1
        self._acked: int | None = None
        self._bytes = 0
        self._vis_size = 0  # readers see the active segment up to here ...
        self._vis_seq = 0  # ... and seqs up to here
        self._pending: list[dict[str, Any]] = []  # gaps not yet written
        self._reported: set[tuple[str, int]] = set()  # corruption a reader found
        self._cursor: tuple[int, str, int, int] | None = None  # after, path, offset, floor
        self._counts = dict(dropped_records=0, corrupt_ranges=0, disk_full_errors=0,
                            disk_full_records=0, gaps_written=0, fsyncs=0)
        os.makedirs(self.path, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self.path, "lock"),
                                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise SpoolError(f"spool {self.path} is open in another process (lock held); "
                             f"stop the other agent or give this one its own spool") from None
        try:
            with self._lock:  # nobody else has it yet; _roll and _sync notify under it
                self._recover()
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
            os.close(self._lock_fd)
            raise
        self._stop = threading.Event()
        self._flusher = None
        if fsync == "interval":
            self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                             name="ff-spool-flush")
            self._flusher.start()

    # --- open and recovery -----------------------------------------------------

    def _read_meta(self) -> dict[str, Any]:
        try:
            with open(os.path.join(self.path, "meta"), encoding="utf-8") as f:
                meta = json.load(f)
            if type(meta) is not dict:
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("spool meta unreadable, starting a new stream path=%s error=%s",
                        self.path, e)
            return {}
        if meta.get("format", FORMAT_VERSION) != FORMAT_VERSION:
            raise SpoolError(f"spool {self.path} has format {meta.get('format')}; this agent "
                             f"reads format {FORMAT_VERSION}: use a newer agent or a new spool")
        return meta

    def _write_meta(self, pending: list[dict[str, Any]] | None = None) -> None:
        meta = {"format": FORMAT_VERSION, "node": self.node, "stream": self.stream,
                "created_ns": self._created_ns, "acked_seq": self._acked,
                "next_seq": self._next_seq, "pending_gaps": pending or []}
        tmp = os.path.join(self.path, "meta.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(meta, f)
            f.flush()
            if self.fsync != "never":
                os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.path, "meta"))
        if self.fsync != "never":
            _fsync_dir(self.path)

    def _recover(self) -> None:
        meta = self._read_meta()
        self.stream, self._created_ns = meta.get("stream"), meta.get("created_ns")
        acked, given = meta.get("acked_seq"), meta.get("next_seq")
        self._acked = acked if type(acked) is int else None
        if not self.stream or meta.get("node") != self.node:
            if self.stream:
                log.warning("spool node changed, starting a new stream path=%s old=%s new=%s",
                            self.path, meta.get("node"), self.node)
            self.stream, self._created_ns = secrets.token_hex(8), time.time_ns()
            self._acked = None
        pending = [g for g in meta.get("pending_gaps") or [] if gap_ok(g)]
        names = []
        for name in os.listdir(self.path):
            if name.endswith(".tmp"):
                os.unlink(os.path.join(self.path, name))
            elif m := _SEGMENT_NAME.match(name):
                names.append(int(m.group(1)))
        names.sort()
        floor, last_ns, repairs, new_gaps = 0, None, [], []
        for i, base in enumerate(names):
            seg = _Segment(base, self._seg_path(base))
            newest, ceil = i == len(names) - 1, names[i + 1] if i + 1 < len(names) else None
            with open(seg.path, "rb") as f:
                buf = f.read()
                if self.fsync != "never":  # what a crashed process left in the page cache
                    os.fsync(f.fileno())
            entries, bad, torn = scan(buf, max(floor, base - 1), ceil, newest)
            for start, stop, before in bad:
                new_gaps.append(self._corrupt_gap(seg.path, buf, start, stop, before, ceil,
                                                  entries, last_ns))
            if torn is not None:
                log.warning("spool torn tail truncated path=%s offset=%d bytes=%d",
                            seg.path, torn, len(buf) - torn)
            if bad or torn is not None:
                repairs.append((seg, buf, entries, bool(bad)))
            for g in gaps_in(buf, entries):
                seg.carry(g)
            if entries:
                seg.first_seq, seg.last_seq = entries[0][2], entries[-1][2] + entries[-1][3] - 1
                seg.records = sum(e[3] for e in entries)
                seg.size = sum(e[1] - e[0] for e in entries)
                seg.first_ns = observed_range(buf, *entries[0][:2])[0]
                seg.last_ns = last_ns = observed_range(buf, *entries[-1][:2])[1]
                floor = seg.last_seq
            self._segs.append(seg)
        pending += [g for g in new_gaps if g is not None]
        if new_gaps:
            self._write_meta(pending)  # before the bad bytes are gone
        for seg, buf, entries, rewrite in repairs:
            self._repair(seg, buf, entries, rewrite)
        for seg in self._segs[:-1]:
            if seg.last_seq is None or (self._acked is not None and seg.last_seq <= self._acked):
                os.unlink(seg.path)
        self._segs = [s for s in self._segs[:-1] if s.last_seq is not None and (
            self._acked is None or s.last_seq > self._acked)] + self._segs[-1:]
        top = max([floor, self._acked or 0, (given if type(given) is int else 1) - 1]
                  + [names[-1] - 1 if names else 0] + [g["last_seq"] for g in pending])
        self._next_seq = top + 1
        if not self._segs:
            self._segs.append(_Segment(self._next_seq, self._seg_path(self._next_seq)))
        act = self._segs[-1]
        self._fd = os.open(act.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                           0o644)
        if self.fsync != "never":
            os.fsync(self._fd)
            _fsync_dir(self.path)
        self._bytes = sum(s.size for s in self._segs)
        self._vis_size = act.size
        self._vis_seq = max((s.last_seq or 0 for s in self._segs), default=0)
        self._pending = pending
        try:
            self._flush_pending()
            self._sync()
        except OSError as e:
            log.warning("spool gaps not written yet path=%s gaps=%d error=%s",
                        self.path, len(self._pending), e)
        self._write_meta(self._pending)
        log.info("spool open path=%s stream=%s segments=%d bytes=%d next_seq=%d acked=%s",
                 self.path, self.stream, len(self._segs), self._bytes, self._next_seq,
                 self._acked)

    def _corrupt_gap(self, path, buf, start, stop, before, ceil, entries, last_ns):
        """The gap fields of bad bytes [start, stop) of a segment, or None if no seq lost."""
        self._counts["corrupt_ranges"] += 1
        first = before + 1
        nxt = entry_at(buf, stop, before, ceil) if stop < len(buf) else None
        if nxt is not None:
            last, n = nxt[1] - 1, nxt[1] - first
        elif ceil is not None:
            last, n = ceil - 1, ceil - first
        else:  # nothing valid after, newest segment: only a bound is known
            below = before  # seqs of the lost bytes start above the bad header's, if sane
            if stop - start >= HEADER_BYTES:
                head_seq = HEADER.unpack_from(buf, start)[2]
                if before < head_seq <= before + 2**32:
                    below = head_seq - 1
            last, n = below + max(1, (stop - start) // MIN_RECORD_BYTES), None
        prev = [e for e in entries if e[1] <= start]
        from_ns = observed_range(buf, *prev[-1][:2])[1] if prev else last_ns
        to_ns = observed_range(buf, stop, nxt[0])[0] if nxt is not None else None
        log.error("spool corrupt bytes skipped path=%s offset=%d bytes=%d seqs=%d..%d",
                  path, start, stop - start, first, last)
        if last < first:
            return None
        return {"reason": "corrupt", "dropped_records": n, "dropped_bytes": stop - start,
                "first_seq": first, "last_seq": last, "from_ns": from_ns, "to_ns": to_ns}

    def _repair(self, seg: _Segment, buf: bytes, entries, rewrite: bool) -> None:
        """Rewrite a segment without its bad bytes, or cut its torn tail."""
        if not rewrite:
            with open(seg.path, "r+b") as f:
                f.truncate(seg.size)
                if self.fsync != "never":
                    os.fsync(f.fileno())
            return
        tmp = seg.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"".join(buf[a:b] for a, b, _, _ in entries))
            f.flush()
            if self.fsync != "never":
                os.fsync(f.fileno())
        os.replace(tmp, seg.path)
        if self.fsync != "never":
            _fsync_dir(self.path)

    def _seg_path(self, base: int) -> str:
        return os.path.join(self.path, f"{base:020d}.seg")

    # --- writing (the caller holds the lock) -----------------------------------

    def _write(self, data: bytes) -> None:
        self._dirty.set()
        view, done = memoryview(data), 0
        try:
            while done < len(data):
                done += os.write(self._fd, view[done:])
        except OSError:
            try:  # never leave a partial entry behind
                os.ftruncate(self._fd, self._segs[-1].size)
            except OSError as e:
                log.error("spool cannot cut a failed write path=%s error=%s",
                          self._segs[-1].path, e)
            raise

    def _put(self, payload: bytes, count: int, lo_ns, hi_ns, room: bool = True) -> int:
        """Write one entry (rolling and making room first); its first seq."""
        n = HEADER_BYTES + len(payload)
        if self._segs[-1].size and self._segs[-1].size + n > self.segment_bytes:
            self._roll()
        if room and self._bytes + n > self.max_bytes:
            self._make_room(n)
            if self._segs[-1].size and self._segs[-1].size + n > self.segment_bytes:
                self._roll()
        seq = self._next_seq
        self._write(encode_entry(seq, payload))
        act = self._segs[-1]
        if act.first_seq is None:
            act.first_seq, act.first_ns = seq, lo_ns
        act.last_seq, act.last_ns = seq + count - 1, hi_ns
        act.size += n
        act.records += count
        self._bytes += n
        self._next_seq = seq + count
        return seq

    def _roll(self) -> None:
        old, base = self._segs[-1], self._next_seq
        new = _Segment(base, self._seg_path(base))
        fd = os.open(new.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
                     0o644)
        try:
            if self.fsync != "never":
                os.fsync(self._fd)
                self._counts["fsyncs"] += 1
                _fsync_dir(self.path)
        except OSError:
            os.close(fd)
            os.unlink(new.path)
            raise
        os.close(self._fd)
        self._fd = fd
        self._segs.append(new)
        self._vis_size = 0
        if old.last_seq is not None:
            self._vis_seq = max(self._vis_seq, old.last_seq)
            self._readable()
            if self._acked is not None and old.last_seq <= self._acked:
                self._delete(old)

    def _delete(self, seg: _Segment) -> None:
        try:
            os.unlink(seg.path)
        except FileNotFoundError:
            pass
        self._segs.remove(seg)
        self._bytes -= seg.size

    def _make_room(self, n: int) -> None:
        dropped: list[_Segment] = []
        try:
            while self._bytes + n + GAP_RESERVE_BYTES > self.max_bytes:
                if len(self._segs) == 1:
                    if not self._segs[0].size:
                        break
                    self._roll()  # may fail (disk full): what was dropped is still named
                    continue
                dropped.append(self._segs[0])
                self._delete(self._segs[0])
        finally:
            self._name_dropped(dropped)

    def _name_dropped(self, dropped: list[_Segment]) -> None:
        """Queue and write one overflow gap naming ``dropped`` (and the gaps they held)."""
        gap = None
        for s in dropped:
            lo = max(s.first_seq or 0, (self._acked or 0) + 1)
            if s.last_seq is not None and s.last_seq >= lo:
                nrec = s.records if lo == s.first_seq else s.last_seq - lo + 1
                self._counts["dropped_records"] += nrec
                g = {"reason": "overflow", "dropped_records": nrec, "dropped_bytes": s.size,
                     "first_seq": lo, "last_seq": s.last_seq, "from_ns": s.first_ns,
                     "to_ns": s.last_ns}
                gap = g if gap is None else _merge(gap, g)
            if s.carried:  # gaps that were in it: the new one names their ranges too
                gap = s.carried if gap is None else _merge(gap, s.carried)
        if gap is None:
            return
        gap = {**gap, "reason": "overflow", "at_ns": time.time_ns()}
        nrec = gap["dropped_records"] or 0
        log.warning("spool full, oldest dropped path=%s records=%d seqs=%d..%d",
                    self.path, nrec, gap["first_seq"], gap["last_seq"])
        self._pending.append(gap)
        self._flush_pending(room=False)

    def _flush_pending(self, room: bool = True) -> None:
        while self._pending:
            g, now = self._pending.pop(0), time.time_ns()
            try:  # popped first: writing it may make room and queue an overflow gap
                self._put(msgpack.packb([1, *([v] for v in gap_row(g, now))]), 1, now, now,
                          room=room)
            except BaseException:
                self._pending.insert(0, g)
                raise
            self._segs[-1].carry(g)
            self._counts["gaps_written"] += 1

    def _sync(self) -> None:
        """After writes: fsync if "always", then show readers what is durable."""
        if self.fsync == "interval":
            return
        act = self._segs[-1]
        if self._vis_size == act.size:
            return
        if self.fsync == "always":
            os.fsync(self._fd)
            self._counts["fsyncs"] += 1
        self._vis_size = act.size
        self._vis_seq = max(self._vis_seq, act.last_seq or 0)
        self._readable()

    def _flush_loop(self) -> None:
        """fsync after appends, fsync_interval_ms apart at least; asleep while none come."""
        name_this_thread()
        last = -float("inf")
        while not self._stop.is_set():
            self._dirty.wait()
            self._dirty.clear()
            if self._stop.wait(last + self.fsync_interval_ms / 1000 - time.monotonic()):
                return
            last = time.monotonic()
            try:
                self._flush_once()
            except OSError as e:
                log.error("spool fsync failed path=%s error=%s", self.path, e)
                self._dirty.set()  # try again in an interval

    def _flush_once(self) -> None:
        with self._lock:
            act = self._segs[-1] if not self._closed else None
            if act is None or self._vis_size >= act.size:
                return
            fd, size, last = os.dup(self._fd), act.size, act.last_seq
        try:
            os.fsync(fd)  # outside the lock: appends go on meanwhile
        finally:
            os.close(fd)
        with self._lock:
            self._counts["fsyncs"] += 1
            if self._segs and self._segs[-1] is act and size > self._vis_size:
                self._vis_size, self._vis_seq = size, max(self._vis_seq, last or 0)
                self._readable()

    # --- the writer's API ------------------------------------------------------

    def _encode(self, rows: list[tuple], out: list) -> None:
        """Append (payload, count, min_ns, max_ns) entries for ``rows`` to ``out``."""
        cols = list(zip(*rows))
        if len(cols) != len(COLUMNS) or len(rows[0]) != len(rows[-1]):
            raise InvalidRecordError(f"spool append: a record has {len(rows[0])} or "
                                     f"{len(rows[-1])} columns, not {len(COLUMNS)}")
        n = len(rows)
        head = msgpack.packb(n)
        try:
            packed, checked = zip(*map(pack_column, cols))
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidRecordError(f"spool append: cannot encode: {e}") from None
        if self.validate:
            for name, values in zip(COLUMNS, checked):
                try:
                    wire.check_column(name, values)
                except WireError as e:
                    raise InvalidRecordError(f"spool append: {e}") from None
        payload = b"".join([b"\x9e", head, *packed])
        if len(payload) > self._entry_limit and len(rows) > 1:
            half = len(rows) // 2
            self._encode(rows[:half], out)
            self._encode(rows[half:], out)
            return
        if HEADER_BYTES + len(payload) + GAP_RESERVE_BYTES > self.max_bytes:
            raise InvalidRecordError(f"spool append: a record of {len(payload)} bytes does "
                                     f"not fit max_bytes={self.max_bytes}")
        obs = cols[OBSERVED]
        try:
            out.append((payload, len(rows), min(obs), max(obs)))
        except TypeError:  # validate=False and a bad observed_ns
            out.append((payload, len(rows), None, None))

    def append(self, records: Iterable[Any]) -> int:
        """Store ``records``, give them seqs; the last seq (the current one if none).

        Each record is a sources Draft, a wire Record (its node, stream and seq are
        ignored) or a tuple of the wire columns in order. Accepted when this returns
        (fsynced first if fsync="always"). Raises InvalidRecordError (nothing
        written) or SpoolFullError (disk full: see the module docstring).
        """
        rows = records if type(records) is list else list(records)
        if rows and type(rows[0]) is not tuple:
            try:
                rows = list(map(_row, rows))
            except AttributeError as e:
                raise InvalidRecordError(f"spool append: records must be Drafts, Records or "
                                         f"tuples of the wire columns, not mixed: {e}") from None
        entries: list = []
        for i in range(0, len(rows), ENTRY_MAX_RECORDS):
            self._encode(rows[i:i + ENTRY_MAX_RECORDS], entries)
        with self._lock:
            self._check_open()
            last, done = None, 0
            try:
                self._flush_pending()
                for payload, count, lo, hi in entries:
                    last = self._put(payload, count, lo, hi) + count - 1
                    done += 1
                self._sync()
            except OSError as e:
                if e.errno not in _DISK_FULL or done == len(entries):  # e.g. fsync failed
                    raise SpoolError(f"spool write failed in {self.path}: {e}; records up "
                                     f"to seq {last} are written, maybe not durable") from e
                lost = self._disk_full(entries[done:])
                try:
                    self._sync()
                except OSError:
                    pass
                raise SpoolFullError(
                    f"disk full writing spool {self.path}: {lost} records not stored; a gap "
                    f"record will name them when space returns; free disk space or lower "
                    f"max_bytes", dropped_records=lost, accepted_seq=last) from e
            return last if last is not None else self._next_seq - 1

    def _disk_full(self, entries: list) -> int:
        n = sum(e[1] for e in entries)
        first, nbytes = self._next_seq, sum(HEADER_BYTES + len(e[0]) for e in entries)
        self._next_seq += n  # spent: the gap names them
        lo = min((e[2] for e in entries if e[2] is not None), default=None)
        hi = max((e[3] for e in entries if e[3] is not None), default=None)
        self._counts["disk_full_errors"] += 1
        self._counts["disk_full_records"] += n
        g = {"reason": "disk_full", "dropped_records": n, "dropped_bytes": nbytes,
             "first_seq": first, "last_seq": first + n - 1, "from_ns": lo, "to_ns": hi,
             "at_ns": time.time_ns()}
        prev = self._pending[-1] if self._pending else None
        if prev and prev["reason"] == "disk_full" and prev["last_seq"] == first - 1:
            self._pending[-1] = _merge(prev, g)  # one gap for a whole streak
        else:
            log.error("spool disk full, dropping records path=%s first_seq=%d", self.path, first)
            self._pending.append(g)
        return n

    def _check_open(self) -> None:
        if self._closed:
            raise SpoolError(f"spool {self.path} is closed")

    def close(self) -> None:
        """Write what is pending, fsync, save meta, release the lock. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._readable()
        self._stop.set()
        self._dirty.set()
        if self._flusher is not None:
            self._flusher.join()
        with self._lock:
            try:
                self._flush_pending()
                if self.fsync != "never":
                    os.fsync(self._fd)
                self._write_meta(self._pending)
            except OSError as e:
                log.error("spool close incomplete path=%s error=%s", self.path, e)
            finally:
                os.close(self._fd)
                os.close(self._lock_fd)

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the reader's API ------------------------------------------------------

    def read_batch_after(self, seq: int | None, max_records: int = wire.MAX_BATCH_RECORDS,
                         max_bytes: int = DEFAULT_READ_BYTES) -> BatchColumns | None:
        """Up to ``max_records`` durable records with seq > ``seq`` (None: all), as columns
        (wire.BatchColumns: seqs and the batch columns; no Record is built).

        Stops before an entry that would take the entry bytes read past
        ``max_bytes`` (one entry at least); None when there is nothing new.
        Sequential calls (``seq`` = the last batch's last seq) resume where the
        last one stopped; any other ``seq`` scans its segment from the start.
        """
        ranges: list[range] = []
        parts: list[list[Any]] = []
        for eseq, lo, hi, count, payload in self._pick(seq, max_records, max_bytes):
            obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
            parts.append(obj[1:] if lo == 0 and hi == count else [c[lo:hi] for c in obj[1:]])
            ranges.append(range(eseq + lo, eseq + hi))
        if not ranges:
            return None
        if len(parts) == 1:
            cols = parts[0]
        else:
            cols = [[] for _ in COLUMNS]
            for p in parts:
                for c, values in zip(cols, p):
                    c += values
        return BatchColumns(self.node, self.stream, _seqs(ranges), dict(zip(COLUMNS, cols)))

    def read_frame_after(self, seq: int | None, max_records: int = wire.MAX_BATCH_RECORDS,
                         max_bytes: int = DEFAULT_READ_BYTES
                         ) -> tuple[range | list[int], bytes] | None:
        """As read_batch_after, as (seqs, one framed wire ``batch``): the shipper's path.

        Whole entries are not decoded: their column arrays' bytes go into the frame
        as they are (wire.encode_packed_columns), checked at append and by the crc
        here. WireError (ERR_TOO_LARGE) if the frame passes MAX_FRAME_BYTES."""
        ranges: list[range] = []
        cols: list[list[bytes]] = [[] for _ in COLUMNS]
        for eseq, lo, hi, count, payload in self._pick(seq, max_records, max_bytes):
            if lo == 0 and hi == count:
                got = column_elements(payload)
            else:  # part of an entry: decode it, pack the part again
                obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                got = [array_elements(msgpack.packb(c[lo:hi])) for c in obj[1:]]
            for c, b in zip(cols, got):
                c.append(b)
            ranges.append(range(eseq + lo, eseq + hi))
        if not ranges:
            return None
        seqs = _seqs(ranges)
        return seqs, wire.encode_packed_columns(self.node, self.stream, seqs,
                                                [b"".join(c) for c in cols])

    def _pick(self, seq: int | None, max_records: int, max_bytes: int
              ) -> Iterator[tuple[int, int, int, int, memoryview]]:
        """(entry seq, lo, hi, count, payload) of the entries whose records [lo, hi)
        a read after ``seq`` takes; moves the cursor once consumed to the end."""
        after = -1 if seq is None else seq
        plan, cursor = self._plan(after)
        taken = nbytes = 0
        cur, full = None, False
        for path, base, end, ceil in plan:
            off, floor = 0, base - 1
            if cursor is not None and cursor[0] == after and cursor[1] == path:
                off, floor = cursor[2], cursor[3]
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:  # acked or dropped since the snapshot
                continue
            try:
                for off, stop, eseq, count, payload in self._entries(fd, path, off, end,
                                                                      floor, ceil):
                    if eseq + count - 1 <= after:
                        continue
                    if taken and nbytes + (stop - off) > max_bytes:
                        full = True
                        break
                    lo = max(0, after + 1 - eseq)
                    hi = min(count, lo + max_records - taken)
                    yield eseq, lo, hi, count, payload
                    taken += hi - lo
                    nbytes += stop - off
                    cur = ((eseq + hi - 1, path, off, eseq - 1) if hi < count
                           else (eseq + count - 1, path, stop, eseq + count - 1))
                    if taken >= max_records or nbytes >= max_bytes:
                        full = True
                        break
            finally:
                os.close(fd)
            if full:
                break
        if taken:
            self._cursor = cur

    def _plan(self, after: int) -> tuple[list[tuple[str, int, int, int]], Any]:
        """(path, base, readable end, ceil) of the segments holding seqs > ``after``; the cursor."""
        with self._lock:
            self._check_open()
            plan = []
            for i, s in enumerate(self._segs):
                end = s.size if i < len(self._segs) - 1 else self._vis_size
                if s.last_seq is not None and s.last_seq > after and end:
                    ceil = (self._segs[i + 1].base if i + 1 < len(self._segs)
                            else self._vis_seq + 1)
                    plan.append((s.path, s.base, end, ceil))
            return plan, self._cursor

    def recent_rows(self, since_ns: int | None, source: str) -> Iterator[tuple]:
        """The rows (wire columns in order, no seq) of ``source`` in segments written
        at or after ``since_ns`` (file mtime; None: every segment), oldest first.

        For a source that saves its position after emit: a crash between the two
        leaves spooled records the saved position does not cover; they are here."""
        plan, _ = self._plan(-1)
        for path, base, end, ceil in plan:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if since_ns is not None and os.fstat(fd).st_mtime_ns < since_ns:
                    continue
                for *_, payload in self._entries(fd, path, 0, end, base - 1, ceil):
                    cols = msgpack.unpackb(payload, raw=False, strict_map_key=False)[1:]
                    if source in cols[0]:
                        yield from (r for r in zip(*cols) if r[0] == source)
            finally:
                os.close(fd)

    def read_after(self, seq: int | None, max_records: int = wire.MAX_BATCH_RECORDS,
                   max_bytes: int = DEFAULT_READ_BYTES) -> list[Record]:
        """As read_batch_after, as Records (about 3 µs a record more: prefer columns)."""
        batch = self.read_batch_after(seq, max_records, max_bytes)
        return batch.records() if batch else []

    def _entries(self, fd: int, path: str, off: int, end: int, floor: int,
                 ceil: int | None) -> Iterator[tuple[int, int, int, int, memoryview]]:
        """(offset, end, seq, count, payload) of the valid entries in [off, end)."""
        buf, boff = b"", off  # buf holds the file's bytes [boff, boff + len(buf))
        while off < end:
            rel = off - boff
            if len(buf) - rel < HEADER_BYTES:
                buf, boff, rel = os.pread(fd, min(end - off, 1 << 20), off), off, 0
            if len(buf) - rel >= HEADER_BYTES:
                stop = off + HEADER_BYTES + HEADER.unpack_from(buf, rel)[0]
                if boff + len(buf) < stop <= end:
                    buf, boff, rel = os.pread(fd, max(stop - off, min(end - off, 1 << 20)),
                                              off), off, 0
            e = entry_at(buf, rel, floor, ceil)  # buf never runs past end
            if e is None:
                buf, boff = os.pread(fd, end - off, off), off
                nxt = resync(buf, 0, floor, ceil)
                self._corrupt_read(path, buf, off, nxt, floor, ceil)
                if nxt >= len(buf):
                    return
                off = boff + nxt
                continue
            stop, seq, count = e
            yield off, boff + stop, seq, count, memoryview(buf)[rel + HEADER_BYTES:stop]
            off, floor = boff + stop, seq + count - 1

    def _corrupt_read(self, path: str, buf: bytes, off: int, nxt: int, floor: int,
                      ceil: int | None) -> None:
        """A reader met bytes that went bad after open: one gap, once."""
        with self._lock:
            if (path, off) in self._reported or self._closed:
                return
            self._reported.add((path, off))
            g = self._corrupt_gap(path, buf, 0, nxt, floor, ceil, [], None)
            if g is not None:
                g["at_ns"] = time.time_ns()
                self._next_seq = max(self._next_seq, g["last_seq"] + 1)
                self._pending.append(g)
                try:
                    self._flush_pending()
                    self._sync()
                except OSError as e:
                    log.error("spool gap not written yet path=%s error=%s", self.path, e)

    def _readable(self) -> None:
        """More is readable (or the spool closed): tell the watcher. Under the lock."""
        if self._watcher is not None:
            self._watcher()

    def watch(self, fn: Callable[[], None] | None) -> None:
        """Call ``fn()`` (None: stop calling) whenever more becomes readable or the
        spool closes, from the thread that made it so and under the spool's lock:
        ``fn`` only hands the news on (``loop.call_soon_threadsafe``). One watcher."""
        with self._lock:
            self._watcher = fn

    def ack(self, seq: int) -> None:
        """The collector stored every record <= ``seq``: delete the closed segments it covers."""
        with self._lock:
            self._check_open()
            seq = min(seq, self._next_seq - 1)
            if self._acked is not None and seq <= self._acked:
                return
            self._acked = seq
            done = []
            for s in self._segs[:-1]:
                if s.last_seq is not None and s.last_seq > seq:
                    break
                done.append(s)
            if not done:
                return
            try:
                self._write_meta(self._pending)
            except OSError as e:  # deleting is still safe: the active segment keeps the seq
                log.warning("spool meta not saved path=%s error=%s", self.path, e)
            for s in done:
                self._delete(s)

    def stats(self) -> SpoolStats:
        with self._lock:
            acked = self._acked if self._acked is not None else 0
            unacked = [s for s in self._segs if s.last_seq is not None and s.last_seq > acked]
            last = max((s.last_seq for s in self._segs if s.last_seq is not None), default=None)
            return SpoolStats(
                bytes=self._bytes, segments=len(self._segs),
                records=sum(s.records for s in self._segs),
                unacked_records=sum(s.records if s.first_seq > acked else s.last_seq - acked
                                    for s in unacked),
                oldest_unacked_seq=max(unacked[0].first_seq, acked + 1) if unacked else None,
                last_seq=last, acked_seq=self._acked, pending_gaps=len(self._pending),
                **self._counts)
