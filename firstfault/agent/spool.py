"""The agent's spool: a durable queue of records in a directory of segments, kept until the
collector acks them. The on-disk format (segments, entries, meta, gap records, recovery) is
specified in firstfault/agent/spoolfile.py's docstring, beside the code that reads and writes
it; this module is the stateful queue: append, fsync, roll, overflow, ack, stats. Open and
recovery are in spoolopen.py, the readers in spoolread.py (both bases of Spool).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections import Counter, deque
from operator import attrgetter
from typing import Any, Callable, Iterable

import msgpack

from firstfault import wire
from firstfault.agent.columns import Columns, Runs
from firstfault.agent.osthread import name_this_thread
from firstfault.agent.spoolfile import (
    COLUMNS,
    ENTRY_MAX_RECORDS,
    HEADER_BYTES,
    OBSERVED,
    check_values,
    encode_entry,
    gap_row,
    pack_column,
)
from firstfault.agent.spoolopen import (
    InvalidRecordError,
    SpoolError,
    SpoolFullError,
    SpoolOpen,
    SpoolStats,
    _fsync_dir,
    _merge,
    _Segment,
)
from firstfault.agent.spoolread import DEFAULT_READ_BYTES, SpoolReads
from firstfault.wire import WireError

__all__ = ["DEFAULT_READ_BYTES", "InvalidRecordError", "Spool", "SpoolError", "SpoolFullError", "SpoolStats"]

log = logging.getLogger(__name__)

MIN_SEGMENT_BYTES = 4096
DEFAULT_SEGMENT_BYTES = 8 * 1024 * 1024
GAP_RESERVE_BYTES = 2048  # room kept for the gap record an overflow writes
FSYNC_MODES = ("always", "interval", "never")
_row = attrgetter(*COLUMNS)
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _origin(source: Any, fields: Any) -> str:
    """Where a record comes from, for a gap: its file (``fields.path``), else its source."""
    path = fields.get("path") if type(fields) is dict else None
    return path if type(path) is str else str(source)


def _origins(c: Columns) -> Counter:
    """How many of ``c``'s records come from each origin (``_origin``)."""
    source, fields = (col.values() if type(col) is Runs else col for col in (c.cols[0], c.cols[-1]))
    return Counter(map(_origin, source, fields))


# --- the spool -----------------------------------------------------------------

