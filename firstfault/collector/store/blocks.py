"""Blocks: how SqliteStore keeps records, many to a row. Pure: no SQL here.

A wire batch's records (firstfault/wire.py columns) are cut by job into blocks of at
most BLOCK_MAX records of one stream and one job (or of none). Each block is one
row of the ``blocks`` table (sqlite.py), its records packed as msgpack columns:
one INSERT per block instead of a 16-column row and three index entries per
record (the bound bench/RESULTS.md measured: 11.3 µs a record as rows).

Packed layout (``data``; ``marked`` the same for a subset): a msgpack array of
the columns of BLOCK_COLUMNS, each an array of the block's values in block order::

    [seqs, t_ns, source, kind, message, occurred_ns, observed_ns, boot_id, mono_ns,
     rank, local_rank, pid, severity, fields]

t_ns = occurred_ns if known, else observed_ns; fields a msgpack map ({} when
empty); the job is the row's. Example: firstfault/wire.py's batch record (gpu-07,
stream 3f2a9c, seq 812) in a block of job 12345 is column entry i with seqs[i] =
812, t_ns[i] = 1796206319782000000, message[i] = '[2026-12-02 10:11:59,782] ...'.

Invariants
    * Records of a block are in (t_ns, seq) order, seqs unique within the block;
      t_lo/t_hi and seq_lo/seq_hi are the exact bounds of its values, ranks the
      sorted distinct non-null ranks.
    * ``marked`` (with the marker that chose them): the records a report needs
      (firstfault/analysis/marks.py decides which), packed the same way, in block
      order. Dropping records older than a time from a block keeps its marks exact
      (the marker keeps the latest of a kind, never an earlier one instead).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from collections import Counter
from itertools import compress, islice, repeat
from operator import eq, le, ne
from typing import Any

import msgpack

from firstfault import wire

BLOCK_MAX = 2000  # records a block holds at most
_FEW = 64  # records of other jobs below which a batch's main job is cut out by deleting them
COLUMNS = wire.COLUMNS  # record columns in wire order, as insert_columns takes them
_STORED = tuple(c for c in COLUMNS if c != "job")  # the columns a block keeps, after seq, t_ns
BLOCK_COLUMNS = ("seq", "t_ns", *_STORED)
SEQ, T, SOURCE, KIND, MESSAGE, OCCURRED, OBSERVED, BOOT_ID, MONO, RANK, LOCAL_RANK, PID, \
    SEVERITY, FIELDS = range(len(BLOCK_COLUMNS))
pack = msgpack.Packer(use_bin_type=True).pack

# (node, stream, columns) -> the indices (ascending) of the records a report needs
MarkFn = Callable[[str, str, list], list[int]]


@dataclass(slots=True)
class Block:
    """One block to write: its job, bounds, and columns in BLOCK_COLUMNS order."""

    job: str | None
    cols: list[list[Any]]
    marked: list[int] | None = None  # indices the marker chose; None: not marked

    @property
    def n(self) -> int:
        return len(self.cols[SEQ])

    def bounds(self) -> tuple[int, int, int, int]:
        """(seq_lo, seq_hi, t_lo, t_hi)."""
        seqs, t = self.cols[SEQ], self.cols[T]
        return min(seqs), max(seqs), t[0], t[-1]

    def ranks(self) -> set[int]:
        ranks = set(self.cols[RANK])
        ranks.discard(None)
        return ranks

    def data(self) -> bytes:
        return pack(self.cols)

    def marked_data(self) -> bytes | None:
        return None if self.marked is None else pack(subset(self.cols, self.marked))


def times(cols: dict[str, Sequence[Any]]) -> list[int] | Sequence[int]:
    """t_ns of each record: occurred_ns if known, else observed_ns."""
    occurred = cols["occurred_ns"]
    if None not in occurred:
        return occurred
    return [b if o is None else o for o, b in zip(occurred, cols["observed_ns"])]


def make_blocks(seqs: Sequence[int], cols: dict[str, Sequence[Any]],
                t: Sequence[int]) -> list[Block]:
    """The blocks of one stream's batch (seqs unique and rising): one or more per job, each in
    (t_ns, seq) order. A batch holds a job or two and its node's jobless records;
    the common case (one job, times rising) costs C-level passes only."""
    columns = [seqs, t, *(cols[c] for c in _STORED)]
    out = []
    for j, part in _by_job(cols["job"], columns):
        ts, ss = part[T], part[SEQ]
        if not all(map(le, ts, islice(ts, 1, None))):  # seqs rise: times alone decide
            order = sorted(range(len(ss)), key=lambda i: (ts[i], ss[i]))
            part = [[c[i] for i in order] for c in part]
        for lo in range(0, len(part[SEQ]), BLOCK_MAX):
            out.append(Block(j, [c[lo:lo + BLOCK_MAX] for c in part] if len(part[SEQ]) > BLOCK_MAX
                             else part))
    return out


def pack_ranks(ranks: set[int]) -> bytes | None:
    """A block's ``ranks`` column: its distinct ranks, sorted, packed; None for none."""
    return pack(sorted(ranks)) if ranks else None


def _by_job(job: Sequence[str | None], columns: list) -> list[tuple[str | None, list[list]]]:
    """(job, its columns) of each job of a batch. The most frequent job's columns are
    copies with the others' entries deleted (a few memmoves where the others are a
    few jobless records among many); the others' are gathered by index."""
    counts = Counter(job)
    if len(counts) == 1:
        return [(job[0], [list(c) for c in columns])]
    main = max(counts, key=counts.__getitem__)
    drop = list(compress(range(len(job)), map(ne, job, repeat(main))))
    where: dict[str | None, list[int]] = {}
    for i in drop:
        where.setdefault(job[i], []).append(i)
    out = [(j, [[c[i] for i in idx] for c in columns]) for j, idx in where.items()]
    if len(drop) <= _FEW:
        part = [list(c) for c in columns]
        for c in part:
            for i in reversed(drop):
                del c[i]
    else:
        keep = list(compress(range(len(job)), map(eq, job, repeat(main))))
        part = [[c[i] for i in keep] for c in columns]
    out.append((main, part))
    return out


def unpack(data: bytes) -> list[list[Any]]:
    """A block's columns (BLOCK_COLUMNS order) from its packed bytes."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def seqs_of(data: bytes) -> list[int]:
    """Only the seqs of a packed block (the first column), for the idempotency check."""
    u = msgpack.Unpacker(raw=False, strict_map_key=False)
    u.feed(data)
    u.read_array_header()
    return u.unpack()


def subset(cols: list[list[Any]], keep: Sequence[int]) -> list[list[Any]]:
    """The columns of the records at indices ``keep``."""
    if len(keep) == len(cols[SEQ]):
        return cols
    return [[c[i] for i in keep] for c in cols]
