"""kmsg: every kernel log record from /dev/kmsg, as read, with its seq, stamp and boot id.

Reads ``/dev/kmsg`` (HostPaths.dev; needs CAP_SYSLOG or root). One ``read()``
returns exactly one record: a header ``prio,seq,usec,flags[,key=value...];text``
and, for device messages, continuation lines that start with a space. Real ones
(tests/data/kernel/boot.kmsg, memcg-oom.kmsg)::

    6,270,283340,-;virtio-pci 0000:00:01.0: enabling device (0000 -> 0002)
     SUBSYSTEM=pci
     DEVICE=+pci:0000:00:01.0
    3,381,923449971,-;Memory cgroup out of memory: Killed process 8333 (python3) ...

``prio`` = facility << 3 | level; ``seq`` rises by one per record within a boot;
``usec`` is microseconds since boot (printk clock); ``flags`` is ``-`` (``c`` on
old kernels for a continued fragment); kernels with CONFIG_PRINTK_CALLER add
``caller=T123`` after the flags. The kernel escapes every byte outside printable
ASCII and the backslash as ``\\xNN`` (an embedded newline is ``\\x0a``), so the
text is ASCII; it is shipped as read, escapes and all.

Emits, with ``boot_id``, ``mono_ns`` = usec * 1000, ``occurred_ns`` = the stamp on
the wall clock (firstfault/agent/clock.py: printk's clock measured with a marker
line the agent writes and then drops, or, where it may not write /dev/kmsg, from
the records it reads as the kernel wakes it), ``severity`` = level:

- ``kernel.line``: message = the text; fields ``seq``, ``facility``, ``level``,
  ``clock_error_ns`` (bound on the occurred_ns error), ``flags`` unless ``-``,
  and every continuation or header ``KEY=value`` lower-cased (``subsystem``,
  ``device``, ``caller``).
- ``kernel.gap``: records this reader never saw: fields ``first_seq``,
  ``last_seq``, ``missing``, ``reason``: ``overrun`` (read() said EPIPE: the ring
  buffer overwrote them before we read), ``seq_jump`` (seq skipped without
  EPIPE), ``resume`` (lost while the agent was down), ``buffer_start`` (gone from
  the buffer before the agent first read this boot).

Resume: the state file ``<state_dir>/kmsg.json`` holds ``{"boot_id", "seq"}`` of
the last record passed on, saved at most once a second and at stop (no fsync:
it only matters within this boot, and a crashed agent's page cache survives).
The same boot resumes after that seq; a new boot (or no state) starts at the
beginning of the buffer. After an agent *crash* the records spooled since the last
save are found in the spool (``catch_up``, firstfault/agent/sources/base.py) and not read
again: exactly once.

Known issues: the kernel also allows writes to /dev/kmsg (facility ``user``,
rate-limited), so a ``kernel.line`` is not proof that the kernel said it: the
facility field tells. Stop latency is the poll timeout (0.25 s).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from firstfault.agent.clock import (
    BootWall,
    PrintkClock,
    is_sync_marker,
    kmsg_error_ns,
    kmsg_to_wall_ns,
    read_boot_id,
    record_usec,
)
from firstfault.agent.hostpaths import HostPaths
from firstfault.agent.sources.base import Draft, Emit, Source, SourceError, StateFile, StopEvent, clip, register
from firstfault.wire import COLUMNS, KIND_KERNEL_GAP, KIND_KERNEL_LINE, MAX_FIELDS, SOURCE_KMSG

log = logging.getLogger(__name__)

READ_BYTES = 16384  # > any record (the kernel answers EINVAL to a buffer too small)
POLL_TIMEOUT_MS = 250
SAVE_EVERY_S = 1.0


class KmsgFormatError(SourceError):
    """A read from /dev/kmsg that is not ``prio,seq,usec,flags;text``."""


class KmsgEntry(NamedTuple):
    """One /dev/kmsg record, parsed; ``props`` holds header extras and continuation lines."""

    prio: int
    seq: int
    usec: int
    flags: str
    text: str
    props: dict[str, str]


def parse_kmsg_record(data: bytes) -> KmsgEntry:
    """Parse what one ``read()`` of /dev/kmsg returned. Pure; KmsgFormatError if malformed."""
    raw = data.decode("utf-8", "backslashreplace")
    head, sep, rest = raw.partition(";")
    parts = head.split(",")
    if not sep or len(parts) < 3:
        raise KmsgFormatError(f"not a kmsg record: {raw[:80]!r}")
    try:
        prio, seq, usec = int(parts[0]), int(parts[1]), int(parts[2])
    except ValueError:
        raise KmsgFormatError(f"bad kmsg header {head[:80]!r}") from None
    if prio < 0 or seq < 0 or usec < 0:
        raise KmsgFormatError(f"negative number in kmsg header {head[:80]!r}")
    props: dict[str, str] = {}
    for extra in parts[4:]:
        key, _, value = extra.partition("=")
        props[key] = value
    lines = rest.split("\n")
    for line in lines[1:]:
        if line.startswith(" "):
            key, _, value = line[1:].partition("=")
            props[key] = value
    return KmsgEntry(prio, seq, usec, parts[3] if len(parts) > 3 else "-", lines[0], props)


def kernel_line(source: str, text: str, usec: int, boot: BootWall, prio: int, boot_id: str | None,
                observed_ns: int, extra: dict, props: dict[str, str]) -> Draft:
    """The kernel.line Draft of one kernel record stamped ``usec`` after boot, as kmsg and
    journal ship it: occurred_ns on the wall clock of ``boot`` (firstfault/agent/clock.py), severity =
    level, fields ``facility``, ``level``, ``clock_error_ns``, then ``extra`` and the
    record's ``KEY=value`` properties lower-cased (``subsystem``, ``device``)."""
    fields = {"facility": prio >> 3, "level": prio & 7, "clock_error_ns": kmsg_error_ns(usec, boot),
              **extra}
    for key, value in props.items():
        if len(fields) < MAX_FIELDS and key:
            fields.setdefault(clip(key.lower(), 256), clip(value))
    return Draft(source=source, kind=KIND_KERNEL_LINE, message=text,
                 occurred_ns=kmsg_to_wall_ns(usec, boot), observed_ns=observed_ns, boot_id=boot_id,
                 mono_ns=usec * 1000, severity=prio & 7, fields=fields)


