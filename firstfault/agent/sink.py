"""The sources' ``emit``: puts records into the spool and counts what went through.

``sink(draft)``, ``sink.many(rows)`` (firstfault/agent/sources/base.py ``emit_many``) and
``sink.columns(records)`` (``emit_columns``) append to the spool in the caller's thread: when they return, the records are
spooled (durable as the spool's fsync setting says), so a source may commit its
own position. A full disk is not the source's problem: the spool keeps a gap
record naming what was lost (firstfault/agent/spool.py), the sink counts it, logs it (at most
once a minute) and returns. Any other spool error raises, and the source's runner
reports it and retries.

It also keeps what /metrics shows: records per source, the state of each source
(from the runners' agent.status records) and, from the (seq, time) of each
append, how long the oldest unacked record has waited (send lag) and how long the
last acked one took from append to ack.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque

from firstfault.agent.columns import Columns, Runs
from firstfault.agent.sources.base import Draft
from firstfault.agent.spool import Spool, SpoolFullError
from firstfault.wire import KIND_AGENT_STATUS

log = logging.getLogger(__name__)

MAX_MARKS = 10_000  # (seq, time) pairs kept for lag and latency
MARK_EVERY_S = 0.005


class SpoolSink:
    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self.records: Counter[str] = Counter()  # by source
        self.spool_full_records = 0
        self.source_states: dict[str, str] = {}
        self.last_ack_latency_s: float | None = None
        self._marks: deque[tuple[int, float]] = deque()
        self._lock = threading.Lock()
        self._warned = 0.0

    def __call__(self, draft: Draft) -> None:
        if draft.kind == KIND_AGENT_STATUS:
            src, state = draft.fields.get("source"), draft.fields.get("state")
            if isinstance(src, str) and isinstance(state, str):
                self.source_states[src] = state
        self.many([draft])

    def many(self, rows: list) -> None:
        """Spool ``rows`` (Drafts or tuples of the wire columns) of one source."""
        if not rows:
            return
        first = rows[0]
        self._spool(self.spool.append, rows, len(rows),
                    first.source if type(first) is Draft else first[0])

    def columns(self, records: Columns) -> None:
        """Spool ``records`` of one source given as columns (firstfault/agent/columns.py)."""
        if records.n:
            source = records.cols[0]
            self._spool(self.spool.append_columns, records, records.n,
                        source[0][0] if type(source) is Runs else source[0])

    def _spool(self, append, records, n: int, source: str) -> None:
        try:
            seq = append(records)
        except SpoolFullError as e:
            self.spool_full_records += e.dropped_records
            if e.accepted_seq is not None:
                self._mark(e.accepted_seq)
            now = time.monotonic()
            if now - self._warned >= 60:
                self._warned = now
                log.error("spool full, records dropped (a gap record names them) error=%s", e)
            return
        self.records[source] += n
        self._mark(seq)

    def _mark(self, seq: int) -> None:
        now = time.monotonic()
        with self._lock:
            marks = self._marks
            if marks and (now - marks[-1][1] < MARK_EVERY_S or len(marks) >= MAX_MARKS):
                marks[-1] = (max(seq, marks[-1][0]), marks[-1][1])  # counted from the older time
            else:
                marks.append((seq, now))

    def acked(self, seq: int) -> None:
        """The collector stored every record <= ``seq`` (the shipper's on_ack)."""
        now = time.monotonic()
        with self._lock:
            marks, last = self._marks, None
            while marks and marks[0][0] <= seq:
                last = marks.popleft()
            if last is not None:
                self.last_ack_latency_s = now - last[1]

    def send_lag_s(self) -> float:
        """How long the oldest unacked record has waited (0 when all are acked)."""
        with self._lock:
            return time.monotonic() - self._marks[0][1] if self._marks else 0.0
