"""The agent's durable, bounded, crash-safe record queue: sources -> spool -> shipper.

Every record is written here before it counts as accepted; the shipper reads what
is here after the collector's high mark, sends it, and trims the spool when the
collector acks. This docstring is the on-disk specification, format version 1;
this module (firstfault/agent/spool/format.py) holds its pure side (encode, check, scan, resync).

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
    "interval"  one fsync an interval (fsync_interval_ms) at most: an append made
                when the last fsync is an interval old fsyncs before it returns,
                in the appending thread (one wake writes and syncs); else a flusher
                thread fsyncs once the interval is over; otherwise append returns
                once the bytes are written (a process crash loses nothing); a power
                loss may lose the last interval of accepted records, and readers
                see records only after their fsync (up to one interval and an
                fsync late).
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
and last lost records, as known; nil if unknown); for "disk_full", origins: where
the lost records came from, JSON text ``{"/logs/rank3.log": 152, "kmsg": 2}`` (a
record's ``fields.path``, else its source; largest first, what does not fit in
1,000 bytes counted under ``"(more)"``), also named in the message. A gap is itself a record that
an overflow may drop: when a dropped segment held gap records that were not yet
acked, they are named again: merged into the drop's gap when their range is above
the acked seq (every seq between is lost too: first_seq and from_ns reach back),
else written again as they were; one that was acked (the collector has it) is not.
dropped_records counts the data records lost, never a gap record and never one
twice: summed over the gaps the collector gets, it is the number of records lost.
Ranges may overlap (a merged range may span one that a kept gap names): take their
union for the seqs, the sum of dropped_records for the count.

Bounded: before an entry would take the segments past max_bytes, whole segments
are deleted oldest first (the active one is rolled first if it is the only one)
and one gap (reason "overflow") names their unacked seqs and observed range.
Disk full (ENOSPC/EDQUOT on write or segment creation): the partial write is
truncated away, the records are not accepted and append raises SpoolFullError
(the daemon logs it, rate-limited, and goes on: there is nothing to retry). Their
seqs are spent and one gap (reason "disk_full", merged over a streak) is written
before the next entry that fits. A crash before that loses the gap: the seqs were
never visible, and are reused. An append with ``hold_on_full`` (a source that can
read its records again: ranklog) spends no seqs and writes no gap: SpoolFullError
(``held``) says how many of its last records were not taken, and the caller offers
them again later.

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

This module is the format, pure (no I/O): encode, check, scan and resync a
segment's bytes. The package's other modules (firstfault/agent/spool/): gaps.py (the gap
records), state.py (what the writer, reader and recovery share: segments, seqs, meta),
recovery.py (open), writer.py and durability.py (append, fsync), encode.py (records to
entries), reader.py (reads, acks), queue.py (Spool: the whole, composed), intake.py (the
sources' emit into the spool), columns.py (records as columns).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from itertools import compress, islice
from operator import is_not, itemgetter

import msgpack

from firstfault import wire
from firstfault.agent.spool.columns import Runs

FORMAT_VERSION = 1
HEADER = struct.Struct(">IIQ")  # len, crc, seq
HEADER_BYTES = HEADER.size
LEN_SEQ = struct.Struct(">IQ")
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
ENTRY_MAX_RECORDS = 1000
MIN_RECORD_BYTES = 15  # source and kind >= 2 payload bytes each, 11 columns >= 1
COLUMNS = wire.COLUMNS  # the batch columns, in wire order
OBSERVED = COLUMNS.index("observed_ns")


def count_at(buf: bytes, p: int, stop: int) -> int | None:
    """The record count at the start of a payload at ``p`` (None if malformed)."""
    if buf[p] != 0x9E:  # fixarray of 14
        return None
    b = buf[p + 1]
    if b < 0x80:
        return b or None
    if b == 0xCC and p + 3 <= stop:
        return buf[p + 2]
    if b == 0xCD and p + 4 <= stop:
        return int.from_bytes(buf[p + 2:p + 4], "big") or None
    return None


def array_elements(packed: bytes | memoryview) -> bytes | memoryview:
    """A msgpack array's element bytes (its header cut off)."""
    b = packed[0]
    return packed[1:] if b < 0xDC else packed[3:] if b == 0xDC else packed[5:]