class KmsgStream:
    """Pure: kmsg reads -> Drafts, tracking seq to find gaps and skip records already sent.

    ``last_seq`` is the seq of the last record already passed on in this boot
    (None: none yet, so a first record after seq 0 means the buffer lost some).
    """

    def __init__(self, boot_id: str, last_seq: int | None = None, source: str = SOURCE_KMSG) -> None:
        self.boot_id, self.last_seq, self.source = boot_id, last_seq, source
        self._resuming = last_seq is not None
        self._overrun = False
        self.max_seen: int | None = None

    def overrun(self) -> None:
        """read() failed with EPIPE: records were overwritten before we read them."""
        self._overrun = True

    def feed(self, data: bytes, boot: BootWall, observed_ns: int | None = None) -> list[Draft]:
        """Drafts for one read: the kernel.line (none for a record already sent, nor for
        the agent's clock marker), after a kernel.gap if records are missing before it."""
        observed_ns = time.time_ns() if observed_ns is None else observed_ns
        try:
            e = parse_kmsg_record(data)
        except KmsgFormatError as err:
            log.warning("malformed kmsg record error=%s", err)
            return [Draft(source=self.source, kind=KIND_KERNEL_LINE, observed_ns=observed_ns,
                          message=data.decode("utf-8", "backslashreplace")[:65536],
                          boot_id=self.boot_id, fields={"malformed": True})]
        self.max_seen = e.seq if self.max_seen is None else max(self.max_seen, e.seq)
        out: list[Draft] = []
        last = self.last_seq
        if last is not None and e.seq <= last:
            return out  # already passed on before a restart
        expected = 0 if last is None else last + 1
        if e.seq > expected:
            reason = ("overrun" if self._overrun else "resume" if self._resuming
                      else "buffer_start" if last is None else "seq_jump")
            out.append(self.gap(expected, e.seq - 1, reason, observed_ns))
        self._overrun = self._resuming = False
        self.last_seq = e.seq
        if is_sync_marker(e.prio >> 3, e.text):
            return out
        extra = {"seq": e.seq}
        if e.flags != "-":
            extra["flags"] = e.flags
        out.append(kernel_line(self.source, e.text, e.usec, boot, e.prio, self.boot_id, observed_ns,
                               extra, e.props))
        return out

    def gap(self, first: int, last: int, reason: str, observed_ns: int) -> Draft:
        return Draft(source=self.source, kind=KIND_KERNEL_GAP, severity=4,
                     message=f"kmsg records {first}..{last} lost ({reason})",
                     observed_ns=observed_ns, boot_id=self.boot_id,
                     fields={"first_seq": first, "last_seq": last, "missing": last - first + 1,
                             "reason": reason})


