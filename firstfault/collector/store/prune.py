"""The store's retention: delete records by age and by size, whole blocks where they
can go whole (with their marks), a block that straddles the cutoff rewritten with only
the records it keeps (its marks stay exact: blocks.py). One transaction per job and
per stream, each holding that job's (or stream's) row locked where the dialect locks
rows, so an insert into it by another collector waits, or retries when it is gone."""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

from firstfault.collector.store.base import check_prune, prune_to_size
from firstfault.collector.store.blocks import Block, pack, pack_ranks, read_block, subset

if TYPE_CHECKING:
    from firstfault.collector.store.core import BlockStore


class Pruner:
    """prune() of a BlockStore."""

    def __init__(self, store: BlockStore) -> None:
        self.store = store
        self.d = store.d

    def prune(self, *, max_age_s: float | None, max_bytes: int | None) -> int:
        check_prune(max_age_s, max_bytes)
        store = self.store
        with self.d.errors("prune"):
            deleted = 0
            if max_age_s is not None:
                cutoff = store.now_ns() - int(max_age_s * 1e9)
                deleted += self._delete_before(cutoff)
                store.write(lambda: self.d.execute(
                    "DELETE FROM node_clocks WHERE measured_ns < ? AND measured_ns < "
                    "(SELECT max(measured_ns) FROM node_clocks c WHERE c.node = node_clocks.node)",
                    (cutoff,)), "prune of clocks")
            if max_bytes is not None:
                deleted += prune_to_size(
                    max_bytes, self.d.used_bytes,
                    lambda: self.d.execute("SELECT coalesce(sum(n), 0) FROM blocks").fetchone()[0],
                    self._kth_oldest, self._delete_before)
            return deleted

    def _kth_oldest(self, k: int) -> int:
        """A time at or after the k-th oldest record's (the t_hi of the block that holds
        it when blocks are taken by t_hi): deleting up to it frees at least k records."""
        seen, t = 0, None
        for t, n in self.d.execute("SELECT t_hi, n FROM blocks ORDER BY t_hi").fetchall():
            seen += n
            if seen >= k:
                break
        return t if t is not None else -(2**63)

    def _delete_before(self, cutoff: int) -> int:
        """Delete every record with t_ns < cutoff."""
        d, store = self.d, self.store
        store.refresh()
        total = 0
        for (jid,) in d.execute("SELECT jid FROM jobs WHERE first_ns < ?", (cutoff,)).fetchall():
            total += store.write(lambda: self._prune_job(jid, cutoff), "prune")
        for (sid,) in d.execute("SELECT sid FROM streams WHERE free_first_ns < ?",
                                (cutoff,)).fetchall():
            total += store.write(lambda: self._prune_free(sid, cutoff), "prune")
        return total

    def _prune_job(self, jid: int, cutoff: int) -> int:
        d = self.d
        if d.execute(f"SELECT jid FROM jobs WHERE jid = ?{d.for_update}", (jid,)).fetchone() is None:
            return 0  # another collector pruned it
        n = self._drop_before(f"{d.hint('blocks_job')} WHERE jid = ?", jid, cutoff)
        row = d.execute(f"SELECT t_lo FROM blocks {d.hint('blocks_job')} WHERE jid = ? "
                        "ORDER BY t_lo LIMIT 1", (jid,)).fetchone()
        if row is None:
            for table in ("jobs", "job_nodes", "job_ranks"):
                d.execute(f"DELETE FROM {table} WHERE jid = ?", (jid,))
            self.store.names.drop_job(jid)
        else:
            d.execute("UPDATE jobs SET records = records - ?, first_ns = ? WHERE jid = ?",
                      (n, row[0], jid))
        return n

    def _prune_free(self, sid: int, cutoff: int) -> int:
        d = self.d
        d.execute(f"SELECT sid FROM streams WHERE sid = ?{d.for_update}", (sid,)).fetchone()
        n = self._drop_before(f"{d.hint('blocks_free')} WHERE jid IS NULL AND sid = ?", sid,
                              cutoff)
        row = d.execute(f"SELECT t_lo FROM blocks {d.hint('blocks_free')} WHERE jid IS NULL AND "
                        "sid = ? ORDER BY t_lo LIMIT 1", (sid,)).fetchone()
        if row is None:
            d.execute("UPDATE streams SET free_first_ns = NULL, free_last_ns = NULL WHERE sid = ?",
                      (sid,))
        else:
            d.execute("UPDATE streams SET free_first_ns = ? WHERE sid = ?", (row[0], sid))
        return n

    def _drop_before(self, where: str, key: int, cutoff: int) -> int:
        """Drop the records with t_ns < cutoff of the blocks ``where`` selects."""
        d = self.d
        n = 0
        for bid, t_hi, count in d.execute(
                f"SELECT bid, t_hi, n FROM blocks {where} AND t_lo < ?", (key, cutoff)).fetchall():
            if t_hi < cutoff:
                for table in ("blocks", "marks", "pending"):
                    d.execute(f"DELETE FROM {table} WHERE bid = ?", (bid,))
                n += count
                continue
            cols, pos, seqs, ts = read_block(*d.execute(
                "SELECT seqs, data, idx FROM blocks WHERE bid = ?", (bid,)).fetchone())
            k = bisect_left(ts, cutoff)
            b = Block(None, subset(cols, pos[k:]), seqs[k:], ts[k:])
            seq_lo, seq_hi, t_lo, _ = b.bounds()
            d.execute("UPDATE blocks SET seq_lo = ?, seq_hi = ?, t_lo = ?, n = ?, ranks = ?, "
                      "seqs = ?, data = ?, idx = NULL WHERE bid = ?",
                      (seq_lo, seq_hi, t_lo, b.n, pack_ranks(b.ranks()), b.seqs_data(), b.data(),
                       bid))
            marked = d.execute("SELECT seqs, data FROM marks WHERE bid = ?", (bid,)).fetchone()
            if marked is not None:
                m, _, mseqs, mts = read_block(*marked, None)
                j = bisect_left(mts, cutoff)
                d.execute("UPDATE marks SET seqs = ?, data = ? WHERE bid = ?",
                          (pack(mseqs[j:]), pack(subset(m, range(j, len(mseqs)))), bid))
            n += k
        return n
