"""The notifier: watches the ingest, decides when a job has failed and its first failure
is settled (decide.py), builds the notice from the job's report and hands it to the
deliveries (deliver.py); counts failed jobs for Prometheus (metrics.py).

The ingest server calls ``stored`` (a batch is durable), ``pong`` (an agent answered a
clock ping with no batch of it in flight) and ``closed`` (a connection ended) on the event
loop; each is a few set and max operations over the batch's columns, nothing more. The
rest runs in the notifier's own task every TICK_S: reports are built on a thread and a
store connection of their own (attach.py), queue files are written through a worker
thread, deliveries are their own tasks. So nothing here blocks ingest or the loop.

Once per job: the answer told (notice.py) is kept in memory and in the queue folder's
``sent.json``, so a job is told once, also across a restart (its agents' resends change
nothing), and again only as an update when a later record changes the answer. A job
not heard of for FORGET_S is forgotten in memory (sent.json keeps its answer).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime

from firstfault.analysis.report import iso
from firstfault.collector.notify import decide, notice
from firstfault.collector.notify.config import NotifyConfig
from firstfault.collector.notify.decide import JobWatch
from firstfault.collector.notify.deliver import Deliverer
from firstfault.collector.notify.metrics import NotifyMetrics
from firstfault.collector.notify.queue import NoticeQueue
from firstfault.common.redact import Redactor
from firstfault.reports.escape import terminal

log = logging.getLogger(__name__)

TICK_S = 0.25
DEBOUNCE_NS = 500_000_000  # a job's records quiet this long before its report is (re)built
REBUILD_NS = 3_000_000_000  # ... or its last report this old while records still come
AGENT_FLUSH_NS = 1_000_000_000  # what an agent may hold unsent when it answers a ping
PROBE_NS = 1_000_000_000  # nodes behind are pinged at most this often
FORGET_NS = 3600 * 10**9
GONE = 2**62  # drained-to of a node whose agent closed cleanly: it flushed all it saw

ReportFn = Callable[[str], Awaitable[dict]]
ClockFn = Callable[[str], "tuple[int, int] | None"]  # node -> (offset_ns, uncertainty_ns)


def _ns(at: str | None) -> int | None:
    if not at:
        return None
    try:
        return int(datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() * 1e9)
    except ValueError:
        return None


class Notifier:
    def __init__(self, cfg: NotifyConfig, *, report: ReportFn, clock: ClockFn,
                 probe: Callable[[Iterable[str]], None] = lambda nodes: None,
                 queue: NoticeQueue | None = None, report_url: str | None = None,
                 redactor: Redactor | None = None,
                 close: Callable[[], Awaitable[None]] | None = None) -> None:
        self.cfg, self.report, self.clock, self.probe = cfg, report, clock, probe
        self._close = close
        self.queue, self.report_url, self.redactor = queue, report_url, redactor
        self.metrics = NotifyMetrics()
        self.deliverer = Deliverer(cfg, queue, self.metrics) if queue is not None and cfg.enabled else None
        self.watches: dict[str, JobWatch] = {}
        self.reports: dict[str, dict] = {}
        self.drained: dict[str, int] = {}  # node -> collector time it has shipped up to
        self.sent: dict[str, dict] = {}
        self._probed: dict[str, int] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self.queue is not None:
            self.sent = await asyncio.to_thread(self.queue.load_sent)
        if self.deliverer is not None:
            await self.deliverer.start()
        self._task = asyncio.create_task(self._loop(), name="firstfault-notify")
        log.info("notify started targets=%s quiet_s=%g settle_s=%g max_wait_s=%g",
                 ",".join(f"{t.name}:{t.type}" for t in self.cfg.target) or "none",
                 self.cfg.quiet_s, self.cfg.settle_s, self.cfg.max_wait_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.deliverer is not None:
            await self.deliverer.stop()
        if self._close is not None:
            await self._close()

    # --- what the ingest tells (on the event loop; cheap) ---------------------------

    def stored(self, node: str, cols: dict) -> None:
        now = time.time_ns()
        est = self.clock(node)
        observed = cols["observed_ns"]
        if self.drained.get(node) == GONE:
            del self.drained[node]  # back (a restarted agent): its records say how far again
        if observed:
            self._drain(node, max(observed) + (est[0] if est else 0))
        jobs = cols["job"]
        distinct = set(jobs)
        distinct.discard(None)
        if not distinct:
            return
        kinds, ranks, fields = cols["kind"], cols["rank"], cols["fields"]
        rows: dict[str, list] = {j: [] for j in distinct}
        for k in decide.WATCH_KINDS.intersection(kinds):  # rare: found by list.index, not a loop
            i = -1
            while True:
                try:
                    i = kinds.index(k, i + 1)
                except ValueError:
                    break
                if jobs[i] is not None:
                    rows[jobs[i]].append((k, ranks[i], fields[i]))
        pairs = set(zip(jobs, ranks)) if len(distinct) > 1 else None
        for job in distinct:
            w = self.watches.get(job) or self._watch(job, now)
            job_ranks = set(ranks) if pairs is None else {r for j, r in pairs if j == job}
            decide.observe(w, node, now, job_ranks, rows[job])

    def pong(self, node: str, t1_ns: int) -> None:
        self._drain(node, t1_ns - AGENT_FLUSH_NS)

    def closed(self, node: str, clean: bool) -> None:
        if clean:
            self._drain(node, GONE)

    def _drain(self, node: str, at_ns: int) -> None:
        if at_ns > self.drained.get(node, -1):
            self.drained[node] = at_ns

    def _watch(self, job: str, now: int) -> JobWatch:
        w = self.watches[job] = JobWatch(job, now)
        told = self.sent.get(job)
        if told is not None:  # told before a restart: only an update may follow
            w.told, w.revision, w.decided_by = told.get("answer"), int(told.get("revision", 1)), told.get("decided_by")
            w.failed_ns = w.failure_ns = int(told.get("failed_ns", now))
        return w

    # --- deciding (the notifier's task) ----------------------------------------------

    async def _loop(self) -> None:
        while True:
            now = time.time_ns()
            for w in list(self.watches.values()):
                try:
                    await self._consider(w, now)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # one job's trouble must not stop the others' notices
                    log.error("notify decision failed job=%r error=%s: %s", terminal(w.job), type(e).__name__, e)
                    w.checked_ns = w.last_ns
                if now - w.last_ns > FORGET_NS:
                    del self.watches[w.job]
                    self.reports.pop(w.job, None)
            await asyncio.sleep(TICK_S)

    async def _fresh_report(self, w: JobWatch, now: int, *, force: bool = False) -> dict | None:
        """The job's report, rebuilt when records came since it was built: once they have
        been quiet for DEBOUNCE_NS, or REBUILD_NS after the last build (or after the failure)
        while they keep coming, or at once (``force``); meanwhile the last one (None before
        the first)."""
        rep = self.reports.get(w.job)
        if rep is not None and w.checked_ns >= w.last_ns:
            return rep
        since = rep["_built_ns"] if rep is not None else (w.failure_ns or w.end_ns or w.last_ns)
        if not force and now - w.last_ns < DEBOUNCE_NS and now - since < REBUILD_NS:
            return rep
        checked = w.last_ns
        rep = dict(await self.report(w.job))
        rep["_built_ns"] = time.time_ns()
        self.reports[w.job], w.checked_ns = rep, checked
        return rep

    async def _consider(self, w: JobWatch, now: int) -> None:
        if w.told is not None:
            if w.checked_ns < w.last_ns and now - w.last_ns >= DEBOUNCE_NS:
                rep = await self._fresh_report(w, now)
                if rep is not None and w.checked_ns >= w.last_ns and notice.answer(rep) != w.told:
                    await self._tell(w, rep, self._behind(w, rep))
            return
        if w.not_failed and w.checked_ns >= w.last_ns:
            return
        if w.failed_ns is None:
            why = decide.failed_because(w, now, int(self.cfg.quiet_s * 1e9))
            if why is None and (w.failure_ns is not None or w.end_ns is not None) and w.checked_ns < w.last_ns:
                rep = await self._fresh_report(w, now)
                if rep is None:
                    return
                if w.failure_ns is not None and decide.every_rank_exited(rep):
                    why = "launcher-end"
                elif w.end_ns is not None and rep.get("first_failure"):
                    why = "epilog"
                elif w.end_ns is not None and w.failure_ns is None:
                    w.not_failed = True
            if why is None:
                return
            w.failed_ns, w.decided_by, w.not_failed = now, why, False
            log.info("job failed job=%r decided_by=%s nodes=%d ranks=%d", terminal(w.job), why,
                     len(w.nodes), len(w.ranks))
        rep = await self._fresh_report(w, now)
        if rep is None:
            return
        lag = self._behind(w, rep)
        if lag and now - w.failed_ns < self.cfg.max_wait_s * 1e9:
            due = [n for n in lag if now - self._probed.get(n, 0) >= PROBE_NS]
            if due:
                self._probed.update((n, now) for n in due)
                self.probe(due)
            return
        if w.checked_ns < w.last_ns:  # records came since its report: tell what they say
            rep = await self._fresh_report(w, now, force=True)
        await self._tell(w, rep, lag)

    def _first_ns(self, w: JobWatch, rep: dict) -> int:
        first = rep.get("first_failure") or {}
        return _ns(first.get("occurred_at")) or w.failure_ns or w.failed_ns or time.time_ns()

    def _behind(self, w: JobWatch, rep: dict) -> list[str]:
        unc = {}
        for n in w.nodes:
            est = self.clock(n)
            unc[n] = est[1] if est else 0
        return decide.behind(w.nodes, self.drained, self._first_ns(w, rep), unc, int(self.cfg.settle_s * 1e9))

    async def _tell(self, w: JobWatch, rep: dict, lag: list[str]) -> None:
        ans = notice.answer(rep)
        w.revision += 1
        first_ns = self._first_ns(w, rep)
        doc = notice.build(rep, job=w.job, revision=w.revision, previous=w.told, decided_by=w.decided_by or "",
                           failed_at=iso(w.failed_ns), settled=not lag, behind=lag, report_url=self.report_url,
                           sent_at=iso(time.time_ns()), redactor=self.redactor)
        if w.told is None:
            self.metrics.job_failed(ans["category"] or "none", ans["signature"] or "none", first_ns / 1e9)
        w.told = ans
        targets = await self.deliverer.submit(doc) if self.deliverer is not None else 0
        log.info("notice job=%r revision=%d decided_by=%s settled=%s behind=%s rank=%s signature=%s targets=%d",
                 terminal(w.job), w.revision, w.decided_by, not lag, ",".join(lag) or "-", ans["rank"],
                 ans["signature"], targets)
        if self.queue is not None:
            self.sent[w.job] = {"revision": w.revision, "answer": ans, "decided_by": w.decided_by,
                                "failed_ns": w.failed_ns, "at": time.time()}
            await asyncio.to_thread(self.queue.save_sent, dict(self.sent))
