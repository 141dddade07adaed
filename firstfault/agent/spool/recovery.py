"""The spool's open and recovery (firstfault/agent/spool/format.py's docstring, "Recovery at
open"): read ``meta``, scan every segment, cut torn tails, name corrupt bytes in gap records,
drop what is acked. ``recover`` fills a SpoolState; the Spool (queue.py) then writes the gaps
found (writer.py) and saves meta. ``corrupt_gap`` is also the reader's, for bytes that go bad
after open."""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from typing import Any

from firstfault.agent.spool.format import (
    FORMAT_VERSION,
    HEADER,
    HEADER_BYTES,
    MIN_RECORD_BYTES,
    entry_at,
    observed_range,
    scan,
)
from firstfault.agent.spool.gaps import gap_ok, gaps_in
from firstfault.agent.spool.state import Segment, SpoolError, SpoolState, fsync_dir

log = logging.getLogger("firstfault.agent.spool")

_SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")


def read_meta(path: str) -> dict[str, Any]:
    """``meta`` as a dict ({} when missing or unreadable: a new stream)."""
    try:
        with open(os.path.join(path, "meta"), encoding="utf-8") as f:
            meta = json.load(f)
        if type(meta) is not dict:
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("spool meta unreadable, starting a new stream path=%s error=%s", path, e)
        return {}
    if meta.get("format", FORMAT_VERSION) != FORMAT_VERSION:
        raise SpoolError(f"spool {path} has format {meta.get('format')}; this agent "
                         f"reads format {FORMAT_VERSION}: use a newer agent or a new spool")
    return meta


def recover(st: SpoolState) -> None:
    """Fill ``st`` from the directory: stream, acked, segments (scanned, repaired), the next
    seq, the gaps found (``st.pending``, saved in meta before a repair), the active fd."""
    meta = read_meta(st.path)
    st.stream, st.created_ns = meta.get("stream"), meta.get("created_ns")
    acked, given = meta.get("acked_seq"), meta.get("next_seq")
    st.acked = acked if type(acked) is int else None
    if not st.stream or meta.get("node") != st.node:
        if st.stream:
            log.warning("spool node changed, starting a new stream path=%s old=%s new=%s",
                        st.path, meta.get("node"), st.node)
        st.stream, st.created_ns = secrets.token_hex(8), time.time_ns()
        st.acked = None
    pending = [g for g in meta.get("pending_gaps") or [] if gap_ok(g)]
    names = []
    for name in os.listdir(st.path):
        if name.endswith(".tmp"):
            os.unlink(os.path.join(st.path, name))
        elif m := _SEGMENT_NAME.match(name):
            names.append(int(m.group(1)))
    names.sort()
    floor, last_ns, repairs, new_gaps = 0, None, [], []
    for i, base in enumerate(names):
        seg = Segment(base, st.seg_path(base))
        newest, ceil = i == len(names) - 1, names[i + 1] if i + 1 < len(names) else None
        with open(seg.path, "rb") as f:
            buf = f.read()
            if st.fsync != "never":  # what a crashed process left in the page cache
                os.fsync(f.fileno())
        entries, bad, torn = scan(buf, max(floor, base - 1), ceil, newest)
        for start, stop, before in bad:
            new_gaps.append(corrupt_gap(st, seg.path, buf, start, stop, before, ceil,
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
        st.segs.append(seg)
    pending += [g for g in new_gaps if g is not None]
    if new_gaps:
        st.write_meta(pending)  # before the bad bytes are gone
    for seg, buf, entries, rewrite in repairs:
        _repair(st, seg, buf, entries, rewrite)
    for seg in st.segs[:-1]:
        if seg.last_seq is None or (st.acked is not None and seg.last_seq <= st.acked):
            os.unlink(seg.path)
    st.segs = [s for s in st.segs[:-1] if s.last_seq is not None and (
        st.acked is None or s.last_seq > st.acked)] + st.segs[-1:]
    top = max([floor, st.acked or 0, (given if type(given) is int else 1) - 1]
              + [names[-1] - 1 if names else 0] + [g["last_seq"] for g in pending])
    st.next_seq = top + 1
    if not st.segs:
        st.segs.append(Segment(st.next_seq, st.seg_path(st.next_seq)))
    act = st.segs[-1]
    st.fd = os.open(act.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    if st.fsync != "never":
        os.fsync(st.fd)
        fsync_dir(st.path)
    st.bytes = sum(s.size for s in st.segs)
    st.vis_size = act.size
    st.vis_seq = max((s.last_seq or 0 for s in st.segs), default=0)
    st.pending = pending


def corrupt_gap(st: SpoolState, path, buf, start, stop, before, ceil, entries, last_ns):
    """The gap fields of bad bytes [start, stop) of a segment, or None if no seq lost."""
    st.counts["corrupt_ranges"] += 1
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


def _repair(st: SpoolState, seg: Segment, buf: bytes, entries, rewrite: bool) -> None:
    """Rewrite a segment without its bad bytes, or cut its torn tail."""
    if not rewrite:
        with open(seg.path, "r+b") as f:
            f.truncate(seg.size)
            if st.fsync != "never":
                os.fsync(f.fileno())
        return
    tmp = seg.path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(buf[a:b] for a, b, _, _ in entries))
        f.flush()
        if st.fsync != "never":
            os.fsync(f.fileno())
    os.replace(tmp, seg.path)
    if st.fsync != "never":
        fsync_dir(st.path)
