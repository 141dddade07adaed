"""Fuzzing the HTTP API of a real ``firstfault collector`` while a good agent ships to it
and a prober times ``/healthz``.

Used by tests/collector/test_http_fuzz.py (a short run, in CI) and bench/fuzz_http.py (the
long run of bench/RESULTS.md). ``run(work, seconds=S, workers=W, seed=N)``:

- the collector (SQLite, HTTP on loopback, no token) holding job ``12345``: lines, a
  traceback, a 64 KiB line of ``A`` (the catastrophic-regex bait), and a job whose id climbs
  out of folders;
- first the prober alone for a few seconds (``healthz_calm``: this machine's own noise);
- ``workers`` attacker processes for ``seconds``: each request is one route (every route of
  api.py and web.py) with every one of its parameters drawn at random from a hostile corpus
  (backtracking patterns, 400-digit numbers, bad times, NULs, traversal, 5,000-character
  strings, unknown parameters, repeated ones), a random method now and then, a foreign
  ``Origin`` or ``Host`` now and then; ``/paste`` gets many gzip parts, gzip bombs, too many
  parts, bodies that lie about their length; one request in twenty is raw bytes that are not
  HTTP at all;
- a prober sends ``GET /healthz`` every 20 ms on its own connection and times it; a good
  agent sends a batch of 50 records every 100 ms and waits for each ack;
- figures (a dict): requests sent by route and by status, answers 5xx (a bug: must be 0),
  connection errors, /healthz latency calm and attacked (count, p50, p99, max, failures), the agent's
  batches, acks and slowest ack, tracebacks in the collector's log, its peak RSS, and
  whether it is alive and answers afterwards.
"""

from __future__ import annotations

import gzip
import http.client
import json
import multiprocessing
import random
import socket
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path

from firstfault.wire import Record
from tests.collector.server.ingest_helpers import Agent, CollectorProcess, make_records

JOB = "12345"
HOSTILE_JOB = "x/../../../../tmp/ff-fuzz-evil"
JOBS = (JOB, HOSTILE_JOB, "nope", "", "..", "%2e%2e", "a" * 3000, "\x00", "☃", "<script>", "%ff")
VALUES = (
    "", "0", "1", "-1", "9" * 400, "1e999", "nan", "inf", "-0", "0x10", " 1", "1,2,,3", ",,,", "1.2.3",
    "(A+)+$x", "(a|aa)*c", "^(\\w+\\s?)*$", "[", "\\", "*", "%", "%00", "\x00", "\r\n", "../../etc/passwd",
    "a" * 5000, "A" * 1000, "2026-13-45T99:99:99Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z",
    "2026-12-02T10:00:00", "2026-12-02T10:00:00+25:00", "☃", "<script>alert(1)</script>",
    "'; DROP TABLE records; --", "json", "jsonl", "html", "md", "text", "xml", "1" * 30, "Traceback",
    "%ff%fe", "true", "null")
