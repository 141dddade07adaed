"""PostgresStore's own behaviour on a real server (the shared contract runs in
test_core.py on both backends): schema and migrations, writers on two connections,
a server that is away or restarts, text PostgreSQL can not hold, byte accounting."""

from __future__ import annotations

import threading

import msgpack
import pytest

psycopg = pytest.importorskip("psycopg", reason="the [postgres] extra is not installed (pip install -e '.[postgres]')")

from firstfault.collector.store import open_store  # noqa: E402 (after the importorskip)
from firstfault.collector.store import postgres_schema as schema  # noqa: E402 (after the importorskip)
from firstfault.collector.store.base import Selection, StoreError  # noqa: E402 (after the importorskip)
from firstfault.collector.store.postgres import ROW_BYTES, PostgresStore  # noqa: E402 (after the importorskip)
from firstfault.wire import COLUMNS  # noqa: E402 (after the importorskip)
from tests.collector.store.conftest import T0, make_record, rows  # noqa: E402 (after the importorskip)

S = 10**9


def sql(url: str, query: str, *args) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as db:
        cur = db.execute(query, args or None)
        return cur.fetchall() if cur.description else []


# --- schema and migrations ------------------------------------------------------------

def test_a_new_database_gets_the_current_schema(pg_url, rec):
    with PostgresStore(pg_url) as s:
        s.insert([rec(0)])
    assert sql(pg_url, "SELECT * FROM schema_version") == [("firstfault", len(schema.MIGRATIONS))]
    with open_store(pg_url) as s:  # reopened: the data is there, nothing migrates again
        assert [r.seq for r in s.records(Selection())] == [0]
    assert sql(pg_url, "SELECT count(*) FROM schema_version") == [(1,)]


def test_an_older_version_is_migrated_in_order(pg_url, rec, monkeypatch):
    with PostgresStore(pg_url) as s:
        s.insert([rec(i) for i in range(5)])
    done = []

    def v_next(db):
        done.append(len(done))
        db.execute("ALTER TABLE blocks ADD COLUMN note text")

    def v_after(db):
        done.append(len(done))
        db.execute("CREATE INDEX blocks_note ON blocks (note)")
    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, v_next, v_after])
    with PostgresStore(pg_url) as s:
        assert [r.seq for r in s.records(Selection(job="job-1"))] == list(range(5))
        assert s.insert([rec(5)]) == 1
    assert done == [0, 1]
    assert sql(pg_url, "SELECT version FROM schema_version") == [(len(schema.MIGRATIONS),)]
    PostgresStore(pg_url).close()
    assert done == [0, 1]  # applied once


def version_2_database(url: str, monkeypatch, records: list) -> None:
    """A database of schema version 2 (a row per record, text escaped as that version
    did, fields a msgpack map) holding ``records`` (one job and jobless ones)."""
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:2])
    with psycopg.connect(url, autocommit=True) as db:
        schema.migrate(db, url)
    monkeypatch.undo()
    e = schema.escape
    sids, jids = {}, {}
    db = psycopg.connect(url, autocommit=True)

    def sql(url, query, *args):
        db.execute(query, args)
    for r in records:
        if (r.node, r.stream) not in sids:
            sids[(r.node, r.stream)] = len(sids) + 1
            sql(url, "INSERT INTO streams (sid, node, stream, high_seq) VALUES (%s, %s, %s, %s)",
                sids[(r.node, r.stream)], e(r.node), e(r.stream),
                max(x.seq for x in records if (x.node, x.stream) == (r.node, r.stream)))
        if r.job is not None and r.job not in jids:
            jids[r.job] = len(jids) + 1
            own = [x for x in records if x.job == r.job]
            t = [x.occurred_ns if x.occurred_ns is not None else x.observed_ns for x in own]
            sql(url, "INSERT INTO jobs (jid, job, first_ns, last_ns, records, failed, bytes, "
                     "marked_by) VALUES (%s, %s, %s, %s, %s, %s, 0, -1)",
                jids[r.job], e(r.job), min(t), max(t), len(own),
                any(x.kind == "proc.exit" for x in own))
            sql(url, "INSERT INTO job_nodes VALUES (%s, %s)", jids[r.job], e(r.node))
        t = r.occurred_ns if r.occurred_ns is not None else r.observed_ns
        escaped = any("\x00" in (v or "") or "\uffff" in (v or "")
                      for v in (r.source, r.kind, r.message, r.boot_id))
        esc = e if escaped else (lambda v: v)
        sql(url, "INSERT INTO records (sid, seq, t_ns, jid, rank, source, kind, message, "
                 "occurred_ns, observed_ns, boot_id, mono_ns, local_rank, pid, severity, fields, "
                 "escaped, needed) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                 "%s, %s, %s, false)",
            sids[(r.node, r.stream)], r.seq, t, jids.get(r.job), r.rank, esc(r.source),
            esc(r.kind), esc(r.message), r.occurred_ns, r.observed_ns,
            None if r.boot_id is None else esc(r.boot_id), r.mono_ns, r.local_rank, r.pid,
            r.severity, msgpack.packb(r.fields) if r.fields else None, escaped)
    db.close()


