"""The collector's HTTP API, as a stranger would try it: read-only, a token off loopback
(any line of the token file; rotated by SIGHUP), closed to other origins (no CORS, no DNS
rebinding), each tested both ways against a real ``firstfault collector`` process."""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request

import pytest

from firstfault.analysis.catalog import load_catalog
from firstfault.collector.api import Api
from tests.collector.server.ingest_helpers import Agent, CollectorProcess

ROUTES = ("/healthz", "/metrics", "/api/jobs", "/api/jobs/12345/report",
          "/api/jobs/12345/timeline", "/api/jobs/12345/bundle")


def call(port: int, path: str, method: str = "GET", **headers) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _collector(tmp_path, *args, token: str = "") -> CollectorProcess:
    """A collector with job 12345 in it, shipped by a real agent session."""
    col = CollectorProcess(tmp_path / "c.db", *args)
    a = Agent(col.ingest)
    a.hello(token=token)
    a.stream_records(0, batches=1, size=20)
    a.close()
    assert b"12345" in call(col.http[1], "/api/jobs", Authorization=f"Bearer {token}")[2]
    return col


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    col = _collector(tmp_path_factory.mktemp("loopback"))
    yield col.http[1]
    col.stop()


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    d = tmp_path_factory.mktemp("remote")
    (d / "token").write_text("old\n")
    col = _collector(d, "--http", "0.0.0.0:0", "--token-file", str(d / "token"), token="old")
    yield col, d / "token"
    col.stop()


def test_every_route_answers_get_only():
    """Structural: every route of the API answers GET/HEAD only; of the web page's, only the
    paste form and the login form take a POST (same-origin only: test_web.py)."""
    app = Api(None, load_catalog()).app()
    methods = {(r.resource.canonical, r.method) for r in app.router.routes()}
    assert {m for _, m in methods} <= {"GET", "HEAD", "POST"}, methods
    assert {path for path, m in methods if m == "POST"} == {"/paste", "/login"}, methods
    assert all(m in ("GET", "HEAD") for path, m in methods if path.startswith(("/api/", "/metrics", "/healthz")))


def test_writes_are_refused_and_change_nothing(loopback):
    before = call(loopback, "/api/jobs")[2]
    for path in ROUTES:
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            status, headers, _ = call(loopback, path, method)
            assert status == 405, (method, path)
        assert call(loopback, path)[0] == 200, path
    assert call(loopback, "/api/jobs")[2] == before


def test_loopback_needs_no_token_but_a_loopback_host(loopback):
    assert call(loopback, "/api/jobs")[0] == 200
    assert call(loopback, "/api/jobs", Host=f"localhost:{loopback}")[0] == 200
    status, _, body = call(loopback, "/api/jobs", Host=f"attacker.example:{loopback}")
    assert status == 403 and b"loopback names only" in body  # DNS rebinding


def test_other_origins_are_refused_and_no_cors_header_is_ever_sent(loopback):
    ok = call(loopback, "/api/jobs", Origin=f"http://127.0.0.1:{loopback}")
    bad = call(loopback, "/api/jobs", Origin="https://attacker.example")
    preflight = call(loopback, "/api/jobs", "OPTIONS", Origin="https://attacker.example",
                     **{"Access-Control-Request-Method": "GET"})
    assert ok[0] == 200 and bad[0] == 403 and preflight[0] == 403
    assert call(loopback, "/api/jobs", "OPTIONS")[0] == 405
    for status, headers, _ in (ok, bad, preflight):
        assert not any(h.lower().startswith("access-control-") for h in headers), headers
        assert headers["Cross-Origin-Resource-Policy"] == "same-origin"
        assert headers["X-Content-Type-Options"] == "nosniff"


def test_off_loopback_every_request_needs_a_token(remote):
    col, _ = remote
    port = col.http[1]
    for path in ROUTES:
        assert call(port, path)[0] == 401, path
        assert call(port, path, Authorization="Bearer wrong")[0] == 401
        assert call(port, path, Authorization="old")[0] == 401  # no scheme
        assert call(port, path, Authorization="Basic old")[0] == 401
        assert call(port, path, Authorization="Bearer old")[0] == 200, path
    # with a token, a Host that is not loopback is fine (it is reached over the network)
    assert call(port, "/api/jobs", Authorization="Bearer old", Host="head-01:7141")[0] == 200


def test_a_token_is_rotated_by_sighup_without_a_restart(remote):
    col, token = remote
    port = col.http[1]
    token.write_text("old\nnew\n")
    col.proc.send_signal(signal.SIGHUP)
    _settle(lambda: call(port, "/api/jobs", Authorization="Bearer new")[0] == 200)
    assert call(port, "/api/jobs", Authorization="Bearer old")[0] == 200  # both, meanwhile
    token.write_text("new\n")
    col.proc.send_signal(signal.SIGHUP)
    _settle(lambda: call(port, "/api/jobs", Authorization="Bearer old")[0] == 401)
    assert call(port, "/api/jobs", Authorization="Bearer new")[0] == 200
    token.write_text("")  # unreadable as tokens: the ones in use are kept
    col.proc.send_signal(signal.SIGHUP)
    _settle(lambda: any("reload failed, the tokens in use are kept" in ln for ln in col.lines))
    assert call(port, "/api/jobs", Authorization="Bearer new")[0] == 200
    assert col.proc.poll() is None


def test_off_loopback_without_a_token_it_does_not_start(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "firstfault", "collector", "--listen", "127.0.0.1:0",
                        "--http", "0.0.0.0:0", "--db", str(tmp_path / "c.db")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "needs a token" in r.stderr, r.stderr


def _settle(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)

