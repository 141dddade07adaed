"""firstfault/agent/tail/inotify.py against the real kernel, and FollowLoop's handling of what it reads."""

from __future__ import annotations

import os
import shutil
import struct
import threading
from pathlib import Path

import pytest

from firstfault.agent.tail import Tailer
from firstfault.agent.tail.follow import WATCH_MASK, FollowLoop
from firstfault.agent.tail.inotify import (
    IN_CREATE,
    IN_DELETE,
    IN_IGNORED,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Inotify,
    InotifyEvent,
    parse_events,
)
from tests.agent.tail.tailmodel import datas, write
from tests.agent.tail.test_follow import _wait


def test_the_kernels_events_for_a_directory_come_in_one_read(tmp_path):
    with Inotify() as ino:
        wd = ino.add_watch(str(tmp_path), WATCH_MASK)
        assert ino.read() == []  # nothing yet: non-blocking
        write(tmp_path / "rank0.log", b"a\n")
        os.rename(tmp_path / "rank0.log", tmp_path / "rank0.log.1")
        (tmp_path / "sub").mkdir()
        os.unlink(tmp_path / "rank0.log.1")
        got = [(e.wd, e.mask, e.name) for e in ino.read()]
        assert got[0] == (wd, IN_CREATE, "rank0.log")
        assert (wd, IN_MODIFY, "rank0.log") in got
        moved = [e for e in got if e[1] in (IN_MOVED_FROM, IN_MOVED_TO)]
        assert moved == [(wd, IN_MOVED_FROM, "rank0.log"), (wd, IN_MOVED_TO, "rank0.log.1")]
        assert got[-2:] == [(wd, IN_CREATE | IN_ISDIR, "sub"), (wd, IN_DELETE, "rank0.log.1")]
        assert ino.add_watch(str(tmp_path), WATCH_MASK) == wd  # the same directory: the same wd
        ino.rm_watch(wd)
        assert [(e.wd, e.mask) for e in ino.read()] == [(wd, IN_IGNORED)]
        ino.rm_watch(wd)  # gone already: ignored
        with pytest.raises(OSError, match="inotify_add_watch"):
            ino.add_watch(str(tmp_path / "missing"), WATCH_MASK)
    assert ino.fd == -1


def test_a_full_kernel_queue_reads_as_an_overflow_event(tmp_path):
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if limit > 100_000:
        pytest.skip(f"max_queued_events is {limit}: too many writes to fill")
    a, b = tmp_path / "a", tmp_path / "b"
    with Inotify() as ino, open(a, "ab", buffering=0) as fa, open(b, "ab", buffering=0) as fb:
        ino.add_watch(str(tmp_path), WATCH_MASK)
        for _ in range(limit // 2 + 1):  # alternate files: equal events in a row are merged
            fa.write(b"x")
            fb.write(b"x")
        events = []
        while batch := ino.read():  # each read's repeats are left out
            events += batch
    assert events[-1] == InotifyEvent(-1, IN_Q_OVERFLOW, 0, "")
    assert {(e.mask, e.name) for e in events[:-1]} == {(IN_MODIFY, "a"), (IN_MODIFY, "b")}


def _event(wd, mask, name):
    return struct.pack("iIII", wd, mask, 0, 16) + name.ljust(16, b"\0")


def test_parse_events_keeps_the_first_of_identical_events_in_order():
    a, b = _event(3, IN_MODIFY, b"rank0.log"), _event(3, IN_MODIFY, b"rank1.log")
    c = _event(3, IN_CREATE, b"rank0.log")
    assert parse_events(a + b + a + c + b + a) == [
        InotifyEvent(3, IN_MODIFY, 0, "rank0.log"), InotifyEvent(3, IN_MODIFY, 0, "rank1.log"),
        InotifyEvent(3, IN_CREATE, 0, "rank0.log")]


def test_parse_events_of_mixed_sizes_that_look_like_records_of_one_size():
    """The first event's size divides the buffer, but the records are not all that size:
    the exact walk, not the cut into equal records."""
    big, small = _event(3, IN_MODIFY, b"rank0.log"), struct.pack("iIII", 3, IN_IGNORED, 0, 0)
    assert len(big) == 2 * len(small)
    assert parse_events(big + small + small + big) == [
        InotifyEvent(3, IN_MODIFY, 0, "rank0.log"), InotifyEvent(3, IN_IGNORED, 0, "")]


def test_parse_events_rejects_a_cut_buffer():
    one = _event(3, IN_CREATE, b"rank0.log")
    assert parse_events(one * 2) == [InotifyEvent(3, IN_CREATE, 0, "rank0.log")]
    with pytest.raises(ValueError, match="truncated"):
        parse_events(one[:-1])
    with pytest.raises(ValueError, match="inside an event header"):
        parse_events(one + one[:8])


def test_an_overflow_makes_the_follow_loop_poll_every_file(tmp_path, monkeypatch):
    """Events lost to an overflow: the loop reads every followed file at once."""
    deaf = threading.Event()
    real_read = Inotify.read

    def read(self):  # the kernel's queue overflowed: all that comes is the overflow event
        events = real_read(self)
        if deaf.is_set():
            return [InotifyEvent(-1, IN_Q_OVERFLOW, 0, "")] if events else []
        return events

    monkeypatch.setattr(Inotify, "read", read)
    got, stop = [], threading.Event()
    loop = FollowLoop(Tailer(None), [str(tmp_path / "r{rank}.log")], got.extend, stop,
                      safety_poll_s=3600)
    th = threading.Thread(target=loop.run)
    th.start()
    try:
        write(tmp_path / "r0.log", b"a\n")
        assert _wait(lambda: datas(got) == [b"a"])
        deaf.set()
        write(tmp_path / "r0.log", b"b\n")
        write(tmp_path / "r1.log", b"c\n")
        assert _wait(lambda: sorted(datas(got)) == [b"a", b"b", b"c"])
    finally:
        loop.stop()
        th.join(10)
    assert not th.is_alive()



def test_a_deleted_and_recreated_job_directory_is_watched_again(tmp_path):
    """The watch of a deleted directory goes (IN_IGNORED); its successor gets its own."""
    got, stop = [], threading.Event()
    loop = FollowLoop(Tailer(None), [str(tmp_path / "{job}" / "r{rank}.log")], got.extend, stop,
                      safety_poll_s=3600)  # inotify alone
    th = threading.Thread(target=loop.run)
    th.start()
    try:
        job = tmp_path / "j1"
        job.mkdir()
        assert _wait(lambda: str(job) in loop._watches)
        write(job / "r0.log", b"a\n")
        assert _wait(lambda: datas(got) == [b"a"])
        old_wd = loop._watches[str(job)][0]
        shutil.rmtree(job)
        assert _wait(lambda: str(job) not in loop._watches and old_wd not in loop._dirs)
        job.mkdir()
        assert _wait(lambda: str(job) in loop._watches)
        write(job / "r0.log", b"b\n")
        assert _wait(lambda: datas(got) == [b"a", b"b"])
        assert loop._watches[str(job)][1] == job.stat().st_ino
        assert sorted(loop._watches) == [str(tmp_path), str(job)]
        assert loop._watches[str(job)][0] != old_wd
    finally:
        loop.stop()
        th.join(10)
    assert not th.is_alive()