def test_a_version_2_database_of_rows_is_migrated_to_blocks(pg_url, rec, monkeypatch):
    """Rows of schema version 2 come back the same from blocks (text escaped for
    PostgreSQL's text unescaped), idempotent; the blocks wait in ``pending`` until
    marked, and then a report reads only their marks."""
    from firstfault.analysis.catalog import load_catalog
    from firstfault.analysis.reads import ReportMarker

    marker = ReportMarker(load_catalog())
    kept = [rec(i, rank=i % 3, t=T0 + (i % 7) * S, fields={"i": i} if i % 2 else {})
            for i in range(2500)]
    kept[3] = rec(3, message="cut by copytruncate \x00\x00 and \uffff0", boot_id="b\x00")
    kept += [rec(3000 + i, job=None, stream="k") for i in range(3)]
    kept.append(rec(2600, kind="proc.exit", source="procs", fields={"exitcode": -9}))
    version_2_database(pg_url, monkeypatch, kept)
    with PostgresStore(pg_url, marker=marker) as s:
        want = sorted(kept, key=lambda r: (r.occurred_ns, r.node, r.stream, r.seq))
        assert list(s.records(Selection(job="job-1"))) == want
        assert s.insert(kept) == 0  # still idempotent over the migrated records
        assert s.job("job-1").records == 2501 and s.job("job-1").status == "failed"
        pending = rows(s, "SELECT count(*) FROM pending")[0][0]
        assert pending == rows(s, "SELECT count(*) FROM blocks")[0][0] == 3  # 2000 + 501, k
        assert len(list(s.needed(Selection(job="job-1"), marker.name))) == 2504  # unmarked: whole
        assert s.mark_pending() == 3 and rows(s, "SELECT count(*) FROM pending") == [(0,)]
        needed = list(s.needed(Selection(job="job-1"), marker.name))
        by_key = {(r.node, r.stream, r.seq): r for r in want}
        assert 0 < len(needed) < 2504 and all(by_key[(r.node, r.stream, r.seq)] == r for r in needed)
        assert s.insert([rec(4000, t=T0 + 8 * S)]) == 1
    assert sql(pg_url, "SELECT version FROM schema_version") == [(len(schema.MIGRATIONS),)] == [(3,)]
    assert sql(pg_url, "SELECT to_regclass('records')") == [(None,)]


def test_a_failed_migration_changes_nothing(pg_url, monkeypatch):
    PostgresStore(pg_url).close()

    def v_bad(db):
        db.execute("CREATE TABLE half_done (x int)")
        db.execute("CREATE TABLE blocks (x int)")  # already exists: fails
    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, v_bad])
    with pytest.raises(StoreError, match=r"opening the store failed: .*\"blocks\" already exists"):
        PostgresStore(pg_url)
    monkeypatch.undo()
    assert sql(pg_url, "SELECT version FROM schema_version") == [(len(schema.MIGRATIONS),)]
    assert sql(pg_url, "SELECT to_regclass('half_done')") == [(None,)]
    PostgresStore(pg_url).close()


def test_a_newer_version_is_refused(pg_url):
    PostgresStore(pg_url).close()
    sql(pg_url, "UPDATE schema_version SET version = 99")
    with pytest.raises(StoreError, match=r"schema version 99.*newer firstfault.*upgrade") as e:
        PostgresStore(pg_url)
    assert pg_url in str(e.value)


def test_another_programs_tables_are_refused_and_left_alone(pg_url):
    sql(pg_url, "CREATE TABLE jobs (id int, name text)")
    with pytest.raises(StoreError, match=r"holds tables named like firstfault's \(jobs\).*not a "
                                         "firstfault store"):
        PostgresStore(pg_url)
    assert sql(pg_url, "SELECT to_regclass('blocks')") == [(None,)]
    sql(pg_url, "DROP TABLE jobs")
    sql(pg_url, "CREATE TABLE schema_version (application text, version int)")
    sql(pg_url, "INSERT INTO schema_version VALUES ('flyway', 3)")
    with pytest.raises(StoreError, match="schema_version table is not firstfault's"):
        PostgresStore(pg_url)


