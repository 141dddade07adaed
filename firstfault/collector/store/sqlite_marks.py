"""SqliteStore's report marks: the ``marks`` table, one row per marked block.

A Marker (base.Marker; firstfault/analysis/reads.py) chooses the records of a block
a report reads; they are packed aside (blocks.py) in a ``marks`` row under the
marker's id in ``markers``, so the block's own row is written once. Inserts mark as
they write (cheap: the marker reads the columns the insert has anyway); a block
stored without a marker, or migrated from a file that had not marked it, waits in
``pending`` and ``mark_pending`` marks it, a step at a time, when the ingest server
finds the store thread idle. Reads (sqlite_read.py ``needed``) use the marks of the
current marker and read any other block whole.
"""

from __future__ import annotations

from firstfault.collector.store.blocks import (
    FIELDS,
    KIND,
    MESSAGE,
    OCCURRED,
    PID,
    RANK,
    SOURCE,
    Block,
    data_seqs,
    times,
    unpack,
)
from firstfault.collector.store.sqlite_schema import INSERT_MARKS

MARK_STEP_RECORDS = 20_000  # records mark_pending marks per call (~10-30 ms of the store thread)


class Marking:
    """The marking methods of SqliteStore (mixed in)."""

    def mark_pending(self, max_records: int = MARK_STEP_RECORDS) -> int:
        """Mark blocks stored unmarked (by a store without a marker, or migrated), about
        max_records records' worth in one transaction; return how many blocks were
        marked: 0 when none waits (or the store has no marker)."""
        if self._marker is None:
            return 0

        def work() -> int:
            db = self._conn()
            mid, done, count = self._marker_id(), 0, 0
            for (bid,) in db.execute("SELECT bid FROM pending ORDER BY bid LIMIT 1000").fetchall():
                row = db.execute("SELECT seqs, data, idx FROM blocks WHERE bid = ?", (bid,)).fetchone()
                db.execute("DELETE FROM pending WHERE bid = ?", (bid,))
                if row is None:
                    continue  # pruned
                cols = unpack(row[1])
                b = Block(None, cols, data_seqs(unpack(row[0]), len(cols[SOURCE])),
                          times(cols), None if row[2] is None else unpack(row[2]))
                self._mark(b)
                db.execute(INSERT_MARKS, (bid, mid, *b.marked_rows()))
                count, done = count + 1, done + b.n
                if done >= max_records:
                    break
            return count
        return self._write(work, "marking blocks")

    def _mark(self, b: Block) -> None:
        c = b.cols
        got = self._marker.mark(source=c[SOURCE], kind=c[KIND], message=c[MESSAGE],
                                occurred_ns=c[OCCURRED], rank=c[RANK], fields=c[FIELDS],
                                order=b.order, pid=c[PID])
        t = b.t  # positions in block order: by time, then position (= seq)
        b.marked = got if b.order is None else sorted(got, key=t.__getitem__)

    def _marker_id(self) -> int:
        """The marker's mid in this file (added on first use, in the insert's transaction)."""
        if self._mid is None:
            db = self._conn()
            name = self._marker.name
            db.execute("INSERT OR IGNORE INTO markers (name) VALUES (?)", (name,))
            self._mid = db.execute("SELECT mid FROM markers WHERE name = ?", (name,)).fetchone()[0]
        return self._mid
