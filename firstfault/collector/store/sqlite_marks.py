"""SqliteStore's report marks: the block rows' ``mid`` and ``marked`` columns.

A Marker (base.Marker; firstfault/analysis/marks.py) chooses the records of a block
a report reads; they are packed aside in the row (blocks.py) under the marker's id
in ``markers``. insert_columns marks as it writes; insert_columns_many (the
server's group commit, when the store is behind) leaves blocks unmarked and
``mark_pending`` marks them, a step at a time, when the server finds the store
thread idle. Reads (sqlite_read.py ``needed``) use the marks of the current
marker and read any other block whole.
"""

from __future__ import annotations

from firstfault.collector.store.blocks import FIELDS, KIND, MESSAGE, OCCURRED, RANK, SOURCE, Block, unpack

MARK_STEP_RECORDS = 20_000  # records mark_pending marks per call (~20-70 ms of the store thread)


class Marking:
    """The marking methods of SqliteStore (mixed in)."""

    def mark_pending(self, max_records: int = MARK_STEP_RECORDS) -> int:
        """Mark blocks stored unmarked (by insert_columns_many, or migrated), about
        max_records records' worth in one transaction; return how many blocks were
        marked: 0 when none waits (or the store has no marker)."""
        if self._marker is None:
            return 0

        def work() -> int:
            db = self._conn()
            mid, done, count = self._marker_id(), 0, 0
            for bid, n in db.execute("SELECT bid, n FROM blocks INDEXED BY blocks_unmarked "
                                     "WHERE mid IS NULL LIMIT 1000").fetchall():
                (data,) = db.execute("SELECT data FROM blocks WHERE bid = ?", (bid,)).fetchone()
                b = Block(None, unpack(data))
                self._mark(b)
                db.execute("UPDATE blocks SET mid = ?, marked = ? WHERE bid = ?",
                           (mid, b.marked_data(), bid))
                count, done = count + 1, done + n
                if done >= max_records:
                    break
            return count
        return self._write(work, "marking blocks")

    def _mark(self, b: Block) -> None:
        c = b.cols
        b.marked = self._marker.mark(source=c[SOURCE], kind=c[KIND], message=c[MESSAGE],
                                     occurred_ns=c[OCCURRED], rank=c[RANK], fields=c[FIELDS])

    def _marker_id(self) -> int:
        """The marker's mid in this file (added on first use, in the insert's transaction)."""
        if self._mid is None:
            db = self._conn()
            name = self._marker.name
            db.execute("INSERT OR IGNORE INTO markers (name) VALUES (?)", (name,))
            self._mid = db.execute("SELECT mid FROM markers WHERE name = ?", (name,)).fetchone()[0]
        return self._mid
