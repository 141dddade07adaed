"""Records to spool entries (firstfault/agent/spool/format.py: Entry): rows or columns are
packed a column at a time, checked against the wire's limits (``validate``), and cut into
entries of at most ENTRY_MAX_RECORDS records and ``entry_limit`` payload bytes. No I/O:
the writer (writer.py) writes what this returns."""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Iterable, NamedTuple

import msgpack

from firstfault.agent.spool.columns import Columns, Runs
from firstfault.agent.spool.format import (
    COLUMNS,
    ENTRY_MAX_RECORDS,
    HEADER_BYTES,
    OBSERVED,
    check_values,
    pack_column,
)
from firstfault.agent.spool.state import InvalidRecordError
from firstfault.wire import WireError

GAP_RESERVE_BYTES = 2048  # room kept for the gap record an overflow writes
_row = attrgetter(*COLUMNS)


class EncodedEntry(NamedTuple):
    payload: bytes  # the entry's msgpack payload, without its header
    count: int  # records
    lo_ns: int | None  # least and greatest observed_ns (None: not ints, validate=False)
    hi_ns: int | None
    packed: tuple[bytes, ...]  # each column's msgpack array, for the readers' memory
    columns: Columns  # the records, for a disk-full gap's origins


class Encoder:
    """``rows(records)`` and ``columns(records)`` -> [EncodedEntry]; InvalidRecordError
    when a record breaks the wire's limits (``validate``) or cannot fit ``max_bytes``."""

    def __init__(self, *, validate: bool, entry_limit: int, max_bytes: int) -> None:
        self.validate, self.entry_limit, self.max_bytes = validate, entry_limit, max_bytes

    def rows(self, records: Iterable[Any]) -> list[EncodedEntry]:
        """Entries for sources Drafts, wire Records or tuples of the wire columns."""
        rows = records if type(records) is list else list(records)
        if rows and type(rows[0]) is not tuple:
            try:
                rows = list(map(_row, rows))
            except AttributeError as e:
                raise InvalidRecordError(f"spool append: records must be Drafts, Records or "
                                         f"tuples of the wire columns, not mixed: {e}") from None
        out: list[EncodedEntry] = []
        for i in range(0, len(rows), ENTRY_MAX_RECORDS):
            part = rows[i:i + ENTRY_MAX_RECORDS]
            cols = list(zip(*part))
            if len(cols) != len(COLUMNS) or len(part[0]) != len(part[-1]):
                raise InvalidRecordError(f"spool append: a record has {len(part[0])} or "
                                         f"{len(part[-1])} columns, not {len(COLUMNS)}")
            self._encode(Columns(len(part), cols), out)
        return out

    def columns(self, records: Columns) -> list[EncodedEntry]:
        """Entries for records given as columns (firstfault/agent/spool/columns.py): no
        tuple per record; a Runs column is packed and checked a run at a time."""
        n = records.n
        if len(records.cols) != len(COLUMNS):
            raise InvalidRecordError(f"spool append: {len(records.cols)} columns, not "
                                     f"{len(COLUMNS)}")
        out: list[EncodedEntry] = []
        for i in range(0, n, ENTRY_MAX_RECORDS):
            self._encode(records if n <= ENTRY_MAX_RECORDS
                         else records.cut(i, min(n, i + ENTRY_MAX_RECORDS)), out)
        return out

    def _encode(self, c: Columns, out: list[EncodedEntry]) -> None:
        """Append the entries of ``c`` (at most ENTRY_MAX_RECORDS records) to ``out``."""
        n, cols = c.n, c.cols
        try:
            packed, checked = zip(*map(pack_column, cols))
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidRecordError(f"spool append: cannot encode: {e}") from None
        lengths = [col.records() if type(col) is Runs else len(col) for col in cols]
        if lengths.count(n) != len(COLUMNS):
            raise InvalidRecordError(f"spool append: columns of {lengths} values for {n} records")
        if self.validate:
            for name, values in zip(COLUMNS, checked):
                try:
                    check_values(name, values)
                except WireError as e:
                    raise InvalidRecordError(f"spool append: {e}") from None
        payload = b"".join([b"\x9e", msgpack.packb(n), *packed])
        if len(payload) > self.entry_limit and n > 1:
            half = n // 2
            self._encode(c.cut(0, half), out)
            self._encode(c.cut(half, n), out)
            return
        if HEADER_BYTES + len(payload) + GAP_RESERVE_BYTES > self.max_bytes:
            raise InvalidRecordError(f"spool append: a record of {len(payload)} bytes does "
                                     f"not fit max_bytes={self.max_bytes}")
        obs = checked[OBSERVED]
        try:
            out.append(EncodedEntry(payload, n, min(obs), max(obs), packed, c))
        except TypeError:  # validate=False and a bad observed_ns
            out.append(EncodedEntry(payload, n, None, None, packed, c))
