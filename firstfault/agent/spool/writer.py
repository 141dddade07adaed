"""The spool's write path (firstfault/agent/spool/format.py's docstring is the spec): entries
appended to the active segment, segments rolled at ``segment_bytes``, the oldest dropped past
``max_bytes`` with an overflow gap, a full disk turned into a disk-full gap (or held), and
the gaps waiting in ``pending`` written before the next entry. Encoding is encode.py's, the
fsync policy durability.py's; one writer thread at a time."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections import Counter
from typing import Any, Iterable

import msgpack

from firstfault.agent.spool.columns import Columns
from firstfault.agent.spool.durability import Durability
from firstfault.agent.spool.encode import GAP_RESERVE_BYTES, EncodedEntry, Encoder
from firstfault.agent.spool.format import HEADER_BYTES, encode_entry
from firstfault.agent.spool.gaps import count_origins, gap_row, merge
from firstfault.agent.spool.reader import RecentEntries
from firstfault.agent.spool.state import Segment, SpoolError, SpoolFullError, SpoolState, fsync_dir

log = logging.getLogger("firstfault.agent.spool")

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class Writer:
    """Appends to one spool: ``append(records)``, ``append_columns(records)`` -> last seq;
    ``write_pending()`` (under the lock) writes the gaps queued in the state."""

    def __init__(self, st: SpoolState, encoder: Encoder, durability: Durability,
                 recent: RecentEntries, *, max_bytes: int, segment_bytes: int) -> None:
        self.st, self.encoder, self.durability, self.recent = st, encoder, durability, recent
        self.max_bytes, self.segment_bytes = max_bytes, segment_bytes

    def append(self, records: Iterable[Any], hold_on_full: bool = False) -> int:
        return self._write_entries(self.encoder.rows(records), hold_on_full)

    def append_columns(self, records: Columns, hold_on_full: bool = False) -> int:
        return self._write_entries(self.encoder.columns(records), hold_on_full)

    def write_pending(self) -> None:
        """Write the queued gaps and make them durable as the fsync mode says (under the lock)."""
        self.flush_pending()
        self.durability.after_write()

    # --- entries (the caller holds the lock) -------------------------------------------

    def _write(self, data: bytes) -> None:
        st = self.st
        view, done = memoryview(data), 0
        try:
            while done < len(data):
                done += os.write(st.fd, view[done:])
        except OSError:
            try:  # never leave a partial entry behind
                os.ftruncate(st.fd, st.segs[-1].size)
            except OSError as e:
                log.error("spool cannot cut a failed write path=%s error=%s",
                          st.segs[-1].path, e)
            raise

    def _put(self, payload: bytes, count: int, lo_ns, hi_ns, room: bool = True,
             packed: tuple[bytes, ...] | None = None) -> int:
        """Write one entry (rolling and making room first); its first seq. ``packed``:
        its columns' bytes, kept for the next read (reader.py's RecentEntries)."""
        st = self.st
        n = HEADER_BYTES + len(payload)
        if st.segs[-1].size and st.segs[-1].size + n > self.segment_bytes:
            self._roll()
        if room and st.bytes + n > self.max_bytes:
            self._make_room(n)
            if st.segs[-1].size and st.segs[-1].size + n > self.segment_bytes:
                self._roll()
        seq = st.next_seq
        self._write(encode_entry(seq, payload))
        self.recent.keep(seq, count, packed, n)
        act = st.segs[-1]
        if act.first_seq is None:
            act.first_seq, act.first_ns = seq, lo_ns
        act.last_seq, act.last_ns = seq + count - 1, hi_ns
        act.size += n
        act.records += count
        st.bytes += n
        st.next_seq = seq + count
        return seq

    def _roll(self) -> None:
        st = self.st
        old, base = st.segs[-1], st.next_seq
        new = Segment(base, st.seg_path(base))
        fd = os.open(new.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
                     0o644)
        try:
            if st.fsync != "never":
                os.fsync(st.fd)
                st.counts["fsyncs"] += 1
                fsync_dir(st.path)
        except OSError:
            os.close(fd)
            os.unlink(new.path)
            raise
        os.close(st.fd)
        st.fd = fd
        st.segs.append(new)
        st.vis_size = 0
        if old.last_seq is not None:
            if old.last_seq > st.vis_seq:  # its unsynced tail is durable now
                st.vis_seq = old.last_seq
                st.readable()
            if st.acked is not None and old.last_seq <= st.acked:
                st.delete(old)

    def _make_room(self, n: int) -> None:
        st = self.st
        dropped: list[Segment] = []
        try:
            while st.bytes + n + GAP_RESERVE_BYTES > self.max_bytes:
                if len(st.segs) == 1:
                    if not st.segs[0].size:
                        break
                    self._roll()  # may fail (disk full): what was dropped is still named
                    continue
                dropped.append(st.segs[0])
                st.delete(st.segs[0])
        finally:
            self._name_dropped(dropped)

    def _name_dropped(self, dropped: list[Segment]) -> None:
        """Queue and write one overflow gap naming the unacked data records of ``dropped``,
        and the unacked gap records they held (the collector never got them): one whose
        range is above the acked seq is merged into the new gap (everything between is lost
        too), one below it is written again as it was. Each lost record is counted once."""
        st = self.st
        acked = -1 if st.acked is None else st.acked
        gap, apart = None, []
        for s in dropped:
            lo = max(s.first_seq or 0, acked + 1)
            unacked = [g for seq, g in s.carried if seq >= lo]
            for g in unacked:
                if g["first_seq"] > acked:
                    gap = dict(g) if gap is None else merge(gap, g)
                else:
                    apart.append(g)
            if s.last_seq is not None and s.last_seq >= lo:
                nrec = (s.records if lo == s.first_seq else s.last_seq - lo + 1) - len(unacked)
                st.counts["dropped_records"] += nrec
                g = {"reason": "overflow", "dropped_records": nrec, "dropped_bytes": s.size,
                     "first_seq": lo, "last_seq": s.last_seq, "from_ns": s.first_ns,
                     "to_ns": s.last_ns}
                gap = g if gap is None else merge(gap, g)
        if gap is not None:
            gap = {**gap, "reason": "overflow", "at_ns": time.time_ns(), "origins": gap.get("origins")}
            log.warning("spool full, oldest dropped path=%s records=%s seqs=%d..%d",
                        st.path, gap["dropped_records"], gap["first_seq"], gap["last_seq"])
            st.pending.append(gap)
        st.pending += apart
        if gap is not None or apart:
            self.flush_pending(room=False)

    def flush_pending(self, room: bool = True) -> None:
        """Write the gaps queued in ``st.pending`` as gap records (under the lock)."""
        st = self.st
        while st.pending:
            g, now = st.pending.pop(0), time.time_ns()
            try:  # popped first: writing it may make room and queue an overflow gap
                self._put(msgpack.packb([1, *([v] for v in gap_row(g, now))]), 1, now, now,
                          room=room)
            except BaseException:
                st.pending.insert(0, g)
                raise
            st.segs[-1].carry(g, st.next_seq - 1)
            st.counts["gaps_written"] += 1

    # --- an append ------------------------------------------------------------------------

    def _write_entries(self, entries: list[EncodedEntry], hold_on_full: bool) -> int:
        last, inline = self._write_entries_locked(entries, hold_on_full)
        if inline:  # "interval" and due: this thread fsyncs, outside the lock
            self.durability.flush_once(inline=True)
        return last

    def _write_entries_locked(self, entries: list[EncodedEntry],
                              hold_on_full: bool) -> tuple[int, bool]:
        st = self.st
        with st.lock:
            st.check_open()
            last, done = None, 0
            try:
                self.flush_pending()
                for payload, count, lo, hi, packed, _ in entries:
                    last = self._put(payload, count, lo, hi, packed=packed) + count - 1
                    done += 1
                inline = self.durability.due_inline()
                self.durability.after_write(inline)
            except OSError as e:
                if e.errno not in _DISK_FULL or done == len(entries):  # e.g. fsync failed
                    raise SpoolError(f"spool write failed in {st.path}: {e}; records up "
                                     f"to seq {last} are written, maybe not durable") from e
                if hold_on_full:
                    st.counts["disk_full_errors"] += 1
                    held = sum(en.count for en in entries[done:])
                    self._sync_quietly()
                    raise SpoolFullError(
                        f"disk full writing spool {st.path}: {held} records not stored; "
                        f"they wait at their source until there is room", dropped_records=held,
                        accepted_seq=last, held=True) from e
                lost = self._disk_full(entries[done:])
                self._sync_quietly()
                raise SpoolFullError(
                    f"disk full writing spool {st.path}: {lost} records not stored; a gap "
                    f"record will name them when space returns; free disk space or lower "
                    f"max_bytes", dropped_records=lost, accepted_seq=last) from e
            return (last if last is not None else st.next_seq - 1), inline

    def _sync_quietly(self) -> None:
        try:
            self.durability.after_write()
        except OSError:
            pass

    def _disk_full(self, entries: list[EncodedEntry]) -> int:
        st = self.st
        n = sum(e.count for e in entries)
        first, nbytes = st.next_seq, sum(HEADER_BYTES + len(e.payload) for e in entries)
        origins = sum((count_origins(e.columns) for e in entries), Counter())
        st.next_seq += n  # spent: the gap names them
        lo = min((e.lo_ns for e in entries if e.lo_ns is not None), default=None)
        hi = max((e.hi_ns for e in entries if e.hi_ns is not None), default=None)
        st.counts["disk_full_errors"] += 1
        st.counts["disk_full_records"] += n
        g = {"reason": "disk_full", "dropped_records": n, "dropped_bytes": nbytes,
             "first_seq": first, "last_seq": first + n - 1, "from_ns": lo, "to_ns": hi,
             "at_ns": time.time_ns(), "origins": dict(origins)}
        prev = st.pending[-1] if st.pending else None
        if prev and prev["reason"] == "disk_full" and prev["last_seq"] == first - 1:
            st.pending[-1] = merge(prev, g)  # one gap for a whole streak
        else:
            log.error("spool disk full, dropping records path=%s first_seq=%d", st.path, first)
            st.pending.append(g)
        return n

    def close(self) -> None:
        """At close, the flusher stopped: write what is pending, fsync, save meta, close
        the active segment (its fd is closed even when a step fails)."""
        st = self.st
        with st.lock:
            try:
                self.flush_pending()
                if st.fsync != "never":
                    os.fsync(st.fd)
                st.write_meta(st.pending)
            except OSError as e:
                log.error("spool close incomplete path=%s error=%s", st.path, e)
            finally:
                os.close(st.fd)