def column_elements(payload: memoryview) -> list[bytes | memoryview]:
    """The element bytes of each column array of an entry payload (nothing decoded)."""
    u = msgpack.Unpacker()
    u.feed(payload)
    u.read_array_header()
    u.skip()  # count
    out, pos = [], u.tell()
    for _ in COLUMNS:
        u.skip()
        end = u.tell()
        out.append(array_elements(payload[pos:end]))
        pos = end
    return out


def pack_column(col: Sequence | Runs) -> tuple[bytes, Sequence]:
    """(``msgpack.packb(col)``, the values of ``col`` the wire checks must see).

    Runs (firstfault/agent/spool/columns.py) are packed a value per run, its bytes repeated,
    and only the runs' values are checked. So is a column of maps that come in runs
    of one shared map (a source's fields: the ranklog shares one per path, and puts
    its position on each path's last row): a map costs ~175 ns to pack and ~600 to
    check, finding the runs ~50. A column holding bytes (UTF-8 text: a message) is
    packed as msgpack str, without decoding it. Other columns: checked as their
    first value when every value packs alike.
    """
    if type(col) is Runs:
        if len(col) == 1:  # one value for every record (source, kind, job, ...)
            v, k = col[0]
            return wire.array_header(k) + _pack(v) * k, (v,)
        return (wire.array_header(col.records()) + b"".join([_pack(v) * k for v, k in col]),
                tuple(map(_value, col)))
    n, first = len(col), col[0]
    if type(first) is bytes or (n > 1 and type(col[-1]) is bytes):
        return _pack_text(col), col
    if type(first) is dict and n > 1:
        cuts = [0, *compress(range(1, n), map(is_not, islice(col, 1, None), col)), n]
        if len(cuts) - 1 <= n // 4:  # runs of 4 rows or more on average
            runs = [(col[a], b - a) for a, b in zip(cuts, cuts[1:])]
            body = b"".join([msgpack.packb(v) * k for v, k in runs])
            return wire.array_header(n) + body, tuple(v for v, _ in runs)
    packed = msgpack.packb(col)
    return packed, col[:1] if same_packed(col, packed) else col


_pack = msgpack.Packer().pack
_value = itemgetter(0)  # of a run
_pack_text = msgpack.Packer(use_bin_type=False).pack  # bytes as str (raw), not bin


def check_values(name: str, values: Sequence) -> None:
    """wire.check_column, where the message column may instead hold bytes: each must be
    UTF-8 of at most MAX_MESSAGE_BYTES (they are sent as str without a decode), and
    none may be str (a column of both would be packed with its bytes as bin)."""
    types = set(map(type, values)) if name == "message" else None
    if types is None or bytes not in types:
        return wire.check_column(name, values)
    if len(types) > 1:  # pack_column would send bytes among str as msgpack bin
        raise wire.WireError("batch column 'message': bytes mixed with other values "
                             "(columns.as_text makes a column all str)")
    if max(map(len, values)) > wire.MAX_MESSAGE_BYTES:
        raise wire.WireError(f"batch column 'message': a message over {wire.MAX_MESSAGE_BYTES} bytes")
    if not all(map(bytes.isascii, values)):
        for v in values:
            try:
                v.decode()
            except UnicodeDecodeError as e:
                raise wire.WireError(f"batch column 'message': not UTF-8 text: {e}") from None


def same_packed(col: tuple, packed: bytes) -> bool:
    """Whether ``packed`` (msgpack of ``col``) is its first value's bytes repeated: the
    wire then sees one value, and checking it checks them all. (Equality alone would
    not do: 1 == 1.0 == True, and a collector rejects a float or bool rank.)"""
    c0, n = col[0], len(col)
    if col.count(c0) != n:
        return False
    one = msgpack.packb(c0)
    return (packed[:len(packed) - len(one) * n] == wire.array_header(n)
            and packed.endswith(one * n))


