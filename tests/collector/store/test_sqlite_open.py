"""Opening a store file: new, migrated, newer, foreign or corrupt."""

import dataclasses
import sqlite3

import msgpack
import pytest

from firstfault.collector.store import sqlite as sq
from firstfault.collector.store.base import Selection, StoreError
from firstfault.collector.store.sqlite import SqliteStore
from tests.collector.store.conftest import T0, S


def pragma(path, name):
    db = sqlite3.connect(path)
    try:
        return db.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        db.close()


def test_a_new_file_gets_the_current_schema(tmp_path, rec):
    path = tmp_path / "ff.db"
    with SqliteStore(path) as s:
        s.insert([rec(0)])
    assert pragma(path, "user_version") == len(sq.MIGRATIONS)
    assert pragma(path, "application_id") == sq.APPLICATION_ID
    with SqliteStore(path) as s:  # reopened: the data is there, nothing migrates again
        assert [r.seq for r in s.records(Selection())] == [0]


def test_an_empty_file_becomes_a_store(tmp_path):
    path = tmp_path / "ff.db"
    path.touch()
    SqliteStore(path).close()
    assert pragma(path, "user_version") == len(sq.MIGRATIONS)


def test_an_older_version_is_migrated_in_order(tmp_path, rec, monkeypatch):
    path = tmp_path / "ff.db"
    with SqliteStore(path) as s:  # a file of today's version
        s.insert([rec(i) for i in range(5)])
    done = []

    def v_next(db):
        done.append(len(done))
        db.execute("ALTER TABLE blocks ADD COLUMN note TEXT")

    def v_after(db):
        done.append(len(done))
        db.execute("CREATE INDEX blocks_note ON blocks (note)")
    monkeypatch.setattr(sq, "MIGRATIONS", [*sq.MIGRATIONS, v_next, v_after])
    with SqliteStore(path) as s:
        assert [r.seq for r in s.records(Selection(job="job-1"))] == list(range(5))
        assert s.insert([rec(5)]) == 1
    assert done == [0, 1]
    assert pragma(path, "user_version") == len(sq.MIGRATIONS)
    SqliteStore(path).close()
    assert done == [0, 1]  # applied once


def version_1_file(path, rec, last: int) -> tuple[sqlite3.Connection, list]:
    """A store file of schema version 1 holding job-1's records of stream s1 (12 rank
    lines, seqs 0..11; from seq 30 on a proc.exit that failed) and 3 jobless kernel lines
    of stream k; the connection, open, and the records."""
    db = sqlite3.connect(path, isolation_level=None)
    sq.MIGRATIONS[0](db)
    kept = [rec(i, rank=i % 3, t=T0 + (i % 7) * S) for i in range(12)]
    kept += [rec(20 + i, job=None, stream="k") for i in range(3)]
    if last >= 30:
        kept.append(rec(30, kind="proc.exit", source="procs", fields={"exitcode": -9}))
    db.execute("INSERT INTO streams (sid, node, stream, high_seq, free_first_ns, free_last_ns) "
               "VALUES (1, 'gpu-01', 's1', ?, NULL, NULL), (2, 'gpu-01', 'k', 22, ?, ?)",
               (last, T0 + 20 * S, T0 + 22 * S))
    own = [r for r in kept if r.job is not None]
    db.execute("INSERT INTO jobs VALUES (1, 'job-1', ?, ?, ?, ?)",
               (T0, max(r.occurred_ns for r in own), len(own), int(last >= 30)))
    db.execute("INSERT INTO job_nodes VALUES (1, 'gpu-01')")
    for r in kept:
        t = r.occurred_ns if r.occurred_ns is not None else r.observed_ns
        db.execute("INSERT INTO records (sid, seq, t_ns, jid, rank, source, kind, message, "
                   "occurred_ns, observed_ns, boot_id, mono_ns, local_rank, pid, severity, "
                   "fields) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (2 if r.job is None else 1, r.seq, t, None if r.job is None else 1, r.rank,
                    r.source, r.kind, r.message, r.occurred_ns, r.observed_ns, r.boot_id,
                    r.mono_ns, r.local_rank, r.pid, r.severity,
                    msgpack.packb(r.fields) if r.fields else None))
    return db, kept


