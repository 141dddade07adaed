"""The store's read side: a Selection's blocks, merged into one ordered stream.

A selection reads the blocks (blocks.py) of its job, by the ``blocks_job`` index, and
the jobless blocks of its nodes, by ``blocks_free``, whose [t_lo, t_hi] overlaps its
window; a block is read (one row, unpacked) only once the merge reaches its t_lo, so
memory holds the blocks that overlap in time, not the job. Records within a block are
in (t_ns, seq) order; shared.merge orders them all by (t_ns, node, stream, seq), no
sort in the database and nothing loaded whole. Rank filters skip blocks by their
``ranks`` column; grep is a literal substring of the messages of the blocks read
(linear: no pattern a user sends can run for long). Building the Record objects is
most of a read's cost.

An iterator reads one block at a time, no transaction held open (a pruner is never
blocked); blocks committed meanwhile may or may not appear, blocks pruned meanwhile
are skipped.
"""

from __future__ import annotations

import functools
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

import msgpack

from firstfault.collector.store.base import Selection, check_selection
from firstfault.collector.store.blocks import (
    BOOT_ID,
    FIELDS,
    KIND,
    LOCAL_RANK,
    MESSAGE,
    MONO,
    OBSERVED,
    OCCURRED,
    PID,
    RANK,
    SEVERITY,
    SOURCE,
    unpack,
)
from firstfault.collector.store.shared import JOB_MARGIN_NS, merge
from firstfault.wire import Record

if TYPE_CHECKING:
    from firstfault.collector.store.core import BlockStore

T_MIN, T_MAX = -(2**63), 2**63 - 1
_BLOCK_META = ("SELECT b.bid, b.sid, b.t_lo, b.t_hi, b.ranks, m.mid FROM blocks AS b {} "
               "LEFT JOIN marks AS m ON m.bid = b.bid ")


class Reader:
    """records() and needed() of a BlockStore."""

    def __init__(self, store: BlockStore) -> None:
        self.store = store

    def records(self, sel: Selection) -> Iterator[Record]:
        return self._read(sel, None)

    def needed(self, sel: Selection, marker: str) -> Iterator[Record]:
        if sel.grep is not None or sel.limit is not None:
            return self._read(sel, None)
        with self.store.d.errors("reading records"):
            row = self.store.d.execute("SELECT mid FROM markers WHERE name = ?",
                                       (marker,)).fetchone()
        return self._read(sel, None if row is None else row[0])

    def _read(self, sel: Selection, mid: int | None) -> Iterator[Record]:
        if not check_selection(sel):
            return iter(())  # an empty filter matches nothing
        with self.store.d.errors("reading records"):
            self.store.refresh()
            sources = self._sources(sel, mid)
        records = self._records(sources)
        return records if sel.limit is None else islice(records, sel.limit)

    def _records(self, sources: list) -> Iterator[Record]:
        store = self.store
        jobs = store.names.jobs
        with store.d.errors("reading records"):
            for _, node, stream, seq, c, i, jid in merge(sources):
                if jid is not None and jid not in jobs:
                    store.load_names()  # a job another connection added meanwhile
                yield Record(node=node, stream=stream, seq=seq, source=c[SOURCE][i],
                             kind=c[KIND][i], message=c[MESSAGE][i], occurred_ns=c[OCCURRED][i],
                             observed_ns=c[OBSERVED][i], boot_id=c[BOOT_ID][i],
                             mono_ns=c[MONO][i], job=None if jid is None else jobs.get(jid),
                             rank=c[RANK][i], local_rank=c[LOCAL_RANK][i], pid=c[PID][i],
                             severity=c[SEVERITY][i], fields=c[FIELDS][i])

    def _sources(self, sel: Selection, mid: int | None) -> list:
        """(lo, open) per block the selection needs (see merge)."""
        d, node_sids = self.store.d, self.store.names.node_sids
        lo = T_MIN if sel.since_ns is None else sel.since_ns
        hi = T_MAX if sel.until_ns is None else sel.until_ns
        wanted = None if sel.nodes is None else set(sel.nodes)
        if sel.job is not None:
            row = d.execute("SELECT jid, first_ns, last_ns FROM jobs WHERE job = ? AND "
                            "records > 0", (d.escape(sel.job),)).fetchone()
            if row is None:
                return []
            jid, first, last = row
            job_nodes = {d.unescape(n) for (n,) in d.execute(
                "SELECT node FROM job_nodes WHERE jid = ?", (jid,))}
            nodes = job_nodes if wanted is None else job_nodes & wanted
            jobs = [(jid, first, last)]
            free_lo, free_hi = max(lo, first - JOB_MARGIN_NS), min(hi, last + JOB_MARGIN_NS)
        else:
            jobs = d.execute("SELECT jid, first_ns, last_ns FROM jobs WHERE records > 0 AND "
                             "first_ns <= ? AND last_ns >= ?", (hi, lo)).fetchall()
            nodes = set(node_sids) if wanted is None else wanted
            free_lo, free_hi = lo, hi
        sids = None if wanted is None else {s for n in wanted for s in node_sids.get(n, ())}
        scan = _Scan(self.store, sel, mid)
        for jid, first, last in jobs:
            a, b = max(lo, first), min(hi, last)
            if a <= b:
                scan.add(d.execute(_BLOCK_META.format(d.hint("blocks_job")) + "WHERE "
                                   "b.jid = ? AND b.t_lo <= ? AND b.t_hi >= ?", (jid, b, a)),
                         jid, a, b, sids)
        free_sids = {s for n in nodes for s in node_sids.get(n, ())}
        for sid, first, last in d.execute(
                "SELECT sid, free_first_ns, free_last_ns FROM streams "
                "WHERE free_first_ns IS NOT NULL").fetchall():
            a, b = max(free_lo, first), min(free_hi, last)
            if sid in free_sids and a <= b:
                scan.add(d.execute(_BLOCK_META.format(d.hint("blocks_free")) + "WHERE "
                                   "b.sid = ? AND b.jid IS NULL AND b.t_lo <= ? AND b.t_hi >= ?",
                                   (sid, b, a)), None, a, b, None)
        return scan.sources


