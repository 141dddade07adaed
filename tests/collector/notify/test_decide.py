"""The rules of decide.py: when a job has failed, and when its first failure is settled."""

from __future__ import annotations

from firstfault.collector.notify.decide import JobWatch, behind, every_rank_exited, failed_because, observe

S = 10**9


def watch(rows, ranks=(0, 1), now=100 * S):
    w = JobWatch("j", now)
    observe(w, "gpu-1", now, ranks, rows)
    return w


def test_a_traceback_alone_is_not_yet_failed_until_quiet():
    w = watch([("rank.traceback", 1, {})])
    assert failed_because(w, 101 * S, 30 * S) is None
    assert failed_because(w, 130 * S, 30 * S) == "quiet"


def test_every_rank_exited_after_a_failure():
    w = watch([("proc.exit", 1, {"code": -9, "signal": "SIGKILL"})])
    assert failed_because(w, 100 * S, 30 * S) is None  # rank 0 still runs
    observe(w, "gpu-1", 101 * S, [0], [("proc.exit", 0, {"code": -15, "signal": "SIGTERM"})])
    assert failed_because(w, 101 * S, 30 * S) == "ranks-exited"


def test_clean_exits_are_no_failure_and_an_end_mark_decides():
    w = watch([("proc.exit", 0, {"code": 0}), ("proc.exit", 1, {"code": 0})])
    assert w.failure_ns is None and failed_because(w, 500 * S, 30 * S) is None
    w2 = watch([("rank.traceback", 0, {}), ("job.mark", None, {"event": "end"})])
    assert failed_because(w2, 100 * S, 30 * S) == "epilog"
    assert watch([("job.mark", None, {"event": "start"})]).end_ns is None


def test_every_rank_exited_in_a_report():
    assert every_rank_exited({"ranks": {"0": {"exit": {"code": 1}}, "1": {"exit": {"code": -15}}}})
    assert not every_rank_exited({"ranks": {"0": {"exit": {"code": 1}}, "1": {"exit": None}}})
    assert not every_rank_exited({"ranks": {}})


def test_settled_when_every_node_shipped_past_the_failure_plus_uncertainty_and_margin():
    nodes = {"a", "b"}
    first = 100 * S
    unc = {"a": S // 100, "b": S // 2}  # b's clock is known to 0.5 s
    bound = first + S // 2 + 2 * S
    assert behind(nodes, {"a": bound, "b": bound - 1}, first, unc, 2 * S) == ["b"]
    assert behind(nodes, {"a": bound, "b": bound}, first, unc, 2 * S) == []
    assert behind(nodes, {"a": bound}, first, unc, 2 * S) == ["b"]  # b never heard of
