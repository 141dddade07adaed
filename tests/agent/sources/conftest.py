"""Fixtures for the source tests: a thread-safe sink, a runner, leak checks, root skips.

Every test here fails if it leaves a thread running, or a kmsg, eventfd, pidfd or
cgroup file descriptor open, after its sources stopped (as watchdog's tests fail
on leaked inotify watches).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import pytest

from firstfault.agent.sources.base import Draft, Source, SourceRunner, StopEvent
from firstfault.wire import Batch

DATA = Path(__file__).resolve().parents[2] / "data"
IS_ROOT = os.geteuid() == 0
V1_MEMORY = Path("/sys/fs/cgroup/memory")
HAS_V1_MEMORY = (V1_MEMORY / "memory.usage_in_bytes").exists() and (
    V1_MEMORY / "cgroup.event_control").exists()
# a container (systemd-nspawn) shows the host's hierarchy read-only: there is nothing to make cgroups in
V1_MEMORY_WRITABLE = HAS_V1_MEMORY and os.access(V1_MEMORY, os.W_OK)

needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root")


def kmsg_problem() -> str | None:
    """Why the tests cannot write and read the real /dev/kmsg here; None when they can."""
    if not IS_ROOT:
        return "needs root (writes /dev/kmsg)"
    try:
        os.close(os.open("/dev/kmsg", os.O_RDWR | os.O_NONBLOCK))
    except OSError as e:  # a container gets none unless it is bound in
        return f"/dev/kmsg cannot be opened here ({e.strerror}), as in a container without it"
    return None


needs_kmsg = pytest.mark.skipif(kmsg_problem() is not None, reason=str(kmsg_problem()))
needs_v1_memory = pytest.mark.skipif(not (IS_ROOT and V1_MEMORY_WRITABLE),
                                     reason="needs root and a cgroup v1 memory controller it can make cgroups in "
                                            "(read-only or absent here, as in a container)")


def remove_cgroup(cg: Path) -> None:
    """Remove a test cgroup; the kernel refuses while its last task is still exiting, so retry a while."""
    for _ in range(100):
        try:
            cg.rmdir()
            return
        except OSError:
            time.sleep(0.05)


def _watched_fds() -> dict[str, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if any(k in target for k in ("eventfd", "pidfd", "kmsg", "memory.", "cgroup.")):
            out[fd] = target
    return out


@pytest.fixture(autouse=True)
def no_leaks():
    threads, fds = set(threading.enumerate()), _watched_fds()
    yield
    deadline = time.monotonic() + 3
    while True:
        extra = [t.name for t in threading.enumerate() if t not in threads and t.is_alive()]
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not extra, f"threads left running: {extra}"
    left = {fd: t for fd, t in _watched_fds().items() if fds.get(fd) != t}
    assert not left, f"descriptors left open: {left}"


class Sink:
    """``emit`` for tests: keeps drafts, checks each makes a valid wire record."""

    def __init__(self) -> None:
        self.drafts: list[Draft] = []
        self.cond = threading.Condition()
        self.times: list[float] = []

    def __call__(self, d: Draft) -> None:
        Batch((d.to_record("node-t", "stream-t", 0),)).to_wire()  # the receiver's checks
        with self.cond:
            self.drafts.append(d)
            self.times.append(time.time())
            self.cond.notify_all()

    def of(self, kind: str) -> list[Draft]:
        with self.cond:
            return [d for d in self.drafts if d.kind == kind]

    def wait_for(self, pred, timeout: float = 5.0) -> Draft:
        """The first draft matching ``pred``; AssertionError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for d in self.drafts:
                    if pred(d):
                        return d
                left = deadline - time.monotonic()
                if left <= 0:
                    kinds = [d.kind for d in self.drafts][-20:]
                    raise AssertionError(f"no matching draft in {timeout} s; last kinds: {kinds}")
                self.cond.wait(left)


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def running():
    """``with running(source, sink) as runner:`` runs it in its thread as the agent does
    (with a StopEvent); stops and joins it."""

    @contextlib.contextmanager
    def run(source: Source, emit, **kw):
        stop = StopEvent()
        runner = SourceRunner(source, emit, stop, **kw).start()
        try:
            yield runner
        finally:
            stop.set()
            assert runner.join(5), f"source {source.name} did not stop within 5 s"
            stop.close()

    return run
