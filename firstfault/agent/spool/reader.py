"""The spool's read side: records after a seq as columns, as a framed wire batch or as
Records (the shipper's reads); a source's recent rows; acks, which delete what the collector
stored. Readers see only what is durable (below the horizon in the SpoolState); a crc
mismatch met while reading becomes one gap record. The on-disk format is specified in
firstfault/agent/spool/format.py's docstring. One reader thread at a time, beside the writer."""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any, Callable, Iterator

import msgpack

from firstfault import wire
from firstfault.agent.spool.format import (
    COLUMNS,
    HEADER,
    HEADER_BYTES,
    array_elements,
    column_elements,
    entry_at,
    resync,
)
from firstfault.agent.spool.recovery import corrupt_gap
from firstfault.agent.spool.state import SpoolState
from firstfault.wire import BatchColumns, Record

log = logging.getLogger("firstfault.agent.spool")

DEFAULT_READ_BYTES = 4 * 1024 * 1024


def _seqs(ranges: list[range]) -> range | list[int]:
    contiguous = all(a.stop == b.start for a, b in zip(ranges, ranges[1:]))
    return (range(ranges[0].start, ranges[-1].stop) if contiguous
            else [s for r in ranges for s in r])


RECENT_BYTES = 1 << 20  # payload bytes of the latest entries a reader gets from memory


class RecentEntries:
    """The latest entries' column bytes (up to RECENT_BYTES), kept from their append: a
    reader that keeps up (the shipper at a steady rate) takes them from here once they are
    durable, without opening, reading and parsing the segment. Used under the spool's lock."""

    def __init__(self) -> None:
        self.entries: deque[tuple[int, int, tuple[bytes, ...], int]] = deque()
        self.bytes = 0

    def keep(self, seq: int, count: int, packed: tuple[bytes, ...] | None, size: int) -> None:
        """An entry of ``size`` bytes was written: keep its columns for the next read."""
        recent = self.entries
        if packed is None:  # (a gap record) the chain breaks: readers go to the file
            recent.clear()
            self.bytes = 0
            return
        recent.append((seq, count, packed, size))
        self.bytes += size
        while self.bytes > RECENT_BYTES and len(recent) > 1:
            self.bytes -= recent.popleft()[3]

    def take(self, after: int, max_records: int, max_bytes: int, vis: int
             ) -> tuple[list[range], list[list[bytes]]] | None:
        """What Reader._pick would take after ``after`` (durable up to seq ``vis``), when
        it is whole entries still here; else None."""
        recent = self.entries
        if not recent or recent[0][0] > after + 1 or recent[-1][0] <= after:
            return None
        ranges, cols, taken, nbytes = [], [[] for _ in COLUMNS], 0, 0
        for seq, count, packed, size in recent:
            if seq + count - 1 <= after:
                continue
            if seq != after + 1 + taken or seq + count - 1 > vis:
                break  # part of an entry, or not durable yet
            if taken and nbytes + size > max_bytes:
                break
            if taken + count > max_records:
                return None  # part of an entry: the file's way
            for c, b in zip(cols, packed):
                c.append(array_elements(b))
            ranges.append(range(seq, seq + count))
            taken, nbytes = taken + count, nbytes + size
            if taken >= max_records or nbytes >= max_bytes:
                break
        return (ranges, cols) if ranges else None


class Reader:
    """Reads one spool's durable records and takes its acks. ``write_pending`` (the
    writer's, called under the lock) writes a gap the reader queued in the state."""

    def __init__(self, st: SpoolState, recent: RecentEntries,
                 write_pending: Callable[[], None]) -> None:
        self.st, self.recent, self._write_pending = st, recent, write_pending
        self._cursor: tuple[int, str, int, int] | None = None  # after, path, offset, floor

    def ack(self, seq: int) -> None:
        """The collector stored every record <= ``seq``: delete the closed segments it covers."""
        st = self.st
        with st.lock:
            st.check_open()
            seq = min(seq, st.next_seq - 1)
            if st.acked is not None and seq <= st.acked:
                return
            st.acked = seq
            done = []
            for s in st.segs[:-1]:
                if s.last_seq is not None and s.last_seq > seq:
                    break
                done.append(s)
            if not done:
                return
            try:
                st.write_meta(st.pending)
            except OSError as e:  # deleting is still safe: the active segment keeps the seq
                log.warning("spool meta not saved path=%s error=%s", st.path, e)
            for s in done:
                st.delete(s)

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
        return BatchColumns(self.st.node, self.st.stream, _seqs(ranges), dict(zip(COLUMNS, cols)))

    def read_frame_after(self, seq: int | None, max_records: int = wire.MAX_BATCH_RECORDS,
                         max_bytes: int = DEFAULT_READ_BYTES
                         ) -> tuple[range | list[int], bytes] | None:
        """As read_batch_after, as (seqs, one framed wire ``batch``): the shipper's path.

        Whole entries are not decoded: their column arrays' bytes go into the frame
        as they are (wire.encode_packed_columns), checked at append and by the crc
        here. WireError (ERR_TOO_LARGE) if the frame passes MAX_FRAME_BYTES."""
        got = (self._from_recent(-1 if seq is None else seq, max_records, max_bytes)
               or self._from_file(seq, max_records, max_bytes))
        if got is None:
            return None
        ranges, cols = got
        seqs = _seqs(ranges)
        return seqs, wire.encode_packed_columns(self.st.node, self.st.stream, seqs,
                                                [b"".join(c) for c in cols])

    def _from_recent(self, after: int, max_records: int, max_bytes: int
                     ) -> tuple[list[range], list[list[bytes]]] | None:
        with self.st.lock:
            return self.recent.take(after, max_records, max_bytes, self.st.vis_seq)

    def _from_file(self, seq: int | None, max_records: int, max_bytes: int
                   ) -> tuple[list[range], list[list[bytes]]] | None:
        """What _pick takes, as (seq ranges, each column's array elements); None if nothing."""
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
        return (ranges, cols) if ranges else None

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
        st = self.st
        with st.lock:
            st.check_open()
            plan = []
            for i, s in enumerate(st.segs):
                end = s.size if i < len(st.segs) - 1 else st.vis_size
                if s.last_seq is not None and s.last_seq > after and end:
                    ceil = st.segs[i + 1].base if i + 1 < len(st.segs) else st.vis_seq + 1
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
        st = self.st
        with st.lock:
            if (path, off) in st.reported or st.closed:
                return
            st.reported.add((path, off))
            g = corrupt_gap(st, path, buf, 0, nxt, floor, ceil, [], None)
            if g is not None:
                g["at_ns"] = time.time_ns()
                st.next_seq = max(st.next_seq, g["last_seq"] + 1)
                st.pending.append(g)
                try:
                    self._write_pending()
                except OSError as e:
                    log.error("spool gap not written yet path=%s error=%s", st.path, e)