def entry_at(buf: bytes, pos: int, floor: int, ceil: int | None) -> tuple[int, int, int] | None:
    """(end, seq, count) of a valid entry at ``pos`` of ``buf``, else None.

    Valid: whole in ``buf``, crc right, seq > ``floor``, last seq < ``ceil``.
    """
    if len(buf) - pos < HEADER_BYTES + 2:
        return None
    n, crc, seq = HEADER.unpack_from(buf, pos)
    end = pos + HEADER_BYTES + n
    if n < 2 or n > MAX_PAYLOAD_BYTES or end > len(buf) or seq <= floor:
        return None
    count = count_at(buf, pos + HEADER_BYTES, end)
    if count is None or seq + count - 1 >= (ceil if ceil is not None else 2**63):
        return None
    mv = memoryview(buf)
    if zlib.crc32(mv[pos + 8:end], zlib.crc32(mv[pos:pos + 4])) != crc:
        return None
    return end, seq, count


def torn(buf: bytes, pos: int, floor: int) -> bool:
    """Whether the bytes from ``pos`` are an append cut short (not corruption)."""
    if len(buf) - pos < HEADER_BYTES:
        return True
    n, _, seq = HEADER.unpack_from(buf, pos)
    if n <= MAX_PAYLOAD_BYTES and pos + HEADER_BYTES + n > len(buf) and floor < seq < 2**63:
        return True
    return not bytes(buf[pos:]).strip(b"\0")


def resync(buf: bytes, pos: int, floor: int, ceil: int | None) -> int:
    """Offset of the next valid entry after a bad one at ``pos``, or len(buf)."""
    if len(buf) - pos >= HEADER_BYTES:
        q = pos + HEADER_BYTES + HEADER.unpack_from(buf, pos)[0]
        if q < len(buf) and entry_at(buf, q, floor, ceil):
            return q
    best = len(buf)
    hi = (floor + 1) >> 24
    for prefix in (hi, hi + 1):  # seq in floor+1 .. floor+2**24: these top 5 bytes
        needle = prefix.to_bytes(5, "big")
        at = pos + 1
        while (i := buf.find(needle, at + 8, best + 12)) != -1:
            q = i - 8
            at = q + 1
            if entry_at(buf, q, floor, ceil):
                best = q
                break
    return best


def scan(buf: bytes, floor: int, ceil: int | None, newest: bool):
    """Walk one segment: (entries, bad, torn_at).

    entries: [(offset, end, seq, count)]; bad: [(start, end, floor_before)] byte
    ranges skipped; torn_at: where a torn tail starts (newest segment only) or None.
    """
    entries: list[tuple[int, int, int, int]] = []
    bad: list[tuple[int, int, int]] = []
    pos = 0
    while pos < len(buf):
        e = entry_at(buf, pos, floor, ceil)
        if e is not None:
            entries.append((pos, *e))
            floor, pos = e[1] + e[2] - 1, e[0]
            continue
        nxt = resync(buf, pos, floor, ceil)
        if newest and nxt == len(buf) and torn(buf, pos, floor):
            return entries, bad, pos
        bad.append((pos, nxt, floor))
        pos = nxt
    return entries, bad, None


def observed_range(buf: bytes, off: int, end: int) -> tuple[int | None, int | None]:
    """(min, max) observed_ns of the entry at ``off``."""
    try:
        col = msgpack.unpackb(buf[off + HEADER_BYTES:end], raw=False,
                              strict_map_key=False)[1 + OBSERVED]
        return min(col), max(col)
    except (ValueError, TypeError, IndexError, msgpack.UnpackException):
        return None, None


def encode_entry(seq: int, payload: bytes) -> bytes:
    """Header + payload of one entry."""
    crc = zlib.crc32(payload, zlib.crc32(LEN_SEQ.pack(len(payload), seq)))
    return HEADER.pack(len(payload), crc, seq) + payload
