"""Records as the ingest server hands them to a store: wire frames decoded with their
columns' bytes (wire.PackedColumns), one per run of one (node, stream)."""

from itertools import groupby

from firstfault import wire, wiredecode
from firstfault.wire import BatchColumns, Record


def as_frames(batch: list[Record]) -> list[BatchColumns]:
    """A frame per run of one (node, stream) of ``batch``, the first record of each seq
    kept, seqs rising (what a wire batch can carry), decoded as the server decodes."""
    out = []
    for _, run in groupby(batch, key=lambda r: (r.node, r.stream)):
        first: dict[int, Record] = {}
        for r in run:
            first.setdefault(r.seq, r)
        out.append(wiredecode.decode_batch_columns(wire.encode_batch([first[q] for q in sorted(first)])))
    assert all(isinstance(b.cols, wire.PackedColumns) for b in out)
    return out


def insert_frames(store, batch: list[Record]) -> int:
    """store.insert(batch) as the ingest server does it (insert_columns of each frame)."""
    return sum(store.insert_columns(b.node, b.stream, b.seqs, b.cols) for b in as_frames(batch))
