"""Real HTTP receivers on loopback for the notify tests: each request's headers and body
kept; behaviour chosen per receiver (answer 200, fail the first N, hang, check a signature)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """``fail_first``: answer 500 to that many requests first; ``hang_s``: hold each request
    that long before answering; ``secret``: answer 401 unless the signature checks."""

    def __init__(self, *, fail_first: int = 0, hang_s: float = 0.0, secret: bytes | None = None,
                 port: int = 0) -> None:
        self.fail_first, self.hang_s, self.secret = fail_first, hang_s, secret
        self.requests: list[dict] = []  # every request: headers, body, status answered
        self.lock = threading.Lock()
        self.stop_hanging = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = outer._status(dict(self.headers), body)
                with outer.lock:
                    outer.requests.append({"headers": dict(self.headers), "body": body, "status": status,
                                           "path": self.path})
                if outer.hang_s:
                    outer.stop_hanging.wait(outer.hang_s)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the sender gave up (timeout)

            def log_message(self, *a):
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _status(self, headers: dict, body: bytes) -> int:
        with self.lock:
            n = len(self.requests)
        if self.secret is not None:
            ts = headers.get("X-Firstfault-Timestamp", "")
            want = "sha256=" + hmac.new(self.secret, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
            if not hmac.compare_digest(want, headers.get("X-Firstfault-Signature", "")):
                return 401
            if abs(time.time() - int(ts)) > 300:
                return 401
        return 500 if n < self.fail_first else 200

    def delivered(self) -> list[dict]:
        """The notices answered 200, parsed."""
        with self.lock:
            return [json.loads(r["body"]) for r in self.requests if r["status"] == 200]

    def wait(self, cond, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"not reached; requests: {self.requests}"
            time.sleep(0.05)

    def close(self) -> None:
        self.stop_hanging.set()
        self.server.shutdown()
        self.server.server_close()