def test_a_version_1_file_is_migrated_to_blocks(tmp_path, rec):
    """Rows of schema version 1 (one per record) come back the same from blocks."""
    path = tmp_path / "ff.db"
    db, kept = version_1_file(path, rec, 30)
    db.execute("PRAGMA user_version = 1")
    db.execute(f"PRAGMA application_id = {sq.APPLICATION_ID}")
    db.close()
    with SqliteStore(path) as s:
        want = sorted(kept, key=lambda r: (r.occurred_ns, r.node, r.stream, r.seq))
        assert list(s.records(Selection(job="job-1"))) == want
        assert s.insert(kept) == 0  # still idempotent over the migrated records
        assert s.job("job-1").records == 13 and s.job("job-1").status == "failed"
    assert pragma(path, "user_version") == len(sq.MIGRATIONS)
    db = sqlite3.connect(path)
    assert not db.execute("SELECT name FROM sqlite_master WHERE name = 'records'").fetchall()
    db.close()


def test_a_version_2_file_is_migrated_in_place_with_its_marks(tmp_path, rec):
    """Blocks of schema version 2 (columns without the job, marks in the row) come back
    the same from version 3; a block marked under the current marker keeps its marks
    (a report reads only them), unmarked ones wait in ``pending`` until marked."""
    from firstfault.analysis.catalog import load_catalog
    from firstfault.analysis.reads import ReportMarker

    marker = ReportMarker(load_catalog())
    path = tmp_path / "ff.db"
    db, kept = version_1_file(path, rec, 11)
    sq.MIGRATIONS[1](db)  # version 2: two blocks, unmarked
    (bid, data), = db.execute("SELECT bid, data FROM blocks WHERE jid = 1").fetchall()
    cols = msgpack.unpackb(data)  # (seq, t_ns, source, ...): mark its first and last record
    db.execute("INSERT INTO markers (mid, name) VALUES (1, ?)", (marker.name,))
    db.execute("UPDATE blocks SET mid = 1, marked = ? WHERE bid = ?",
               (msgpack.packb([[c[0], c[-1]] for c in cols]), bid))
    db.execute("PRAGMA user_version = 2")
    db.execute(f"PRAGMA application_id = {sq.APPLICATION_ID}")
    db.close()
    want = sorted(kept[:12], key=lambda r: (r.occurred_ns, r.seq))
    with SqliteStore(path, marker=marker) as s:
        assert list(s.records(Selection(job="job-1"))) == sorted(
            kept, key=lambda r: (r.occurred_ns, r.node, r.stream, r.seq))
        assert list(s.needed(Selection(job="job-1", nodes=("gpu-01",), since_ns=T0,
                                        until_ns=T0 + 6 * S), marker.name)) == [want[0], want[-1]]
        assert s.insert(kept) == 0  # still idempotent over the migrated records
        assert s._db.execute("SELECT bid FROM pending").fetchall() == [(bid + 1,)]
        assert s.mark_pending() == 1 and not s._db.execute("SELECT * FROM pending").fetchall()
        assert s.insert([rec(12, rank=0, t=T0 + 7 * S)]) == 1  # new blocks in the new layout
        assert [r.seq for r in s.records(Selection(job="job-1", until_ns=T0 + 7 * S))][-1] == 12
    assert pragma(path, "user_version") == len(sq.MIGRATIONS) == 3
    db = sqlite3.connect(path)
    names = {n for (n,) in db.execute("SELECT name FROM sqlite_master")}
    assert {"blocks", "marks", "pending"} <= names and "blocks_v2" not in names
    db.close()


def test_a_failed_migration_changes_nothing(tmp_path, rec, monkeypatch):
    path = tmp_path / "ff.db"
    SqliteStore(path).close()

    def v_bad(db):
        db.execute("CREATE TABLE half_done (x)")
        db.execute("CREATE TABLE blocks (x)")  # already exists: fails
    monkeypatch.setattr(sq, "MIGRATIONS", [*sq.MIGRATIONS, v_bad])
    with pytest.raises(StoreError, match=str(path)):
        SqliteStore(path)
    monkeypatch.undo()
    assert pragma(path, "user_version") == len(sq.MIGRATIONS)
    db = sqlite3.connect(path)
    assert not db.execute("SELECT name FROM sqlite_master WHERE name = 'half_done'").fetchall()
    db.close()
    SqliteStore(path).close()


