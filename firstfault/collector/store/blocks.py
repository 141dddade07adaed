"""Blocks: how the stores (core.py) keep records, many to a row. Pure: no SQL here.

A wire batch's records (firstfault/wire.py columns) become blocks: the records of one
stream and one job (or of none) from one insert, each one row of the ``blocks`` table
(core.py): one INSERT per block instead of a 16-column row and three index entries
per record (the bound bench/RESULTS.md measured: 11.3 µs a record as rows).

Row layout (schema version 3)
    data   a msgpack array of the 13 wire columns (wire.COLUMNS order), each an array
           of the m values of the records the row's bytes hold.
    seqs   msgpack int s (record i of data has seq s + i) or an array of m seqs.
    idx    NULL: the block's records are data's records 0..m-1, in that order; else
           a msgpack array of the positions in data of the block's records, in
           block order.

The block of a batch's main job (most of its records) keeps the batch's columns
exactly as the frame carried them (wire.PackedColumns): nothing is unpacked and
packed again; the batch's other records ride along in its data, unread (each is in
its own job's block too), and ``idx`` names the block's own when they are not all
of data in order. A block of another job, of records that came without their
bytes (``insert``, resends), or rewritten by prune holds only its own records,
packed here, in block order.

Block order is (t_ns, seq), t_ns = occurred_ns if known, else observed_ns. Example:
firstfault/wire.py's batch record (gpu-07, stream 3f2a9c, seq 812) as the only record
of a block of job 12345: data holds ``[["ranklog"], ["rank.line"], ["[2026-12-02
10:11:59,782] ..."], ...]``, seqs is 812, idx NULL, t_lo = t_hi = 1796206319782000000.

Invariants
    * A block's records are in (t_ns, seq) order, their seqs unique; seq_lo/seq_hi and
      t_lo/t_hi (core.py's columns) are the exact bounds of its records, ranks
      their sorted distinct non-null ranks.
    * Its marks (marking.py, table ``marks``): the records a report needs
      (firstfault/analysis/reads.py decides which), packed as ``data`` with their own
      seqs array, in block order. Dropping records older than a time from a block
      keeps its marks exact (the marker keeps the latest of a kind, never an
      earlier one instead).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, islice, repeat
from operator import eq, is_, le, ne
from typing import Any

import msgpack

from firstfault import wire

BLOCK_MAX = 2000  # records a block packed here holds at most (a frame's block: all it holds)
COLUMNS = wire.COLUMNS  # record columns in wire order: a block's data
SOURCE, KIND, MESSAGE, OCCURRED, OBSERVED, BOOT_ID, MONO, JOB, RANK, LOCAL_RANK, PID, \
    SEVERITY, FIELDS = range(len(COLUMNS))
pack = msgpack.Packer(use_bin_type=True).pack
_DATA_HEAD = wire.array_header(len(COLUMNS))

# (node, stream, columns) -> the indices (ascending) of the records a report needs
MarkFn = Callable[[str, str, list], list[int]]


@dataclass(slots=True)
class Block:
    """One block to write: its job, its data's columns, seqs and times, and which of
    them are the block's (``order``: positions in block order; None: all, in order)."""

    job: str | None
    cols: list[list[Any]]  # data's columns, COLUMNS order
    seq: Sequence[int]  # data's seqs (a range or a list)
    t: Sequence[int]  # data's t_ns
    order: list[int] | None = None
    packed: bytes | None = None  # data's bytes as received; None: packed from cols
    marked: list[int] | None = None  # positions the marker chose; None: not marked

    @property
    def positions(self) -> Sequence[int]:
        return range(len(self.seq)) if self.order is None else self.order

    @property
    def n(self) -> int:
        return len(self.positions)

    def bounds(self) -> tuple[int, int, int, int]:
        """(seq_lo, seq_hi, t_lo, t_hi)."""
        pos, seq, order = self.positions, self.seq, self.order
        if order is None:
            lo, hi = (seq[0], seq[-1]) if type(seq) is range else (min(seq), max(seq))
        else:  # data's seqs rise with the position (a frame's)
            lo, hi = seq[min(order)], seq[max(order)]
        return lo, hi, self.t[pos[0]], self.t[pos[-1]]

    def ranks(self) -> set[int]:
        rank = self.cols[RANK]
        ranks = set(rank if self.order is None else map(rank.__getitem__, self.order))
        ranks.discard(None)
        return ranks

    def data(self) -> bytes:
        return self.packed if self.packed is not None else pack(self.cols)

    def seqs_data(self) -> bytes:
        return pack_seqs(self.seq)

    def idx_data(self) -> bytes | None:
        return None if self.order is None else pack(self.order)

    def marked_rows(self) -> tuple[bytes, bytes] | None:
        """(seqs, data) of the marked records, in block order; None if not marked."""
        if self.marked is None:
            return None
        keep, seq = self.marked, self.seq
        return pack([seq[i] for i in keep]), pack([[c[i] for i in keep] for c in self.cols])


def pack_seqs(seq: Sequence[int]) -> bytes:
    """A row's ``seqs``: the first seq of a contiguous run, else every seq."""
    if type(seq) is range and seq.step == 1:
        return pack(seq.start)
    return pack(list(seq))