class Spool(SpoolOpen, SpoolReads):
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
        self._synced_at = -float("inf")  # monotonic time the last fsync began ("interval")
        self._syncing = False  # an appending thread is fsyncing
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
        self._recent: deque[tuple[int, int, tuple[bytes, ...]]] = deque()  # spoolread.py
        self._recent_bytes = 0
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

    # --- writing (the caller holds the lock) -----------------------------------

    def _write(self, data: bytes) -> None:
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

    def _put(self, payload: bytes, count: int, lo_ns, hi_ns, room: bool = True,
             packed: tuple[bytes, ...] | None = None) -> int:
        """Write one entry (rolling and making room first); its first seq. ``packed``:
        its columns' bytes, kept for the next read (spoolread.py)."""
        n = HEADER_BYTES + len(payload)
        if self._segs[-1].size and self._segs[-1].size + n > self.segment_bytes:
            self._roll()
        if room and self._bytes + n > self.max_bytes:
            self._make_room(n)
            if self._segs[-1].size and self._segs[-1].size + n > self.segment_bytes:
                self._roll()
        seq = self._next_seq
        self._write(encode_entry(seq, payload))
        self._keep_recent(seq, count, packed, n)
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
            if old.last_seq > self._vis_seq:  # its unsynced tail is durable now
                self._vis_seq = old.last_seq
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
        """Queue and write one overflow gap naming the unacked data records of ``dropped``,
        and the unacked gap records they held (the collector never got them): one whose
        range is above the acked seq is merged into the new gap (everything between is lost
        too), one below it is written again as it was. Each lost record is counted once."""
        acked = -1 if self._acked is None else self._acked
        gap, apart = None, []
        for s in dropped:
            lo = max(s.first_seq or 0, acked + 1)
            unacked = [g for seq, g in s.carried if seq >= lo]
            for g in unacked:
                if g["first_seq"] > acked:
                    gap = dict(g) if gap is None else _merge(gap, g)
                else:
                    apart.append(g)
            if s.last_seq is not None and s.last_seq >= lo:
                nrec = (s.records if lo == s.first_seq else s.last_seq - lo + 1) - len(unacked)
                self._counts["dropped_records"] += nrec
                g = {"reason": "overflow", "dropped_records": nrec, "dropped_bytes": s.size,
                     "first_seq": lo, "last_seq": s.last_seq, "from_ns": s.first_ns,
                     "to_ns": s.last_ns}
                gap = g if gap is None else _merge(gap, g)
        if gap is not None:
            gap = {**gap, "reason": "overflow", "at_ns": time.time_ns(), "origins": gap.get("origins")}
            log.warning("spool full, oldest dropped path=%s records=%s seqs=%d..%d",
                        self.path, gap["dropped_records"], gap["first_seq"], gap["last_seq"])
            self._pending.append(gap)
        self._pending += apart
        if gap is not None or apart:
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
            self._segs[-1].carry(g, self._next_seq - 1)
            self._counts["gaps_written"] += 1

    def _sync(self, inline: bool = False) -> None:
        """After writes: fsync if "always", then show readers what is durable ("interval":
        the flusher will, once an interval passed since the last fsync, unless the
        writing thread does at once: ``inline``)."""
        act = self._segs[-1]
        if self.fsync == "interval":
            if self._vis_size < act.size and not inline:
                self._dirty.set()
            return
        if self._vis_size == act.size:
            return
        if self.fsync == "always":
            os.fsync(self._fd)
            self._counts["fsyncs"] += 1
        self._vis_size = act.size
        self._vis_seq = max(self._vis_seq, act.last_seq or 0)
        self._readable()

    def _fsync_now(self) -> bool:
        """"interval", after writes (under the lock): whether the writing thread fsyncs
        them itself, now: the last fsync is an interval old and none is under way
        (one wake appends and syncs, the flusher sleeps); else the flusher will."""
        if (self._syncing or self._vis_size >= self._segs[-1].size
                or time.monotonic() - self._synced_at < self.fsync_interval_ms / 1000):
            return False
        self._syncing = True
        return True

    def _flush_loop(self) -> None:
        """fsync what appends left unsynced, fsync_interval_ms after the last fsync;
        asleep while none come."""
        name_this_thread()
        while not self._stop.is_set():
            self._dirty.wait()
            self._dirty.clear()
            if self._stop.wait(self._synced_at + self.fsync_interval_ms / 1000 - time.monotonic()):
                return
            self._flush_once()

    def _flush_once(self, inline: bool = False) -> None:
        """fsync the active segment and show readers what it holds; an error is logged
        and the flusher tries again an interval later."""
        try:
            with self._lock:
                act = self._segs[-1] if not self._closed else None
                if act is None or self._vis_size >= act.size:
                    return
                fd, size, last = os.dup(self._fd), act.size, act.last_seq
                self._synced_at = time.monotonic()
            try:
                os.fsync(fd)  # outside the lock: appends go on meanwhile
            finally:
                os.close(fd)
            with self._lock:
                self._counts["fsyncs"] += 1
                if self._segs and self._segs[-1] is act and size > self._vis_size:
                    self._vis_size, self._vis_seq = size, max(self._vis_seq, last or 0)
                    self._readable()
        except OSError as e:
            log.error("spool fsync failed path=%s error=%s", self.path, e)
            self._dirty.set()  # try again in an interval
        finally:
            if inline:
                self._syncing = False

    # --- the writer's API ------------------------------------------------------

    def _encode(self, rows: list[tuple], out: list) -> None:
        """Append (payload, count, min_ns, max_ns, packed columns, Columns) entries for
        ``rows`` to ``out``."""
        cols = list(zip(*rows))
        if len(cols) != len(COLUMNS) or len(rows[0]) != len(rows[-1]):
            raise InvalidRecordError(f"spool append: a record has {len(rows[0])} or "
                                     f"{len(rows[-1])} columns, not {len(COLUMNS)}")
        self._encode_columns(Columns(len(rows), cols), out)

    def _encode_columns(self, c: Columns, out: list) -> None:
        """Append the entries of ``c`` (at most ENTRY_MAX_RECORDS records) to ``out``."""
        n, cols = c.n, c.cols
        try:
            packed, checked = zip(*map(pack_column, cols))
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidRecordError(f"spool append: cannot encode: {e}") from None
        lengths = [sum(k for _, k in col) if type(col) is Runs else len(col) for col in cols]
        if lengths.count(n) != len(COLUMNS):
            raise InvalidRecordError(f"spool append: columns of {lengths} values for {n} records")
        if self.validate:
            for name, values in zip(COLUMNS, checked):
                try:
                    check_values(name, values)
                except WireError as e:
                    raise InvalidRecordError(f"spool append: {e}") from None
        payload = b"".join([b"\x9e", msgpack.packb(n), *packed])
        if len(payload) > self._entry_limit and n > 1:
            half = n // 2
            self._encode_columns(c.cut(0, half), out)
            self._encode_columns(c.cut(half, n), out)
            return
        if HEADER_BYTES + len(payload) + GAP_RESERVE_BYTES > self.max_bytes:
            raise InvalidRecordError(f"spool append: a record of {len(payload)} bytes does "
                                     f"not fit max_bytes={self.max_bytes}")
        obs = checked[OBSERVED]
        try:
            out.append((payload, n, min(obs), max(obs), packed, c))
        except TypeError:  # validate=False and a bad observed_ns
            out.append((payload, n, None, None, packed, c))

    def append(self, records: Iterable[Any], *, hold_on_full: bool = False) -> int:
        """Store ``records``, give them seqs; the last seq (the current one if none).

        Each record is a sources Draft, a wire Record (its node, stream and seq are
        ignored) or a tuple of the wire columns in order. Accepted when this returns
        (fsynced first if fsync="always"). Raises InvalidRecordError (nothing
        written) or SpoolFullError (disk full: see the module docstring). With
        ``hold_on_full`` a full disk spends no seqs and queues no gap: the caller
        keeps the records it was not given back as accepted and appends them again
        (a source that can read them again, as ranklog from its files).
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
        return self._write_entries(entries, hold_on_full)

    def append_columns(self, records: Columns, *, hold_on_full: bool = False) -> int:
        """append() for records given as columns (firstfault/agent/columns.py): no tuple
        per record; a Runs column is packed and checked a run at a time."""
        n = records.n
        if len(records.cols) != len(COLUMNS):
            raise InvalidRecordError(f"spool append: {len(records.cols)} columns, not "
                                     f"{len(COLUMNS)}")
        entries: list = []
        for i in range(0, n, ENTRY_MAX_RECORDS):
            self._encode_columns(records if n <= ENTRY_MAX_RECORDS
                                 else records.cut(i, min(n, i + ENTRY_MAX_RECORDS)), entries)
        return self._write_entries(entries, hold_on_full)

    def _write_entries(self, entries: list, hold_on_full: bool) -> int:
        last, inline = self._write_entries_locked(entries, hold_on_full)
        if inline:  # "interval" and due: this thread fsyncs, outside the lock
            self._flush_once(inline=True)
        return last

    def _write_entries_locked(self, entries: list, hold_on_full: bool) -> tuple[int, bool]:
        with self._lock:
            self._check_open()
            last, done = None, 0
            try:
                self._flush_pending()
                for payload, count, lo, hi, packed, _ in entries:
                    last = self._put(payload, count, lo, hi, packed=packed) + count - 1
                    done += 1
                inline = self.fsync == "interval" and self._fsync_now()
                self._sync(inline)
            except OSError as e:
                if e.errno not in _DISK_FULL or done == len(entries):  # e.g. fsync failed
                    raise SpoolError(f"spool write failed in {self.path}: {e}; records up "
                                     f"to seq {last} are written, maybe not durable") from e
                if hold_on_full:
                    self._counts["disk_full_errors"] += 1
                    held = sum(en[1] for en in entries[done:])
                    try:
                        self._sync()
                    except OSError:
                        pass
                    raise SpoolFullError(
                        f"disk full writing spool {self.path}: {held} records not stored; "
                        f"they wait at their source until there is room", dropped_records=held,
                        accepted_seq=last, held=True) from e
                lost = self._disk_full(entries[done:])
                try:
                    self._sync()
                except OSError:
                    pass
                raise SpoolFullError(
                    f"disk full writing spool {self.path}: {lost} records not stored; a gap "
                    f"record will name them when space returns; free disk space or lower "
                    f"max_bytes", dropped_records=lost, accepted_seq=last) from e
            return (last if last is not None else self._next_seq - 1), inline

    def _disk_full(self, entries: list) -> int:
        n = sum(e[1] for e in entries)
        first, nbytes = self._next_seq, sum(HEADER_BYTES + len(e[0]) for e in entries)
        origins = sum((_origins(e[5]) for e in entries), Counter())
        self._next_seq += n  # spent: the gap names them
        lo = min((e[2] for e in entries if e[2] is not None), default=None)
        hi = max((e[3] for e in entries if e[3] is not None), default=None)
        self._counts["disk_full_errors"] += 1
        self._counts["disk_full_records"] += n
        g = {"reason": "disk_full", "dropped_records": n, "dropped_bytes": nbytes,
             "first_seq": first, "last_seq": first + n - 1, "from_ns": lo, "to_ns": hi,
             "at_ns": time.time_ns(), "origins": dict(origins)}
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

    def _readable(self) -> None:
        """More is readable (or the spool closed): tell the watcher. Under the lock."""
        if self._watcher is not None:
            self._watcher()

    @property
    def visible_seq(self) -> int:
        """The last seq a reader can see now (0: none yet); a read after it finds nothing."""
        return self._vis_seq

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
