"""The spool's intake: the sources' ``emit``, which puts records into the spool and counts
what went through. (Not a "sink": in Vector and Fluent Bit a sink is the outbound end; here
that is the shipper.)

``intake(draft)``, ``intake.many(rows)`` (firstfault/agent/sources/base.py ``emit_many``) and
``intake.columns(records)`` (``emit_columns``) append to the spool in the caller's thread: when they return, the records are
spooled (durable as the spool's fsync setting says), so a source may commit its
own position. A full disk is not the source's problem: the spool keeps a gap
record naming what was lost (firstfault/agent/spool/), the intake counts it, logs it (at most
once a minute) and returns -- unless the source holds (``many(rows, hold=True)``:
it can read the rows again, as ranklog from its files): then nothing is lost and
IntakeFull says how many rows were taken. Any other spool error raises, and the
source's runner reports it and retries.

Before anything is spooled, secrets in the messages are redacted (``redactor``,
firstfault/common/redact.py; the agent's ``[redact]``): ``redacted`` counts them by pattern.

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

from firstfault.agent.sources.base import Draft, IntakeFull
from firstfault.agent.spool.columns import FIELDS, MESSAGE, Columns, Runs
from firstfault.agent.spool.queue import Spool
from firstfault.agent.spool.state import SpoolFullError
from firstfault.common.redact import Redactor
from firstfault.wire import KIND_AGENT_STATUS

log = logging.getLogger(__name__)

MAX_MARKS = 10_000  # (seq, time) pairs kept for lag and latency
MARK_EVERY_S = 0.005


class SpoolIntake:
    def __init__(self, spool: Spool, redactor: Redactor | None = None) -> None:
        self.spool, self.redactor = spool, redactor
        self.redacted: Counter[str] = Counter()  # by pattern
        self.records: Counter[str] = Counter()  # by source
        self.spool_full_records = 0  # lost, in a gap
        self.spool_full_held = 0  # times a holding source was told to wait
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

    def many(self, rows: list, hold: bool = False) -> None:
        """Spool ``rows`` (Drafts or tuples of the wire columns) of one source; with
        ``hold``, IntakeFull when the disk is full (the caller keeps what was not taken)."""
        if not rows:
            return
        if self.redactor is not None:
            rows = self.redactor.rows(rows, self.redacted)
        first = rows[0]
        self._spool(self.spool.append, rows, len(rows),
                    first.source if type(first) is Draft else first[0], hold)

    def columns(self, records: Columns, hold: bool = False) -> None:
        """Spool ``records`` of one source given as columns (firstfault/agent/spool/columns.py);
        ``hold`` as for many()."""
        if records.n:
            if self.redactor is not None:
                records = self._redact(records)
            source = records.cols[0]
            self._spool(self.spool.append_columns, records, records.n,
                        source[0][0] if type(source) is Runs else source[0], hold)

    def _redact(self, records: Columns) -> Columns:
        hits = self.redactor.messages(records.cols[MESSAGE], self.redacted, chunks=records.chunks)
        if not hits:
            return records
        cols = list(records.cols)
        message, fields = list(cols[MESSAGE]), cols[FIELDS]
        fields = Runs(list(run) for run in fields) if type(fields) is Runs else list(fields)
        for i, (text, mark) in hits.items():
            message[i] = text if type(message[i]) is str else text.encode()  # one type a column
            if type(fields) is not Runs:
                fields[i] = {**fields[i], "redacted": mark}
        if type(fields) is Runs:  # one pass over the runs for all the hits
            fields.update({i: _marked(mark) for i, (_, mark) in hits.items()})
        cols[MESSAGE], cols[FIELDS] = message, fields
        return Columns(records.n, cols)

    def _spool(self, append, records, n: int, source: str, hold: bool) -> None:
        try:
            seq = append(records, hold_on_full=hold)
        except SpoolFullError as e:
            if e.accepted_seq is not None:
                self._mark(e.accepted_seq)
            if e.held:
                self.spool_full_held += 1
                self.records[source] += n - e.dropped_records
                raise IntakeFull(str(e), n - e.dropped_records) from e
            self.spool_full_records += e.dropped_records
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


def _marked(mark: str):
    return lambda fields: {**fields, "redacted": mark}
