"""The store core on both dialects (SqliteStore and PostgresStore, by the ``store`` fixture): idempotent
inserts, ordering, selections, jobs, clocks, pruning; SqliteStore's own details."""

import dataclasses
import sqlite3

import pytest

from firstfault import wire
from firstfault.collector.store.base import NodeClock, Selection, StoreError
from firstfault.collector.store.sqlite import SqliteStore
from tests.collector.store.conftest import rows

T0 = 1_796_206_319_782_000_000
S = 1_000_000_000
MIN = 60 * S


def keys(records):
    return [(r.node, r.stream, r.seq) for r in records]


def stored(store) -> tuple[str, str, str]:
    """(table, count, time): how the store's schema holds records (both: blocks)."""
    return "blocks", "sum(n)", "t_lo"


def count(store) -> int:
    return rows(store, f"SELECT coalesce({stored(store)[1]}, 0) FROM {stored(store)[0]}")[0][0]


# --- idempotency and high_seq -----------------------------------------------------

def test_resending_the_same_records_stores_them_once(store, rec):
    batch = [rec(i, rank=i % 4) for i in range(100)]
    assert store.insert(batch) == 100
    assert store.insert(batch) == 0
    assert count(store) == 100
    assert store.job("job-1").records == 100
    assert keys(store.records(Selection(job="job-1"))) == keys(batch)


def test_an_overlapping_resend_counts_only_the_new_records(store, rec):
    assert store.insert([rec(i) for i in range(100)]) == 100
    assert store.insert([rec(i) for i in range(50, 150)]) == 50
    assert count(store) == 150
    assert store.job("job-1").records == 150


def test_duplicates_within_one_call_are_stored_once(store, rec):
    assert store.insert([rec(0), rec(1), rec(1), rec(2), rec(0)]) == 3
    assert store.job("job-1").records == 3


def test_records_below_the_high_mark_that_are_missing_are_stored(store, rec):
    assert store.insert([rec(0), rec(1), rec(5)]) == 3
    assert store.insert([rec(4), rec(2), rec(3), rec(5)]) == 3  # a late fill plus a resend
    assert store.high_seq("gpu-01", "s1") == 5
    assert [r.seq for r in store.records(Selection())] == [0, 1, 2, 3, 4, 5]


def test_high_seq_per_stream(store, rec):
    assert store.high_seq("gpu-01", "s1") is None
    store.insert([rec(i) for i in range(10)] + [rec(3, stream="s2"), rec(7, node="gpu-02")])
    assert store.high_seq("gpu-01", "s1") == 9
    assert store.high_seq("gpu-01", "s2") == 3
    assert store.high_seq("gpu-02", "s1") == 7
    assert store.high_seq("gpu-03", "s1") is None


def test_insert_columns_stores_what_insert_stores(open_store, rec):
    batch = [rec(i, rank=i % 3, fields={"x": i} if i % 2 else {}) for i in range(20)]
    batch[5] = dataclasses.replace(batch[5], job=None)
    cols = wire.BatchColumns.from_wire(wire.Batch(tuple(batch)).to_wire())
    a, b = open_store("a"), open_store("b")
    assert a.insert(batch) == b.insert_columns(cols.node, cols.stream, cols.seqs, cols.cols) == 20
    assert b.insert_columns(cols.node, cols.stream, cols.seqs, cols.cols) == 0
    assert list(a.records(Selection())) == list(b.records(Selection())) == batch
    assert a.jobs() == b.jobs()


def test_every_field_round_trips(store, rec):
    records = [
        rec(0, fields={"i": -(2**63), "f": 0.25, "s": "ünï", "b": True, "n": None, "z": False},
            boot_id="boot", mono_ns=2**63 - 1, severity=3, message="Ω traceback\nline 2"),
        rec(1, occurred_ns=None, message="", pid=None, local_rank=None),
        rec(2, job=None, source="nvml", kind="gpu.xid", fields={"xid": 79}, severity=2),
    ]
    store.insert(records)
    assert list(store.records(Selection())) == records


def test_empty_insert(store):
    assert store.insert([]) == 0


# --- order and selection ----------------------------------------------------------

