"""journal: the kernel's messages from the systemd journal (systemd-python), resumed by cursor.

For nodes where the agent may not read /dev/kmsg but journald keeps the kernel's
messages (and to read the journal files of a node, ``directory``). Off by default.
``from systemd import journal`` happens when the source runs (and in
``unavailable()``), so an agent without systemd-python never imports it.

Reads entries with ``_TRANSPORT=kernel`` (journald's /dev/kmsg reader) from the
local journal, or from the journal files in ``directory``. One entry (real, from
tests/data/kernel/journal-input.export through systemd-journal-remote)::

    _TRANSPORT=kernel  PRIORITY=3  SYSLOG_FACILITY=0  _SOURCE_MONOTONIC_TIMESTAMP=923449922
    __MONOTONIC_TIMESTAMP=923449922  __REALTIME_TIMESTAMP=1796209945174575
    _BOOT_ID=cb326fee93b444caa3d373cf19686857  MESSAGE=Memory cgroup out of memory: Killed
    process 8333 (python3) total-vm:75156kB, anon-rss:65280kB, ...

Emits the kernel.line records kmsg emits (``kmsg.kernel_line``: same fields, same
conversion), source ``journal``: message = MESSAGE (journald has undone the
kernel's ``\\xNN`` escapes; bytes that are not UTF-8 come back as ``\\xNN``),
``mono_ns`` = _SOURCE_MONOTONIC_TIMESTAMP (the printk stamp), ``boot_id`` =
_BOOT_ID, severity and ``level`` = PRIORITY, ``facility`` = SYSLOG_FACILITY,
``subsystem``/``device`` from _KERNEL_SUBSYSTEM/_KERNEL_DEVICE, and ``cursor``.
``occurred_ns`` converts the printk stamp with the boot's wall time that the
entry's own pair gives (__REALTIME_TIMESTAMP - __MONOTONIC_TIMESTAMP: when
journald read it, on both clocks), so an entry of an earlier boot gets its own
boot's time. No ``seq``: journald does not keep the kmsg sequence number.

Resume: ``<state_dir>/journal.json`` holds ``{"cursor"}`` of the last entry
passed on, saved after each batch was emitted (in the spool); after a crash
between the two the newest cursor the spool holds wins (``catch_up``), so a
restart repeats nothing and loses nothing. If that entry is gone (the journal was rotated
or vacuumed past it) a ``kernel.gap`` (``reason`` = ``cursor_gone``) comes first.
Without a cursor it starts at ``start_at``: ``boot`` (the first entry stamped
since this machine booted, what /dev/kmsg would hold) or ``head`` (everything
the journal holds, e.g. files copied from a dead node).

Known issues: stop latency is the wait timeout (0.5 s). If the cursor's entry was
vacuumed, the journal seeks to the nearest entry, which may lie before it (a few
entries sent twice). Suspend breaks the stamp conversion (as for kmsg).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
import uuid

from firstfault.agent.clock import BootWall, boot_wall
from firstfault.agent.hostpaths import HostPaths
from firstfault.agent.sources.base import Draft, Emit, Source, SourceError, StateFile, clip, emit_many, register
from firstfault.agent.sources.kmsg import kernel_line
from firstfault.wire import COLUMNS, KIND_KERNEL_GAP, KIND_KERNEL_LINE, MAX_MESSAGE_BYTES, SOURCE_JOURNAL

log = logging.getLogger(__name__)

WAIT_S = 0.5
BATCH = 1000  # entries per emit (one spool append) and cursor save
START_AT = ("boot", "head")
INSTALL_HINT = "apt-get install python3-systemd, or pip install systemd-python (needs libsystemd-dev)"


def _raw(v):
    return v


# Field values as the parser wants them (systemd.journal.Reader's converters): stamps as
# integers, MESSAGE as bytes (decoded here, so no text is ever lost to a failed decode).
CONVERTERS = {"__REALTIME_TIMESTAMP": _raw, "__MONOTONIC_TIMESTAMP": _raw, "MESSAGE": bytes,
              "_SOURCE_MONOTONIC_TIMESTAMP": int, "_BOOT_ID": bytes.decode}


def _first(v):
    return v[0] if isinstance(v, list) and v else v


def _int(v) -> int | None:
    v = _first(v)
    return v if type(v) is int else None


def parse_entry(entry: dict, observed_ns: int, source: str = SOURCE_JOURNAL) -> Draft:
    """The kernel.line Draft of one journal entry as the Reader returns it (CONVERTERS). Pure."""
    msg = _first(entry.get("MESSAGE", b""))
    text = msg.decode("utf-8", "backslashreplace") if isinstance(msg, bytes) else str(msg)
    boot_id = _first(entry.get("_BOOT_ID"))
    try:
        boot_id = str(uuid.UUID(boot_id)) if boot_id else None
    except (ValueError, TypeError):
        boot_id = str(boot_id)
    level, facility = _int(entry.get("PRIORITY")), _int(entry.get("SYSLOG_FACILITY"))
    prio = (facility or 0) << 3 | (6 if level is None else level & 7)
    realtime_us = entry.get("__REALTIME_TIMESTAMP")
    mono = entry.get("__MONOTONIC_TIMESTAMP")  # (µs, boot id bytes)
    mono_us = mono[0] if isinstance(mono, tuple) else None
    usec = _int(entry.get("_SOURCE_MONOTONIC_TIMESTAMP"))
    if usec is None:  # not seen for kernel entries; journald's receipt is all there is
        usec = mono_us
    if type(realtime_us) is int and mono_us is not None:
        boot = BootWall(ns=(realtime_us - mono_us) * 1000, error_ns=1000, at_boottime_ns=mono_us * 1000)
    else:
        boot = boot_wall()
    props = {k.removeprefix("_KERNEL_"): str(_first(entry[k])) for k in ("_KERNEL_SUBSYSTEM", "_KERNEL_DEVICE")
             if k in entry}
    extra = {"cursor": clip(str(entry.get("__CURSOR", "")))}
    if usec is None:
        return Draft(source=source, kind=KIND_KERNEL_LINE, message=clip(text, MAX_MESSAGE_BYTES),
                     observed_ns=observed_ns, boot_id=boot_id, severity=prio & 7,
                     fields={"facility": prio >> 3, "level": prio & 7, **extra})
    return kernel_line(source, clip(text, MAX_MESSAGE_BYTES), usec, boot, prio, boot_id, observed_ns, extra, props)


def _journal_module():
    try:
        return importlib.import_module("systemd.journal")
    except ImportError as e:
        raise SourceError(f"systemd-python is not installed ({e}): {INSTALL_HINT}") from e


@register
class JournalSource(Source):
    """Kernel entries of the systemd journal; see the module docstring."""

    name = SOURCE_JOURNAL

    def __init__(self, *, directory: str = "", start_at: str = "boot", **kw) -> None:
        super().__init__(**kw)
        if start_at not in START_AT:
            raise ValueError(f"{self.name}: start_at must be one of {', '.join(START_AT)}, got {start_at!r}")
        self.directory, self.start_at = directory, start_at
        self.state = StateFile(self.state_dir, self.name)
        self._spooled_cursor: str | None = None  # the newest entry found in the spool

    def saved_at_ns(self) -> int | None:
        return self.state.saved_at_ns()

    def catch_up(self, rows) -> None:
        i = COLUMNS.index("fields")
        for r in rows:  # oldest first: the last cursor is the newest
            c = r[i].get("cursor")
            if isinstance(c, str) and c:
                self._spooled_cursor = c

    @classmethod
    def unavailable(cls, paths: HostPaths) -> str | None:
        try:
            _journal_module()
        except SourceError as e:
            return str(e)
        return None

    def run(self, emit: Emit, stop: threading.Event) -> None:
        journal = _journal_module()
        reader = journal.Reader(path=self.directory or None, converters=CONVERTERS)
        try:
            reader.add_match(_TRANSPORT="kernel")
            pending = self._seek(reader)
            many = emit_many(emit)
            while not stop.is_set():
                batch, cursor = pending, None
                pending = []
                while len(batch) < BATCH:
                    entry = reader.get_next()
                    if not entry:
                        break
                    batch.append(parse_entry(entry, time.time_ns(), self.name))
                    cursor = entry["__CURSOR"]
                if batch:
                    many(batch)
                    if cursor is not None:
                        self.state.save({"cursor": cursor})
                if len(batch) < BATCH:
                    reader.wait(WAIT_S)
        finally:
            reader.close()

    def _seek(self, reader) -> list[Draft]:
        """Position the reader; a kernel.gap to send first if the saved entry is gone."""
        state = self.state.load() or {}
        cursor = self._spooled_cursor or state.get("cursor")
        if not isinstance(cursor, str) or not cursor:
            if self.start_at == "head":
                reader.seek_head()
            else:
                reader.seek_realtime(boot_wall().ns // 1000 / 1e6)
            return []
        reader.seek_cursor(cursor)
        if reader.get_next() and reader.test_cursor(cursor):
            return []  # at the last entry sent: the next get_next() is the first new one
        reader.seek_cursor(cursor)  # gone: the nearest entry is the first to send
        log.warning("journal cursor entry gone (rotated or vacuumed?) cursor=%s", cursor)
        return [self.draft(KIND_KERNEL_GAP, "journal entries after the saved cursor may be lost: "
                           "its entry is no longer in the journal", severity=4,
                           fields={"reason": "cursor_gone", "cursor": clip(cursor)})]
