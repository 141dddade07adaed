"""SqliteStore's retention: delete records by age and by size, whole blocks where
they can go whole (with their marks), a block that straddles the cutoff rewritten
with only the records it keeps (its marks stay exact: blocks.py). One transaction
per job and per stream."""

from __future__ import annotations

from bisect import bisect_left

from firstfault.collector.store.base import check_prune, prune_to_size
from firstfault.collector.store.blocks import Block, pack, pack_ranks, read_block, subset


class Pruning:
    """The retention methods of SqliteStore (mixed in)."""

    def prune(self, *, max_age_s: float | None, max_bytes: int | None) -> int:
        """Delete records older than max_age_s (by t_ns), then the oldest until the
        live pages take at most max_bytes; return how many records went. Clock
        estimates older than max_age_s go too, but each node's latest stays."""
        check_prune(max_age_s, max_bytes)
        with self._sql("prune"):
            return self._prune(max_age_s, max_bytes)

    def _prune(self, max_age_s: float | None, max_bytes: int | None) -> int:
        deleted = 0
        if max_age_s is not None:
            cutoff = self._now_ns() - int(max_age_s * 1e9)
            deleted += self._delete_before(cutoff)
            self._write(lambda: self._conn().execute(
                "DELETE FROM node_clocks WHERE measured_ns < ? AND measured_ns < "
                "(SELECT max(measured_ns) FROM node_clocks c WHERE c.node = node_clocks.node)",
                (cutoff,)), "prune of clocks")
        if max_bytes is not None:
            deleted += prune_to_size(
                max_bytes, self.used_bytes,
                lambda: self._conn().execute("SELECT sum(n) FROM blocks").fetchone()[0],
                self._kth_oldest, self._delete_before)
        return deleted

    def used_bytes(self) -> int:
        """Bytes of the pages in use (page_count - freelist_count), what max_bytes bounds."""
        db = self._conn()
        with self._sql("used_bytes"):
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            free = db.execute("PRAGMA freelist_count").fetchone()[0]
            return (pages - free) * db.execute("PRAGMA page_size").fetchone()[0]

    def _kth_oldest(self, k: int) -> int:
        """A time at or after the k-th oldest record's (the t_hi of the block that holds
        it when blocks are taken by t_hi): deleting up to it frees at least k records."""
        seen, t = 0, None
        for t, n in self._conn().execute("SELECT t_hi, n FROM blocks ORDER BY t_hi"):
            seen += n
            if seen >= k:
                break
        return t if t is not None else -(2**63)

    def _delete_before(self, cutoff: int) -> int:
        """Delete every record with t_ns < cutoff."""
        db = self._conn()
        self._refresh()
        total = 0
        for (jid,) in db.execute("SELECT jid FROM jobs WHERE first_ns < ?", (cutoff,)).fetchall():
            total += self._write(lambda: self._prune_job(jid, cutoff), "prune")
        for (sid,) in db.execute("SELECT sid FROM streams WHERE free_first_ns < ?",
                                 (cutoff,)).fetchall():
            total += self._write(lambda: self._prune_free(sid, cutoff), "prune")
        return total

    def _prune_job(self, jid: int, cutoff: int) -> int:
        db = self._conn()
        n = self._drop_before("INDEXED BY blocks_job WHERE jid = ?", jid, cutoff)
        row = db.execute("SELECT t_lo FROM blocks INDEXED BY blocks_job WHERE jid = ? "
                         "ORDER BY t_lo LIMIT 1", (jid,)).fetchone()
        if row is None:
            for table in ("jobs", "job_nodes", "job_ranks"):
                db.execute(f"DELETE FROM {table} WHERE jid = ?", (jid,))
            self._jids.pop(self._jobs.pop(jid, None), None)
        else:
            db.execute("UPDATE jobs SET records = records - ?, first_ns = ? WHERE jid = ?",
                       (n, row[0], jid))
        return n

    def _prune_free(self, sid: int, cutoff: int) -> int:
        db = self._conn()
        n = self._drop_before("INDEXED BY blocks_free WHERE jid IS NULL AND sid = ?", sid,
                              cutoff)
        row = db.execute("SELECT t_lo FROM blocks INDEXED BY blocks_free WHERE jid IS NULL AND "
                         "sid = ? ORDER BY t_lo LIMIT 1", (sid,)).fetchone()
        db.execute("UPDATE streams SET free_first_ns = ? WHERE sid = ?",
                   (None if row is None else row[0], sid))
        if row is None:
            db.execute("UPDATE streams SET free_last_ns = NULL WHERE sid = ?", (sid,))
        return n

    def _drop_before(self, where: str, key: int, cutoff: int) -> int:
        """Drop the records with t_ns < cutoff of the blocks ``where`` selects."""
        db = self._conn()
        n = 0
        for bid, t_hi, count in db.execute(
                f"SELECT bid, t_hi, n FROM blocks {where} AND t_lo < ?", (key, cutoff)).fetchall():
            if t_hi < cutoff:
                for table in ("blocks", "marks", "pending"):
                    db.execute(f"DELETE FROM {table} WHERE bid = ?", (bid,))
                n += count
                continue
            cols, pos, seqs, ts = read_block(*db.execute(
                "SELECT seqs, data, idx FROM blocks WHERE bid = ?", (bid,)).fetchone())
            k = bisect_left(ts, cutoff)
            b = Block(None, subset(cols, pos[k:]), seqs[k:], ts[k:])
            seq_lo, seq_hi, t_lo, _ = b.bounds()
            db.execute("UPDATE blocks SET seq_lo = ?, seq_hi = ?, t_lo = ?, n = ?, ranks = ?, "
                       "seqs = ?, data = ?, idx = NULL WHERE bid = ?",
                       (seq_lo, seq_hi, t_lo, b.n, pack_ranks(b.ranks()), b.seqs_data(), b.data(),
                        bid))
            marked = db.execute("SELECT seqs, data FROM marks WHERE bid = ?", (bid,)).fetchone()
            if marked is not None:
                m, _, mseqs, mts = read_block(*marked, None)
                j = bisect_left(mts, cutoff)
                db.execute("UPDATE marks SET seqs = ?, data = ? WHERE bid = ?",
                           (pack(mseqs[j:]), pack(subset(m, range(j, len(mseqs)))), bid))
            n += k
        return n
