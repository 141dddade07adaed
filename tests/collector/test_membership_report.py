"""A job's report and timeline over a shared node hold only the job's own processes and
kernel events: not a process that shared RANK (before the job, or of no job), not a
helper that inherited it, not another job's OOM kill nor the kernel's boot log; exits
come from the rank process's own exit record."""

from __future__ import annotations

import json

from firstfault.analysis.catalog import load_catalog
from firstfault.cli import main
from firstfault.collector import query
from firstfault.collector.store.base import Selection
from firstfault.collector.store.sqlite import SqliteStore
from firstfault.wire import Record

T0 = 1_796_206_319_782_000_000
S = 1_000_000_000
NODE = "gpu-01"
OTHER_OOM = ("Memory cgroup out of memory: Killed process 555 (python3) total-vm:2000000kB, anon-rss:900000kB, "
             "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:2000kB oom_score_adj:0")


def rec(seq: int, kind: str, source: str, message: str = "", *, job: str | None = "77", rank: int | None = None,
        pid: int | None = None, at: int, fields: dict | None = None, severity: int = 6) -> Record:
    return Record(node=NODE, stream="s", seq=seq, source=source, kind=kind, message=message, occurred_ns=at,
                  observed_ns=at, job=job, rank=rank, pid=pid, severity=severity, fields=fields or {})


def _records() -> list[Record]:
    seq = iter(range(1, 1000))

    def proc(kind, rank, pid, at, job="77", **fields):
        return rec(next(seq), kind, "procs", "", job=job, rank=rank, pid=pid, at=at, fields=fields)

    def line(rank, text, at, kind="rank.line"):
        return rec(next(seq), kind, "ranklog", text, rank=rank, at=at, fields={"path": f"/logs/77/rank{rank}.log"})

    tb = ("Traceback (most recent call last):\n  File \"/work/train.py\", line 12, in <module>\n"
          "    loss.backward()\nRuntimeError: boom at step 5")
    return [
        rec(next(seq), "kernel.line", "kmsg", "Linux version 6.18.0 (boot)", job=None, at=T0 - 300 * S),
        # a process the job label named, with RANK=0 WORLD_SIZE=8, that ended before the job began
        proc("proc.start", 0, 90, T0 - 200 * S, world_size="8", start_ns=T0 - 200 * S),
        proc("proc.exit", 0, 90, T0 - 150 * S, code=0, signal=None, start_ns=T0 - 200 * S),
        proc("proc.start", 0, 100, T0, world_size="2", start_ns=T0, cgroup="/job77"),
        proc("proc.start", 1, 101, T0, world_size="2", start_ns=T0, cgroup="/job77"),
        # a process of no job with RANK=0 WORLD_SIZE=8, running meanwhile
        proc("proc.start", 0, 91, T0 + 1 * S, job=None, world_size="8", start_ns=T0 + S),
        line(0, "rank 0 step 1 loss 2.3", T0 + 2 * S),
        line(1, "rank 1 step 1 loss 2.3", T0 + 2 * S),
        # an old agent took rank 1's compile worker (it inherited RANK) for a rank: it ended 0
        proc("proc.start", 1, 150, T0 + 3 * S, world_size="2", start_ns=T0 + 3 * S),
        proc("proc.exit", 1, 150, T0 + 4 * S, code=0, signal=None, start_ns=T0 + 3 * S),
        rec(next(seq), "kernel.line", "kmsg", OTHER_OOM, job=None, at=T0 + 5 * S, severity=3),
        line(1, tb, T0 + 6 * S, kind="rank.traceback"),
        proc("proc.exit", 1, 101, T0 + 7 * S, code=1, signal=None, start_ns=T0),
        proc("proc.exit", 0, 100, T0 + 8 * S, code=-15, signal="SIGTERM", start_ns=T0),
        proc("proc.exit", 0, 91, T0 + 9 * S, job=None, code=0, signal=None, start_ns=T0 + S),
    ]


def test_report_holds_only_the_jobs_ranks_exits_and_events(tmp_path):
    with SqliteStore(tmp_path / "f.db") as store:
        store.insert(_records())
        rep = query.report(store, "77", load_catalog())
    assert rep["context"]["world_size"] == 2
    assert sorted(rep["ranks"]) == ["0", "1"]
    assert not [g for g in rep["gaps"] if g.get("rank") is not None]  # no phantom ranks 2..7
    assert rep["ranks"]["0"]["exit"] == {"code": -15, "signal": "SIGTERM"}
    assert rep["ranks"]["1"]["exit"] == {"code": 1, "signal": None}
    ff = rep["first_failure"]
    assert ff["rank"] == 1 and "555" not in json.dumps(ff) and "555" not in json.dumps(rep["distinct_failures"])
    ctx = rep["node_context"]
    assert ctx["count"] == 1 and [e["text"] for e in ctx["events"]] == [OTHER_OOM]


def test_timeline_defaults_to_the_jobs_records(tmp_path, capsys):
    db = tmp_path / "f.db"
    with SqliteStore(db) as store:
        store.insert(_records())
        own = list(query.timeline(store, Selection(job="77")))
        more = list(query.timeline(store, Selection(job="77"), context=True))
        two = list(query.timeline(store, Selection(job="77", limit=2)))
        marked = list(query.timeline(store, Selection(job="77"), catalog=load_catalog()))  # learnt from marks
    pids = {r["pid"] for r in own if r["source"] == "procs"}
    assert pids == {100, 101, 150} and not [r for r in own if r["source"] == "kmsg"]
    [extra] = [r for r in more if r not in own]
    assert extra["message"] == OTHER_OOM and extra["node_context"] is True
    assert not [r for r in more if "boot" in r["message"]]  # outside the job's lifetime
    assert two == own[:2] and marked == own
    assert main(["timeline", "77", "--db", str(db), "--node-context"]) == 0
    out = capsys.readouterr().out
    assert "Killed process 555" in out and "boot" not in out and "pid 90" not in out
