"""The agent's clocks: wall, monotonic, boottime, the boot id; kmsg time -> wall time.

Three clocks, never mixed up (STYLE: keep occurred and observed time apart):

- wall (``CLOCK_REALTIME``, ns since the Unix epoch): ``observed_ns`` of every
  record, and what ``occurred_ns`` is converted to. NTP slews and steps it.
- monotonic / boottime (ns since boot): kmsg stamps every record with
  ``usec`` since boot (printk's ``local_clock()``, which follows CLOCK_MONOTONIC
  and CLOCK_BOOTTIME here: no suspend on a server).
- the boot id (``/proc/sys/kernel/random/boot_id``, e.g.
  ``cb326fee-93b4-44ca-a3d3-73cf19686857``): a monotonic stamp means something
  only with it; a new id means a new boot and seqs/stamps restart at 0.

kmsg time to wall time. ``dmesg -T`` assumes the printk clock is CLOCK_BOOTTIME:

    wall_ns = time.time_ns() - clock_gettime_ns(CLOCK_BOOTTIME) + usec * 1000

It is not: printk stamps with ``local_clock()`` (sched_clock: the TSC with a scale
fixed at boot), while CLOCK_BOOTTIME follows NTP's frequency correction. The two
drift apart from boot on: 55 ms after 7.8 hours on this VM (~2 ppm), seconds after
weeks on a real node. So the agent *measures* the wall time of printk's zero
(``PrintkClock``): it writes a marker line to /dev/kmsg between two wall-clock
reads and reads the marker's stamp back (``sync_printk_wall``). The marker is a
debug-level line of facility ``user``, ``firstfault-agent: printk clock sync
<nonce>``; the kmsg source drops it. It is measured again when a record needs
converting and the last measurement is older than ``SYNC_EVERY_S``, so a quiet
kernel log stays quiet. ``/proc/stat`` btime is whole seconds (0.2 s off seen
here), so it is not used.

Error bound (``kmsg_error_ns``): the conversion assumes the wall clock ran at the
rate of the printk clock between the measurement and the record's stamp. It is off
by

1. half the time between the two wall reads around the marker's write (a few µs),
2. the stamp's resolution (1 µs),
3. the drift between the measurement and the stamp: NTP's frequency correction is
   capped at 500 ppm (``MAXFREQ`` in include/linux/timex.h), so at most 0.5 ms per
   second between them: a record replayed from the buffer a day after it was
   stamped may be 43 s off; a live record read within ``SYNC_EVERY_S`` of a
   measurement is off by at most 0.3 s (by about 1 ms at this VM's 2 ppm).

Where /dev/kmsg cannot be written (the packaged unit: a user with CAP_SYSLOG and
``DeviceAllow=/dev/kmsg r``), the records themselves are the measurement
(``PrintkClock.observe``): a record read at wall time R was stamped before, so
R - stamp is an upper bound on printk's zero, and a record read right after the
kernel woke the reader is late by the wake-up only (printk wakes readers through
irq_work: within a tick). The smallest such bound of the last ``SYNC_EVERY_S`` is
the estimate, with an assumed error of ``LIVE_READ_NS`` (10 ms: a tick and a
scheduling delay; a reader held up for longer breaks it). Until a first live record
arrives, the ``dmesg -T`` assumption is all there is, and its bound counts the
drift since boot at 500 ppm: honest, and wide on a node that has been up for long.

Known issues: a wall-clock *step* (``date -s``, chrony ``makestep``) between the
stamp and the conversion, and suspend (printk's clock stops, boottime does not),
break the bound; neither is detectable here. The journal source still takes
journald's own realtime-minus-monotonic for the boot's wall time, which has the
same drift. The collector can rebuild the time from ``mono_ns`` and ``boot_id``
with a better boot time if it has one.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import NamedTuple

from firstfault.agent.hostpaths import HostPaths

log = logging.getLogger(__name__)

_NS_PER_US = 1_000
MAX_SLEW_PPM = 500  # MAXFREQ: 500000 ns/s, the kernel's cap on NTP frequency correction
SYNC_PREFIX = "firstfault-agent: printk clock sync "
SYNC_EVERY_S = 600.0
LIVE_READ_NS = 10_000_000  # assumed bound on stamp -> read of a record read when the kernel woke us


def wall_ns() -> int:
    """CLOCK_REALTIME, ns since the Unix epoch."""
    return time.time_ns()


def monotonic_ns() -> int:
    """CLOCK_MONOTONIC, ns since boot (not counting suspend)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def boottime_ns() -> int:
    """CLOCK_BOOTTIME, ns since boot (counting suspend): the base of ``dmesg -T``."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def read_boot_id(paths: HostPaths = HostPaths()) -> str:
    """The boot id, e.g. ``cb326fee-93b4-44ca-a3d3-73cf19686857``; OSError if unreadable."""
    with open(paths.boot_id, encoding="ascii") as f:
        return f.read().strip()


class BootWall(NamedTuple):
    """The wall-clock time of boot, measured now."""

    ns: int  # wall ns at boottime 0
    error_ns: int  # half the bracket of the measurement
    at_boottime_ns: int  # boottime when measured (the age of a stamp is taken from it)


def boot_wall() -> BootWall:
    """Wall time of boot = wall now - boottime now, bracketed by two wall reads."""
    w1 = time.time_ns()
    b = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    w2 = time.time_ns()
    return BootWall((w1 + w2) // 2 - b, (w2 - w1 + 1) // 2, b)


def kmsg_to_wall_ns(usec: int, boot: BootWall | None = None) -> int:
    """Wall ns of a kmsg stamp (``usec`` since boot); ``boot`` reuses one measurement."""
    return (boot or boot_wall()).ns + usec * _NS_PER_US


def kmsg_error_ns(usec: int, boot: BootWall | None = None) -> int:
    """Bound on the error of ``kmsg_to_wall_ns(usec, boot)`` (module docstring)."""
    boot = boot or boot_wall()
    drift_ns = abs(boot.at_boottime_ns - usec * _NS_PER_US) * MAX_SLEW_PPM // 1_000_000
    return boot.error_ns + _NS_PER_US + drift_ns


def sync_printk_wall(kmsg_path: str, timeout_s: float = 0.5) -> BootWall | None:
    """The wall time of printk's zero, measured with a marker written to ``kmsg_path``
    (module docstring); ``at_boottime_ns`` is the marker's stamp. None if the device
    cannot be written or the marker is not read back within ``timeout_s``."""
    nonce = os.urandom(8).hex()
    want = f"{SYNC_PREFIX}{nonce}".encode()
    try:
        fd = os.open(kmsg_path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        os.lseek(fd, 0, os.SEEK_END)
        w1 = time.time_ns()
        os.write(fd, b"<15>" + want + b"\n")  # user.debug
        w2 = time.time_ns()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                data = os.read(fd, 16384)
            except BlockingIOError:
                poller.poll(left * 1000)
                continue
            except BrokenPipeError:  # overrun: records lost to this reader, read on
                continue
            if data.partition(b";")[2].split(b"\n", 1)[0] == want and (usec := record_usec(data)) >= 0:
                stamp_ns = usec * _NS_PER_US
                return BootWall((w1 + w2) // 2 - stamp_ns, (w2 - w1 + 1) // 2, stamp_ns)
        return None
    except OSError:
        return None
    finally:
        os.close(fd)


def record_usec(data: bytes) -> int:
    """The stamp of a /dev/kmsg read (``prio,seq,usec,...;text``), cheaply; -1 if there is none."""
    try:
        return int(data.split(b",", 3)[2])
    except (IndexError, ValueError):
        return -1


def is_sync_marker(facility: int, text: str) -> bool:
    """A marker ``sync_printk_wall`` wrote (facility user): not the kernel's news."""
    return facility == 1 and text.startswith(SYNC_PREFIX)


