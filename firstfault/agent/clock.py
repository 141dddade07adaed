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

kmsg time to wall time, as ``dmesg -T`` does (knowledge/FACTS.md):

    wall_ns = time.time_ns() - clock_gettime_ns(CLOCK_BOOTTIME) + usec * 1000

``/proc/stat`` btime is whole seconds (0.2 s off seen here), so it is not used.

Error bound (``kmsg_error_ns``): the conversion assumes the wall clock ran at the
rate of the printk clock since the record was stamped. It is off by

1. half the time between the two clock reads that estimate the boot's wall time
   (``boot_wall()`` brackets the boottime read with two wall reads; ~100 ns),
2. the stamp's resolution (1 µs),
3. the NTP frequency correction since the stamp: the kernel caps it at 500 ppm
   (``MAXFREQ`` in include/linux/timex.h), so at most 0.5 ms per second of age:
   a record replayed from the buffer a day after boot may be 43 s off, a live
   record is off by microseconds.

Known issues: a wall-clock *step* (``date -s``, chrony ``makestep``) between the
stamp and the conversion, and suspend (printk's clock stops, boottime does not),
break the bound; neither is detectable here. The collector can rebuild the time
from ``mono_ns`` and ``boot_id`` with a better boot time if it has one.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from firstfault.agent.hostpaths import HostPaths

_NS_PER_US = 1_000
MAX_SLEW_PPM = 500  # MAXFREQ: 500000 ns/s, the kernel's cap on NTP frequency correction


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
    age_ns = max(0, boot.at_boottime_ns - usec * _NS_PER_US)
    return boot.error_ns + _NS_PER_US + age_ns * MAX_SLEW_PPM // 1_000_000
