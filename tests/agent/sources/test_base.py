"""The source interface: Draft, SourceRunner (failures become status records), registry,
HostPaths and the clocks."""

from __future__ import annotations

import os
import random
import re
import select
import threading
import time

import pytest

from firstfault.agent import clock
from firstfault.agent.hostpaths import HostPaths
from firstfault.agent.sources import (
    Draft,
    PollingSource,
    Source,
    SourceError,
    SourceRunner,
    UnknownSourceError,
    cgroup,
    get,
    kmsg,
    marks,
    names,
    register,
)
from firstfault.agent.sources.base import REGISTRY, StopEvent, clip
from firstfault.agent.sources.cgroup import CgroupSource
from firstfault.agent.sources.kmsg import KmsgSource
from firstfault.agent.sources.marks import MarksSource
from firstfault.agent.sources.procs import ProcsSource
from firstfault.agent.sources.ranklog import RanklogSource
from firstfault.agent.tail.follow import FollowLoop
from firstfault.wire import Record


def test_draft_to_record_keeps_every_field():
    d = Draft(source="kmsg", kind="kernel.line", message="m", occurred_ns=5, observed_ns=6,
              boot_id="b", mono_ns=7, job="j", rank=1, local_rank=0, pid=42, severity=3,
              fields={"seq": 9})
    assert d.to_record("n", "s", 11) == Record(
        node="n", stream="s", seq=11, source="kmsg", kind="kernel.line", message="m",
        occurred_ns=5, observed_ns=6, boot_id="b", mono_ns=7, job="j", rank=1, local_rank=0,
        pid=42, severity=3, fields={"seq": 9})


def test_source_draft_stamps_source_and_observed_time():
    before = time.time_ns()
    d = KmsgSource().draft("kernel.line", "x", fields={"seq": 1})
    assert d.source == "kmsg" and before <= d.observed_ns <= time.time_ns() and d.severity == 6


def test_clip_cuts_on_a_character_boundary():
    assert clip("abc") == "abc"
    cut = clip("é" * 1000, 1001)  # 2 bytes each
    assert cut == "é" * 500 and len(cut.encode()) == 1000


class Flaky(Source):
    name = "flaky_test"

    def __init__(self, fail_times: int) -> None:
        super().__init__()
        self.fail_times, self.runs = fail_times, 0

    def run(self, emit, stop):
        self.runs += 1
        if self.runs <= self.fail_times:
            raise RuntimeError(f"boom {self.runs}")
        emit(self.draft("kernel.line", "working"))
        stop.wait()


def _states(sink):
    return [(d.fields["state"], d.fields.get("attempt")) for d in sink.of("agent.status")]


def test_runner_turns_failures_into_status_records_and_retries(sink, running):
    src = Flaky(fail_times=2)
    with running(src, sink, backoff_initial_s=0.01, backoff_max_s=0.02):
        sink.wait_for(lambda d: d.message == "working")
    assert _states(sink) == [("running", 1), ("failed", 1), ("running", 2), ("failed", 2),
                             ("running", 3), ("stopped", None)]
    failed = sink.of("agent.status")[1]
    assert failed.source == "agent" and failed.severity == 3
    assert failed.fields["source"] == "flaky_test" and failed.fields["error"] == "RuntimeError: boom 1"
    assert 0.005 <= failed.fields["retry_in_s"] <= 0.01
    assert sink.of("agent.status")[-1].fields == {"source": "flaky_test", "state": "stopped",
                                                  "error": None}


def test_runner_retries_a_source_that_returns_before_stop(sink, running):
    class Quitter(Source):
        name = "quitter_test"

        def run(self, emit, stop):
            return None

    with running(Quitter(), sink, backoff_initial_s=0.01, backoff_max_s=0.01):
        sink.wait_for(lambda d: d.fields.get("attempt") == 3)
    errors = {d.fields["error"] for d in sink.of("agent.status") if d.fields["state"] == "failed"}
    assert errors == {"run() returned before stop"}


