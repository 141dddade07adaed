"""firstfault/collector/daemon.py: exit codes, a whole run in-process on the FakeStore, and the
real thing as a subprocess on SqliteStore and on PostgreSQL: SIGTERM, and kill -9
mid-stream (slow)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from firstfault.collector import daemon
from firstfault.collector.config import parse_args
from tests.collector.server.ingest_helpers import Agent, ClosedByServer, CollectorProcess, FakeStore, make_records

ROOT = Path(__file__).resolve().parents[3]
def Collector(db: Path) -> CollectorProcess:  # noqa: N802
    return CollectorProcess(db, "--clock-ping-interval-s", "0.5")




def test_usage_and_config_errors(capsys):
    assert daemon.main(["--help"]) == 0
    assert "usage: firstfault collector" in capsys.readouterr().out
    assert daemon.main(["--listen", "0.0.0.0:7140", "--nope"]) == 2
    err = capsys.readouterr().err
    assert "2 problems" in err and "--nope: unknown flag" in err and "token is required" in err


def test_check_config_checks_what_start_needs_and_opens_nothing(tmp_path, capsys):
    db = tmp_path / "c.db"
    assert daemon.main(["--check-config", "--db", str(db), "--listen", "127.0.0.1:0"]) == 0
    out = capsys.readouterr().out
    assert f"db={db}" in out and out.endswith("configuration ok\n")
    assert not db.exists()  # no store opened
    missing = tmp_path / "absent" / "c.db"
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    assert daemon.main(["--check-config", "--db", str(missing), "--tls-cert", str(bad),
                        "--tls-key", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "tls: cannot load cert/key/client_ca" in err and f"the folder {missing.parent} does not exist" in err


def test_a_postgres_store_without_psycopg_is_a_clear_start_error(caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the [postgres] extra were not installed
    assert daemon.main(["--db", "postgres://ff:secret@127.0.0.1:1/ff", "--listen", "127.0.0.1:0",
                        "--http", "127.0.0.1:0"]) == 1
    assert re.search(r"cannot start: cannot open the store db=postgres://ff@127.0.0.1:1/ff: the PostgreSQL "
                     r"store needs psycopg 3: pip install 'firstfault\[postgres\]'", caplog.text)
    assert "secret" not in caplog.text


def test_a_postgres_server_that_is_away_is_a_clear_start_error(caplog):
    pytest.importorskip("psycopg", reason="the [postgres] extra is not installed")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgres://ff:secret@127.0.0.1:{port}/ff"
    assert daemon.main(["--db", url, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"]) == 1
    assert re.search(rf"cannot start: cannot open the store db=postgres://ff@127.0.0.1:{port}/ff: "
                     r".*can not connect to PostgreSQL: .*Connection refused", caplog.text)
    assert "secret" not in caplog.text


def test_run_in_process_until_sigterm(monkeypatch, caplog):
    """The daemon's loop on the FakeStore: serves, prunes, stops on SIGTERM with exit 0."""
    caplog.set_level("INFO")
    store = FakeStore()
    pruned = []
    store.prune = lambda **kw: pruned.append(kw) or 0
    monkeypatch.setattr(daemon, "open_store", lambda db, ingest=False: store)
    cfg, _ = parse_args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--retention-max-age-days", "2",
                      "--retention-max-bytes", "1000000"])
    result: dict = {}

    def agent():
        try:
            deadline = time.monotonic() + 10
            while not (m := re.search(r"ingest listening address=([\d.]+):(\d+)", caplog.text)):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            a = Agent((m.group(1), int(m.group(2))))
            a.hello()
            a.stream_records(0, batches=3, size=10)
            os.kill(os.getpid(), signal.SIGTERM)
            result["error"] = a.expect_error()
            a.close()
        except BaseException as e:
            result["exc"] = e
            os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=agent)
    t.start()
    assert asyncio.run(daemon.run(cfg)) == 0
    t.join(10)
    assert "exc" not in result, result.get("exc")
    assert result["error"].code == "shutdown"
    assert store.seqs("gpu-01", "s1") == list(range(30))
    assert pruned == [{"max_age_s": 2 * 86400, "max_bytes": 1000000}]
    assert "stopping signal=SIGTERM" in caplog.text


