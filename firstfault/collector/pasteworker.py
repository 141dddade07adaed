"""The /paste analysis in a process of its own, so a paste never holds the collector.

A pasted log (up to 32 MiB) takes seconds of CPU and hundreds of MiB to analyse. Run in a
thread of the collector it would hold the GIL against the event loop (ingest, /healthz) and
its memory would be the collector's; here it runs in one worker process (started on the
first paste, spawned: the collector is threaded; niced, so the daemon's own threads win the
CPU), which loads the catalog once, redacts the events before the analysis reads them
(firstfault/common/redact.py ``events``) and returns the rendered HTML page. One paste at a
time; a worker that dies (killed for memory) is replaced at the next paste.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

log = logging.getLogger(__name__)

NICE = 10  # the worker's niceness: below the collector's threads
_catalog: Any = None  # the worker's catalog, loaded once


class PasteFailed(Exception):
    """The worker could not analyse a paste (it died); the message says so."""


def _start_worker() -> None:
    try:
        os.nice(NICE)
    except OSError:
        pass


def render_paste(data: bytes, tz, patterns) -> str:
    """In the worker: the HTML page of one pasted log, redacted by ``patterns`` (None: off)."""
    global _catalog
    from firstfault.analysis.catalog import load_catalog
    from firstfault.collector.web import analyze_paste
    from firstfault.common import redact
    from firstfault.reports.html import render_html

    if _catalog is None:
        _catalog = load_catalog()
    redactor = None if patterns is None else redact.Redactor(patterns)
    counts: Counter = Counter()
    rep = analyze_paste(data, _catalog, tz, redactor=redactor, redacted=counts)
    return render_html(redact.report(rep, redactor, counts))


class PasteWorker:
    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._lock = asyncio.Lock()

    async def render(self, data: bytes, tz, redactor) -> str:
        patterns = None if redactor is None else redactor.patterns
        async with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_start_worker)
            loop = asyncio.get_running_loop()
            try:
                return await loop.run_in_executor(self._pool, render_paste, data, tz, patterns)
            except BrokenProcessPool:
                log.error("paste worker died (killed for memory?): the next paste starts a new one")
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
                raise PasteFailed("the paste could not be analysed: its worker process ended "
                                  "(too large for this collector's memory?)") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