def test_records_come_in_time_node_stream_seq_order(store, rec):
    t = T0 + 5 * S
    records = [
        rec(9, node="gpu-02", stream="a", t=t),
        rec(1, node="gpu-01", stream="b", t=t),
        rec(2, node="gpu-01", stream="a", t=t),
        rec(3, node="gpu-01", stream="a", t=t),
        rec(4, node="gpu-01", stream="a", t=t - 1),
        rec(5, node="gpu-01", stream="a", occurred_ns=None, observed_ns=t - 2),  # observed
        rec(6, node="gpu-01", stream="a", job=None, t=t),  # a kernel line, same instant
        rec(7, node="gpu-01", stream="b", t=t + 1, rank=3),
    ]
    for r in reversed(records):
        store.insert([r])
    expected = sorted(records, key=lambda r: (r.occurred_ns if r.occurred_ns is not None
                                              else r.observed_ns, r.node, r.stream, r.seq))
    assert [r.seq for r in expected] == [5, 4, 2, 3, 6, 1, 9, 7]
    assert list(store.records(Selection(job="job-1"))) == expected
    assert list(store.records(Selection())) == expected


def test_a_job_selects_the_jobless_records_of_its_nodes_around_it(store, rec):
    job = [rec(i, node=n, t=T0 + i * S) for i, n in enumerate(["gpu-01", "gpu-02"] * 30)]
    store.insert(job)  # 59 s long, on gpu-01 and gpu-02
    first, last = T0, T0 + 59 * S
    kernel = {
        "before, in": rec(100, node="gpu-01", stream="k", job=None, t=first - 10 * MIN),
        "before, out": rec(101, node="gpu-01", stream="k", job=None, t=first - 10 * MIN - 1),
        "during": rec(102, node="gpu-02", stream="k", job=None, t=first + 30 * S,
                      source="cgroup", kind="cgroup.oom", message=""),
        "after, in": rec(103, node="gpu-02", stream="k", job=None, t=last + 10 * MIN),
        "after, out": rec(104, node="gpu-02", stream="k", job=None, t=last + 10 * MIN + 1),
        "other node": rec(105, node="gpu-03", stream="k", job=None, t=first + 30 * S),
    }
    store.insert(sorted(kernel.values(), key=lambda r: (r.node, r.seq)))
    other = [rec(i, node="gpu-03", job="job-2", t=T0 + i * S) for i in range(5)]
    store.insert(other)
    got = list(store.records(Selection(job="job-1")))
    inside = [kernel[k] for k in ("before, in", "during", "after, in")]
    assert sorted(keys(got)) == sorted(keys(job + inside))
    assert got[0] == kernel["before, in"] and got[-1] == kernel["after, in"]
    assert keys(store.records(Selection(job="job-2"))) == keys(other) + [
        ("gpu-03", "k", 105)]  # 26 s after job-2's last record: inside its window
    assert list(store.records(Selection(job="no-such-job"))) == []


def test_filters(store, rec):
    records = [rec(i, node=f"gpu-0{i % 2 + 1}", rank=i % 4,
                   message=f"step {i} {'loss scale' if i % 5 == 0 else 'ok'}") for i in range(40)]
    records.append(rec(100, node="gpu-01", stream="k", job=None, t=T0 + 7 * S,
                       message="Out of memory: Killed process 24211 (python3)"))
    store.insert(records)

    def seqs(**kw):
        return [r.seq for r in store.records(Selection(job="job-1", **kw))]
    assert seqs(nodes=("gpu-02",)) == list(range(1, 40, 2))
    assert seqs(nodes=("gpu-01",)) == [0, 2, 4, 6, 100, 8] + list(range(10, 40, 2))
    assert seqs(nodes=("gpu-09",)) == []
    assert seqs(ranks=(1, 3)) == list(range(1, 40, 2))
    assert seqs(ranks=(2,), nodes=("gpu-01",)) == list(range(2, 40, 4))
    # inclusive bounds; at T0+7 s gpu-01's kernel line comes before gpu-02's rank line
    assert seqs(since_ns=T0 + 5 * S, until_ns=T0 + 8 * S) == [5, 6, 100, 7, 8]
    assert seqs(grep=r"loss scale") == list(range(0, 40, 5))
    assert seqs(grep="Killed process 24211") == [100]
    assert seqs(grep=r"Killed process \d+") == []  # a literal, never a pattern
    assert seqs(limit=3) == [0, 1, 2]
    assert seqs(limit=0) == []
    assert seqs(grep="ok", ranks=(0,), limit=2) == [4, 8]
    assert [r.seq for r in store.records(Selection(grep="Killed"))] == [100]
    assert [r.seq for r in store.records(Selection(ranks=(3,), until_ns=T0 + 20 * S))] == [
        3, 7, 11, 15, 19]
    assert seqs(grep="(unclosed") == []  # no pattern: nothing to be malformed
    with pytest.raises(ValueError, match="limit"):
        store.records(Selection(limit=-1))


