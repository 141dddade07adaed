"""The notifier's Prometheus metrics, appended to the collector's /metrics.

- ``firstfault_failed_jobs_total{category, signature}`` (counter): jobs told as failed,
  by their first failure's category and signature (counted once per job, at its first
  notice; ``none`` when no first failure was found);
- ``firstfault_last_failure_timestamp_seconds`` (gauge): when the latest failed job's first
  failure occurred (Unix seconds; when it was decided failed where its time is unknown);
- ``firstfault_notices_delivered_total{target}``, ``firstfault_notice_failures_total{target}``
  (counters: attempts that failed), ``firstfault_notices_queued`` (gauge: deliveries pending).

deploy/alerts/firstfault.rules.yml holds example Alertmanager rules over them. No I/O.
"""

from __future__ import annotations

from firstfault.common.prometheus import family


class NotifyMetrics:
    def __init__(self) -> None:
        self.failed_jobs: dict[tuple[str, str], int] = {}
        self.last_failure_s: float | None = None
        self.deliveries: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.queued = 0

    def job_failed(self, category: str, signature: str, at_s: float) -> None:
        key = (category, signature)
        self.failed_jobs[key] = self.failed_jobs.get(key, 0) + 1
        self.last_failure_s = at_s if self.last_failure_s is None else max(self.last_failure_s, at_s)

    def delivered(self, target: str) -> None:
        self.deliveries[target] = self.deliveries.get(target, 0) + 1

    def failed(self, target: str) -> None:
        self.failures[target] = self.failures.get(target, 0) + 1

    def render_prometheus(self) -> str:
        out: list[str] = []
        out += family("firstfault_failed_jobs_total", "counter",
                      "Failed jobs told, by the first failure's category and signature.",
                      [("", {"category": c, "signature": s}, n) for (c, s), n in sorted(self.failed_jobs.items())])
        if self.last_failure_s is not None:
            out += family("firstfault_last_failure_timestamp_seconds", "gauge",
                          "When the latest failed job's first failure occurred (Unix seconds).",
                          self.last_failure_s)
        out += family("firstfault_notices_delivered_total", "counter", "Notices delivered, by target.",
                      [("", {"target": t}, n) for t, n in sorted(self.deliveries.items())])
        out += family("firstfault_notice_failures_total", "counter", "Delivery attempts that failed, by target.",
                      [("", {"target": t}, n) for t, n in sorted(self.failures.items())])
        out += family("firstfault_notices_queued", "gauge", "Deliveries pending on disk.", self.queued)
        return "\n".join(out) + "\n"
