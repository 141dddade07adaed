"""Back-to-back jobs share a node's kernel log: a job's report never blames an OOM kill of
another job's process that came before its own processes started. The kernel lines are the
real memcg OOM capture (tests/data/kernel/memcg-oom.kmsg, read by the agent's kmsg code); the
process records are what the agent's procs source sends."""

from __future__ import annotations

from pathlib import Path

from firstfault.agent.clock import BootWall
from firstfault.agent.sources.kmsg import KmsgStream
from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.records import events_from_records
from firstfault.analysis.report import Inputs, build_report
from firstfault.wire import Record

KMSG = Path(__file__).resolve().parents[1] / "data" / "kernel" / "memcg-oom.kmsg"
T0 = 1_796_221_000_000_000_000
S = 10**9
NODE, JOB = "vm", "job-b"


def oom_kill(pid: int, at_ns: int, seq: int) -> list[Record]:
    """The real 'Killed process' line of the capture, as the kmsg source ships it, with the
    pid replaced and stamped at ``at_ns``."""
    raw = next(ln for ln in KMSG.read_bytes().splitlines(True) if b"Killed process" in ln)
    raw = raw.replace(b"Killed process 8333 ", f"Killed process {pid} ".encode())
    usec = int(raw.split(b",")[2])
    boot = BootWall(ns=at_ns - usec * 1000, error_ns=50, at_boottime_ns=usec * 1000)
    stream = KmsgStream("boot-1", last_seq=int(raw.split(b",")[1]) - 1)
    return [d.to_record(NODE, "k", seq) for d in stream.feed(raw, boot, observed_ns=at_ns + 10**6)]


def proc(kind: str, rank: int, pid: int, at_ns: int, seq: int, **fields) -> Record:
    return Record(node=NODE, stream="a", seq=seq, source="procs", kind=kind, message="",
                  occurred_ns=at_ns, observed_ns=at_ns, job=JOB, rank=rank, local_rank=rank,
                  pid=pid, fields=fields)


def report(records: list[Record]) -> dict:
    records.sort(key=lambda r: r.occurred_ns or r.observed_ns)
    return build_report(events_from_records(records), load_catalog(),
                        Inputs(job=JOB, gaps=[], clocks={}, generated_ns=T0, rank_nodes={}))


def test_an_earlier_jobs_oom_kill_is_context_and_this_jobs_own_is_the_failure():
    records = [
        *oom_kill(4000, T0 - 20 * S, 1),  # job-a's rank, before job-b started
        proc("proc.start", 0, 5000, T0, 1), proc("proc.start", 1, 5001, T0 + S // 10, 2),
        *oom_kill(5001, T0 + 30 * S, 2),
        proc("proc.exit", 1, 5001, T0 + 30 * S + 5 * 10**6, 3, code=-9, signal="SIGKILL"),
    ]
    first = report(records)["first_failure"]
    assert first["rank"] == 1 and first["signature"] == "kernel.memcg_oom_kill"
    assert "Killed process 5001" in first["evidence"][0]["text"]


def test_without_its_own_kill_the_job_does_not_inherit_the_earlier_one():
    records = [
        *oom_kill(4000, T0 - 20 * S, 1),
        proc("proc.start", 0, 5000, T0, 1),
        proc("proc.exit", 0, 5000, T0 + 60 * S, 2, code=1),
    ]
    first = report(records)["first_failure"]
    assert first is None or first["signature"] != "kernel.memcg_oom_kill"


def test_a_kill_after_the_job_started_of_a_pid_it_does_not_know_still_counts():
    # a rank's DataLoader worker is no rank itself: the kill of its pid is still this job's
    records = [
        proc("proc.start", 0, 5000, T0, 1),
        *oom_kill(5077, T0 + 30 * S, 1),
        proc("proc.exit", 0, 5000, T0 + 31 * S, 2, code=-9, signal="SIGKILL"),
    ]
    first = report(records)["first_failure"]
    assert first["signature"] == "kernel.memcg_oom_kill"


def test_an_earlier_xid_of_another_jobs_pid_is_context_too():
    xid = next(ln for ln in (KMSG.parent / "nvrm.kmsg").read_bytes().splitlines(True) if b"): 79, " in ln)
    usec = int(xid.split(b",")[2])
    at = T0 - 60 * S
    boot = BootWall(ns=at - usec * 1000, error_ns=50, at_boottime_ns=usec * 1000)
    stream = KmsgStream("boot-1", last_seq=int(xid.split(b",")[1]) - 1)
    records = [d.to_record(NODE, "k", 9) for d in stream.feed(xid, boot, observed_ns=at + 10**6)]
    records += [proc("proc.start", 0, 5000, T0, 1), proc("proc.start", 1, 5001, T0, 2),
                *oom_kill(5001, T0 + 30 * S, 2),
                proc("proc.exit", 1, 5001, T0 + 30 * S + 5 * 10**6, 3, code=-9, signal="SIGKILL")]
    first = report(records)["first_failure"]
    assert first["rank"] == 1 and first["signature"] == "kernel.memcg_oom_kill"
