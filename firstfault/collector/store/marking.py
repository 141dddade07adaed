"""Report marks: the records of a block a report reads, packed aside in ``marks``.

A Marker (base.Marker; firstfault/analysis/reads.py) chooses them. ``mark`` is the one
place the store calls it. Inserts mark as they write (cheap: the marker reads the
columns the insert has anyway) under the marker's id in ``markers``, so a block's own
row is written once; a block stored without a marker, or migrated from a layout that
had not marked it, waits in ``pending`` and ``mark_pending`` marks it, a step at a
time, when the ingest server finds the store thread idle. Reads (read.py ``needed``)
use the marks of the current marker and read any other block whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from firstfault.collector.store.base import Marker
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

if TYPE_CHECKING:
    from firstfault.collector.store.core import BlockStore

MARK_STEP_RECORDS = 20_000  # records mark_pending marks per call (~10-30 ms of the store thread)
UPSERT_MARKS = ("INSERT INTO marks (bid, mid, seqs, data) VALUES (?, ?, ?, ?) ON CONFLICT (bid) "
                "DO UPDATE SET mid = excluded.mid, seqs = excluded.seqs, data = excluded.data")


def mark(marker: Marker, b: Block) -> None:
    """Set ``b.marked``: the positions of the records the marker chooses, in block order."""
    c = b.cols
    got = marker.mark(source=c[SOURCE], kind=c[KIND], message=c[MESSAGE],
                      occurred_ns=c[OCCURRED], rank=c[RANK], fields=c[FIELDS],
                      order=b.order, pid=c[PID])
    t = b.t  # positions in block order: by time, then position (= seq)
    b.marked = got if b.order is None else sorted(got, key=t.__getitem__)


def marker_id(store: BlockStore) -> int:
    """The store's marker's mid (added on first use, in the calling transaction)."""
    if store.mid is None:
        name = store.marker.name
        store.d.execute("INSERT INTO markers (name) VALUES (?) ON CONFLICT DO NOTHING", (name,))
        store.mid = store.d.execute("SELECT mid FROM markers WHERE name = ?",
                                    (name,)).fetchone()[0]
    return store.mid


def mark_pending(store: BlockStore, max_records: int = MARK_STEP_RECORDS) -> int:
    """Mark blocks stored unmarked, about max_records records' worth in one transaction;
    how many blocks were marked: 0 when none waits (or the store has no marker)."""
    if store.marker is None:
        return 0
    d = store.d

    def work() -> int:
        mid, done, count = marker_id(store), 0, 0
        for (bid,) in d.execute("SELECT bid FROM pending ORDER BY bid LIMIT 1000").fetchall():
            row = d.execute(f"SELECT seqs, data, idx FROM blocks WHERE bid = ?{d.for_update}",
                            (bid,)).fetchone()  # held: a prune waits
            d.execute("DELETE FROM pending WHERE bid = ?", (bid,))
            if row is None:
                continue  # pruned
            cols = unpack(row[1])
            b = Block(None, cols, data_seqs(unpack(row[0]), len(cols[SOURCE])), times(cols),
                      None if row[2] is None else unpack(row[2]))
            mark(store.marker, b)
            d.execute(UPSERT_MARKS, (bid, mid, *b.marked_rows()))
            count, done = count + 1, done + b.n
            if done >= max_records:
                break
        return count
    return store.write(work, "marking blocks")
