"""store/shared.py: the rules both backends share (failure, running, belonging) and the lazy merge."""

from firstfault.collector.store.shared import RUNNING_NS, failed_jobs, is_failure, job_status, merge


def test_failure_is_a_traceback_or_a_bad_exit():
    assert is_failure("rank.traceback", {})
    assert is_failure("proc.exit", {"exitcode": 1}) and is_failure("proc.exit", {"returncode": -9})
    assert is_failure("proc.exit", {"signal": "SIGKILL"})
    assert not is_failure("proc.exit", {"exitcode": 0}) and not is_failure("proc.exit", {"exitcode": "1"})
    assert not is_failure("rank.line", {"exitcode": 1})
    kinds = ["rank.line", "proc.exit", "proc.exit", "rank.traceback"]
    fields = [{}, {"exitcode": 0}, {"code": 2}, {}]
    assert failed_jobs(kinds, fields, ["a", "b", "c", "d"]) == {"c", "d"}
    assert failed_jobs(["rank.line"], [{}], ["a"]) == set()


def test_running_then_failed_or_ended():
    assert job_status(100 + RUNNING_NS, 100, True) == "running"
    assert job_status(101 + RUNNING_NS, 100, True) == "failed"
    assert job_status(101 + RUNNING_NS, 100, False) == "ended"


def test_merge_opens_each_scan_only_when_it_is_reached():
    opened = []

    def source(name, items):
        def open_():
            opened.append(name)
            return iter(items)
        return (items[0][0] if items else 0, open_)
    a = [(1, "a"), (4, "a"), (9, "a")]
    b = [(2, "b"), (3, "b"), (10, "b")]
    c = [(5, "c"), (6, "c")]
    merged = merge([source("c", c), source("a", a), source("b", b), source("e", [])])
    assert next(merged) == (1, "a") and opened == ["e", "a"]
    assert next(merged) == (2, "b") and opened == ["e", "a", "b"]
    assert list(merged) == [(3, "b"), (4, "a"), (5, "c"), (6, "c"), (9, "a"), (10, "b")]
    assert opened == ["e", "a", "b", "c"]
    ties = merge([(1, lambda: iter([(1,), (2,), (2,)])), (2, lambda: iter([(2,), (3,)]))])
    assert list(ties) == [(1,), (2,), (2,), (2,), (3,)]
