"""The spool's open and recovery (part of Spool, firstfault/agent/spool.py): read and write
``meta``, scan every segment, cut torn tails, name corrupt bytes in gap records, drop what
is acked. Also the pieces the writer shares: the errors, SpoolStats, a segment's bookkeeping.
The on-disk format is specified in firstfault/agent/spoolfile.py's docstring."""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from firstfault.agent.spoolfile import (
    FORMAT_VERSION,
    HEADER,
    HEADER_BYTES,
    MIN_RECORD_BYTES,
    entry_at,
    gap_ok,
    gaps_in,
    observed_range,
    scan,
)

log = logging.getLogger("firstfault.agent.spool")

_SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")


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


class _Segment:
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


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One gap naming both ranges (and what lies between)."""
    def lo(k):
        return min((v for v in (a[k], b[k]) if v is not None), default=None)

    def hi(k):
        return max((v for v in (a[k], b[k]) if v is not None), default=None)
    n = (None if a["dropped_records"] is None or b["dropped_records"] is None
         else a["dropped_records"] + b["dropped_records"])
    origins = Counter(a.get("origins") or {}) + Counter(b.get("origins") or {})
    return {**a, "dropped_records": n, "dropped_bytes": a["dropped_bytes"] + b["dropped_bytes"],
            "first_seq": lo("first_seq"), "last_seq": hi("last_seq"), "from_ns": lo("from_ns"),
            "to_ns": hi("to_ns"), "origins": dict(origins) if origins else None}


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SpoolOpen:
    """Open and recovery, a base of Spool: it works on Spool's state (``_segs``, ``_counts``, ...)."""

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
            for seq, g in gaps_in(buf, entries):
                seg.carry(g, seq)
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