def _stored_seqs(db: Path | str, node: str, stream: str) -> list[int]:
    from firstfault.collector.store import open_store
    from firstfault.collector.store.base import Selection

    with open_store(str(db)) as store:
        return [r.seq for r in store.records(Selection(nodes=(node,))) if r.stream == stream]


def test_subprocess_stops_on_sigterm(db):
    c = Collector(db)
    a = Agent(c.address)
    assert a.hello().high_seq is None
    a.stream_records(0, batches=5, size=200)
    time.sleep(0.7)  # a ping or two
    assert c.stop() == 0
    assert a.expect_error().code == "shutdown"
    a.close()
    assert sorted(_stored_seqs(db, "gpu-01", "s1")) == list(range(1000))
    assert any("stopping signal=SIGTERM" in line for line in c.lines)
    c = Collector(db)  # a restart knows where the stream stands
    b = Agent(c.address)
    assert b.hello().high_seq == 999
    b.close()
    assert c.stop() == 0


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    """The --db of a new store: a SQLite file, or a database on the test server."""
    if request.param == "sqlite":
        return tmp_path / "ff.db"
    return request.getfixturevalue("pg_url")


@pytest.mark.slow
def test_kill_9_mid_stream_loses_nothing_acked(db):
    """The agent keeps up to 3 batches unacked; the collector is SIGKILLed while
    batches are in flight, restarted, and the agent resends after high_seq."""
    total, size = 60_000, 500
    acked = -1
    for attempt in range(4):
        c = Collector(db)
        a = Agent(c.address, timeout=20)
        high = a.hello().high_seq
        high = -1 if high is None else high
        assert high >= acked, f"acked up to {acked} but the store has {high}"
        nxt, unacked = high + 1, []
        kill_at = (attempt + 1) * 15_000 if attempt < 3 else None
        try:
            while nxt < total or unacked:
                while nxt < total and len(unacked) < 3:
                    n = min(size, total - nxt)
                    a.send_batch(make_records("gpu-01", "s1", nxt, n))
                    unacked.append(nxt + n - 1)
                    nxt += n
                if kill_at is not None and acked >= kill_at:
                    c.proc.kill()  # three batches sent and not acked
                seq = unacked.pop(0)
                a.wait_ack(seq, timeout=20)
                acked = max(acked, seq)
        except (ClosedByServer, ConnectionError, OSError):
            assert kill_at is not None
        a.close()
        if kill_at is None:
            assert c.stop() == 0
            break
        assert c.proc.wait(20) == -signal.SIGKILL
    seqs = _stored_seqs(db, "gpu-01", "s1")
    assert len(seqs) == len(set(seqs)) == total and sorted(seqs) == list(range(total))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_speaks_sd_notify_ready_after_both_listeners_watchdog_and_stopping(tmp_path):
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    ingest, http = _free_port(), _free_port()
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "200000",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "firstfault", "collector", "--listen", f"127.0.0.1:{ingest}",
                             "--http", f"127.0.0.1:{http}", "--db", str(tmp_path / "ff.db")],
                            cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    try:
        first = notify.recv(4096).decode()
        assert first.startswith("READY=1\nSTATUS=serving ingest on 127.0.0.1:")
        for port in (ingest, http):  # READY came after both listen
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        pings = [notify.recv(4096).decode() for _ in range(2)]
        assert all(p.startswith("WATCHDOG=1\nSTATUS=") and "records stored" in p for p in pings)
        proc.send_signal(signal.SIGTERM)
        while (msg := notify.recv(4096).decode()) != "STOPPING=1":
            assert msg.startswith("WATCHDOG=1")
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
        notify.close()