@register
class KmsgSource(Source):
    """Follows /dev/kmsg; see the module docstring."""

    name = SOURCE_KMSG

    @classmethod
    def unavailable(cls, paths: HostPaths) -> str | None:
        if not os.access(paths.kmsg, os.R_OK):
            return f"cannot read {paths.kmsg} (needs root or CAP_SYSLOG)"
        return None

    def __init__(self, *, tag: Callable[[Draft], Draft] | None = None, **kw) -> None:
        """``tag``: told of every kernel line before it is emitted (the pods source's: an OOM
        kill in a pod's cgroup gets the pod's job and rank)."""
        super().__init__(**kw)
        self.tag = tag
        self.state = StateFile(self.state_dir, self.name)
        self._spooled: dict[str, int] = {}  # boot id -> highest seq found in the spool

    def saved_at_ns(self) -> int | None:
        return self.state.saved_at_ns()

    def catch_up(self, rows) -> None:
        i_kind, i_boot, i_fields = (COLUMNS.index(c) for c in ("kind", "boot_id", "fields"))
        for r in rows:
            f = r[i_fields]
            seq = f.get("seq") if r[i_kind] == KIND_KERNEL_LINE else f.get("last_seq")
            boot = r[i_boot]
            if type(seq) is int and boot and seq > self._spooled.get(boot, -1):
                self._spooled[boot] = seq

    def load_state(self, boot_id: str) -> int | None:
        """The last seq passed on in boot ``boot_id``, or None (no state, other boot)."""
        state = self.state.load()
        if state is None or state.get("boot_id") != boot_id or type(state.get("seq")) is not int:
            return None
        return state["seq"]

    def run(self, emit: Emit, stop: threading.Event) -> None:
        boot_id = read_boot_id(self.paths)
        saved, spooled = self.load_state(boot_id), self._spooled.get(boot_id)
        if spooled is not None and (saved is None or spooled > saved):
            log.info("kmsg resumes after the spool's seq=%d (saved state: %s)", spooled, saved)
            saved = spooled
        stream = KmsgStream(boot_id, saved, self.name)
        stored = stream.last_seq
        fd = os.open(self.paths.kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        clock = PrintkClock(self.paths.kmsg)
        clock.get()  # measured now, so that observe() knows whether it is needed
        saved_seq, saved_at = stored, time.monotonic()
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLPRI)
            timeout_ms = POLL_TIMEOUT_MS
            if isinstance(stop, StopEvent):
                poller.register(stop, select.POLLIN)
                timeout_ms = None
            woken = False  # the kernel woke us: what is read now was stamped just before
            while not stop.is_set():
                for _ in range(1000):  # a burst, then look at stop again
                    try:
                        data = os.read(fd, READ_BYTES)
                    except BlockingIOError:
                        break
                    except BrokenPipeError:
                        stream.overrun()
                        continue
                    observed = time.time_ns()
                    if woken:
                        clock.observe(record_usec(data), observed)
                    # measured again only when records need it (clock.py)
                    for d in stream.feed(data, clock.get(), observed):
                        emit(self.tag(d) if self.tag is not None else d)
                else:
                    woken = False
                    continue  # more to read: no wait
                woken = False
                if stored is not None and stream.last_seq == stored and (
                        stream.max_seen is not None and stream.max_seen < stored):
                    # The saved seq lies beyond everything in this boot's buffer: the state
                    # is not this buffer's. Start over from the buffer's beginning.
                    log.warning("kmsg state seq=%d beyond the buffer (max %d); rereading",
                                stored, stream.max_seen)
                    stream = KmsgStream(boot_id, None, self.name)
                    os.lseek(fd, 0, os.SEEK_SET)
                    stored = None
                    continue
                stored = None
                if stream.last_seq != saved_seq and time.monotonic() - saved_at >= SAVE_EVERY_S:
                    saved_seq = self._save(boot_id, stream.last_seq, saved_seq)
                    saved_at = time.monotonic()
                woken = any(ready == fd for ready, _ in poller.poll(timeout_ms))
        except OSError as e:
            if e.errno == errno.EINVAL:
                raise SourceError(f"read of {self.paths.kmsg} failed: record longer than "
                                  f"{READ_BYTES} bytes?") from e
            raise
        finally:
            os.close(fd)
            if stream.last_seq != saved_seq:
                self._save(boot_id, stream.last_seq, saved_seq)

    def _save(self, boot_id: str, seq: int | None, saved: int | None) -> int | None:
        """Save the position; the seq now on disk (the old one if the save failed: a
        restart then repeats records, which the collector drops by boot_id and seq)."""
        if seq is None or not self.state.save({"boot_id": boot_id, "seq": seq}):
            return saved
        return seq