def test_long_rank_and_node_lists_are_filtered_too(store, rec):
    store.insert([rec(i, rank=i) for i in range(20)])
    ranks = tuple(range(1, 2000, 2))  # longer than one IN list
    assert [r.seq for r in store.records(Selection(job="job-1", ranks=ranks))] == list(
        range(1, 20, 2))
    nodes = tuple(f"gpu-{i:04d}" for i in range(800)) + ("gpu-01",)
    assert len(list(store.records(Selection(job="job-1", nodes=nodes)))) == 20


def test_a_selection_without_job_merges_every_job_and_node(store, rec):
    a = [rec(i, job="a", node="gpu-01", t=T0 + 2 * i * S) for i in range(10)]
    b = [rec(i, job="b", node="gpu-02", t=T0 + (2 * i + 1) * S) for i in range(10)]
    k = [rec(50 + i, job=None, node="gpu-03", stream="k", t=T0 + i * S) for i in range(3)]
    store.insert(a), store.insert(b), store.insert(k)
    got = list(store.records(Selection()))
    assert got == sorted(a + b + k, key=lambda r: (r.occurred_ns, r.node, r.stream, r.seq))
    assert [r.job for r in store.records(Selection(nodes=("gpu-02", "gpu-03")))] == [
        None, "b", None, None] + ["b"] * 9
    assert len(list(store.records(Selection(since_ns=T0 + 15 * S)))) == 5


def test_queries_use_the_indexes_without_sorting(sqlite_store, rec):
    store = sqlite_store
    store.insert([rec(i) for i in range(10)])
    db = store._db
    meta = ("SELECT b.bid, b.sid, b.t_lo, b.t_hi, b.ranks, m.mid FROM blocks AS b {} "
            "LEFT JOIN marks AS m ON m.bid = b.bid ")
    plans = {
        "job": meta.format("INDEXED BY blocks_job") + "WHERE b.jid = 1 AND b.t_lo <= 9 "
                                                      "AND b.t_hi >= 0",
        "free": meta.format("INDEXED BY blocks_free") + "WHERE b.sid = 1 AND b.jid IS NULL "
                                                        "AND b.t_lo <= 9 AND b.t_hi >= 0",
        "key": "SELECT seqs, idx, n FROM blocks INDEXED BY blocks_seq WHERE sid = 1 AND "
               "seq_hi >= 1 AND seq_lo <= 2",
    }
    for name, sql in plans.items():
        plan = " | ".join(row[-1] for row in db.execute("EXPLAIN QUERY PLAN " + sql))
        assert "TEMP B-TREE" not in plan and "USING" in plan and "INDEX" in plan, (name, plan)
    pending = db.execute("EXPLAIN QUERY PLAN SELECT bid FROM pending ORDER BY bid LIMIT 1000")
    assert "TEMP B-TREE" not in " | ".join(row[-1] for row in pending)  # rowid order
    indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' "
                                        "AND tbl_name = 'blocks' AND sql IS NOT NULL")}
    assert indexes == {"blocks_seq", "blocks_job", "blocks_free"}


def test_another_store_on_the_same_file_sees_new_streams_and_jobs(open_store, rec):
    writer, reader = open_store(), open_store()
    assert reader.high_seq("gpu-01", "s1") is None
    writer.insert([rec(i, job="late") for i in range(3)])
    assert reader.high_seq("gpu-01", "s1") == 2
    assert [r.job for r in reader.records(Selection(job="late"))] == ["late"] * 3
    it = reader.records(Selection())
    assert next(it).seq == 0
    writer.insert([rec(0, node="gpu-07", stream="new", job="newer", t=T0 + 100 * S)])
    assert [(r.node, r.job) for r in it][-1][0] in ("gpu-01", "gpu-07")  # no KeyError
    assert [r.node for r in reader.records(Selection(job="newer"))] == ["gpu-07"]


