"""SqliteStore's schema and its migrations (the schema version is ``len(MIGRATIONS)``).

Version 1 kept one row per record (``records``, three indexes); version 2 keeps
blocks of records (blocks.py), one row each. Every migration runs inside the
one transaction SqliteStore._migrate opens; never edit a released one, append.

Version 2, the tables (sqlite.py's docstring says what each holds):
    streams(sid, node, stream, high_seq, free_first_ns, free_last_ns)
    blocks(bid, sid, jid, seq_lo, seq_hi, t_lo, t_hi, n, ranks, data, mid, marked)
        blocks_seq  (sid, seq_hi)                     idempotency look-ups of resends
        blocks_job  (jid, t_lo)                       a job's blocks in time order
        blocks_free (sid, t_lo) WHERE jid IS NULL     a stream's jobless blocks
        blocks_unmarked (bid) WHERE mid IS NULL       blocks waiting for marks
    markers(mid, name), jobs(...), job_nodes, job_ranks, node_clocks (as in version 1)
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from itertools import groupby

import msgpack

from firstfault.collector.store.blocks import BLOCK_MAX, Block, pack_ranks

log = logging.getLogger(__name__)

_SCHEMA_V1 = """
CREATE TABLE streams (
    sid INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    stream TEXT NOT NULL,
    high_seq INTEGER,
    free_first_ns INTEGER,
    free_last_ns INTEGER,
    UNIQUE (node, stream));
CREATE TABLE records (
    id INTEGER PRIMARY KEY,
    sid INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    t_ns INTEGER NOT NULL,
    jid INTEGER,
    rank INTEGER,
    source TEXT NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL,
    occurred_ns INTEGER,
    observed_ns INTEGER NOT NULL,
    boot_id TEXT,
    mono_ns INTEGER,
    local_rank INTEGER,
    pid INTEGER,
    severity INTEGER NOT NULL,
    fields BLOB);
CREATE UNIQUE INDEX records_key ON records (sid, seq);
CREATE INDEX records_job ON records (jid, t_ns, rank);
CREATE INDEX records_free ON records (sid, t_ns, seq) WHERE jid IS NULL;
CREATE TABLE jobs (
    jid INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL UNIQUE,
    first_ns INTEGER NOT NULL,
    last_ns INTEGER NOT NULL,
    records INTEGER NOT NULL,
    failed INTEGER NOT NULL);
CREATE TABLE job_nodes (jid INTEGER NOT NULL, node TEXT NOT NULL,
    PRIMARY KEY (jid, node)) WITHOUT ROWID;
CREATE TABLE job_ranks (jid INTEGER NOT NULL, rank INTEGER NOT NULL,
    PRIMARY KEY (jid, rank)) WITHOUT ROWID;
CREATE TABLE node_clocks (
    node TEXT NOT NULL,
    measured_ns INTEGER NOT NULL,
    offset_ns INTEGER NOT NULL,
    uncertainty_ns INTEGER NOT NULL);
CREATE INDEX node_clocks_node ON node_clocks (node, measured_ns);
"""

_BLOCKS_V2 = """
CREATE TABLE blocks (
    bid INTEGER PRIMARY KEY,
    sid INTEGER NOT NULL,
    jid INTEGER,
    seq_lo INTEGER NOT NULL,
    seq_hi INTEGER NOT NULL,
    t_lo INTEGER NOT NULL,
    t_hi INTEGER NOT NULL,
    n INTEGER NOT NULL,
    ranks BLOB,
    data BLOB NOT NULL,
    mid INTEGER,
    marked BLOB);
CREATE INDEX blocks_seq ON blocks (sid, seq_hi);
CREATE INDEX blocks_job ON blocks (jid, t_lo);
CREATE INDEX blocks_free ON blocks (sid, t_lo) WHERE jid IS NULL;
CREATE INDEX blocks_unmarked ON blocks (bid) WHERE mid IS NULL;
CREATE TABLE markers (mid INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
"""

INSERT_BLOCK = ("INSERT INTO blocks (sid, jid, seq_lo, seq_hi, t_lo, t_hi, n, ranks, data, mid, "
                "marked) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def run_script(db: sqlite3.Connection, script: str) -> None:
    """Each statement of ``script`` (executescript would COMMIT the migration)."""
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def block_row(sid: int, jid: int | None, b: Block, mid: int | None) -> tuple:
    """The ``blocks`` row of a Block (INSERT_BLOCK's parameters)."""
    return (sid, jid, *b.bounds(), b.n, pack_ranks(b.ranks()), b.data(), mid, b.marked_data())


def _v1(db: sqlite3.Connection) -> None:
    run_script(db, _SCHEMA_V1)


def _v2(db: sqlite3.Connection) -> None:
    """Records as blocks: every (stream, job)'s rows, in (t_ns, seq) order, cut into
    blocks of BLOCK_MAX, unmarked (a report reads them in full)."""
    run_script(db, _BLOCKS_V2)
    rows = db.execute(
        "SELECT sid, jid, seq, t_ns, source, kind, message, occurred_ns, observed_ns, boot_id, "
        "mono_ns, rank, local_rank, pid, severity, fields FROM records "
        "ORDER BY sid, jid, t_ns, seq")
    n = 0
    for (sid, jid), group in groupby(rows, key=lambda r: (r[0], r[1])):
        chunk: list[tuple] = []
        for row in group:
            chunk.append(row[2:15] + ({} if row[15] is None else msgpack.unpackb(row[15]),))
            if len(chunk) == BLOCK_MAX:
                n += _v2_block(db, sid, jid, chunk)
                chunk = []
        if chunk:
            n += _v2_block(db, sid, jid, chunk)
    run_script(db, "DROP INDEX records_key; DROP INDEX records_job; DROP INDEX records_free;"
                   "DROP TABLE records")
    log.info("store migrate to=2 records=%d as blocks", n)


def _v2_block(db: sqlite3.Connection, sid: int, jid: int | None, rows: list[tuple]) -> int:
    cols = [list(c) for c in zip(*rows)]
    db.execute(INSERT_BLOCK, block_row(sid, jid, Block(None, cols), None))
    return len(rows)


# Applied in order at open, all in one transaction; never edit a released one,
# append a new one (the schema version is len(MIGRATIONS)).
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1, _v2]