def test_runner_survives_an_emit_that_raises(running):
    def broken_emit(d):
        raise OSError("spool full")

    src = Flaky(fail_times=1)
    with running(src, broken_emit, backoff_initial_s=0.01, backoff_max_s=0.01) as runner:
        deadline = time.monotonic() + 3
        while src.runs < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runner.thread.is_alive()  # emit failing inside run() is a failed run, retried
    assert src.runs >= 3


def test_backoff_is_exponential_with_jitter_and_capped():
    runner = SourceRunner(Flaky(0), lambda d: None, threading.Event(), backoff_initial_s=1,
                          backoff_max_s=60, rng=random.Random(7))
    for n, base in ((1, 1), (2, 2), (3, 4), (6, 32), (7, 60), (50, 60)):
        delays = [runner.backoff_s(n) for _ in range(200)]
        assert base * 0.5 <= min(delays) and max(delays) <= base
        assert max(delays) - min(delays) > base * 0.3  # jittered, not fixed


def test_polling_source_polls_until_stopped_and_closes_once(sink, running):
    class Counter(PollingSource):
        name = "counter_test"
        interval_s = 0.01

        def __init__(self):
            super().__init__()
            self.closed = 0

        def poll(self):
            return [self.draft("cgroup.memory", fields={"n": 1})]

        def close(self):
            self.closed += 1

    src = Counter()
    with running(src, sink):
        sink.wait_for(lambda d: len(sink.of("cgroup.memory")) >= 5)
    assert src.closed == 1


def test_a_stop_event_is_readable_once_set_until_cleared():
    ev = StopEvent()
    try:
        assert select.select([ev], [], [], 0)[0] == []
        ev.set()
        assert ev.is_set() and select.select([ev], [], [], 0)[0] == [ev]
        ev.set()  # twice: still one flag
        ev.clear()
        assert not ev.is_set() and select.select([ev], [], [], 0)[0] == []
    finally:
        ev.close()


@pytest.mark.parametrize("name", ["kmsg", "cgroup", "marks", "ranklog"])
def test_sources_that_wait_on_descriptors_wake_on_the_stop_event(monkeypatch, tmp_path, sink,
                                                                  running, name):
    """Their look at a plain Event made an hour apart: only the StopEvent's descriptor
    can end their wait within the runner's 5 s (an idle agent wakes for nothing)."""
    monkeypatch.setattr(kmsg, "POLL_TIMEOUT_MS", 3_600_000)
    monkeypatch.setattr(cgroup, "STOP_SLICE_S", 3600)
    monkeypatch.setattr(marks, "STOP_SLICE_S", 3600)
    monkeypatch.setattr(FollowLoop, "STOP_CHECK_S", 3600)
    src = {"kmsg": lambda: KmsgSource(state_dir=str(tmp_path)),
           "cgroup": lambda: CgroupSource(v1_root=str(tmp_path / "none"), v2_root=str(tmp_path / "none"),
                                          interval_s=3600),
           "marks": lambda: MarksSource(state_dir=str(tmp_path), rescan_s=3600),
           "ranklog": lambda: RanklogSource(globs=[str(tmp_path / "rank{rank}.log")],
                                            state_dir=str(tmp_path), safety_poll_s=3600)}[name]()
    if name == "kmsg" and KmsgSource.unavailable(src.paths):
        pytest.skip(KmsgSource.unavailable(src.paths))
    with running(src, sink):  # joins within 5 s or fails
        time.sleep(0.5)  # in its wait by now
    assert sink.of("agent.status")[-1].fields["state"] == "stopped"


def test_polling_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        CgroupSource(interval_s=0)


def test_registry_finds_each_source_by_its_module_name():
    assert {"kmsg", "cgroup", "procs"} <= set(names())
    assert get("kmsg") is KmsgSource and get("cgroup") is CgroupSource and get("procs") is ProcsSource
    for name in ("kmsg", "cgroup", "procs"):
        assert get(name).name == name