def test_reading_while_inserting_on_the_same_store(store, rec):
    """The HTTP API streams a timeline in chunks between the ingest's inserts."""
    store.insert([rec(i) for i in range(12_000)])
    it = store.records(Selection(job="job-1"))
    first = [next(it) for _ in range(7000)]
    assert store.insert([rec(i, t=T0 - S) for i in range(12_000, 12_010)]) == 10
    rest = list(it)
    seqs = [r.seq for r in first + rest]
    assert seqs[:7000] == list(range(7000)) and seqs[7000:12_000] == list(range(7000, 12_000))


# --- jobs ---------------------------------------------------------------------------

def test_jobs_are_derived_from_their_records(store, rec, clock):
    store.insert([rec(i, node=f"gpu-0{i % 2 + 1}", rank=i % 4, t=T0 + i * S) for i in range(8)])
    store.insert([rec(0, stream="s2", job="job-2", rank=7, t=T0 + 100 * S)])
    store.insert([rec(100, job=None, stream="k", t=T0 + 1000 * S)])  # no job: no job entry
    j = store.job("job-1")
    assert (j.first_ns, j.last_ns, j.records) == (T0, T0 + 7 * S, 8)
    assert j.nodes == ("gpu-01", "gpu-02") and j.ranks == (0, 1, 2, 3)
    assert j.status == "ended"
    assert [x.job for x in store.jobs()] == ["job-2", "job-1"]  # newest first
    assert store.job("nope") is None
    clock.now = T0 + 100 * S + 59 * S
    assert store.job("job-2").status == "running"
    assert store.job("job-1").status == "ended"


@pytest.mark.parametrize("kind, fields, failed", [
    ("proc.exit", {"exitcode": -9, "signal": "SIGKILL"}, True),
    ("proc.exit", {"exitcode": 1}, True),
    ("proc.exit", {"code": 3}, True),
    ("proc.exit", {"signal": "SIGSEGV"}, True),
    ("proc.exit", {"exitcode": 0, "signal": None}, False),
    ("rank.traceback", {}, True),
    ("rank.line", {"exitcode": 1}, False),
])
def test_failed_status(store, rec, clock, kind, fields, failed):
    store.insert([rec(0), rec(1, kind=kind, fields=fields, source="procs"), rec(2)])
    assert store.job("job-1").status == ("failed" if failed else "ended")
    clock.now = T0 + 30 * S
    assert store.job("job-1").status == "running"  # records still coming in


def test_a_failure_in_a_mixed_batch_marks_only_its_job(store, rec):
    store.insert([rec(0, job="a"), rec(1, job="b", kind="rank.traceback"), rec(2, job=None),
                  rec(3, job="a", rank=5)])
    assert {j.job: j.status for j in store.jobs()} == {"a": "ended", "b": "failed"}
    assert store.job("a").ranks == (0, 5) and store.job("a").records == 2


# --- clocks -------------------------------------------------------------------------

def test_clocks_keep_history_and_return_the_latest(store):
    for measured, offset in ((T0, 5), (T0 + 20 * S, 7), (T0 + 10 * S, 6)):
        store.save_clock(NodeClock("gpu-01", offset, 100, measured))
    store.save_clock(NodeClock("gpu-02", -3, 50, T0))
    assert store.clocks() == {"gpu-01": NodeClock("gpu-01", 7, 100, T0 + 20 * S),
                              "gpu-02": NodeClock("gpu-02", -3, 50, T0)}
    assert rows(store, "SELECT count(*) FROM node_clocks") == [(4,)]


# --- prune --------------------------------------------------------------------------

