"""The attacks on a running collector that once worked, each against a real ``firstfault
collector`` process: a request that froze it, bad query values that answered 500."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from firstfault.wire import Record
from tests.collector.server.ingest_helpers import Agent, CollectorProcess

JOB = "12345"
PATHOLOGICAL = "(A%2B)%2B%24x"  # (A+)+$x: exponential for a backtracking regex on a line of A


def get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def collector(tmp_path):
    col = CollectorProcess(tmp_path / "c.db")
    yield col
    col.proc.kill()  # a frozen one would not stop on SIGTERM
    col.proc.wait(30)


def _long_line(col) -> Agent:
    agent = Agent(col.ingest)
    agent.hello()
    agent.send_batch([Record(node="gpu-01", stream="s1", seq=0, source="ranklog", kind="rank.line",
                             message="A" * 65536, observed_ns=time.time_ns(), job=JOB, rank=0)])
    agent.wait_ack(0)
    return agent


def test_a_backtracking_pattern_freezes_nothing(collector):
    """grep is a literal match and queries run off the ingest thread: while the request with
    the pathological pattern runs, /healthz, /api/jobs and ingest answer at once."""
    agent = _long_line(collector)
    port = collector.http[1]
    got: list = []
    query = threading.Thread(target=lambda: got.append(
        get(port, f"/api/jobs/{JOB}/timeline?grep={PATHOLOGICAL}", timeout=60)), daemon=True)
    query.start()
    time.sleep(0.3)
    for path in ("/healthz", "/api/jobs"):
        t0 = time.monotonic()
        status, _ = get(port, path, timeout=5)
        assert status == 200 and time.monotonic() - t0 < 1.0, path
    t0 = time.monotonic()
    agent.stream_records(1, batches=1, size=20)  # acked: ingest goes on
    assert time.monotonic() - t0 < 2.0
    query.join(10)
    assert got and got[0][0] == 200 and json.loads(got[0][1])["records"] == []  # no such text
    status, body = get(port, f"/api/jobs/{JOB}/timeline?grep=AAAA&limit=5")
    assert status == 200 and [r["seq"] for r in json.loads(body)["records"]] == [0]
    agent.close()


@pytest.mark.parametrize("query", [
    "since=" + "9" * 400, "until=" + "9" * 400, "since=9999-12-31T23:59:59Z", "since=0001-01-01T00:00:00Z",
    "rank=99999999999999999999999", "rank=x", "limit=-1", "limit=" + "9" * 30, "since=1.2.3",
    "since=2026-13-01T00:00:00Z", "grep=" + "a" * 2000], ids=lambda q: q[:24])
def test_bad_query_values_answer_400(collector, query):
    _long_line(collector).close()
    status, body = get(collector.http[1], f"/api/jobs/{JOB}/timeline?{query}")
    assert status == 400 and json.loads(body)["error"].startswith("bad query"), (status, body[:200])
    assert not any("Traceback" in line for line in collector.lines)


ROUTES = ("/healthz", "/metrics", "/api/jobs", f"/api/jobs/{JOB}/report", f"/api/jobs/{JOB}/timeline",
          f"/api/jobs/{JOB}/bundle", "/", f"/jobs/{JOB}", "/paste")


def _token_collector(tmp_path, *extra):
    (tmp_path / "token").write_text("s3cret\n")
    col = CollectorProcess(tmp_path / "c.db", "--token-file", str(tmp_path / "token"), *extra)
    agent = Agent(col.ingest)
    agent.hello(token="s3cret")
    agent.stream_records(0, batches=1, size=5)
    agent.close()
    return col


def _status(port, path, token=None, method="GET", data=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=data,
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None


def test_a_configured_token_applies_on_loopback_too(tmp_path):
    """With --token-file and HTTP on 127.0.0.1, every route once answered without the token:
    any local user of a shared head node read every job (and kept pastes)."""
    col = _token_collector(tmp_path)
    try:
        port = col.http[1]
        for path in ROUTES:
            assert _status(port, path) in (401, 303), path  # 303: a page sends a browser to /login
            assert _status(port, path, "s3cret") == 200, path
        form = b"text=Traceback+%28most+recent+call+last%29%3A%0AValueError%3A+x&keep=1"
        assert _status(port, "/paste", method="POST", data=form) == 401
    finally:
        col.stop()


def test_the_operator_can_open_loopback_explicitly(tmp_path):
    col = _token_collector(tmp_path, "--http-open-on-loopback", "true")
    try:
        assert _status(col.http[1], "/api/jobs") == 200
    finally:
        col.stop()