def test_a_store_in_its_own_schema_beside_other_tables(postgres, pg_url, rec):
    sql(pg_url, "CREATE TABLE jobs (id int, name text)")  # another program's, in public
    sql(pg_url, "CREATE SCHEMA ff")
    url = pg_url + "?options=-csearch_path%3Dff"
    with PostgresStore(url) as s:
        assert s.insert([rec(0)]) == 1
    assert sql(pg_url, "SELECT sum(n) FROM ff.blocks") == [(1,)]
    assert sql(pg_url, "SELECT count(*) FROM public.jobs") == [(0,)]


def test_collectors_starting_together_migrate_once(pg_url, rec):
    stores, errors = [], []

    def open_one():
        try:
            stores.append(PostgresStore(pg_url))
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(stores) == 4
    assert stores[0].insert([rec(0)]) == 1 and stores[3].high_seq("gpu-01", "s1") == 0
    for s in stores:
        s.close()


# --- connections ---------------------------------------------------------------------

def test_no_server_at_the_url_is_a_clear_error_without_the_password(postgres):
    url = f"postgresql://ff:s3cret@127.0.0.1:{postgres.port + 1}/ff"  # nothing listens there
    with pytest.raises(StoreError, match="can not connect to PostgreSQL") as e:
        PostgresStore(url, connect_timeout_s=2)
    assert "s3cret" not in str(e.value) and f"127.0.0.1:{postgres.port + 1}" in str(e.value)
    with pytest.raises(StoreError, match='database "no_such_db" does not exist'):
        PostgresStore(postgres.url("no_such_db"))
    with pytest.raises(StoreError, match="can not connect"):
        PostgresStore("postgresql://ff@127.0.0.1:notaport/ff")


def test_a_server_restart_costs_a_clear_error_then_the_store_reconnects(postgres, pg_url, rec):
    s = PostgresStore(pg_url)
    assert s.insert([rec(0)]) == 1
    postgres.stop()
    try:
        with pytest.raises(StoreError, match="insert of 1 records failed|can not connect"):
            s.insert([rec(1)])
        with pytest.raises(StoreError, match="can not connect to PostgreSQL"):
            s.high_seq("gpu-01", "s1")
    finally:
        postgres.start()
    assert s.insert([rec(1)]) == 1  # a new connection
    assert [r.seq for r in s.records(Selection())] == [0, 1]
    s.close()