def test_prune_by_age(store, rec, clock):
    old = [rec(i, job="old", t=T0 + i * S) for i in range(10)]
    mixed = [rec(i, stream="s2", job="mixed", t=T0 + i * 600 * S) for i in range(12)]  # 2 h
    kernel = [rec(i, stream="k", job=None, t=T0 + i * 600 * S) for i in range(12)]
    for batch in (old, mixed, kernel):
        store.insert(batch)
    store.save_clock(NodeClock("gpu-01", 1, 1, T0))
    store.save_clock(NodeClock("gpu-01", 2, 1, T0 + 2 * 3600 * S))
    store.save_clock(NodeClock("gpu-02", 3, 1, T0))
    clock.now = T0 + 2 * 3600 * S
    # older than 1 h: all of "old", mixed/kernel 0..5 (t < T0 + 3600 s)
    assert store.prune(max_age_s=3600, max_bytes=None) == 10 + 6 + 6
    assert [j.job for j in store.jobs()] == ["mixed"]
    m = store.job("mixed")
    assert (m.first_ns, m.last_ns, m.records) == (T0 + 3600 * S, T0 + 11 * 600 * S, 6)
    assert [(r.stream, r.seq) for r in store.records(Selection())][:2] == [("k", 6), ("s2", 6)]
    assert store.high_seq("gpu-01", "s1") == 9  # never lowered: pruned records are not resent
    assert store.insert(old) == 10  # (unless sent again, then they are new)
    assert store.prune(max_age_s=3600, max_bytes=None) == 10
    assert store.clocks()["gpu-02"].offset_ns == 3  # each node's latest estimate stays
    assert rows(store, "SELECT count(*) FROM node_clocks") == [(2,)]
    assert store.prune(max_age_s=None, max_bytes=None) == 0
    table, n, _ = stored(store)
    assert rows(store, f"SELECT {n} FROM {table} WHERE jid IS NULL") == [(6,)]
    assert count(store) == 12


def test_prune_by_size_deletes_the_oldest_first(store, rec, clock):
    for j, node in (("a", "gpu-01"), ("b", "gpu-02")):
        for k in range(0, 12_000, 3000):
            store.insert([rec(i, node=node, job=j, rank=i % 8, t=T0 + i * S + (j == "b"))
                          for i in range(k, k + 3000)])
    store.insert([rec(i, stream="k", job=None, t=T0 + i * 1000 * S) for i in range(12)])
    total = count(store)
    used = store.used_bytes()
    bound = used // 3
    deleted = store.prune(max_age_s=None, max_bytes=bound)
    assert store.used_bytes() <= bound
    assert deleted == total - count(store) and deleted > total / 2
    table, n, t = stored(store)
    assert rows(store, f"SELECT min({t}) FROM {table}")[0][0] > T0 + 6000 * S
    for j in store.jobs():  # counts and first times follow the rows
        assert rows(store, f"SELECT {n}, min({t}) FROM {table} r JOIN jobs j ON r.jid = j.jid "
                           f"WHERE j.job = '{j.job}'") == [(j.records, j.first_ns)]
    if isinstance(store, SqliteStore):
        assert rows(store, "PRAGMA integrity_check") == [("ok",)]


def test_prune_rejects_negative_bounds(store):
    with pytest.raises(ValueError):
        store.prune(max_age_s=-1, max_bytes=None)
    with pytest.raises(ValueError):
        store.prune(max_age_s=None, max_bytes=-1)


# --- life cycle ---------------------------------------------------------------------

def test_a_closed_store_says_so(open_store):
    with open_store() as s:
        pass
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.high_seq("a", "b")


def test_power_safe_means_synchronous_full(tmp_path):
    s = SqliteStore(tmp_path / "a.db", power_safe=True)
    assert s._db.execute("PRAGMA synchronous").fetchone()[0] == 2
    s.close()
    s = SqliteStore(tmp_path / "a.db")
    assert s._db.execute("PRAGMA synchronous").fetchone()[0] == 1
    assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s.close()


def test_a_failed_insert_rolls_back_and_keeps_the_store_usable(sqlite_store, rec, monkeypatch):
    store = sqlite_store
    store.insert([rec(0)])

    def boom(*a, **kw):
        raise sqlite3.OperationalError("disk I/O error (test)")
    monkeypatch.setattr(store._ingest, "add_to_jobs", boom)
    with pytest.raises(StoreError, match="insert of 2 records"):
        store.insert([rec(1), rec(0, node="gpu-05")])
    monkeypatch.undo()
    assert store.high_seq("gpu-05", "s1") is None and store.high_seq("gpu-01", "s1") == 0
    assert store.insert([rec(1), rec(0, node="gpu-05")]) == 2
    assert store.job("job-1").records == 3
