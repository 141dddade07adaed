"""The ingest server's bookkeeping: its Metrics (Prometheus text), the RecordBudget
that bounds records read and not yet stored over all connections (backpressure),
and a LogLimiter for repeated warnings. No I/O; firstfault/collector/server.py uses them."""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections import deque
from itertools import accumulate

from firstfault.common.prometheus import family


class Metrics:
    """Counters of the ingest, rendered as Prometheus text by render_prometheus()."""

    STORE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
    _COUNTERS = (
        ("records_received", "Records received in batches."),
        ("records_stored", "Records the store took as new."),
        ("records_duplicate", "Records the store already had (resends)."),
        ("batches", "Batches stored and acked."),
        ("bytes_received", "Frame bytes received, length prefixes included."),
        ("connections", "Connections accepted."),
        ("connections_rejected", "Connections refused at max_connections."),
        ("clock_samples", "Ping/pong exchanges taken by the clock tracker."),
    )

    def __init__(self) -> None:
        for name, _ in self._COUNTERS:
            setattr(self, name, 0)
        self.connections_open = 0
        self.inflight_records = 0
        self.errors: dict[str, int] = {}
        self.store_buckets = [0] * (len(self.STORE_BUCKETS_S) + 1)
        self.store_seconds_sum = 0.0
        self.store_seconds_count = 0

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1

    def observe_store(self, seconds: float) -> None:
        self.store_buckets[bisect_left(self.STORE_BUCKETS_S, seconds)] += 1
        self.store_seconds_sum += seconds
        self.store_seconds_count += 1

    def render_prometheus(self) -> str:
        p = "firstfault_collector_"
        out: list[str] = []
        for name, doc in self._COUNTERS:
            out += family(f"{p}{name}_total", "counter", doc, getattr(self, name))
        for name, doc in (("connections_open", "Connections open now."),
                          ("inflight_records", "Records read and not yet stored.")):
            out += family(p + name, "gauge", doc, getattr(self, name))
        out += family(p + "errors_total", "counter", "Connections closed for an error, by code.",
                      [("", {"code": c}, n) for c, n in sorted(self.errors.items())])
        buckets = zip((*map(repr, self.STORE_BUCKETS_S), "+Inf"), accumulate(self.store_buckets))
        out += family(p + "store_seconds", "histogram",
                      "Time of one batch's store insert (in the store thread).",
                      [*(("_bucket", {"le": le}, n) for le, n in buckets),
                       ("_sum", {}, self.store_seconds_sum), ("_count", {}, self.store_seconds_count)])
        return "\n".join(out) + "\n"


class RecordBudget:
    """Records read and not yet stored, over all connections; acquire() waits (FIFO)."""

    def __init__(self, limit: int, metrics: Metrics | None = None) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._metrics = metrics
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def acquire(self, n: int) -> int:
        """Reserve ``n`` records (at most the limit); returns how many were reserved."""
        n = min(n, self.limit)
        if not self._waiters and self.used + n <= self.limit:
            self._take(n)
            return n
        entry = (n, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].done() and not entry[1].cancelled():
                self.release(n)  # granted just as we were cancelled
            else:
                self._waiters.remove(entry)
                self._wake()
            raise
        return n

    def release(self, n: int) -> None:
        self.used -= n
        self._set_gauge()
        self._wake()

    def _take(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)
        self._set_gauge()

    def _set_gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.inflight_records = self.used

    def _wake(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.limit:
            n, fut = self._waiters.popleft()
            self._take(n)
            fut.set_result(None)


class LogLimiter:
    """At most ``burst`` warning lines per code per ``period_s``; the rest are counted."""

    def __init__(self, burst: int = 20, period_s: float = 60.0) -> None:
        self.burst, self.period_s = burst, period_s
        self._state: dict[str, list] = {}  # code -> [window start, lines, suppressed]

    def allow(self, code: str) -> tuple[bool, int]:
        now = time.monotonic()
        st = self._state.setdefault(code, [now, 0, 0])
        if now - st[0] >= self.period_s:
            st[:] = [now, 0, st[2]]
        if st[1] < self.burst:
            st[1] += 1
            suppressed, st[2] = st[2], 0
            return True, suppressed
        st[2] += 1
        return False, 0
