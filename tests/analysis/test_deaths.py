"""analysis/deaths.py: a rank the agent saw die by a signal before its peers failed is the first
failure, with the signal and its meaning; an abort after a collective timeout stays a cascade."""

from __future__ import annotations

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.records import events_from_records
from firstfault.analysis.report import Inputs, build_report
from firstfault.wire import Record

T0 = 1_796_206_319_782_000_000
S = 1_000_000_000
# gloo's peer error as FORMATS.md gives its shape
RESET = ("Traceback (most recent call last):\n  File \"/w/train.py\", line 30, in <module>\n"
         "    dist.all_reduce(loss)\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
         "[127.0.0.1]:7889: Connection reset by peer")
TIMEOUT = ("Traceback (most recent call last):\n  File \"/w/train.py\", line 30, in <module>\n"
           "    dist.all_reduce(loss)\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
           "Timed out waiting 15000ms for recv operation to complete")


def rec(seq, kind, source, message="", *, rank, pid=None, fields=None, at):
    return Record(node="n1", stream="s", seq=seq, source=source, kind=kind, message=message, occurred_ns=at,
                  observed_ns=at, job="j", rank=rank, pid=pid, fields=fields or {})


def _report(records):
    return build_report(events_from_records(records), load_catalog(), Inputs(job="j"))


def _job(first_error: str, death_at: int) -> list[Record]:
    return [
        rec(1, "proc.start", "procs", rank=0, pid=100, fields={"world_size": "2"}, at=T0),
        rec(2, "proc.start", "procs", rank=1, pid=101, fields={"world_size": "2"}, at=T0),
        rec(3, "rank.line", "ranklog", "rank 0 step 1 loss 2.3", rank=0, at=T0 + S),
        rec(4, "rank.line", "ranklog", "rank 1 step 1 loss 2.3", rank=1, at=T0 + S),
        rec(5, "proc.exit", "procs", rank=1, pid=101, fields={"code": -6, "signal": "SIGABRT"}, at=death_at),
        rec(6, "rank.traceback", "ranklog", first_error, rank=0, at=T0 + 6 * S),
        rec(7, "proc.exit", "procs", rank=0, pid=100, fields={"code": 1, "signal": None}, at=T0 + 7 * S),
    ]


def test_an_abort_before_its_peers_error_is_the_failure_not_a_hang():
    rep = _report(_job(RESET, T0 + 5 * S))
    ff = rep["first_failure"]
    assert (ff["rank"], ff["signature"], ff["inferred"]) == (1, "agent.rank_signal", False)
    assert "SIGABRT" in ff["summary"] and "aborted itself" in ff["summary"]
    assert rep["ranks"]["1"]["exit"] == {"code": -6, "signal": "SIGABRT"}
    assert rep["ranks"]["0"]["first_error"]["role"] == "cascade"


def test_an_abort_after_a_collective_timeout_is_a_cascade():
    rep = _report(_job(TIMEOUT, T0 + 8 * S))  # rank 0 timed out waiting for rank 1, which aborted after
    ff = rep["first_failure"]
    assert (ff["rank"], ff["signature"], ff["inferred"]) == (1, "hang.stopped_first", True)
    fe = rep["ranks"]["1"]["first_error"]
    assert (fe["signature"], fe["role"]) == ("agent.rank_signal", "cascade")


def _three_ranks() -> list[Record]:
    """Rank 0 fails with an error of its own and exits 1; ranks 1 and 2 die by SIGSEGV as the
    launcher tears the job down."""
    recs = [rec(i + 1, "proc.start", "procs", rank=r, pid=100 + r, fields={"world_size": "3"}, at=T0)
            for i, r in enumerate(range(3))]
    recs += [
        rec(10, "rank.traceback", "ranklog", RESET.replace("RuntimeError: [../third_party/gloo/gloo/transport/tcp/"
                                                           "pair.cc:537] Read error [127.0.0.1]:7889: Connection "
                                                           "reset by peer", "ValueError: bad batch shape (3, 7)"),
            rank=0, at=T0 + 2 * S),
        rec(11, "proc.exit", "procs", rank=0, pid=100, fields={"code": 1, "signal": None}, at=T0 + 3 * S),
        rec(12, "proc.exit", "procs", rank=1, pid=101, fields={"code": -11, "signal": "SIGSEGV"}, at=T0 + 4 * S),
    ]
    recs.append(rec(14, "proc.exit", "procs", rank=2, pid=102, fields={"code": -11, "signal": "SIGSEGV"},
                    at=T0 + 5 * S))
    return recs


