"""The agent's spool: a durable queue of records in a directory of segments, kept until the
collector acks them. The on-disk format (segments, entries, meta, gap records, recovery) is
specified in firstfault/agent/spool/format.py's docstring. ``Spool`` is the whole, composed
of its parts over one SpoolState (state.py): recovery.py opens it, a Writer (writer.py, with
encode.py and durability.py) appends, a Reader (reader.py) reads and takes acks.
"""

from __future__ import annotations

import fcntl
import logging
import os
from typing import Any, Callable, Iterable, Iterator

from firstfault import wire
from firstfault.agent.spool.columns import Columns
from firstfault.agent.spool.durability import Durability
from firstfault.agent.spool.encode import Encoder
from firstfault.agent.spool.reader import DEFAULT_READ_BYTES, Reader, RecentEntries
from firstfault.agent.spool.recovery import recover
from firstfault.agent.spool.state import FSYNC_MODES, SpoolError, SpoolState, SpoolStats
from firstfault.agent.spool.writer import Writer
from firstfault.wire import BatchColumns, Record

log = logging.getLogger("firstfault.agent.spool")

MIN_SEGMENT_BYTES = 4096
DEFAULT_SEGMENT_BYTES = 8 * 1024 * 1024


class Spool:
    """A directory of segments; firstfault/agent/spool/format.py's docstring is the spec.

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
        self.state = st = SpoolState(self.path, node, fsync)
        recent = RecentEntries()
        self.durability = Durability(st, fsync_interval_ms)
        self.writer = Writer(st, Encoder(validate=validate, max_bytes=max_bytes,
                                         entry_limit=min(4 * 1024 * 1024, segment_bytes // 4)),
                             self.durability, recent, max_bytes=max_bytes,
                             segment_bytes=segment_bytes)
        self.reader = Reader(st, recent, self.writer.write_pending)
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
            with st.lock:  # nobody else has it yet; the writer notifies under it
                self._open()
        except BaseException:
            if st.fd >= 0:
                os.close(st.fd)
            os.close(self._lock_fd)
            raise
        self.durability.start()

    def _open(self) -> None:
        """Recover, then write the gaps recovery found and save meta."""
        st = self.state
        recover(st)
        try:
            self.writer.write_pending()
        except OSError as e:
            log.warning("spool gaps not written yet path=%s gaps=%d error=%s",
                        self.path, len(st.pending), e)
        st.write_meta(st.pending)
        log.info("spool open path=%s stream=%s segments=%d bytes=%d next_seq=%d acked=%s",
                 self.path, st.stream, len(st.segs), st.bytes, st.next_seq, st.acked)

    @property
    def stream(self) -> str:
        """This spool's stream id (random hex, in meta)."""
        return self.state.stream

    def append(self, records: Iterable[Any], *, hold_on_full: bool = False) -> int:
        """Store ``records``, give them seqs; the last seq (the current one if none).

        Each record is a sources Draft, a wire Record (its node, stream and seq are
        ignored) or a tuple of the wire columns in order. Accepted when this returns
        (fsynced first if fsync="always"). Raises InvalidRecordError (nothing
        written) or SpoolFullError (disk full: see the format's docstring). With
        ``hold_on_full`` a full disk spends no seqs and queues no gap: the caller
        keeps the records it was not given back as accepted and appends them again
        (a source that can read them again, as ranklog from its files).
        """
        return self.writer.append(records, hold_on_full)

    def append_columns(self, records: Columns, *, hold_on_full: bool = False) -> int:
        """append() for records given as columns (firstfault/agent/spool/columns.py): no tuple
        per record; a Runs column is packed and checked a run at a time."""
        return self.writer.append_columns(records, hold_on_full)

    def read_batch_after(self, seq: int | None, max_records: int = wire.MAX_BATCH_RECORDS,
                         max_bytes: int = DEFAULT_READ_BYTES) -> BatchColumns | None:
        """Reader.read_batch_after: durable records after ``seq`` as columns."""
        return self.reader.read_batch_after(seq, max_records, max_bytes)

    def read_frame_after(self, seq: int | None, max_records: int = wire.MAX_BATCH_RECORDS,
                         max_bytes: int = DEFAULT_READ_BYTES
                         ) -> tuple[range | list[int], bytes] | None:
        """Reader.read_frame_after: the same as (seqs, one framed wire batch)."""
        return self.reader.read_frame_after(seq, max_records, max_bytes)

    def read_after(self, seq: int | None, max_records: int = wire.MAX_BATCH_RECORDS,
                   max_bytes: int = DEFAULT_READ_BYTES) -> list[Record]:
        """Reader.read_after: the same as Records."""
        return self.reader.read_after(seq, max_records, max_bytes)

    def recent_rows(self, since_ns: int | None, source: str) -> Iterator[tuple]:
        """Reader.recent_rows: ``source``'s rows in segments written since ``since_ns``."""
        return self.reader.recent_rows(since_ns, source)

    def ack(self, seq: int) -> None:
        """The collector stored every record <= ``seq``: delete the closed segments it covers."""
        self.reader.ack(seq)

    @property
    def visible_seq(self) -> int:
        """The last seq a reader can see now (0: none yet); a read after it finds nothing."""
        return self.state.vis_seq

    def watch(self, fn: Callable[[], None] | None) -> None:
        """Call ``fn()`` (None: stop calling) whenever more becomes readable or the
        spool closes, from the thread that made it so and under the spool's lock:
        ``fn`` only hands the news on (``loop.call_soon_threadsafe``). One watcher."""
        with self.state.lock:
            self.state.watcher = fn

    def stats(self) -> SpoolStats:
        return self.state.stats()

    def close(self) -> None:
        """Write what is pending, fsync, save meta, release the lock. Idempotent."""
        st = self.state
        with st.lock:
            if st.closed:
                return
            st.closed = True
            st.readable()
        self.durability.stop()
        try:
            self.writer.close()
        finally:
            os.close(self._lock_fd)

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
