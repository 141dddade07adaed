"""What the collector's report takes from the records besides findings: every rank that
logged (even with nothing but progress) is known with its node, its world size comes from
the agents' process records, and a kernel gap the agent noticed before the job began is
not a gap of the job."""

from __future__ import annotations

from firstfault.analysis.catalog import load_catalog
from firstfault.collector import query
from firstfault.collector.store.sqlite import SqliteStore
from firstfault.wire import Record

T0 = 1_796_206_319_782_000_000
S = 1_000_000_000


def rec(node: str, seq: int, kind: str, source: str, message: str = "", *, job: str | None = "77",
        rank: int | None = None, at: int | None = None, fields: dict | None = None) -> Record:
    t = T0 + seq * S if at is None else at
    return Record(node=node, stream=f"{node}-s", seq=seq, source=source, kind=kind, message=message,
                  occurred_ns=t, observed_ns=t, job=job, rank=rank, fields=fields or {})


def test_quiet_ranks_are_known_with_their_node_and_early_kernel_gaps_are_not_the_jobs(tmp_path):
    records = [
        rec("gpu-01", 1, "kernel.gap", "kmsg", "kmsg records 1..40 lost (buffer_start)", job=None,
            at=T0 - 5 * S, fields={"first_seq": 1, "last_seq": 40, "reason": "buffer_start"}),
        rec("gpu-01", 2, "proc.start", "procs", "python train.py", rank=0, fields={"world_size": "3"}),
        rec("gpu-01", 3, "rank.line", "ranklog", "step=1 loss=2.3", rank=0),
        rec("gpu-02", 4, "rank.line", "ranklog", "step=1 loss=2.3", rank=1),
        rec("gpu-02", 5, "rank.line", "ranklog", "ValueError: expected 16 features, got 17", rank=1),
        rec("gpu-02", 6, "kernel.gap", "kmsg", "kmsg records 50..52 lost (overrun)", job=None,
            fields={"first_seq": 50, "last_seq": 52, "reason": "overrun"}),
    ]
    with SqliteStore(tmp_path / "f.db") as store:
        store.insert(records)
        rep = query.report(store, "77", load_catalog())
    assert rep["ranks"]["0"]["node"] == "gpu-01" and rep["ranks"]["0"]["first_error"] is None
    assert rep["ranks"]["1"]["node"] == "gpu-02"
    assert rep["context"]["world_size"] == 3
    reasons = [g["reason"] for g in rep["gaps"]]
    assert query.NO_RECORD in reasons  # rank 2 of 3 sent nothing
    assert [g["rank"] for g in rep["gaps"] if g.get("rank") is not None] == [2]
    assert any("overrun" in r for r in reasons) and not any("buffer_start" in r for r in reasons)