def test_a_death_after_a_peer_exited_with_a_failure_is_the_teardown():
    rep = _report(_three_ranks())
    ff = rep["first_failure"]
    assert (ff["rank"], ff["category"]) == (0, "user-code")
    fe = rep["ranks"]["1"]["first_error"]
    assert (fe["signature"], fe["role"]) == ("agent.rank_signal", "cascade")
    assert rep["ranks"]["1"]["exit"] == {"code": -11, "signal": "SIGSEGV"}
    assert [g["signature"] for g in rep["distinct_failures"]] == ["python.exception"]



def test_a_death_after_the_ranks_own_error_is_how_it_ended():
    # rank 1 raised (a collective timeout) and then died by SIGSEGV; no peer had exited yet
    recs = [rec(1, "proc.start", "procs", rank=r, pid=100 + r, fields={"world_size": "2"}, at=T0) for r in (0, 1)]
    recs += [rec(3, "rank.traceback", "ranklog", TIMEOUT, rank=1, at=T0 + 2 * S),
             rec(4, "proc.exit", "procs", rank=1, pid=101, fields={"code": -11, "signal": "SIGSEGV"}, at=T0 + 3 * S)]
    rep = _report(recs)
    assert not any(g["signature"] == "agent.rank_signal" for g in rep["distinct_failures"])
    assert rep["first_failure"]["signature"] != "agent.rank_signal"
    # the same death with no error before it is the failure
    rep = _report([r for r in recs if r.kind != "rank.traceback"])
    assert (rep["first_failure"]["signature"], rep["first_failure"]["rank"]) == ("agent.rank_signal", 1)


def untimed(seq, kind, source, message, *, rank, observed):
    """A record whose line carried no time of its own: only when the agent read it."""
    return Record(node="n1", stream="s", seq=seq, source=source, kind=kind, message=message, occurred_ns=None,
                  observed_ns=observed, job="j", rank=rank, pid=None, fields={})


VALUE_ERROR = RESET.replace("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                            "[127.0.0.1]:7889: Connection reset by peer", "ValueError: bad batch shape (3, 7)")


def test_a_death_after_an_untimed_error_of_its_own_is_how_it_ended():
    # rank 1's traceback came without a time (a rank log's traceback lines carry none), then the
    # launcher SIGKILLed it: a dead process prints nothing, so the error came first
    recs = [rec(1, "proc.start", "procs", rank=r, pid=100 + r, fields={"world_size": "2"}, at=T0) for r in (0, 1)]
    recs += [untimed(3, "rank.traceback", "ranklog", VALUE_ERROR, rank=1, observed=T0 + 41 * S),
             rec(4, "proc.exit", "procs", rank=1, pid=101, fields={"code": -9, "signal": "SIGKILL"}, at=T0 + 40 * S)]
    rep = _report(recs)
    assert (rep["first_failure"]["rank"], rep["first_failure"]["category"]) == (1, "user-code")
    assert rep["ranks"]["1"]["first_error"]["signature"] != "agent.rank_signal"


DS_KILL = "[2026-12-05 01:58:12,004] [INFO] [launch.py:319:sigkill_handler] Killing subprocess {pid}"


def test_a_death_its_launcher_said_it_was_causing_is_the_teardown():
    # the DeepSpeed launcher stops rank 0 (pid 100) after rank 1 failed; the agent missed rank 1's exit
    # (its launcher reaped it first) and rank 1's error carries no time
    recs = [rec(1, "proc.start", "procs", rank=r, pid=100 + r, fields={"world_size": "2"}, at=T0) for r in (0, 1)]
    recs += [untimed(3, "rank.traceback", "ranklog", VALUE_ERROR, rank=1, observed=T0 + 41 * S),
             rec(4, "rank.line", "ranklog", DS_KILL.format(pid=100), rank=None, at=T0 + 9 * S),
             rec(5, "proc.exit", "procs", rank=0, pid=100, fields={"code": -9, "signal": "SIGKILL"}, at=T0 + 40 * S)]
    rep = _report(recs)
    assert (rep["first_failure"]["rank"], rep["first_failure"]["category"]) == (1, "user-code")
    fe = rep["ranks"]["0"]["first_error"]
    assert (fe["signature"], fe["role"]) == ("agent.rank_signal", "cascade")
    # not-example: the launcher named another pid: rank 0's SIGKILL stays a failure of its own
    other = [r if r.seq != 4 else rec(4, "rank.line", "ranklog", DS_KILL.format(pid=777), rank=None, at=T0 + 9 * S)
             for r in recs]
    fe = _report(other)["ranks"]["0"]["first_error"]
    assert (fe["signature"], fe["role"]) == ("agent.rank_signal", "root")