def test_two_collectors_write_one_job_and_one_stream_concurrently(pg_url, clock):
    """Two stores (connections) insert batches of one job from two nodes, and both
    resend the same stream of a third node: every record once, the job's aggregates
    exact."""
    a, b = PostgresStore(pg_url, now_ns=clock), PostgresStore(pg_url, now_ns=clock)
    news = {"a": 0, "b": 0}
    errors = []

    def write(store, name, node):
        try:
            for k in range(0, 3000, 250):
                own = [make_record(i, node=node, rank=i % 4 + (node == "gpu-02") * 4)
                       for i in range(k, k + 250)]
                shared = [make_record(i, node="gpu-03", stream="k", job=None)
                          for i in range(k, k + 250)]
                news[name] += store.insert(own) + store.insert_columns_many([
                    ("gpu-03", "k", [r.seq for r in shared],
                     {c: [getattr(r, c) for r in shared] for c in COLUMNS})])[0]
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=write, args=(a, "a", "gpu-01")),
               threading.Thread(target=write, args=(b, "b", "gpu-02"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert news["a"] + news["b"] == 3 * 3000
    assert sql(pg_url, "SELECT sum(n) FROM blocks") == [(9000,)]
    every = [(r.node, r.stream, r.seq) for r in a.records(Selection())]
    assert len(every) == len(set(every)) == 9000
    j = a.job("job-1")
    assert (j.records, j.first_ns, j.last_ns) == (6000, T0, T0 + 2999 * S)
    assert j.nodes == ("gpu-01", "gpu-02") and j.ranks == tuple(range(8))
    assert b.high_seq("gpu-03", "k") == 2999
    got = list(b.records(Selection(job="job-1")))  # gpu-03 sent none of its records
    assert len(got) == 6000 and [r.occurred_ns for r in got] == sorted(r.occurred_ns for r in got)
    assert [r.seq for r in a.records(Selection(nodes=("gpu-03",)))] == list(range(3000))
    a.close(), b.close()


def test_a_job_pruned_by_another_collector_is_recreated_by_the_next_insert(pg_url, clock):
    writer, pruner = PostgresStore(pg_url, now_ns=clock), PostgresStore(pg_url, now_ns=clock)
    writer.insert([make_record(i) for i in range(10)])
    clock.now = T0 + 3600 * S
    assert pruner.prune(max_age_s=60, max_bytes=None) == 10
    assert pruner.job("job-1") is None
    assert writer.insert([make_record(i, t=T0 + 3599 * S) for i in range(10, 15)]) == 5
    j = pruner.job("job-1")
    assert (j.records, j.first_ns, j.nodes) == (5, T0 + 3599 * S, ("gpu-01",))
    assert [r.job for r in pruner.records(Selection(job="job-1"))] == ["job-1"] * 5
    writer.close(), pruner.close()


# --- text and bytes ---------------------------------------------------------------------

def test_nul_and_ffff_in_any_text_round_trip_and_grep(store, rec):
    odd = "a\x00b\uffff0c\uffff\x00"
    records = [rec(0, message=f"Killed process 1 {odd}", source="rank\x00log", boot_id=odd),
               rec(1, node="gpu\x00x", stream="s\uffff", job="j\x00b", message="plain"),
               rec(2, message="\uffff1 not an escape", kind="rank.\uffff")]
    assert store.insert(records) == 3
    assert list(store.records(Selection())) == records
    assert [r.seq for r in store.records(Selection(grep="b\uffff0c"))] == [0]
    assert [r.seq for r in store.records(Selection(grep="\x00b\uffff"))] == [0]
    assert [r.seq for r in store.records(Selection(grep="0"))] == [0]  # "b\uffff0c", not an escaped NUL
    assert [r.seq for r in store.records(Selection(grep="\uffff1"))] == [2]
    assert store.high_seq("gpu\x00x", "s\uffff") == 1
    assert {j.job for j in store.jobs()} == {"job-1", "j\x00b"}
    assert store.job("j\x00b").nodes == ("gpu\x00x",)


def test_used_bytes_counts_every_block_and_follows_prune(pg_url, clock):
    from firstfault.analysis.catalog import load_catalog
    from firstfault.analysis.reads import ReportMarker

    s = PostgresStore(pg_url, now_ns=clock, marker=ReportMarker(load_catalog()))
    for k in range(0, 6000, 1000):
        s.insert([make_record(i, fields={"x": i} if i % 3 else {}) for i in range(k, k + 1000)])
    s.insert([make_record(i, stream="k", job=None) for i in range(300)])

    def counted():
        return sum(rows(s, f"SELECT coalesce(sum({size}) + {ROW_BYTES} * count(*), 0)::bigint "
                           f"FROM {table}")[0][0] for table, size in (
            ("blocks", "octet_length(seqs) + octet_length(data) + coalesce(octet_length(idx), "
                       "0) + coalesce(octet_length(ranks), 0)"),
            ("marks", "octet_length(seqs) + octet_length(data)")))
    assert s.used_bytes() == counted() > 0
    disk = sum(sql(pg_url, f"SELECT pg_total_relation_size('{t}')")[0][0] for t in ("blocks", "marks"))
    assert 0.5 < s.used_bytes() / disk < 2, (s.used_bytes(), disk)  # ROW_BYTES is about right
    bound = s.used_bytes() // 2
    deleted = s.prune(max_age_s=None, max_bytes=bound)
    assert 0 < deleted < 6300 and s.used_bytes() == counted() <= bound
    clock.now = T0 + 86400 * S
    s.prune(max_age_s=1, max_bytes=None)
    assert s.used_bytes() == counted() == 0 and s.jobs() == []
    s.close()


def test_the_scans_use_the_indexes(pg_url):
    s = PostgresStore(pg_url)
    for k in range(100):  # a block each, of many jobs and streams: an index is worth it
        s.insert([make_record(k * 5 + i, job=f"job-{k}" if k % 2 else None, stream=f"s{k % 7}")
                  for i in range(5)])
    sql(pg_url, "ANALYZE")
    meta = ("SELECT b.bid, b.sid, b.t_lo, b.t_hi, b.ranks, m.mid FROM blocks AS b "
            "LEFT JOIN marks AS m ON m.bid = b.bid ")
    plans = {
        "job": meta + "WHERE b.jid = 1 AND b.t_lo <= 9 AND b.t_hi >= 0",
        "free": meta + "WHERE b.sid = 1 AND b.jid IS NULL AND b.t_lo <= 9 AND b.t_hi >= 0",
        "seq": "SELECT seqs, idx, n FROM blocks WHERE sid = 1 AND seq_hi >= 1 AND seq_lo <= 2",
    }
    for name, query in plans.items():
        with psycopg.connect(pg_url, autocommit=True) as db:
            db.execute("SET enable_seqscan = off")  # a tiny table: ask which index fits
            plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + query))
        assert f"blocks_{name}" in plan, (name, plan)
    s.close()
