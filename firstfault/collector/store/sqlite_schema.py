"""SqliteStore's schema and its migrations (the schema version is ``len(MIGRATIONS)``).

Version 1 kept one row per record (``records``, three indexes); version 2 keeps
blocks of records, one row each, their report marks in the row; version 3 keeps a
batch's column bytes as received as its main job's block (blocks.py has the layout)
and the marks in a table of their own, so a block's row is written once. Every
migration runs inside the one transaction SqliteDialect._migrate opens; never edit a
released one, append.

Version 3, the tables (core.py's docstring says what each holds):
    streams(sid, node, stream, high_seq, free_first_ns, free_last_ns)
    blocks(bid, sid, jid, seq_lo, seq_hi, t_lo, t_hi, n, ranks, seqs, data, idx)
        blocks_seq  (sid, seq_hi)                     idempotency look-ups of resends
        blocks_job  (jid, t_lo)                       a job's blocks in time order
        blocks_free (sid, t_lo) WHERE jid IS NULL     a stream's jobless blocks
    marks(bid, mid, seqs, data): a block's marked records (marking.py)
    pending(bid): blocks stored unmarked, waiting for a marker
    markers(mid, name), jobs(...), job_nodes, job_ranks, node_clocks (as in version 1)
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from itertools import groupby

import msgpack

from firstfault.collector.store.blocks import BLOCK_MAX, pack, pack_ranks, pack_seqs

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

_BLOCKS_V3 = """
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
    seqs BLOB NOT NULL,
    data BLOB NOT NULL,
    idx BLOB);
CREATE INDEX blocks_seq ON blocks (sid, seq_hi);
CREATE INDEX blocks_job ON blocks (jid, t_lo);
CREATE INDEX blocks_free ON blocks (sid, t_lo) WHERE jid IS NULL;
CREATE TABLE marks (bid INTEGER PRIMARY KEY, mid INTEGER NOT NULL, seqs BLOB NOT NULL,
    data BLOB NOT NULL);
CREATE TABLE pending (bid INTEGER PRIMARY KEY);
"""

INSERT_MARKS = "INSERT OR REPLACE INTO marks (bid, mid, seqs, data) VALUES (?, ?, ?, ?)"


def run_script(db: sqlite3.Connection, script: str) -> None:
    """Each statement of ``script`` (executescript would COMMIT the migration)."""
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


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
    """One version 2 block: columns (seq, t_ns, source, kind, message, occurred_ns,
    observed_ns, boot_id, mono_ns, rank, local_rank, pid, severity, fields) packed,
    unmarked."""
    cols = [list(c) for c in zip(*rows)]
    seqs, t, ranks = cols[0], cols[1], set(cols[9]) - {None}
    db.execute("INSERT INTO blocks (sid, jid, seq_lo, seq_hi, t_lo, t_hi, n, ranks, data, mid, "
               "marked) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
               (sid, jid, min(seqs), max(seqs), t[0], t[-1], len(seqs), pack_ranks(ranks),
                pack(cols)))
    return len(rows)


def _v3(db: sqlite3.Connection) -> None:
    """Blocks in the wire's column order with their seqs apart (blocks.py), marks in a
    table of their own; blocks without marks wait in ``pending``."""
    run_script(db, "DROP INDEX blocks_seq; DROP INDEX blocks_job; DROP INDEX blocks_free;"
                   "DROP INDEX blocks_unmarked; ALTER TABLE blocks RENAME TO blocks_v2")
    run_script(db, _BLOCKS_V3)
    jobs = dict(db.execute("SELECT jid, job FROM jobs"))
    n = 0
    for bid, sid, jid, seq_lo, seq_hi, t_lo, t_hi, count, ranks, data, mid, marked in db.execute(
            "SELECT bid, sid, jid, seq_lo, seq_hi, t_lo, t_hi, n, ranks, data, mid, marked "
            "FROM blocks_v2 ORDER BY bid"):
        seqs, cols = _v2_to_v3(data, jobs.get(jid))
        db.execute("INSERT INTO blocks (bid, sid, jid, seq_lo, seq_hi, t_lo, t_hi, n, ranks, seqs, "
                   "data, idx) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                   (bid, sid, jid, seq_lo, seq_hi, t_lo, t_hi, count, ranks, seqs, cols))
        if mid is None:
            db.execute("INSERT INTO pending (bid) VALUES (?)", (bid,))
        else:
            db.execute(INSERT_MARKS, (bid, mid, *_v2_to_v3(marked, jobs.get(jid))))
        n += count
    run_script(db, "DROP TABLE blocks_v2")
    log.info("store migrate to=3 records=%d", n)


def _v2_to_v3(data: bytes, job: str | None) -> tuple[bytes, bytes]:
    """(seqs, data) of version 3 from a version 2 block's packed columns."""
    c = msgpack.unpackb(data, raw=False, strict_map_key=False)
    seq, n = c[0], len(c[0])
    return pack_seqs(seq), pack([*c[2:9], [job] * n, *c[9:]])


# Applied in order at open, all in one transaction; never edit a released one,
# append a new one (the schema version is len(MIGRATIONS)).
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1, _v2, _v3]
