"""The collector daemon's way to its notifier: one Notifier wired to the ingest server
(what was stored, pongs, closes; pings on demand), the store (reports on the store
thread, as the HTTP API builds them) and the queue folder.

The queue folder is ``[notify] queue_dir``, else ``notify/`` beside the SQLite file. With
no target the notifier still decides and counts failed jobs for /metrics, and keeps no
files.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from firstfault.analysis.catalog import Catalog

from firstfault.collector import query
from firstfault.collector.config import CollectorConfig
from firstfault.collector.notify.notifier import Notifier
from firstfault.collector.notify.queue import NoticeQueue
from firstfault.collector.server import IngestServer
from firstfault.collector.store.base import Store


def queue_dir(cfg: CollectorConfig) -> Path:
    if cfg.notify.queue_dir is not None:
        return cfg.notify.queue_dir
    return Path(os.path.dirname(os.path.abspath(cfg.db))) / "notify"


def report_url(cfg: CollectorConfig, bound: tuple[str, int] | None) -> str:
    if cfg.notify.report_url:
        return cfg.notify.report_url
    host, port = bound or (cfg.http.host, cfg.http.port)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def attach(cfg: CollectorConfig, store: Store, server: IngestServer, catalog: Catalog,
           http_address: tuple[str, int] | None = None) -> Notifier:
    """A Notifier watching ``server`` (not yet started: ``await notifier.start()``)."""
    redactor = cfg.redact.redactor()

    async def report(job: str) -> dict:
        return await server.call(lambda: query.report(store, job, catalog, redactor=redactor))

    def clock(node: str) -> tuple[int, int] | None:
        est = server.clocks.estimate(node, time.time_ns())
        return None if est is None else (est.offset_ns, est.uncertainty_ns)

    queue = NoticeQueue(queue_dir(cfg), cfg.notify.max_queue) if cfg.notify.enabled else None
    notifier = Notifier(cfg.notify, report=report, clock=clock, probe=server.probe, queue=queue,
                        report_url=report_url(cfg, http_address), redactor=redactor)
    server.observer = notifier
    return notifier
