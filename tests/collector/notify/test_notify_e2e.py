"""A real collector process (SQLite, PostgreSQL) tells a real receiver on loopback of a failed job: the records of
a real DeepSpeed job (rank 2 raised) come from two nodes through the ingest; exactly one
signed notice arrives, its rank and checkpoint those of `firstfault report`; /metrics counts
the job. A collector stopped with the notice still pending (receiver down) sends it after
its restart, once."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from tests.analysis.shipped import ship_file
from tests.collector.notify.receiver import Receiver
from tests.collector.server.ingest_helpers import Agent, CollectorProcess

ROOT = Path(__file__).resolve().parents[3]
REAL = ROOT / "tests" / "data" / "real" / "deepspeed-exception-rank2-of-4"
NODES = {"node-a": (0, 1), "node-b": (2, 3)}
SECRET = b"e2e-hmac-key"


def config(tmp_path: Path, url: str) -> Path:
    (tmp_path / "secret").write_bytes(SECRET)
    p = tmp_path / "collector.toml"
    p.write_text(f'''
[notify]
queue_dir = "{tmp_path / 'queue'}"
quiet_s = 1
settle_s = 0.5
backoff_initial_s = 0.5
backoff_max_s = 1
[[notify.target]]
name = "ops"
type = "webhook"
url = "{url}"
secret_file = "{tmp_path / 'secret'}"
''')
    return p


def ship(col: CollectorProcess, job: str) -> None:
    """The real job's rank logs as two nodes' agents send them; each agent then closes."""
    for node, ranks in NODES.items():
        records = []
        for p in sorted((REAL / "logs").glob("*.log")):
            r = int(p.stem.rsplit("rank", 1)[1])
            if r in ranks:
                records += ship_file(p, node, r, len(records))
        records = [type(rec)(**{**{f: getattr(rec, f) for f in rec.__slots__}, "job": job, "stream": "s1"})
                   for rec in records]
        a = Agent(col.ingest, node=node, stream="s1")
        a.hello()
        for i in range(0, len(records), 500):
            a.send_batch(records[i:i + 500])
            a.wait_ack(records[min(i + 500, len(records)) - 1].seq)
        a.close()


def get(col: CollectorProcess, path: str) -> str:
    with urllib.request.urlopen(f"http://{col.http[0]}:{col.http[1]}{path}", timeout=30) as r:
        return r.read().decode()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_one_signed_notice_per_failed_job_matching_its_report(tmp_path, request, backend):
    db = tmp_path / "c.db" if backend == "sqlite" else request.getfixturevalue("postgres").create_database()
    rx = Receiver(secret=SECRET)
    col = CollectorProcess(db, "--config", str(config(tmp_path, rx.url)))
    try:
        t0 = time.monotonic()
        ship(col, "ds-7")
        rx.wait(lambda: rx.delivered(), timeout=30)
        took = time.monotonic() - t0
        time.sleep(2.5)  # nothing more comes: once per job
        (got,) = rx.delivered()
        assert all(r["status"] == 200 for r in rx.requests)  # the signature checked
        rep = json.loads(get(col, "/api/jobs/ds-7/report"))
        assert got["schema"] == "firstfault.notice/1" and got["job"] == "ds-7" and got["revision"] == 1
        assert got["first_failure"]["rank"] == rep["first_failure"]["rank"] == 2
        assert got["first_failure"]["signature"] == rep["first_failure"]["signature"]
        assert got["checkpoint"]["verdict"] == rep["checkpoint"]["verdict"]
        assert got["checkpoint"]["resume_from"] == rep["checkpoint"]["resume_from"]
        assert got["settled"] is True and got["decided_by"] in ("quiet", "launcher-end")
        assert got["report_url"] == f"http://{col.http[0]}:{col.http[1]}/jobs/ds-7"
        assert took < 15, took
        metrics = get(col, "/metrics")
        cat, sig = rep["first_failure"]["category"], rep["first_failure"]["signature"]
        assert f'firstfault_failed_jobs_total{{category="{cat}",signature="{sig}"}} 1' in metrics
        assert "firstfault_last_failure_timestamp_seconds " in metrics
        assert 'firstfault_notices_delivered_total{target="ops"} 1' in metrics
        log = "".join(col.lines)
        assert "notice delivered target=ops type=webhook job='ds-7' revision=1 attempt=1 status=200" in log
        assert rx.url not in log
    finally:
        assert col.stop() == 0
        rx.close()


def test_a_notice_pending_when_the_collector_stops_is_sent_after_its_restart(tmp_path):
    down = Receiver()
    port, url = down.port, down.url
    down.close()  # the receiver is away when the job fails
    cfg = config(tmp_path, url)
    col = CollectorProcess(tmp_path / "c.db", "--config", str(cfg))
    try:
        ship(col, "ds-8")
        deadline = time.monotonic() + 30
        while "notice delivery failed target=ops" not in "".join(col.lines):
            assert time.monotonic() < deadline, "".join(col.lines)
            time.sleep(0.1)
    finally:
        assert col.stop() == 0
    assert len(list((tmp_path / "queue" / "pending").glob("*.json"))) == 1
    rx = Receiver(secret=SECRET, port=port)
    col = CollectorProcess(tmp_path / "c.db", "--config", str(cfg))
    try:
        rx.wait(lambda: rx.delivered(), timeout=30)
        time.sleep(2)
        (got,) = rx.delivered()
        assert got["job"] == "ds-8" and got["first_failure"]["rank"] == 2
        assert "notices pending from before the restart deliveries=1" in "".join(col.lines)
        assert not list((tmp_path / "queue" / "pending").glob("*.json"))
    finally:
        assert col.stop() == 0
        rx.close()


def _records(node: str, job: str, now: int) -> list:
    """Rank 1 raises now; both ranks exit (as the agent's procs source reports them)."""
    from firstfault.wire import Record

    tb = ('Traceback (most recent call last):\n  File "train.py", line 7, in <module>\n    step()\n'
          'ValueError: batch 5: expected 16 features, got 17')
    rows = [("ranklog", "rank.traceback", tb, 1, {}),
            ("procs", "proc.exit", "pid 11 exited: code 1", 1, {"code": 1}),
            ("procs", "proc.exit", "pid 10 exited: signal 15 (SIGTERM)", 0, {"code": -15, "signal": "SIGTERM"})]
    return [Record(node=node, stream="live", seq=i, source=src, kind=kind, message=msg, occurred_ns=now,
                   observed_ns=now, job=job, rank=rank, fields=fields)
            for i, (src, kind, msg, rank, fields) in enumerate(rows)]


@pytest.mark.parametrize("answers_pings", [True, False])
def test_a_connected_agent_settles_the_notice_by_answering_a_ping(tmp_path, answers_pings):
    """The agent stays connected: the collector pings it once past the failure plus the
    margin, and its answer settles the notice; an agent that answers nothing holds the
    notice up to max_wait_s, then it goes unsettled, naming its node."""
    import threading

    rx = Receiver()
    cfg = config(tmp_path, rx.url)
    cfg.write_text(cfg.read_text().replace("quiet_s = 1", "quiet_s = 1\nmax_wait_s = 6"))
    col = CollectorProcess(tmp_path / "c.db", "--config", str(cfg))
    a = Agent(col.ingest, node="gpu-live", stream="live")
    stop = threading.Event()
    try:
        a.hello()
        now = time.time_ns()
        recs = _records("gpu-live", "live-1", now)
        a.send_batch(recs)
        a.wait_ack(recs[-1].seq)

        def answer():  # recv() answers pings
            a.sock.settimeout(0.2)
            while not stop.is_set():
                try:
                    a.recv()
                except (TimeoutError, OSError):
                    pass
        if answers_pings:
            threading.Thread(target=answer, daemon=True).start()
        rx.wait(lambda: rx.delivered(), timeout=30)
        took_s = (time.time_ns() - now) / 1e9
        (got,) = rx.delivered()
        assert got["first_failure"]["rank"] == 1 and got["decided_by"] == "ranks-exited"
        if answers_pings:
            assert got["settled"] is True and got["nodes_behind"] == []
            assert 0.5 + 1.0 <= took_s < 6, took_s  # past settle_s and the agent's flush margin
        else:
            assert got["settled"] is False and got["nodes_behind"] == ["gpu-live"]
            assert took_s >= 6, took_s
    finally:
        stop.set()
        a.close()
        assert col.stop() == 0
        rx.close()
