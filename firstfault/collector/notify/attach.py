"""The collector daemon's way to its notifier: one Notifier wired to the ingest server
(what was stored, pongs, closes; pings on demand), the store and the queue folder.

Reports are built on a thread of their own with a store connection of their own (as
``firstfault report --db`` reads the store of a running collector): building the report
of a 512-rank job takes a while, and the ingest's store thread never waits for it.

The queue folder is ``[notify] queue_dir``, else ``notify/`` beside the SQLite file. With
no target the notifier still decides and counts failed jobs for /metrics, and keeps no
files.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from firstfault.analysis.catalog import Catalog
from firstfault.collector import query
from firstfault.collector.config import CollectorConfig
from firstfault.collector.notify.notifier import Notifier
from firstfault.collector.notify.queue import NoticeQueue
from firstfault.collector.server import IngestServer
from firstfault.collector.store import open_store
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


class ReportReader:
    """Reports of jobs, from a store connection of its own on a thread of its own."""

    def __init__(self, db: str, catalog: Catalog, cfg: CollectorConfig) -> None:
        self.db, self.catalog, self.redactor = db, catalog, cfg.redact.redactor()
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="firstfault-notify-read")
        self.store: Store | None = None

    def _report(self, job: str) -> dict:  # on self.thread
        if self.store is None:
            self.store = open_store(self.db)
        return query.report(self.store, job, self.catalog, redactor=self.redactor)

    async def report(self, job: str) -> dict:
        return await asyncio.get_running_loop().run_in_executor(self.thread, self._report, job)

    async def close(self) -> None:
        def close() -> None:
            if self.store is not None:
                self.store.close()
        await asyncio.get_running_loop().run_in_executor(self.thread, close)
        self.thread.shutdown(wait=False)


def attach(cfg: CollectorConfig, server: IngestServer, catalog: Catalog,
           http_address: tuple[str, int] | None = None) -> Notifier:
    """A Notifier watching ``server`` (not yet started: ``await notifier.start()``)."""
    reader = ReportReader(cfg.db, catalog, cfg)

    def clock(node: str) -> tuple[int, int] | None:
        est = server.clocks.estimate(node, time.time_ns())
        return None if est is None else (est.offset_ns, est.uncertainty_ns)

    queue = NoticeQueue(queue_dir(cfg), cfg.notify.max_queue) if cfg.notify.enabled else None
    notifier = Notifier(cfg.notify, report=reader.report, clock=clock, probe=server.probe, queue=queue,
                        report_url=report_url(cfg, http_address), redactor=reader.redactor, close=reader.close)
    server.observer = notifier
    return notifier
