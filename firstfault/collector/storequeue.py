"""The ingest server's way to the store: one thread, group commits, marks when idle.

Store calls run on one thread (``writer``), as firstfault/collector/store/base.py asks. Batches
that arrive while that thread is busy wait in ``waiting`` and go to it together, as one
``store.insert_columns_many([(node, stream, seqs, cols), ...])`` (one transaction) where
the store has it, else one ``insert_columns`` (or ``insert`` of Records) each. Under load
this amortizes the per-transaction cost; when idle a batch goes alone at once. When
nothing waits, the idle thread runs ``store.mark_pending()`` steps (where the store has
it): the report marks of blocks stored without them (a migrated file's).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from firstfault.collector.store.base import Store
from firstfault.wire import BatchColumns

log = logging.getLogger(__name__)


class StoreQueue:
    def __init__(self, store: Store, writer: ThreadPoolExecutor) -> None:
        self.store, self.writer = store, writer
        self._insert_columns = getattr(store, "insert_columns", None)
        self._insert_many = getattr(store, "insert_columns_many", None)
        self._mark_pending = getattr(store, "mark_pending", None)
        self.marks_behind = self._mark_pending is not None  # the file may hold some
        # batches for the store, each with its future and what to do the moment it is durable
        self.waiting: list[tuple[BatchColumns, asyncio.Future, Callable[[], None] | None]] = []
        self.stopping = False  # no more marking
        self._storing = False  # a group of batches (or a marking step) is on the thread

    async def store_batch(self, b: BatchColumns,
                          on_durable: Callable[[tuple[int, float]], None] | None = None) -> tuple[int, float]:
        """(records new, seconds of the store call it was part of) once durable.
        ``on_durable(that result)`` (the counts, then the ack's write) is called as soon as the store thread's commit
        is back, in the loop's thread: before the next group goes to the store thread and
        before this coroutine resumes (the ack is not queued behind slower work)."""
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append((b, fut, on_durable))
        if not self._storing:
            self._store_waiting()
        return await fut

    def _store_waiting(self) -> None:
        group, self.waiting = self.waiting, []
        self._storing = True
        loop = asyncio.get_running_loop()
        try:
            job = self.writer.submit(self._insert_group, [b for b, _, _ in group])
        except RuntimeError as e:  # the store thread is shut down
            job = concurrent.futures.Future()
            job.set_exception(e)
            self._stored(group, job)
            return
        job.add_done_callback(lambda done: loop.call_soon_threadsafe(self._stored, group, done))

    def _stored(self, group: list[tuple[BatchColumns, asyncio.Future, Any]], done: Any) -> None:
        self._storing = False
        try:
            results = done.result()
        except BaseException as e:  # the executor is gone (stop past its grace)
            results = [e] * len(group)
        for (_, fut, on_durable), result in zip(group, results):
            if fut.done():
                continue  # its session was cancelled
            if isinstance(result, BaseException):
                fut.set_exception(result)
                continue
            if on_durable is not None:
                try:
                    on_durable(result)
                except Exception as e:  # (a closed transport): the session finds out itself
                    log.debug("ack not written error=%s", e)
            fut.set_result(result)
        self._next()

    def _next(self) -> None:
        """Store what waits; else, while the store thread is idle, a step of marks."""
        if self.waiting:
            self._store_waiting()
        elif self.marks_behind and not self.stopping:
            self._storing = True  # batches arriving meanwhile wait, then go at once
            loop = asyncio.get_running_loop()
            try:
                job = self.writer.submit(self._mark_pending)
            except RuntimeError:  # the store thread is shut down
                self._storing = self.marks_behind = False
                return
            job.add_done_callback(lambda done: loop.call_soon_threadsafe(self._marked, done))

    def _marked(self, done: Any) -> None:
        self._storing = False
        try:
            self.marks_behind = done.result() > 0
        except Exception as e:  # marks only speed reports up: log, go on without
            log.warning("store marking failed error=%s", e)
            self.marks_behind = False
        self._next()

    def _insert_group(self, batches: list[BatchColumns]) -> list[Any]:  # on the store thread
        """Per batch (records new, seconds) or the exception its insert raised."""
        t0 = time.perf_counter()
        if self._insert_many is not None and len(batches) > 1:
            try:
                news = self._insert_many([(b.node, b.stream, b.seqs, b.cols) for b in batches])
            except Exception as e:
                return [e] * len(batches)
            seconds = time.perf_counter() - t0
            return [(new, seconds) for new in news]
        out: list[Any] = []
        for b in batches:
            try:
                if self._insert_columns is not None:
                    new = self._insert_columns(b.node, b.stream, b.seqs, b.cols)
                else:  # the Store protocol: Records are built here, off the event loop
                    new = self.store.insert(b.records())
                out.append((new, time.perf_counter() - t0))
            except Exception as e:
                out.append(e)
            t0 = time.perf_counter()
        return out
