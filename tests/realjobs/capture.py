"""The kernel's messages of a real job's window and the memory cgroup of the OOM scenarios.

Used by tests/realjobs/run.py (loaded by path, as run.py is by its tests). Root only:
/dev/kmsg and cgroup v1's memory controller.
"""

import os
import subprocess
import time
import uuid
from pathlib import Path

CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")


# --- kernel messages --------------------------------------------------------------


class KmsgWindow:
    """Reads /dev/kmsg records written after open() — the job's window — non-blocking."""

    def __init__(self, path="/dev/kmsg"):
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.seq_before = None
        for rec in self._drain():  # skip what was there before the job
            self.seq_before = _kmsg_seq(rec)
        self.lost = 0

    def _drain(self):
        while True:
            try:
                rec = os.read(self.fd, 16384)
            except BlockingIOError:
                return
            except BrokenPipeError:  # records overwritten before we read them
                self.lost += 1
                continue
            if not rec:
                return
            yield rec

    def read(self):
        self.lost = 0
        records = list(self._drain())
        os.close(self.fd)
        return records


def _kmsg_seq(rec):
    return int(rec.split(b";", 1)[0].split(b",")[1])


def _kmsg_usec(rec):
    return int(rec.split(b";", 1)[0].split(b",")[2])


def _dmesg_records(text):
    """Group dmesg output lines into records: a record starts with '['."""
    records = []
    for line in text.splitlines(keepends=True):
        if line.startswith("[") or not records:
            records.append(line)
        else:
            records[-1] += line
    return records


def dmesg_window(first_usec, last_usec):
    """`dmesg` and `dmesg -T` records whose timestamps lie in [first_usec, last_usec].

    Both outputs are read back to back and aligned record by record; the window is
    chosen on the plain output, whose timestamps are the kmsg microseconds.
    """
    for _ in range(5):
        plain = _dmesg_records(subprocess.run(["dmesg"], capture_output=True, text=True, errors="replace",
                                              check=True).stdout)
        human = _dmesg_records(subprocess.run(["dmesg", "-T"], capture_output=True, text=True, errors="replace",
                                              check=True).stdout)
        if len(plain) == len(human):
            break
    else:
        raise RuntimeError("dmesg and dmesg -T kept returning different record counts")
    keep = []
    for i, rec in enumerate(plain):
        stamp = rec[1:rec.index("]")].strip()
        secs, _, frac = stamp.partition(".")
        usec = int(secs) * 1_000_000 + int(frac.ljust(6, "0"))
        if first_usec <= usec <= last_usec:
            keep.append(i)
    return "".join(plain[i] for i in keep), "".join(human[i] for i in keep)


def clock_sample():
    """The clocks at one instant: kmsg ``usec`` → wall time is ``wall_s - boottime_s + usec/1e6``.

    ``btime`` (/proc/stat, whole seconds) is what ``dmesg -T`` adds to the record time here,
    so its lines can read up to a second early, then are cut to whole seconds.
    """
    with open("/proc/stat") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    return {"wall_s": time.time(), "boottime_s": time.clock_gettime(time.CLOCK_BOOTTIME),
            "monotonic_s": time.clock_gettime(time.CLOCK_MONOTONIC), "proc_stat_btime_s": btime}


def capture_kernel(window, out):
    records = window.read()
    (out / "kmsg.txt").write_bytes(b"".join(records))
    info = {"seq_before": window.seq_before, "records": len(records), "lost_reads": window.lost,
            "clock": clock_sample()}
    if records:
        info["first_seq"], info["last_seq"] = _kmsg_seq(records[0]), _kmsg_seq(records[-1])
        plain, human = dmesg_window(_kmsg_usec(records[0]), _kmsg_usec(records[-1]))
    else:
        plain = human = ""
    (out / "dmesg.txt").write_text(plain)
    (out / "dmesg-T.txt").write_text(human)
    return info


# --- memory cgroup ------------------------------------------------------------------


def make_cgroup(limit_bytes):
    path = CGROUP_V1_MEMORY / f"firstfault-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
    return path


def close_cgroup(path):
    """Read the cgroup's OOM counters, then remove it (moving stragglers out first)."""
    info = {"path": str(path), "limit_in_bytes": int((path / "memory.limit_in_bytes").read_text())}
    for name in ("memory.oom_control", "memory.max_usage_in_bytes", "memory.failcnt"):
        info[name] = (path / name).read_text().strip()
    for _ in range(50):
        pids = (path / "cgroup.procs").read_text().split()
        for pid in pids:
            try:
                (CGROUP_V1_MEMORY / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # it exited meanwhile
        try:
            path.rmdir()
            return info
        except OSError:
            time.sleep(0.1)
    info["not_removed"] = True
    return info


def kmsg_mark(text):
    """Write one line of our own into the kernel log (root): it brackets the job's window, so
    an empty window still shows which time the kernel log covers."""
    with open("/dev/kmsg", "w") as f:
        f.write(text + "\n")