def test_registry_rejects_unknown_names_and_name_clashes():
    with pytest.raises(UnknownSourceError, match="known sources: .*kmsg"):
        get("kmesg")
    assert issubclass(UnknownSourceError, SourceError)

    class Clash(Source):
        name = "kmsg"

    with pytest.raises(ValueError, match="taken"):
        register(Clash)

    class Bad(Source):
        name = "not a name"

    with pytest.raises(ValueError, match="module-like"):
        register(Bad)
    assert REGISTRY["kmsg"] is KmsgSource


def test_hostpaths_from_a_root_prefix():
    assert HostPaths() == HostPaths.from_root("/") == HostPaths("/proc", "/sys", "/dev", "/run")
    h = HostPaths.from_root("/host/")
    assert (h.proc, h.sys, h.dev, h.run) == ("/host/proc", "/host/sys", "/host/dev", "/host/run")
    assert h.kmsg == "/host/dev/kmsg" and h.pid(42, "environ") == "/host/proc/42/environ"
    assert h.boot_id == "/host/proc/sys/kernel/random/boot_id"
    assert h.cgroup_root == "/host/sys/fs/cgroup" and not h.is_default_proc
    assert HostPaths(proc="/tmp/x/").proc == "/tmp/x" and HostPaths().is_default_proc
    with pytest.raises(AttributeError):
        h.proc = "/proc"  # frozen


def test_boot_id_and_clocks():
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                        clock.read_boot_id())
    assert clock.monotonic_ns() <= clock.boottime_ns()
    assert abs(clock.wall_ns() - time.time_ns()) < 10**9


