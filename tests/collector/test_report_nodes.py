"""A job's report lists its nodes, including nodes known only from job marks (Slurm
prolog / `firstfault mark`): a node whose agent marked the job but whose ranks never
logged is listed, with a note, and counts as a gap. Hostlist expansion as Slurm does it."""

from __future__ import annotations

import pytest

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.hostlist import MAX_HOSTS, HostlistError, expand_hostlist
from firstfault.collector import query
from firstfault.collector.store.sqlite import SqliteStore
from firstfault.reports import render
from firstfault.wire import Record

T0 = 1_796_206_319_782_000_000
S = 1_000_000_000


@pytest.mark.parametrize("expr, names", [
    ("gpu-01", ["gpu-01"]),
    ("gpu-[01-04,07],head-01", ["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07", "head-01"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a,b,a", ["a", "b"]),
    ("x[3]-ib", ["x3-ib"]),
    ("", []),
])
def test_expand_hostlist(expr, names):
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("expr, error", [
    ("gpu-[01-04", "not closed"),
    ("gpu-01]", "without"),
    ("gpu-[[1]]", "nested"),
    ("gpu-[4-1]", "reversed range"),
    ("gpu-[a-b]", "bad range"),
    (f"n[0-{MAX_HOSTS}]", "more than"),
    ("a[0-999]b[0-999]", "more than"),
])
def test_expand_hostlist_rejects_bad_lists(expr, error):
    with pytest.raises(HostlistError, match=error):
        expand_hostlist(expr)


def _rec(node: str, seq: int, kind: str, source: str, message: str = "", *, job: str | None = "77",
         rank: int | None = None, fields: dict | None = None) -> Record:
    return Record(node=node, stream="s1", seq=seq, source=source, kind=kind, message=message,
                  occurred_ns=T0 + seq * S, observed_ns=T0 + seq * S, job=job, rank=rank,
                  fields=fields or {})


def _mark(node: str, seq: int, event: str, nodes: str | None) -> Record:
    return _rec(node, seq, "job.mark", "marks", f"job 77 {event}",
                fields={"event": event, "step": None, "nodes": nodes, "uid": 0, "file": "x.json"})


def test_the_report_lists_a_node_that_marked_the_job_but_never_logged(tmp_path):
    lines = ["[2026-12-02 10:11:59,782] [INFO] [logging.py:128:log_dist] [Rank 0] step=10, skipped=0",
             "RuntimeError: CUDA error: an illegal memory access was encountered"]
    with SqliteStore(tmp_path / "ff.db") as store:
        store.insert([
            _mark("gpu-01", 0, "start", "gpu-[01-03]"),
            *[_rec("gpu-01", 1 + i, "rank.line", "ranklog", text, rank=0) for i, text in enumerate(lines)],
            _mark("gpu-02", 0, "start", "gpu-[01-03]"),
            _mark("gpu-02", 5, "end", "gpu-[01-03]"),
            _rec("gpu-09", 0, "job.mark", "marks", fields={"event": "start", "nodes": "gpu-09"}, job="other"),
        ])
        rep = query.report(store, "77", load_catalog())
    assert rep["nodes"] == [
        {"node": "gpu-01", "ranks": [0], "marked": ["start"], "note": None},
        {"node": "gpu-02", "ranks": [], "marked": ["end", "start"],
         "note": "its agent marked the job (end, start) but sent no records of the job"},
        {"node": "gpu-03", "ranks": [], "marked": [],
         "note": "in the job's node list (mark from gpu-01) but its agent sent no records of the job"},
    ]
    assert rep["partial"]
    assert [g for g in rep["gaps"] if "node" in g] == [
        {"node": n["node"], "reason": n["note"]} for n in rep["nodes"][1:]]
    text = render(rep, "text")
    assert "Nodes (3): gpu-01 (ranks 0), gpu-02 (sent nothing), gpu-03 (sent nothing)" in text
    assert "gpu-03: in the job's node list (mark from gpu-01)" in text
    assert "**Nodes (3):** gpu-01 (ranks 0), gpu-02 (sent nothing)" in render(rep, "md")


def test_a_bad_node_list_in_a_mark_is_a_gap_not_a_failure(tmp_path):
    with SqliteStore(tmp_path / "ff.db") as store:
        store.insert([_mark("gpu-01", 0, "start", "gpu-[01-")])
        rep = query.report(store, "77", load_catalog())
    assert rep["nodes"] == [{"node": "gpu-01", "ranks": [], "marked": ["start"],
                             "note": "its agent marked the job (start) but sent no records of the job"}]
    assert {"node": "gpu-01", "source": "marks",
            "reason": "node list of its job mark unreadable: '[' not closed in 'gpu-[01-'"} in rep["gaps"]
