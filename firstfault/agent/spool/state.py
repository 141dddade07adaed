"""What the spool's writer, reader and recovery share: the segments on disk, the seqs given
out and acked, the readers' horizon, the gaps not yet written, and ``meta``. One lock guards
it all (firstfault/agent/spool/format.py's docstring: Threads); the parts that change it
(writer.py, reader.py, recovery.py) each hold a reference to the one SpoolState of a Spool.
Also the spool's errors and SpoolStats."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable

from firstfault.agent.spool.format import FORMAT_VERSION

FSYNC_MODES = ("always", "interval", "never")


class SpoolError(Exception):
    """Base of the spool's errors."""


class SpoolFullError(SpoolError):
    """The disk is full: these records were not accepted; a gap will name them (held: the
    caller keeps them to append again, no gap, no seqs spent)."""

    def __init__(self, message: str, *, dropped_records: int, accepted_seq: int | None,
                 held: bool = False) -> None:
        super().__init__(message)
        self.dropped_records = dropped_records  # the last records of the append
        self.accepted_seq = accepted_seq  # last seq of this append that was written
        self.held = held


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


class Segment:
    """One segment file's bookkeeping: its name's seq, size, seqs and observed times."""

    __slots__ = ("base", "path", "size", "first_seq", "last_seq", "records", "first_ns",
                 "last_ns", "carried")

    def __init__(self, base: int, path: str) -> None:
        self.base, self.path, self.size, self.records = base, path, 0, 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.carried: list[tuple[int, dict[str, Any]]] = []  # (seq, fields) of its gap records

    def carry(self, g: dict[str, Any], seq: int) -> None:
        """Remember a gap record written here (at ``seq``): dropping this segment before it
        is acked must write it again."""
        self.carried.append((seq, g))


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SpoolState:
    """The shared state of one open spool; every field is read and changed under ``lock``.

    ``fd`` is the active (newest) segment's, open for appending; readers see the active
    segment up to ``vis_size`` bytes and seqs up to ``vis_seq`` (the durable horizon)."""

    def __init__(self, path: str, node: str, fsync: str) -> None:
        self.path, self.node, self.fsync = path, node, fsync
        self.stream: str = ""
        self.created_ns: int | None = None
        self.lock = threading.Lock()
        self.watcher: Callable[[], None] | None = None
        self.closed = False
        self.segs: list[Segment] = []
        self.fd = -1
        self.next_seq = 1
        self.acked: int | None = None
        self.bytes = 0
        self.vis_size = 0  # readers see the active segment up to here ...
        self.vis_seq = 0  # ... and seqs up to here
        self.pending: list[dict[str, Any]] = []  # gaps not yet written
        self.reported: set[tuple[str, int]] = set()  # corruption a reader found
        self.counts = dict(dropped_records=0, corrupt_ranges=0, disk_full_errors=0,
                           disk_full_records=0, gaps_written=0, fsyncs=0)

    def seg_path(self, base: int) -> str:
        return os.path.join(self.path, f"{base:020d}.seg")

    def check_open(self) -> None:
        if self.closed:
            raise SpoolError(f"spool {self.path} is closed")

    def readable(self) -> None:
        """More is readable (or the spool closed): tell the watcher. Under the lock."""
        if self.watcher is not None:
            self.watcher()

    def delete(self, seg: Segment) -> None:
        try:
            os.unlink(seg.path)
        except FileNotFoundError:
            pass
        self.segs.remove(seg)
        self.bytes -= seg.size

    def write_meta(self, pending: list[dict[str, Any]] | None = None) -> None:
        """Replace ``meta`` whole (tmp, fsync, rename, fsync dir; no fsync with "never")."""
        meta = {"format": FORMAT_VERSION, "node": self.node, "stream": self.stream,
                "created_ns": self.created_ns, "acked_seq": self.acked,
                "next_seq": self.next_seq, "pending_gaps": pending or []}
        tmp = os.path.join(self.path, "meta.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(meta, f)
            f.flush()
            if self.fsync != "never":
                os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.path, "meta"))
        if self.fsync != "never":
            fsync_dir(self.path)

    def stats(self) -> SpoolStats:
        with self.lock:
            acked = self.acked if self.acked is not None else 0
            unacked = [s for s in self.segs if s.last_seq is not None and s.last_seq > acked]
            last = max((s.last_seq for s in self.segs if s.last_seq is not None), default=None)
            return SpoolStats(
                bytes=self.bytes, segments=len(self.segs),
                records=sum(s.records for s in self.segs),
                unacked_records=sum(s.records if s.first_seq > acked else s.last_seq - acked
                                    for s in unacked),
                oldest_unacked_seq=max(unacked[0].first_seq, acked + 1) if unacked else None,
                last_seq=last, acked_seq=self.acked, pending_gaps=len(self.pending),
                **self.counts)

