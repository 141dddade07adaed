"""Tests of firstfault/agent/tail/follow.py: named glob parts, and the FollowLoop on real
inotify (wakes, new files, directories made later, the safety poll, stopping, quiet lines)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from firstfault.agent.tail import Line, Tailer, TailError
from firstfault.agent.tail.follow import FollowLoop, compile_glob
from tests.agent.tail.conftest import open_fds
from tests.agent.tail.tailmodel import datas, write

# -- globs ------------------------------------------------------------------------------

def test_compile_glob_named_parts():
    g, rx = compile_glob("/logs/{job}/rank{rank:\\d+}.log")
    assert g == "/logs/*/rank*.log"
    assert rx.fullmatch("/logs/j-42/rank12.log").groupdict() == {"job": "j-42", "rank": "12"}
    assert rx.fullmatch("/logs/a/b/rank1.log") is None and rx.fullmatch("/logs/j/rankX.log") is None
    g, rx = compile_glob("/l/[!x]?/*.lo[gh]")
    assert g == "/l/[!x]?/*.lo[gh]" and rx.fullmatch("/l/ab/q.log") and not rx.fullmatch("/l/xb/q.log")
    assert rx.fullmatch("/l/a.b/q.log") is None  # [!x]? is two characters
    with pytest.raises(ValueError):
        compile_glob("/l/{job}/{job}.log")
    with pytest.raises(ValueError):
        compile_glob("/l/{1bad}.log")


# -- the follow loop (real inotify) --------------------------------------------------------

def _run_loop(tmp_path, globs, safety_poll_s=3600.0, **tailer_kw):
    got: list[Line] = []
    events = []
    stop = threading.Event()
    tailer = Tailer(tmp_path / "state.json", **tailer_kw)
    loop = FollowLoop(tailer, globs, got.extend, stop, on_events=events.extend,
                      safety_poll_s=safety_poll_s)
    th = threading.Thread(target=loop.run, name="follow-loop-test")
    th.start()
    return loop, th, got, events, tailer


def test_follow_loop_reads_the_writes_of_one_min_wake_together(tmp_path):
    calls: list[int] = []
    stop = threading.Event()
    path = tmp_path / "rank0.log"
    write(path, b"ready\n")
    loop = FollowLoop(Tailer(tmp_path / "state.json"), [str(tmp_path / "rank{rank}.log")],
                      lambda lines: calls.append(len(lines)), stop, safety_poll_s=3600,
                      min_wake_s=0.5)
    th = threading.Thread(target=loop.run, name="follow-loop-test")
    th.start()
    try:
        assert _wait(lambda: calls == [1])  # the loop runs
        calls.clear()
        t0 = time.monotonic()
        for i in range(20):  # 20 writes within ~0.2 s, all in one gap after the last wake
            with open(path, "ab") as f:
                f.write(b"line %d\n" % i)
            time.sleep(0.01)
        writing_s = time.monotonic() - t0
        assert _wait(lambda: sum(calls) == 20)
        if writing_s < 0.45:  # the machine kept up: the writes fit one gap
            assert len(calls) <= 2, calls
    finally:
        loop.stop()
        th.join(10)


def _writing_loop(tmp_path, files: int, seconds: float, **loop_kw):
    """Append a line to each of ``files`` files every 10 ms for ``seconds`` under a
    FollowLoop; (lines per delivery, seconds the writing took)."""
    calls: list[int] = []
    stop = threading.Event()
    tmp_path.mkdir(parents=True, exist_ok=True)
    paths = [tmp_path / f"rank{i}.log" for i in range(files)]
    for p in paths:
        write(p, b"ready\n")
    loop = FollowLoop(Tailer(tmp_path / "state.json"), [str(tmp_path / "rank{rank}.log")],
                      lambda lines: calls.append(len(lines)), stop, safety_poll_s=3600, **loop_kw)
    th = threading.Thread(target=loop.run, name="follow-loop-test")
    th.start()
    try:
        assert _wait(lambda: sum(calls) == files)
        calls.clear()
        t0, n = time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            for p in paths:
                with open(p, "ab") as f:
                    f.write(b"line %d\n" % n)
            n += 1
            time.sleep(0.01)
        writing_s = time.monotonic() - t0
        assert _wait(lambda: sum(calls) == n * files), (sum(calls), n * files)
        return calls, writing_s
    finally:
        loop.stop()
        th.join(10)


def test_follow_loop_spaces_wakes_by_the_files_they_polled(tmp_path):
    # 20 changed files a wake at 100 polls/s: a wake waits 0.2 s, not min_wake_s
    calls, writing_s = _writing_loop(tmp_path, 20, 1.0, min_wake_s=0.01, max_polls_per_s=100)
    assert len(calls) <= writing_s / 0.2 + 2, (calls, writing_s)
    # the same files without a tight budget wake every min_wake_s: many more deliveries
    calls_free, writing_free_s = _writing_loop(tmp_path / "free", 20, 1.0, min_wake_s=0.01,
                                               max_polls_per_s=1e9)
    if writing_free_s < 1.5:  # the machine kept up
        assert len(calls_free) > 2 * len(calls), (calls_free, calls)


def test_follow_loop_budget_waits_at_most_max_wake(tmp_path):
    # 1 poll/s would wait 5 s after polling 5 files; MAX_WAKE_S caps it
    calls, writing_s = _writing_loop(tmp_path, 5, 1.0, min_wake_s=0.01, max_polls_per_s=1)
    assert len(calls) >= writing_s / (2 * FollowLoop.MAX_WAKE_S), (calls, writing_s)


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_follow_loop_picks_up_a_new_file_by_inotify_alone(tmp_path):
    logs = tmp_path / "logs"
    (logs / "job1").mkdir(parents=True)
    write(logs / "job1" / "rank0.log", b"before start\n")
    inotify_before = open_fds(tmp_path)[0]
    loop, th, got, events, tailer = _run_loop(tmp_path, [str(logs / "{job}" / "rank{rank}.log")])
    try:
        assert _wait(lambda: len(got) == 1)
        assert open_fds(tmp_path)[0] == inotify_before + 1  # what the leak fixture counts is real
        write(logs / "job1" / "rank1.log", b"hello from rank 1\n")  # a new file, same dir
        (logs / "job2").mkdir()  # a new directory below the watched one
        write(logs / "job2" / "rank7.log", b"job 2 rank 7\n")
        assert _wait(lambda: len(got) == 3), datas(got)
        by = {ln.data: dict(ln.fields) for ln in got}
        assert by[b"hello from rank 1"] == {"job": "job1", "rank": "1"}
        assert by[b"job 2 rank 7"] == {"job": "job2", "rank": "7"}
        write(logs / "job1" / "rank1.log", b"appended\n")
        os.rename(logs / "job1" / "rank1.log", logs / "job1" / "rank1.log.1")
        write(logs / "job1" / "rank1.log", b"after rotation\n")
        write(logs / "job1" / "other.txt", b"not followed\n")
        assert _wait(lambda: len(got) == 5), datas(got)
        assert datas(got)[3:] == [b"appended", b"after rotation"]
    finally:
        loop.stop()
        th.join(10)
    assert not th.is_alive()
    with pytest.raises(TailError):  # the loop closed the tailer on its way out
        tailer.poll_file(str(logs / "job1" / "rank0.log"))


def test_follow_loop_base_directory_created_later(tmp_path):
    loop, th, got, events, tailer = _run_loop(tmp_path, [str(tmp_path / "later" / "r{rank}.log")])
    try:
        time.sleep(0.2)
        (tmp_path / "later").mkdir()
        assert _wait(lambda: loop._watches and list(loop._watches) == [str(tmp_path / "later")])
        write(tmp_path / "later" / "r3.log", b"x\n")
        assert _wait(lambda: datas(got) == [b"x"])
    finally:
        loop.stop()
        th.join(10)


def test_follow_loop_safety_poll_catches_what_events_missed(tmp_path, monkeypatch):
    write(tmp_path / "r0.log", b"a\n")
    monkeypatch.setattr(FollowLoop, "_take_events", lambda self, events: None)  # inotify deaf
    loop, th, got, events, tailer = _run_loop(tmp_path, [str(tmp_path / "r{rank}.log")],
                                              safety_poll_s=0.2)
    try:
        assert _wait(lambda: len(got) == 1)
        write(tmp_path / "r0.log", b"b\n")
        write(tmp_path / "r1.log", b"c\n")
        assert _wait(lambda: sorted(datas(got)) == [b"a", b"b", b"c"])
    finally:
        loop.stop()
        th.join(10)


def test_follow_loop_polls_only_the_files_inotify_names(tmp_path, monkeypatch):
    """A wake polls the paths its events name (a poll costs a stat and preads): a quiet
    file is not polled while another one is written, until the safety poll."""
    for r in range(3):
        write(tmp_path / f"r{r}.log", b"start\n")
    polled: list[str] = []
    poll_path = Tailer.poll_path
    monkeypatch.setattr(Tailer, "poll_path", lambda self, path, *a: polled.append(path) or poll_path(self, path, *a))
    loop, th, got, events, tailer = _run_loop(tmp_path, [str(tmp_path / "r{rank}.log")])
    try:
        assert _wait(lambda: len(got) == 3)
        polled.clear()
        for i in range(5):
            write(tmp_path / "r1.log", b"more %d\n" % i)
            time.sleep(0.03)
        assert _wait(lambda: len(got) == 8)
        assert set(polled) == {str(tmp_path / "r1.log")}
    finally:
        loop.stop()
        th.join(10)


def test_follow_loop_stops_cleanly_on_the_stop_event_alone(tmp_path):
    loop, th, got, events, tailer = _run_loop(tmp_path, [str(tmp_path / "*.log")])
    time.sleep(0.1)
    loop.stop_event.set()  # no wake: the loop notices within STOP_CHECK_S
    th.join(FollowLoop.STOP_CHECK_S + 5)
    assert not th.is_alive()


def test_follow_loop_flushes_a_quiet_partial_line_on_time(tmp_path):
    loop, th, got, events, tailer = _run_loop(tmp_path, [str(tmp_path / "r{rank}.log")],
                                              partial_flush_s=0.3)
    try:
        time.sleep(0.1)
        t0 = time.monotonic()
        write(tmp_path / "r0.log", b"Fatal Python error: Aborted")  # the last words, no newline
        assert _wait(lambda: datas(got) == [b"Fatal Python error: Aborted"])
        assert 0.25 < time.monotonic() - t0 < 8  # on time, give or take a loaded CI machine
    finally:
        loop.stop()
        th.join(10)