ROUTES = {  # path template -> its parameters
    "/healthz": (), "/metrics": (), "/api/jobs": (),
    "/api/jobs/{job}/report": ("format", "timeline"),
    "/api/jobs/{job}/timeline": ("rank", "node", "since", "until", "grep", "limit", "format"),
    "/api/jobs/{job}/bundle": (),
    "/": ("q",), "/jobs/{job}": (), "/paste": (), "/login": (),
}
METHODS = ("GET", "GET", "GET", "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "FOO")
HEALTH_EVERY_S = 0.02


def _seed_store(col: CollectorProcess) -> None:
    agent = Agent(col.ingest, node="gpu-01", stream="seed")
    agent.hello()
    now = time.time_ns()
    recs = make_records("gpu-01", "seed", 0, 200)
    recs.append(Record(node="gpu-01", stream="seed", seq=200, source="ranklog", kind="rank.line",
                       message="A" * 65536, observed_ns=now, occurred_ns=1796206319782000000 + 200,
                       job=JOB, rank=0))
    recs.append(Record(node="gpu-01", stream="seed", seq=201, source="ranklog", kind="rank.traceback",
                       message="Traceback (most recent call last):\n  File \"/job/train.py\", line 8, in <module>\n"
                               "    token = self.tokenizer(batch[\"text\"])\nValueError: token=50257 is out of range",
                       observed_ns=now, occurred_ns=1796206319782000000 + 201, job=JOB, rank=1))
    recs.append(Record(node="gpu-01", stream="seed", seq=202, source="ranklog", kind="rank.line",
                       message="hostile job", observed_ns=now, job=HOSTILE_JOB, rank=0))
    agent.send_batch(recs)
    agent.wait_ack(202)
    agent.close()


def _query(rnd: random.Random, params: tuple[str, ...]) -> str:
    pairs = [(p, rnd.choice(VALUES)) for p in params if rnd.random() < 0.6]
    if rnd.random() < 0.1:
        pairs.append((rnd.choice(VALUES)[:40] or "x", rnd.choice(VALUES)))  # unknown
    if pairs and rnd.random() < 0.1:
        pairs.append(pairs[0])  # repeated
    return urllib.parse.urlencode(pairs, errors="surrogatepass") if pairs else ""


_BOMB = gzip.compress(b"\0" * (64 << 20), 1)  # 64 KiB that inflate to 64 MiB
_PART = gzip.compress(b"z" * (3 << 20), 1)  # 3 MiB inflated, under the limit alone


def _paste_body(rnd: random.Random) -> tuple[bytes, str]:
    """(body, content type) of a hostile /paste."""
    kind = rnd.randrange(6)
    if kind == 0:  # raw gzip bomb
        return _BOMB, "application/gzip"
    if kind == 1:  # a real small log
        return b"Traceback (most recent call last):\nValueError: x\n", "text/plain"
    if kind == 2:
        return urllib.parse.urlencode({"text": "y" * rnd.randrange(10, 40000), "tz": rnd.choice(VALUES)[:50],
                                       "keep": rnd.choice(("", "1"))}).encode(), \
            "application/x-www-form-urlencoded"
    boundary = "ffz" + str(rnd.randrange(1 << 30))
    parts = []
    n = rnd.choice((1, 3, 16, 17, 40)) if kind != 5 else 16
    part = _PART if kind in (3, 5) else b"Traceback (most recent call last):\n"
    for i in range(n):
        name = rnd.choice(("file", "text", "tz", "keep", "x" * 300))
        parts.append(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"l.gz\"\r\n"
                     f"Content-Type: application/octet-stream\r\n\r\n".encode() + part + b"\r\n")
    body = b"".join(parts) + (f"--{boundary}--\r\n".encode() if kind != 4 else b"")  # 4: no end
    return body, f"multipart/form-data; boundary={boundary}"


class _Attacker(threading.Thread):
    def __init__(self, port: int, seed: int, until: float) -> None:
        super().__init__(daemon=True)
        self.port, self.rnd, self.until = port, random.Random(seed), until
        self.by_route: Counter = Counter()
        self.by_status: Counter = Counter()
        self.server_errors: list[str] = []
        self.conn_errors = 0
        self.failed: str | None = None

    def run(self) -> None:
        while time.monotonic() < self.until:
            try:
                self._one()
            except (OSError, http.client.HTTPException):
                self.conn_errors += 1
            except Exception as e:  # the attacker's own bug: named in the figures
                self.failed = f"{type(e).__name__}: {e}"[:300]
                return

    def _one(self) -> None:
        rnd = self.rnd
        if rnd.random() < 0.05:  # not HTTP at all
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                s.sendall(rnd.choice((b"\x16\x03\x01\x02\x00", b"GET / HTTP/9.9\r\n\r\n", b"\0" * 70000,
                                      b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
                                      b"POST /paste HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999999\r\n\r\nab")))
                s.settimeout(2)
                try:
                    s.recv(4096)
                except OSError:
                    pass
            self.by_route["raw"] += 1
            return
        template = rnd.choice(list(ROUTES))
        job = rnd.choice(JOBS)
        path = template.replace("{job}", urllib.parse.quote(job, safe="", errors="surrogatepass"))
        q = _query(rnd, ROUTES[template])
        method = "POST" if template in ("/paste", "/login") and rnd.random() < 0.7 else rnd.choice(METHODS)
        headers = {"Host": f"127.0.0.1:{self.port}"}
        if rnd.random() < 0.05:
            headers["Origin"] = "http://evil.example"
        if rnd.random() < 0.05:
            headers["Host"] = rnd.choice(("evil.example", "", "a" * 300, "127.0.0.1:1"))
        if rnd.random() < 0.05:
            value = rnd.choice(VALUES)[:100].replace("\r", "").replace("\n", "")
            headers["Authorization"] = "Bearer " + value.encode("utf-8", "replace").decode("latin-1")
        body = None
        if method == "POST" and template == "/paste":
            body, headers["Content-Type"] = _paste_body(rnd)
        elif method == "POST":
            body, headers["Content-Type"] = (urllib.parse.urlencode({"token": rnd.choice(VALUES)[:200]}).encode(),
                                             "application/x-www-form-urlencoded")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path + ("?" + q if q else ""), body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
        finally:
            conn.close()
        self.by_route[template] += 1
        self.by_status[resp.status] += 1
        if resp.status >= 500:
            self.server_errors.append(f"{resp.status} {method} {path[:80]}?{q[:120]}")


def _attack(port: int, seed: int, until: float, results) -> None:
    """One attacker process: requests until ``until``, then its counts on ``results``."""
    a = _Attacker(port, seed, until)
    try:
        a.run()
    finally:
        results.put({"by_route": dict(a.by_route), "by_status": dict(a.by_status),
                     "server_errors": a.server_errors[:20], "conn_errors": a.conn_errors,
                     "failed": a.failed})


class _Prober(threading.Thread):
    def __init__(self, port: int, until: float) -> None:
        super().__init__(daemon=True)
        self.port, self.until = port, until
        self.ms: list[float] = []
        self.failures = 0

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        while time.monotonic() < self.until:
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/healthz")
                r = conn.getresponse()
                r.read()
                if r.status != 200:
                    self.failures += 1
                self.ms.append((time.perf_counter() - t0) * 1000)
            except (OSError, http.client.HTTPException):
                self.failures += 1
                self.ms.append((time.perf_counter() - t0) * 1000)
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            time.sleep(max(0.0, HEALTH_EVERY_S - (time.perf_counter() - t0)))
        conn.close()


class _GoodAgent(threading.Thread):
    def __init__(self, address, until: float) -> None:
        super().__init__(daemon=True)
        self.address, self.until = address, until
        self.batches = self.acked = 0
        self.slowest_ack_ms = 0.0
        self.error: str | None = None

    def run(self) -> None:
        try:
            a = Agent(self.address, node="gpu-02", stream="good")
            a.hello()
            seq = 0
            while time.monotonic() < self.until:
                t0 = time.perf_counter()
                a.send_batch(make_records("gpu-02", "good", seq, 50))
                self.batches += 1
                a.wait_ack(seq + 49, timeout=30)
                self.acked += 1
                self.slowest_ack_ms = max(self.slowest_ack_ms, (time.perf_counter() - t0) * 1000)
                seq += 50
                time.sleep(0.1)
            a.close()
        except Exception as e:  # reported in the figures
            self.error = f"{type(e).__name__}: {e}"


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(p / 100 * len(s)))], 1)


