"""stacks: real py-spy dumps of real processes with a rank's environment, on a timeout line or a stall."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from firstfault.agent.sources import get
from firstfault.agent.sources.procs import Identity
from firstfault.agent.sources.stacks import StacksSource, find_py_spy
from firstfault.analysis.records import events_from_records
from firstfault.wire import KIND_RANK_STACKS
from tests.agent.sources.conftest import DATA, IS_ROOT

pytestmark = pytest.mark.skipif(not (find_py_spy() and IS_ROOT),
                                reason="needs py-spy (the [stacks] extra) and ptrace rights (root)")
HUNG = """
import time
def forward():
    time.sleep(120)
def main():
    forward()
main()
"""
TIMEOUT_LINE = next(ln for ln in (DATA / "formats" / "torchrun-gloo-timeout-hung-rank.log").read_text().splitlines()
                    if "Timed out waiting" in ln).encode()


@pytest.fixture
def ranks(tmp_path):
    """Two real Python processes that hang in forward(), with the identity procs would give them."""
    procs, ids = [], {}
    script = tmp_path / "hung.py"
    script.write_text(HUNG)
    for r in (0, 1):
        p = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "RANK": str(r)})
        procs.append(p)
        ids[p.pid] = Identity("job-a", r, r, {})
    time.sleep(0.3)  # the interpreter is up and in forward()
    yield ids
    for p in procs:
        p.kill()
        p.wait()


def test_option_checks():
    with pytest.raises(ValueError, match="native = true needs nonblocking = false"):
        StacksSource(native=True)
    with pytest.raises(ValueError, match="stall_s"):
        StacksSource(stall_s=-1)
    with pytest.raises(ValueError, match="absolute"):
        StacksSource(py_spy="py-spy")
    assert get("stacks") is StacksSource


def test_a_timeout_line_captures_every_rank_of_the_job(ranks, sink, running):
    src = StacksSource(ranks=lambda: dict(ranks), stall_s=0)
    with running(src, sink):
        src.watch(("job-a", 0, 0, {}), b"step 3\n" + TIMEOUT_LINE, time.time_ns())
        sink.wait_for(lambda d: len(sink.of(KIND_RANK_STACKS)) == 2, timeout=15)
    got = sorted(sink.of(KIND_RANK_STACKS), key=lambda d: d.rank)
    assert [(d.rank, d.job, d.pid) for d in got] == [(i.rank, "job-a", pid) for pid, i in sorted(
        ranks.items(), key=lambda kv: kv[1].rank)]
    for d in got:
        assert d.fields["tool"] == "py-spy" and d.fields["trigger"] == "timeout"
        assert "Timed out waiting" in d.fields["detail"] and d.message.startswith(f"Process {d.pid}: ")
        assert d.occurred_ns <= d.observed_ns and d.fields["duration_ms"] < 10_000
    # what the collector makes of them: frames, innermost last
    [ev] = events_from_records([got[0].to_record("n", "s", 0)])
    assert [f.func for f in ev.frames][-2:] == ["main", "forward"]


def test_a_stall_captures_once_until_new_lines(ranks, sink, running):
    src = StacksSource(ranks=lambda: dict(ranks), stall_s=0.5, min_interval_s=0)
    with running(src, sink):
        src.watch(("job-a", 0, 0, {}), b"rank 0 step 1 loss 1.0", time.time_ns())
        sink.wait_for(lambda d: len(sink.of(KIND_RANK_STACKS)) == 2, timeout=15)
        time.sleep(1.2)
        assert len(sink.of(KIND_RANK_STACKS)) == 2  # not again without new lines
        src.watch(("job-a", 0, 0, {}), b"rank 0 step 2 loss 1.0", time.time_ns())
        sink.wait_for(lambda d: len(sink.of(KIND_RANK_STACKS)) == 4, timeout=15)
    assert {d.fields["trigger"] for d in sink.of(KIND_RANK_STACKS)} == {"stall"}


def test_captures_are_rate_limited_per_job(ranks, sink):
    src = StacksSource(ranks=lambda: dict(ranks), max_captures_per_job=1)
    assert src.capture("job-a", "timeout", "x", sink) == 2
    assert src.capture("job-a", "timeout", "x", sink) == 0
    assert src.capture("job-a", "stall", "x", sink) == 0
    gaps = sink.of("rank.gap")
    assert [g.fields["reason"] for g in gaps] == ["rate_limited"]  # said once


def test_ranks_of_another_job_are_not_dumped(ranks, sink):
    other = {pid: i._replace(job="4242", env={"TORCHELASTIC_RUN_ID": "run-b", "SLURM_JOB_ID": "4242"})
             for pid, i in ranks.items()}
    src = StacksSource(ranks=lambda: dict(other))
    assert src.capture("job-a", "timeout", "x", sink) == 0  # job 4242's ranks are not job-a's
    assert src.capture("run-b", "timeout", "x", sink) == 2  # a torchrun log names the run id
    src.watch(("run-b", 0, 0, {}), b"x", time.time_ns())
    assert StacksSource(ranks=lambda: dict(other)).capture(None, "timeout", "x", sink) == 2
    src.min_interval_s = 0
    assert src.capture(None, "timeout", "x", sink) == 0  # lines of no job: not ranks a log names


def test_failures_become_gaps_and_never_raise(ranks, sink, tmp_path, running):
    sleeper = subprocess.Popen(["sleep", "30"])  # not a Python process: py-spy fails on it
    try:
        src = StacksSource(ranks=lambda: {sleeper.pid: Identity("job-a", 5, 5, {})})
        assert src.capture("job-a", "timeout", "x", sink) == 0
        [g] = sink.of("rank.gap")
        assert g.fields["reason"] == "py_spy_failed" and g.rank == 5 and g.pid == sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()
    slow = StacksSource(ranks=lambda: dict(ranks), timeout_s=0.001)
    assert slow.capture("job-a", "timeout", "x", sink) == 0
    assert {g.fields["reason"] for g in sink.of("rank.gap")[1:]} == {"timeout"}
    missing = StacksSource(ranks=lambda: dict(ranks), py_spy=str(tmp_path / "no-py-spy"))
    with running(missing, sink):
        sink.wait_for(lambda d: d.kind == "agent.status" and d.fields.get("state") == "degraded")
        missing.watch(("job-a", 0, 0, {}), TIMEOUT_LINE, time.time_ns())
        sink.wait_for(lambda d: d.kind == "rank.gap" and d.fields["reason"] == "py_spy_missing")