class PrintkClock:
    """The wall time of printk's zero, kept fresh: ``get()`` measures again when the
    last measurement is older than ``every_s`` (module docstring). Thread-safe."""

    def __init__(self, kmsg_path: str, every_s: float = SYNC_EVERY_S) -> None:
        self.kmsg_path, self.every_s = kmsg_path, every_s
        self.synced: bool | None = None  # None: not tried yet; False: the dmesg -T guess
        self._warned = False
        self._boot: BootWall | None = None
        self._at = 0.0
        self._live: BootWall | None = None  # the tightest live record of the window (unsynced)
        self._live_at = 0.0
        self._lock = threading.Lock()

    def observe(self, usec: int, read_wall_ns: int) -> None:
        """A record stamped ``usec`` read at ``read_wall_ns`` right after the kernel woke the
        reader: without a marker, its upper bound on printk's zero is the estimate while
        it is the tightest of the window (module docstring)."""
        with self._lock:
            if self.synced is not False or usec < 0:
                return
            bound, now = read_wall_ns - usec * _NS_PER_US, time.monotonic()
            if self._live is None or bound < self._live.ns or now - self._live_at >= self.every_s:
                self._live, self._live_at = BootWall(bound, LIVE_READ_NS, usec * _NS_PER_US), now

    def get(self) -> BootWall:
        with self._lock:
            now = time.monotonic()
            if self._boot is None or now - self._at >= self.every_s:
                self._boot, self._at = self._measure(), now
                self.synced = self._boot is not None
                if self._boot is None:
                    self._boot = assumed_printk_wall()
                    if not self._warned:
                        log.warning("cannot measure printk's clock through %s: kernel times assume it is "
                                    "CLOCK_BOOTTIME (error bound widened)", self.kmsg_path)
                        self._warned = True
            if self.synced is False and self._live is not None:
                return self._live
            return self._boot

    def _measure(self, tries: int = 3, good_ns: int = 500_000) -> BootWall | None:
        """The tightest of up to ``tries`` measurements, stopping at one within ``good_ns``
        (a write preempted under load widens the bracket)."""
        best = None
        for _ in range(tries):
            b = sync_printk_wall(self.kmsg_path)
            if b is None:
                return best
            if best is None or b.error_ns < best.error_ns:
                best = b
            if best.error_ns <= good_ns:
                break
        return best


def assumed_printk_wall() -> BootWall:
    """The ``dmesg -T`` guess (printk's clock is CLOCK_BOOTTIME), its bound widened by
    the drift since boot at 500 ppm."""
    b = boot_wall()
    return b._replace(error_ns=b.error_ns + b.at_boottime_ns * MAX_SLEW_PPM // 1_000_000)