class _Scan:
    """The (lo, open) sources of one selection's blocks."""

    def __init__(self, store: BlockStore, sel: Selection, mid: int | None) -> None:
        self.store, self.mid = store, mid
        self.ranks = None if sel.ranks is None else set(sel.ranks)
        self.grep = sel.grep
        self.sources: list[tuple[int, Callable[[], Iterator[tuple]]]] = []

    def add(self, rows: Any, jid: int | None, a: int, b: int, sids: set[int] | None) -> None:
        for bid, sid, t_lo, t_hi, ranks, mid in rows.fetchall():
            if sids is not None and sid not in sids:
                continue
            if self.ranks is not None and (ranks is None or
                                           self.ranks.isdisjoint(msgpack.unpackb(ranks))):
                continue
            inside = a <= t_lo and t_hi <= b
            marked = mid is not None and mid == self.mid and inside
            self.sources.append((max(a, t_lo), functools.partial(
                self._block, bid, sid, jid, None if inside else (a, b), marked)))

    def _block(self, bid: int, sid: int, jid: int | None, window: tuple[int, int] | None,
               marked: bool) -> Iterator[tuple]:
        """(t_ns, node, stream, seq, columns, i, jid) of the block's matching records
        within ``window`` (None: the whole block is inside the selection's)."""
        store = self.store
        row = store.d.execute(
            "SELECT seqs, data, NULL FROM marks WHERE bid = ?" if marked else
            "SELECT seqs, data, idx FROM blocks WHERE bid = ?", (bid,)).fetchone()
        if row is None:
            return  # pruned meanwhile
        c = unpack(row[1])
        s = unpack(row[0])
        pos: Sequence[int] = range(len(c[SOURCE])) if row[2] is None else unpack(row[2])
        occurred, observed = c[OCCURRED], c[OBSERVED]
        if window is not None:  # only the records in the window: bisect the block's times
            ts = [observed[i] if occurred[i] is None else occurred[i] for i in pos]
            pos = pos[bisect_left(ts, window[0]):bisect_right(ts, window[1])]
        names = store.names.streams.get(sid)
        if names is None:
            store.load_names()  # a stream another connection added meanwhile
            names = store.names.streams[sid]
        node, stream = names
        ranks, messages = c[RANK], c[MESSAGE]
        want, grep = self.ranks, self.grep
        for i in pos:  # times and seqs only of the records that match
            if want is not None and ranks[i] not in want:
                continue
            if grep is not None and grep not in messages[i]:
                continue
            t = occurred[i]
            yield (observed[i] if t is None else t), node, stream, (
                s + i if type(s) is int else s[i]), c, i, jid