def times(cols: dict[str, Sequence[Any]] | list[Sequence[Any]]) -> list[int] | Sequence[int]:
    """t_ns of each record: occurred_ns if known, else observed_ns (columns by name or
    in COLUMNS order)."""
    occurred, observed = ((cols["occurred_ns"], cols["observed_ns"]) if isinstance(cols, dict)
                          else (cols[OCCURRED], cols[OBSERVED]))
    if None not in occurred:
        return occurred
    t = list(occurred)
    for i in compress(range(len(t)), map(is_, occurred, repeat(None))):
        t[i] = observed[i]
    return t


def rising(t: Sequence[int]) -> bool:
    return all(map(le, t, islice(t, 1, None)))


def make_blocks(seqs: Sequence[int], cols: dict[str, Sequence[Any]], t: Sequence[int],
                packed: Sequence[bytes] | None = None) -> list[Block]:
    """The blocks of one stream's batch (seqs unique and rising): one per job, in
    (t_ns, seq) order; with ``packed`` (each column's bytes, wire.PackedColumns) the
    main job's block keeps them as its data, the others are packed; without, blocks
    of at most BLOCK_MAX. The common case costs C-level passes only."""
    columns = [cols[c] for c in COLUMNS]
    job = columns[JOB]
    counts = Counter(job)
    main = job[0] if len(counts) == 1 else max(counts, key=counts.__getitem__)
    out = []
    if packed is not None:
        data = b"".join([_DATA_HEAD, *packed])
        if len(counts) == 1:
            order = None if rising(t) else sorted(range(len(t)), key=t.__getitem__)
        else:  # seqs rise with the position, so a stable sort on time is block order
            mine = compress(range(len(job)), map(eq, job, repeat(main)))
            order = sorted(mine, key=t.__getitem__)
        out.append(Block(main, columns, seqs, t, order, data))
    for j, idx in _positions(job, main, len(counts) == 1, packed is None).items():
        out += _packed_blocks(j, columns, seqs, t, idx)
    return out


def _positions(job: Sequence[str | None], main: str | None, one: bool,
               with_main: bool) -> dict[str | None, list[int] | None]:
    """The positions of each job in ``job`` (None: all of them), the main job's only if
    ``with_main``. ``one``: ``job`` holds one job only."""
    if one:
        return {main: None} if with_main else {}
    where: dict[str | None, list[int] | None] = {}
    for i in compress(range(len(job)), map(ne, job, repeat(main))):  # the few others
        where.setdefault(job[i], []).append(i)
    if with_main:
        where[main] = list(compress(range(len(job)), map(eq, job, repeat(main))))
    return where


def _packed_blocks(job: str | None, columns: list, seqs: Sequence[int], t: Sequence[int],
                   idx: list[int] | None) -> list[Block]:
    """Blocks of at most BLOCK_MAX holding only the records at ``idx`` (None: all)."""
    if idx is None:
        cols, seq, ts = [list(c) for c in columns], list(seqs), list(t)
    else:
        cols = [[c[i] for i in idx] for c in columns]
        seq, ts = [seqs[i] for i in idx], [t[i] for i in idx]
    if not rising(ts):
        order = sorted(range(len(ts)), key=ts.__getitem__)
        cols = [[c[i] for i in order] for c in cols]
        seq, ts = [seq[i] for i in order], [ts[i] for i in order]
    return [Block(job, [c[lo:lo + BLOCK_MAX] for c in cols], seq[lo:lo + BLOCK_MAX],
                  ts[lo:lo + BLOCK_MAX]) for lo in range(0, len(seq), BLOCK_MAX)]


def pack_ranks(ranks: set[int]) -> bytes | None:
    """A block's ``ranks`` column: its distinct ranks, sorted, packed; None for none."""
    return pack(sorted(ranks)) if ranks else None


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def data_seqs(s: int | list[int], m: int) -> Sequence[int]:
    """The seqs of a row's ``m`` data records from its unpacked ``seqs`` (pack_seqs)."""
    return range(s, s + m) if type(s) is int else s


def read_block(seqs: bytes, data: bytes, idx: bytes | None) -> tuple[list, list[int], list[int], list[int]]:
    """(data's columns, the block's positions in block order, its seqs, its t_ns) of
    a row (or of a marks row: idx None)."""
    cols = unpack(data)
    pos = list(range(len(cols[SOURCE]))) if idx is None else unpack(idx)
    seq = list(data_seqs(unpack(seqs), len(cols[SOURCE])))
    t = times(cols)
    if idx is None:
        return cols, pos, seq, list(t)
    return cols, pos, [seq[i] for i in pos], [t[i] for i in pos]


def block_seqs(seqs: bytes, idx: bytes | None, n: int) -> list[int]:
    """Only the seqs of a row's ``n`` records (the idempotency check)."""
    s = unpack(seqs)
    if type(s) is int:
        return list(range(s, s + n)) if idx is None else [s + i for i in unpack(idx)]
    return s if idx is None else [s[i] for i in unpack(idx)]


def subset(cols: list[list[Any]], keep: Sequence[int]) -> list[list[Any]]:
    """The columns of the records at indices ``keep``."""
    return [[c[i] for i in keep] for c in cols]