def _peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def run(work: Path, *, seconds: float = 10.0, workers: int = 4, seed: int = 0) -> dict:
    col = CollectorProcess(work / "c.db")
    try:
        _seed_store(col)
        port = col.http[1]
        calm = _Prober(port, time.monotonic() + min(3.0, seconds / 3))  # before: the machine's own noise
        calm.start()
        calm.join()
        until = time.monotonic() + seconds
        # attackers in processes of their own: their work does not delay the prober's thread
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        procs = [ctx.Process(target=_attack, args=(port, seed * 1000 + i, until, results), daemon=True)
                 for i in range(workers)]
        for p in procs:
            p.start()
        prober, agent = _Prober(port, until), _GoodAgent(col.ingest, until)
        for t in (prober, agent):
            t.start()
        for t in (prober, agent):
            t.join(seconds + 120)
        attackers = [results.get(timeout=seconds + 120) for _ in procs]
        for p in procs:
            p.join(30)
        by_route, by_status = Counter(), Counter()
        for a in attackers:
            by_route.update(a["by_route"])
            by_status.update(a["by_status"])
        alive = col.proc.poll() is None
        after = [urllib_status(port, p) for p in ("/healthz", "/api/jobs", f"/api/jobs/{JOB}/report")] if alive else []
        figures = {
            "seconds": seconds, "workers": workers, "seed": seed,
            "requests": sum(by_route.values()),
            "by_route": dict(sorted(by_route.items())),
            "by_status": {str(k): v for k, v in sorted(by_status.items())},
            "server_errors": [e for a in attackers for e in a["server_errors"]][:20],
            "connection_errors": sum(a["conn_errors"] for a in attackers),
            "attacker_failures": [a["failed"] for a in attackers if a["failed"]],
            "healthz_calm": {"count": len(calm.ms), "p50_ms": _pct(calm.ms, 50), "p99_ms": _pct(calm.ms, 99)},
            "healthz": {"count": len(prober.ms), "p50_ms": _pct(prober.ms, 50), "p99_ms": _pct(prober.ms, 99),
                        "max_ms": round(max(prober.ms), 1) if prober.ms else None, "failures": prober.failures},
            "agent": {"batches": agent.batches, "acked": agent.acked, "slowest_ack_ms": round(agent.slowest_ack_ms, 1),
                      "error": agent.error},
            "collector_alive": alive, "answers_after": after,
            "collector_peak_rss_mib": _peak_rss_mib(col.proc.pid),
            "tracebacks_in_log": sum("Traceback" in line for line in col.lines),
            "log_errors": [ln.strip()[:300] for ln in col.lines if ln.startswith(("ERROR", "Traceback"))
                           or "Error" in ln[:40]][:10],
            "evil_file_written": Path("/tmp/ff-fuzz-evil").exists(),
        }
    finally:
        if col.proc.poll() is None:
            col.stop()
    return figures


def urllib_status(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        return r.status
    except (OSError, http.client.HTTPException):
        return -1
    finally:
        conn.close()


if __name__ == "__main__":
    import tempfile

    print(json.dumps(run(Path(tempfile.mkdtemp()), seconds=5), indent=1))
