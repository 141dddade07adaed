"""Deliveries: each queued notice to its target, with a timeout, retries and back-off.

On the collector's event loop, never blocking it: HTTP through aiohttp, a command as
an asyncio subprocess, the queue's files through a worker thread. At most
``CONCURRENCY`` deliveries run at once, each under ``timeout_s`` (its target's, else
``[notify] timeout_s``): a receiver that hangs costs one slot for that long, then counts as
a failure. A failure is retried after ``backoff_initial_s`` doubling up to
``backoff_max_s`` (each 50-100 % of that, so many collectors do not retry in step), until
``max_attempts``; then the delivery is dropped. One log line per delivery and per failure::

    notice delivered target=ops type=webhook job='4242' revision=1 attempt=1 status=200 seconds=0.01
    notice delivery failed target=ops type=webhook job='4242' revision=1 attempt=2 error='HTTP 500' retry_in_s=1.7
    notice dropped target=ops type=webhook job='4242' revision=1 attempts=8 error='timeout after 10 s'

A webhook or Slack delivery succeeds on an HTTP 2xx (redirects are not followed: a 3xx
is a failure); a command on exit status 0 (its stdout is discarded, the end of its stderr
goes into the failure's line; over its time it is killed with its process group). Stopping leaves undelivered files in the queue: the next
start sends them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import time

import aiohttp

from firstfault.collector.notify import formats
from firstfault.collector.notify.config import NotifyConfig, Target
from firstfault.collector.notify.metrics import NotifyMetrics
from firstfault.collector.notify.notice import matches
from firstfault.collector.notify.queue import Delivery, NoticeQueue
from firstfault.reports.escape import terminal

log = logging.getLogger(__name__)

CONCURRENCY = 8
_MAX_ERROR = 200  # characters of a receiver's answer in a log line


class DeliveryError(Exception):
    """One attempt failed; the message says how (no URL, no secret in it)."""


class Deliverer:
    def __init__(self, cfg: NotifyConfig, queue: NoticeQueue, metrics: NotifyMetrics) -> None:
        self.cfg, self.queue, self.metrics = cfg, queue, metrics
        self.targets = {t.name: t for t in cfg.target}
        self.pending: dict[str, Delivery] = {}
        self._running: dict[str, asyncio.Task] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._http: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(CONCURRENCY)

    async def start(self) -> None:
        for d in await asyncio.to_thread(self.queue.load):
            if d.target not in self.targets:
                log.error("notice dropped target=%s job=%r reason=target-not-configured", d.target,
                          terminal(d.notice.get("job")))
                await asyncio.to_thread(self.queue.remove, d.id)
                continue
            self.pending[d.id] = d
        if self.pending:
            log.info("notices pending from before the restart deliveries=%d", len(self.pending))
        self.metrics.queued = len(self.pending)
        self._http = aiohttp.ClientSession()
        self._task = asyncio.create_task(self._run(), name="firstfault-notify-deliver")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for t in list(self._running.values()):
            t.cancel()
        await asyncio.gather(*filter(None, [self._task, *self._running.values()]), return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    async def submit(self, notice: dict) -> int:
        """Queue ``notice`` for every target whose filter takes it; how many."""
        n = 0
        for t in self.targets.values():
            if not matches(t.filter, notice):
                continue
            d, dropped = await asyncio.to_thread(self.queue.put, t.name, notice, time.time())
            self.pending[d.id] = d
            for id in dropped:  # a running one ends without writing its file again
                self.pending.pop(id, None)
            n += 1
        self.metrics.queued = len(self.pending)
        self._wake.set()
        return n

    async def _run(self) -> None:
        while True:
            now = time.time()
            for d in sorted(self.pending.values(), key=lambda d: d.next_at):
                if d.next_at > now:
                    break
                if d.id not in self._running:
                    self._running[d.id] = asyncio.create_task(self._attempt(d))
            waiting = [d.next_at for d in self.pending.values() if d.id not in self._running]
            self._wake.clear()
            try:  # asyncio.timeout, not wait_for: 3.11's wait_for can lose a cancel (a hung stop)
                async with asyncio.timeout(max(0.05, min(waiting, default=now + 60) - now)):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _attempt(self, d: Delivery) -> None:
        t = self.targets[d.target]
        attempt = d.attempts + 1
        timeout = t.timeout_s or self.cfg.timeout_s
        job, rev = terminal(d.notice.get("job")), d.notice.get("revision")
        try:
            async with self._slots:
                t0 = time.monotonic()
                try:
                    async with asyncio.timeout(timeout):
                        status = await self._send(t, d.notice, timeout)
                except TimeoutError:
                    raise DeliveryError(f"timeout after {timeout:g} s") from None
                except DeliveryError:
                    raise
                except Exception as e:  # refused, reset, a bad URL, a command not found, ...
                    raise DeliveryError(f"{type(e).__name__}: {terminal(e)[:_MAX_ERROR]}") from None
            log.info("notice delivered target=%s type=%s job=%r revision=%s attempt=%d status=%s seconds=%.3f",
                     t.name, t.type, job, rev, attempt, status, time.monotonic() - t0)
            self.metrics.delivered(t.name)
            await asyncio.to_thread(self.queue.remove, d.id)
            self.pending.pop(d.id, None)
        except DeliveryError as e:
            self.metrics.failed(t.name)
            if attempt >= self.cfg.max_attempts:
                log.error("notice dropped target=%s type=%s job=%r revision=%s attempts=%d error=%r",
                          t.name, t.type, job, rev, attempt, str(e))
                await asyncio.to_thread(self.queue.remove, d.id)
                self.pending.pop(d.id, None)
            else:
                delay = self.backoff(attempt)
                log.warning("notice delivery failed target=%s type=%s job=%r revision=%s attempt=%d "
                            "error=%r retry_in_s=%.1f", t.name, t.type, job, rev, attempt, str(e), delay)
                nd = Delivery(d.id, d.target, d.notice, attempt, time.time() + delay, d.queued_at)
                if d.id in self.pending:  # else dropped meanwhile for the queue's bound
                    self.pending[d.id] = nd
                    await asyncio.to_thread(self.queue.save, nd)
        finally:
            self._running.pop(d.id, None)
            self.metrics.queued = len(self.pending)
            self._wake.set()

    def backoff(self, attempt: int) -> float:
        """Seconds before the next attempt after ``attempt`` failed ones."""
        full = min(self.cfg.backoff_max_s, self.cfg.backoff_initial_s * 2 ** (attempt - 1))
        return full * random.uniform(0.5, 1.0)

    async def _send(self, t: Target, notice: dict, timeout: float) -> str:
        if t.type == "command":
            return await self._command(t, formats.body(notice))
        if t.type == "slack":
            payload, headers = formats.slack_body(notice), {"Content-Type": "application/json"}
        else:
            payload = formats.body(notice)
            headers = formats.webhook_headers(notice, payload, t.secret, int(time.time()))
        assert self._http is not None
        async with self._http.post(t.url, data=payload, headers=headers, allow_redirects=False,
                                   timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            text = await resp.content.read(_MAX_ERROR)
            if not 200 <= resp.status < 300:
                raise DeliveryError(f"HTTP {resp.status}: {terminal(text.decode('utf-8', 'replace'))}")
            return str(resp.status)

    async def _command(self, t: Target, payload: bytes) -> str:
        proc = await asyncio.create_subprocess_exec(
            *t.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        try:
            _, err = await proc.communicate(payload)
        except BaseException:  # the timeout (cancelled) or stop: the command goes too
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # its children too (start_new_session)
                except ProcessLookupError:
                    pass
                await asyncio.shield(proc.wait())
            raise
        if proc.returncode != 0:
            raise DeliveryError(f"exit status {proc.returncode}: "
                                f"{terminal(err.decode('utf-8', 'replace')[-_MAX_ERROR:])}")
        return "exit 0"