def test_a_newer_version_is_refused(tmp_path):
    path = tmp_path / "ff.db"
    SqliteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(StoreError, match=r"schema version 99.*newer firstfault.*upgrade") as e:
        SqliteStore(path)
    assert str(path) in str(e.value)


def test_another_programs_database_is_refused(tmp_path):
    path = tmp_path / "other.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE accounts (id, name)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="another program"):
        SqliteStore(path)
    assert pragma(path, "journal_mode") == "delete"  # left as it was
    db = sqlite3.connect(path)
    db.execute("PRAGMA application_id = 1234")
    db.close()
    with pytest.raises(StoreError, match="not a firstfault store"):
        SqliteStore(path)


@pytest.mark.parametrize("content", [
    b"\x00\x01garbage" * 100,
    b"SQLite format 3\x00" + b"\xff" * 4080,
    b"not a database at all\n",
])
def test_a_corrupt_file_is_a_clear_error_naming_the_path(tmp_path, content):
    path = tmp_path / "ff.db"
    path.write_bytes(content)
    with pytest.raises(StoreError, match="not a usable SQLite database") as e:
        SqliteStore(path)
    assert str(path) in str(e.value)


def test_a_missing_directory_is_a_clear_error(tmp_path):
    path = tmp_path / "no" / "such" / "dir" / "ff.db"
    with pytest.raises(StoreError) as e:
        SqliteStore(path)
    assert str(path) in str(e.value)


def test_a_file_written_by_the_previous_code_opens_with_its_records_and_marks(tmp_path):
    """tests/data/store/main-v3.db.gz was written by the SqliteStore of main before the
    store became one core over dialects (its make.py says how): today's code reads the
    same records, jobs, marks and pending blocks from it, and writes on."""
    import gzip
    import importlib.util
    from pathlib import Path

    from firstfault.analysis.catalog import load_catalog
    from firstfault.analysis.reads import ReportMarker

    data = Path(__file__).parents[2] / "data" / "store"
    spec = importlib.util.spec_from_file_location("store_make", data / "make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    path = tmp_path / "ff.db"
    path.write_bytes(gzip.decompress((data / "main-v3.db.gz").read_bytes()))
    batches = make.records()
    every = [r for b in batches for r in b]
    marker = ReportMarker(load_catalog())
    with SqliteStore(path, marker=marker) as s:
        assert list(s.records(Selection())) == sorted(
            every, key=lambda r: (r.occurred_ns if r.occurred_ns is not None else r.observed_ns,
                                  r.node, r.stream, r.seq))
        j1, j2 = s.job("job-1"), s.job("job-2")
        assert (j1.records, j1.nodes, j1.ranks, j1.status) == (
            sum(r.job == "job-1" for r in every), ("gpu-01", "gpu-02"), tuple(range(8)), "failed")
        assert (j2.records, j2.status) == (2, "ended")
        whole = list(s.records(Selection(job="job-1")))
        # the marks main's code wrote, under its marker's name (a marker's name follows the catalog:
        # today's catalog reads more, so its marker is another, and finds no marks of its own yet)
        [(written,)] = s._db.execute("SELECT name FROM markers").fetchall()
        needed = list(s.needed(Selection(job="job-1"), written))
        assert 0 < len(needed) < len(whole)  # the marks main's code wrote are read
        if written != marker.name:
            assert list(s.needed(Selection(job="job-1"), marker.name)) == whole  # no marks of its own: all
        assert needed[-1] == whole[-1]  # the exit, from the block stored unmarked: read whole
        assert s.insert(every) == 0  # idempotent over what main stored
        assert s._db.execute("SELECT count(*) FROM pending").fetchone()[0] == 1
        assert s.mark_pending() == 1
        assert s.insert([dataclasses.replace(every[-1], seq=1501)]) == 1
        assert s.high_seq("gpu-02", "r") == 1501
    assert pragma(path, "user_version") == len(sq.MIGRATIONS) == 3