def test_kmsg_time_to_wall_time_and_its_error_bound():
    boot = clock.boot_wall()
    assert boot.error_ns < 10**6  # two wall reads around one boottime read
    now_usec = clock.boottime_ns() // 1000
    assert abs(clock.kmsg_to_wall_ns(now_usec) - time.time_ns()) < 10**7
    assert clock.kmsg_to_wall_ns(now_usec, boot) == boot.ns + now_usec * 1000
    fresh = clock.kmsg_error_ns(boot.at_boottime_ns // 1000, boot)
    day_old = clock.kmsg_error_ns(max(0, boot.at_boottime_ns // 1000 - 86_400 * 10**6), boot)
    assert fresh < 10**6 and fresh <= day_old <= fresh + 86_400 * 500_000  # 500 ppm of a day


@pytest.mark.root
@pytest.mark.skipif(not os.access("/dev/kmsg", os.W_OK), reason="needs a writable /dev/kmsg (root)")
def test_printk_clock_is_measured_with_a_marker_and_a_later_line_lands_within_its_bound():
    c = clock.PrintkClock("/dev/kmsg")
    boot = c.get()  # the tightest of up to 3 markers
    assert c.synced and boot.error_ns < 10**6
    text = f"firstfault-clock-test {os.urandom(8).hex()}"
    before = time.time_ns()
    with open("/dev/kmsg", "wb", buffering=0) as f:
        f.write(f"<7>{text}\n".encode())
    after = time.time_ns()
    with open("/dev/kmsg", "rb", buffering=0) as f:
        os.set_blocking(f.fileno(), False)
        usec = next(int(r.split(b",")[2]) for r in iter(lambda: f.read(16384), None)
                    if r.split(b";", 1)[1].startswith(text.encode()))
    at, err = clock.kmsg_to_wall_ns(usec, boot), clock.kmsg_error_ns(usec, boot)
    assert before - err <= at <= after + err and err < 2 * 10**6


def test_printk_clock_without_a_writable_kmsg_falls_back_to_the_boottime_guess_with_a_wide_bound(tmp_path):
    assert clock.sync_printk_wall(str(tmp_path / "no-kmsg")) is None
    c = clock.PrintkClock(str(tmp_path / "no-kmsg"))
    boot = c.get()
    assert c.synced is False and c.get() is boot  # not tried again before every_s
    guess = clock.boot_wall()
    assert abs(boot.ns - guess.ns) < 10**7
    assert boot.error_ns >= guess.at_boottime_ns * clock.MAX_SLEW_PPM // 10**6  # drift since boot


def test_printk_clock_without_a_marker_takes_the_tightest_live_record_of_the_window(tmp_path, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(clock.time, "monotonic", lambda: now[0])
    c = clock.PrintkClock(str(tmp_path / "no-kmsg"), every_s=600)
    c.observe(5_000_000, 10**18)  # before the first get(): not known to be unsynced yet
    guess = c.get()
    assert c.synced is False and guess.error_ns > clock.LIVE_READ_NS
    c.observe(-1, 10**18)  # no stamp: ignored
    assert c.get() is guess
    c.observe(5_000_000, 10**18 + 7_000)  # read 7 µs late on the wall clock
    assert c.get() == clock.BootWall(10**18 + 7_000 - 5 * 10**9, clock.LIVE_READ_NS, 5 * 10**9)
    c.observe(6_000_000, 10**18 + 10**9 + 2_000)  # a tighter one wins
    assert c.get().ns == 10**18 + 2_000 - 5 * 10**9
    c.observe(7_000_000, 10**18 + 2 * 10**9 + 90_000)  # a looser one does not, within the window
    assert c.get().ns == 10**18 + 2_000 - 5 * 10**9
    now[0] += 600  # the window is over: the next live record starts the next one
    c.observe(8_000_000, 10**18 + 3 * 10**9 + 50_000)
    best = c.get()
    assert best.ns == 10**18 + 50_000 - 5 * 10**9 and best.at_boottime_ns == 8 * 10**9
    assert clock.kmsg_error_ns(8_000_000, best) == clock.LIVE_READ_NS + 1000


@pytest.mark.root
@pytest.mark.skipif(not os.access("/dev/kmsg", os.W_OK), reason="needs a writable /dev/kmsg (root)")
def test_kmsg_source_that_cannot_write_its_marker_times_a_live_record_by_its_read(tmp_path, sink, running,
                                                                                  monkeypatch):
    monkeypatch.setattr(clock, "sync_printk_wall", lambda path, timeout_s=0.5: None)  # as the unit's user
    text = f"firstfault-live-clock-test {os.urandom(8).hex()}"
    with running(KmsgSource(state_dir=str(tmp_path)), sink):
        # the buffer drained (a line written now arrives only after the backlog before it, however
        # long a loaded machine takes): what comes next is read when the kernel wakes us
        drained = f"firstfault-live-clock-drained {os.urandom(8).hex()}"
        with open("/dev/kmsg", "wb", buffering=0) as f:
            f.write(f"<6>{drained}\n".encode())
        sink.wait_for(lambda d: d.kind == "kernel.line" and d.message == drained, timeout=60.0)
        time.sleep(0.05)  # back in poll()
        before = time.time_ns()
        with open("/dev/kmsg", "wb", buffering=0) as f:
            f.write(f"<6>{text}\n".encode())
        d = sink.wait_for(lambda d: d.kind == "kernel.line" and d.message == text)
    assert not [x for x in sink.of("kernel.line") if x.message.startswith(clock.SYNC_PREFIX)]
    err = d.fields["clock_error_ns"]
    assert before <= d.occurred_ns <= d.observed_ns  # no later than read, no earlier than written
    assert clock.LIVE_READ_NS < err < clock.LIVE_READ_NS + 10**6  # not the dmesg -T guess's bound


def test_emit_many_uses_the_sinks_batch_method_else_one_by_one():
    from firstfault.agent.sources.base import emit_many

    class Sink:
        def __init__(self):
            self.calls = []

        def __call__(self, d):
            self.calls.append(("one", d))

        def many(self, rows):
            self.calls.append(("many", list(rows)))

    sink = Sink()
    emit_many(sink)([1, 2])
    assert sink.calls == [("many", [1, 2])]
    out: list = []
    emit_many(out.append)([1, 2, 3])
    assert out == [1, 2, 3]
