"""ranklog on the kubelet's container logs (/var/log/pods, the CRI format): partial records
joined, each line's own time and stream, tracebacks per stream, rotation, restarts."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from firstfault.agent.sources.ranklog import RankLines, RanklogSource
from firstfault.agent.tail import Tailer
from firstfault.wire import KIND_RANK_LINE, KIND_RANK_TRACEBACK
from tests.agent.sources.test_ranklog import Rows, committed
from tests.agent.tail.tailmodel import Clock
from tests.common.criwriter import append, records, rotate

UID = "5b1c7a2e-3f4d-4e6a-9b8c-0d1e2f3a4b5c"
T0 = int(datetime(2026, 12, 3, 20, 32, 39, tzinfo=timezone.utc).timestamp()) * 1_000_000_000
TB = [b"[rank3]: Traceback (most recent call last):",
      b'[rank3]:   File "/app/train.py", line 41, in <module>',
      b"[rank3]:     main()",
      b"[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered"]


def pod_log(root: Path, restart: int = 0) -> Path:
    d = root / f"training_llama-worker-3_{UID}" / "pytorch"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{restart}.log"


def drain(t: Tailer, engine: RankLines, path: Path) -> None:
    while True:
        engine.batches(t.poll_batches(str(path)))
        if not t.more(str(path)):
            break


def test_a_pod_log_gives_whole_lines_with_their_time_stream_and_pod(tmp_path):
    log, rows, clock = pod_log(tmp_path), Rows(), Clock()
    long = b"[rank3]: " + b"w" * 20_000  # split by the runtime into two records
    data = (records("stdout", b"[rank3]: step 7 loss 2.31", T0)
            + records("stderr", TB[0], T0 + 10) + records("stderr", TB[1], T0 + 11)
            + records("stdout", b"[rank3]: step 8 loss 2.30", T0 + 12)  # stdout inside the traceback
            + records("stderr", TB[2], T0 + 13) + records("stderr", TB[3], T0 + 14)
            + records("stdout", long, T0 + 20, buf=16384))
    append(log, data)
    with Tailer(None, clock=clock) as t:
        engine = RankLines(t, rows)
        t.add(str(log))
        drain(t, engine, log)
        clock.t += 60
        assert engine.tick() is None
    got = [(r.kind, r.message, r.occurred_ns, r.fields["stream"]) for r in rows.records]
    assert got == [
        (KIND_RANK_LINE, "[rank3]: step 7 loss 2.31", T0, "stdout"),
        (KIND_RANK_TRACEBACK, "\n".join(x.decode() for x in TB), T0 + 10, "stderr"),
        (KIND_RANK_LINE, "[rank3]: step 8 loss 2.30", T0 + 12, "stdout"),
        (KIND_RANK_LINE, long.decode(), T0 + 20, "stdout"),
    ]
    f = rows.records[0].fields
    assert (f["namespace"], f["pod"], f["pod_uid"], f["container"], f["restart"]) == (
        "training", "llama-worker-3", UID, "pytorch", 0)


def test_rotation_as_the_kubelet_does_it_loses_and_repeats_nothing(tmp_path):
    log, rows, clock = pod_log(tmp_path), Rows(), Clock()
    sent = []
    with Tailer(None, clock=clock) as t:
        engine = RankLines(t, rows)
        t.add(str(log))
        for k in range(3):
            for i in range(5):
                line = f"[rank3]: rotation {k} line {i}".encode()
                sent.append(line.decode())
                append(log, records("stdout", line, T0 + k * 100 + i))
            drain(t, engine, log)
            append(log, records("stdout", f"[rank3]: last of file {k}".encode(), T0 + k * 100 + 50))
            sent.append(f"[rank3]: last of file {k}")
            rotate(log, datetime(2026, 12, 3, 20, 40 + k, tzinfo=timezone.utc))  # unread line in it
            drain(t, engine, log)
        clock.t += 60
        engine.tick()
    assert [r.message for r in rows.records] == sent
    names = sorted(p.name for p in log.parent.iterdir())
    assert names == ["0.log", "0.log.20261203-204000.gz", "0.log.20261203-204100.gz", "0.log.20261203-204200"]


def test_a_partial_record_holds_the_commit_and_a_restart_joins_the_line_whole(tmp_path):
    log, state, rows = pod_log(tmp_path), tmp_path / "state.json", Rows()
    whole = b"[rank3]: " + b"z" * 50
    recs = records("stderr", whole, T0, buf=20).split(b"\n")[:-1]  # P P F
    append(log, recs[0] + b"\n" + records("stdout", b"[rank3]: step 1", T0 + 1))
    with Tailer(state) as t:
        engine = RankLines(t, rows, commit_s=0)
        t.add(str(log))
        drain(t, engine, log)
        engine.tick()
        engine.commit()
    assert [r.message for r in rows.records] == ["[rank3]: step 1"]
    assert committed(state, log) == 0  # not past the open line's first record
    append(log, recs[1] + b"\n" + recs[2] + b"\n")
    with Tailer(state) as t:  # the restarted agent
        engine = RankLines(t, rows, commit_s=0)
        t.add(str(log))
        drain(t, engine, log)
        engine.tick()
        engine.commit()
    # the line emitted while the partial was open comes again (at-least-once there); the joined one whole
    assert [r.message for r in rows.records] == ["[rank3]: step 1", "[rank3]: step 1", whole.decode()]
    assert rows.records[-1].occurred_ns == T0
    assert committed(state, log) == log.stat().st_size


def test_pod_dirs_follow_the_kubelet_layout_and_turn_the_source_on(tmp_path):
    from firstfault.agent.config import parse_args
    from firstfault.agent.daemon import build_sources
    cfg, _ = parse_args(["--collector", "127.0.0.1:7140", "--state-dir", str(tmp_path),
                         "--ranklog-pod-dirs", "/var/log/pods", "--kmsg-enabled", "false",
                         "--cgroup-enabled", "false", "--procs-enabled", "false"])
    (src,) = [s for s in build_sources(cfg, create_dirs=True)[0] if s.name == "ranklog"]
    assert isinstance(src, RanklogSource) and src.patterns() == ["/var/log/pods/*_*_*/*/*.log"]


def test_a_pods_logs_get_its_job_and_rank_once_the_pods_source_knows_it(tmp_path):
    from firstfault.agent.sources.pods import PodOwner
    log, rows = pod_log(tmp_path), Rows()
    known: dict[str, PodOwner] = {}
    with Tailer(None) as t:
        engine = RankLines(t, rows, job_label="fallback", pod_owner=known.get)
        t.add(str(log))
        append(log, records("stdout", b"before the pods source polled", T0))
        drain(t, engine, log)
        known[UID] = PodOwner("llama", 3, {"pod_uid": UID})
        append(log, records("stdout", b"after", T0 + 1))
        drain(t, engine, log)
    assert [(r.message, r.job, r.rank) for r in rows.records] == [
        ("before the pods source polled", "fallback", None), ("after", "llama", 3)]
