"""The store's ingest: batches into blocks, in the calling write transaction (core.py).

Ingest, one write transaction per call (insert_columns_many: the ingest server's group
commit; committed on return)
    1. new streams get their row first, each in a transaction of its own;
    2. the batches' stream rows are read (and locked where the dialect locks rows) in
       sid order: records above a stream's high_seq are new by construction, those at
       or below it (resends, late fills, seq lists with holes) are looked up in the
       stream's blocks whose [seq_lo, seq_hi] reaches them before anything is written;
    3. the new records become blocks (a batch's main job keeps the frame's column
       bytes), marked when the store has a marker;
    4. new jobs are created (in name order), the jobs' aggregates added (in jid order;
       a job gone meanwhile, pruned by another collector, rolls back and retries),
       then the blocks, their marks (or ``pending``), the streams' high_seq and
       jobless bounds. Locks are taken in one order: streams, new jobs, jobs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from itertools import islice
from operator import lt
from typing import TYPE_CHECKING, Any

from firstfault.collector.store import marking
from firstfault.collector.store.blocks import COLUMNS, Block, block_seqs, make_blocks, pack_ranks, times
from firstfault.collector.store.dialect import Retry, placeholders
from firstfault.collector.store.shared import failed_jobs

if TYPE_CHECKING:
    from firstfault.collector.store.core import BlockStore

T_MIN, T_MAX = -(2**63), 2**63 - 1


def block_row(sid: int, jid: int | None, b: Block) -> tuple:
    """The ``blocks`` row of a Block (dialect.INSERT_BLOCK's parameters)."""
    return (sid, jid, *b.bounds(), b.n, pack_ranks(b.ranks()), b.seqs_data(), b.data(),
            b.idx_data())


class Ingest:
    """new_stream() and insert() of a BlockStore."""

    def __init__(self, store: BlockStore) -> None:
        self.store = store

    def new_stream(self, node: str, stream: str) -> None:
        """The stream's row, committed at once (an empty row means what no row means)."""
        d = self.store.d
        key = (d.escape(node), d.escape(stream))

        def work() -> int:
            d.execute("INSERT INTO streams (node, stream) VALUES (?, ?) ON CONFLICT DO NOTHING", key)
            return d.execute("SELECT sid FROM streams WHERE node = ? AND stream = ?",
                             key).fetchone()[0]
        self.store.names.add_stream(self.store.write(work, f"creating stream node={node} stream={stream}"),
                              node, stream)

    def insert(self, batches: list) -> list[int]:
        d, names = self.store.d, self.store.names
        sids = [names.sids[(node, stream)] for node, stream, _, _ in batches]
        order = sorted(set(sids))
        high = dict(d.execute(f"SELECT sid, high_seq FROM streams WHERE sid IN "
                              f"({placeholders(len(order))}) ORDER BY sid{d.for_update}",
                              order).fetchall())
        staged: list[tuple[int, int, list[Block], set]] = []  # sid, new, blocks, failed jobs
        taken: dict[int, set[int]] = defaultdict(set)  # a stream's seqs kept in this call
        for sid, (_, _, seqs, cols) in zip(sids, batches):
            floor = -1 if high[sid] is None else high[sid]
            packed = getattr(cols, "packed", None)  # wire.PackedColumns: the frame's bytes
            if not (seqs[0] > floor and (isinstance(seqs, range)
                                         or all(map(lt, seqs, islice(seqs, 1, None))))):
                seqs, cols = self._only_new(sid, floor, seqs, cols, taken[sid])
                packed = None
            if not seqs:
                staged.append((sid, 0, [], set()))
                continue
            high[sid] = max(floor, seqs[-1])
            if sids.count(sid) > 1:
                taken[sid].update(seqs)
            blocks = make_blocks(seqs, cols, times(cols), packed)
            if self.store.marker is not None:
                for b in blocks:
                    marking.mark(self.store.marker, b)
            staged.append((sid, len(seqs), blocks, failed_jobs(cols["kind"], cols["fields"],
                                                               cols["job"])))
        self.add_to_jobs(staged)
        mid = None if self.store.marker is None else marking.marker_id(self.store)
        free: dict[int, list[int]] = {}
        for sid, _, blocks, _ in staged:
            for b in blocks:
                d.insert_block(block_row(sid, None if b.job is None else names.jids[b.job], b),
                               None if mid is None else (mid, *b.marked_rows()))
                if b.job is None:
                    _, _, lo, hi = b.bounds()
                    f = free.setdefault(sid, [lo, hi])
                    f[0], f[1] = min(f[0], lo), max(f[1], hi)
        for sid in order:
            if sid not in free:
                d.execute("UPDATE streams SET high_seq = ? WHERE sid = ?", (high[sid], sid))
                continue
            lo, hi = free[sid]
            d.execute("UPDATE streams SET high_seq = ?, free_first_ns = CASE WHEN free_first_ns IS "
                      "NULL OR free_first_ns > ? THEN ? ELSE free_first_ns END, free_last_ns = CASE "
                      "WHEN free_last_ns IS NULL OR free_last_ns < ? THEN ? ELSE free_last_ns END "
                      "WHERE sid = ?", (high[sid], lo, lo, hi, hi, sid))
        return [new for _, new, _, _ in staged]

    def _only_new(self, sid: int, floor: int, seqs: Sequence[int], cols: dict[str, Sequence[Any]],
                  taken: set[int]) -> tuple[list[int], dict[str, list[Any]]]:
        """The records of a batch not stored yet nor in ``taken``, first of duplicates
        kept, by seq."""
        first: dict[int, tuple] = {}
        for row in zip(seqs, *(cols[c] for c in COLUMNS)):
            first.setdefault(row[0], row)
        old = sorted(s for s in first if s <= floor and s not in taken)
        have = set(taken)
        if old:
            for seqs_data, idx, n in self.store.d.execute(
                    f"SELECT seqs, idx, n FROM blocks {self.store.d.hint('blocks_seq')} WHERE sid = ? "
                    "AND seq_hi >= ? AND seq_lo <= ?", (sid, old[0], old[-1])):
                have.update(block_seqs(seqs_data, idx, n))
        keep = [first[s] for s in sorted(first) if s not in have]
        if not keep:
            return [], {}
        columns = list(map(list, zip(*keep)))
        return columns[0], dict(zip(COLUMNS, columns[1:]))

    def add_to_jobs(self, staged: list[tuple[int, int, list[Block], set]]) -> None:
        """Create the staged blocks' new jobs (name order), add to their aggregates (jid
        order); Retry when a job's row is gone (pruned by another collector)."""
        d, names = self.store.d, self.store.names
        per_job: dict[str, list] = {}  # job -> [first, last, count, failed, nodes, ranks]
        for sid, _, blocks, failed in staged:
            node = names.streams[sid][0]
            for b in blocks:
                if b.job is None:
                    continue
                _, _, lo, hi = b.bounds()
                agg = per_job.setdefault(b.job, [T_MAX, T_MIN, 0, False, set(), set()])
                agg[0], agg[1], agg[2] = min(agg[0], lo), max(agg[1], hi), agg[2] + b.n
                agg[3] |= b.job in failed
                agg[4].add(node)
                agg[5] |= b.ranks()
        for job in sorted(j for j in per_job if j not in names.jids):
            d.execute("INSERT INTO jobs (job, first_ns, last_ns, records, failed) VALUES "
                      "(?, ?, ?, 0, ?) ON CONFLICT DO NOTHING", (d.escape(job), T_MAX, T_MIN, False))
            names.add_job(d.execute("SELECT jid FROM jobs WHERE job = ?",
                                    (d.escape(job),)).fetchone()[0], job)
        for jid, job in sorted((names.jids[j], j) for j in per_job):
            first, last, count, failed, nodes, ranks = per_job[job]
            cur = d.execute("UPDATE jobs SET first_ns = CASE WHEN first_ns < ? THEN first_ns "
                            "ELSE ? END, last_ns = CASE WHEN last_ns > ? THEN last_ns ELSE ? END, "
                            "records = records + ? WHERE jid = ?",
                            (first, first, last, last, count, jid))
            if cur.rowcount != 1:
                raise Retry(f"job {job!r} is gone")
            if failed:
                d.execute("UPDATE jobs SET failed = ? WHERE jid = ?", (True, jid))
            new_nodes = sorted((jid, n) for n in nodes if (jid, n) not in names.job_nodes)
            new_ranks = sorted((jid, r) for r in ranks if (jid, r) not in names.job_ranks)
            if new_nodes:
                d.executemany("INSERT INTO job_nodes (jid, node) VALUES (?, ?) ON CONFLICT DO "
                              "NOTHING", [(j, d.escape(n)) for j, n in new_nodes])
            if new_ranks:
                d.executemany("INSERT INTO job_ranks (jid, rank) VALUES (?, ?) ON CONFLICT DO "
                              "NOTHING", new_ranks)
            names.job_nodes.update(new_nodes)  # a rollback reloads these (write)
            names.job_ranks.update(new_ranks)
