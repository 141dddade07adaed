"""The spool's entries on disk, pure: encode, check, scan and resync segment bytes, and the
gap records (the format is specified in firstfault/agent/spool.py's docstring; no I/O here)."""

from __future__ import annotations

import bisect
import struct
import time
import zlib
from itertools import compress, islice
from operator import is_not
from typing import Any

import msgpack

from firstfault import wire
from firstfault.wire import KIND_AGENT_GAP, SOURCE_AGENT

FORMAT_VERSION = 1
HEADER = struct.Struct(">IIQ")  # len, crc, seq
HEADER_BYTES = HEADER.size
LEN_SEQ = struct.Struct(">IQ")
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
ENTRY_MAX_RECORDS = 1000
MIN_RECORD_BYTES = 15  # source and kind >= 2 payload bytes each, 11 columns >= 1
COLUMNS = wire.COLUMNS  # the batch columns, in wire order
OBSERVED = COLUMNS.index("observed_ns")
GAP_KIND = msgpack.packb(KIND_AGENT_GAP)


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


def pack_column(col: tuple) -> tuple[bytes, tuple]:
    """(``msgpack.packb(col)``, the values of ``col`` the wire checks must see).

    A column of maps that come in runs of one shared map (a source's fields: the
    ranklog shares one per path, and puts its position on each path's last row) is
    packed a map per run, its bytes repeated, and only the runs' maps are checked:
    a map costs ~175 ns to pack and ~600 to check, finding the runs ~50. Other
    columns: checked as their first value when every value packs alike.
    """
    n, first = len(col), col[0]
    if type(first) is dict and n > 1:
        cuts = [0, *compress(range(1, n), map(is_not, islice(col, 1, None), col)), n]
        if len(cuts) - 1 <= n // 4:  # runs of 4 rows or more on average
            runs = [(col[a], b - a) for a, b in zip(cuts, cuts[1:])]
            body = b"".join([msgpack.packb(v) * k for v, k in runs])
            return wire.array_header(n) + body, tuple(v for v, _ in runs)
    packed = msgpack.packb(col)
    return packed, col[:1] if same_packed(col, packed) else col


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


def iso(ns: int | None) -> str:
    if ns is None:
        return "?"
    ms = ns % 10**9 // 10**6
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ms:03d}Z"


def gap_row(g: dict[str, Any], now_ns: int) -> tuple:
    n, a, b = g["dropped_records"], g["first_seq"], g["last_seq"]
    what = {"overflow": "spool over max_bytes: dropped the oldest unshipped",
            "corrupt": "spool corrupt on disk: lost",
            "disk_full": "disk full: could not spool"}.get(g["reason"], "lost")
    count = f"{n}" if n is not None else f"at most {b - a + 1}"
    msg = (f"{what} {count} records (seq {a}..{b}, {g['dropped_bytes']} bytes) observed "
           f"{iso(g['from_ns'])} .. {iso(g['to_ns'])}")
    occurred = None if g["reason"] == "corrupt" else g.get("at_ns", now_ns)
    fields = {k: g[k] for k in ("reason", "dropped_records", "dropped_bytes", "first_seq",
                                "last_seq", "from_ns", "to_ns")}
    return (SOURCE_AGENT, KIND_AGENT_GAP, msg, occurred, now_ns, None, None, None, None,
            None, None, 4, fields)


def gaps_in(buf: bytes, entries: list[tuple[int, int, int, int]]) -> list[dict[str, Any]]:
    """The fields of the gap records among ``entries`` (found by their kind's bytes)."""
    out, at, starts = [], 0, [e[0] for e in entries]
    while (i := buf.find(GAP_KIND, at)) != -1:
        k = bisect.bisect_right(starts, i) - 1
        if k < 0 or i >= entries[k][1]:  # in bytes that are no entry
            at = i + 1
            continue
        at = entries[k][1]
        try:
            cols = msgpack.unpackb(buf[entries[k][0] + HEADER_BYTES:entries[k][1]], raw=False,
                                   strict_map_key=False)[1:]
        except (ValueError, TypeError, msgpack.UnpackException):
            continue
        out += [f for kind, f in zip(cols[1], cols[12])
                if kind == KIND_AGENT_GAP and gap_ok(f)]
    return out


def gap_ok(g: Any) -> bool:
    """Whether ``g`` (from meta) has the fields of a gap."""
    return (type(g) is dict and type(g.get("reason")) is str
            and all(type(g.get(k)) is int for k in ("first_seq", "last_seq", "dropped_bytes"))
            and all(g.get(k) is None or type(g.get(k)) is int
                    for k in ("dropped_records", "from_ns", "to_ns")))
