"""Tests of firstfault/agent/tail/ (the Tailer: lines, rotation, the commit contract, a random model); the follow loop is test_follow.py's.

The model test (test_random_operations_against_a_model) runs the random operations of
tests/agent/tail/tailmodel.py against the tailer alone: its docstring says what may be lost.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import pytest

from firstfault.agent.tail import (
    DELETED,
    LOST,
    ROTATED,
    STATE_RESET,
    TRUNCATED,
    Line,
    Position,
    StateError,
    Tailer,
    TailError,
    committed_at_ns,
    cut_line,
    to_text,
)
from firstfault.agent.tail import file as tail_file
from tests.agent.tail.tailmodel import Clock, Model, datas, poll_all, write

# -- helpers -----------------------------------------------------------------------------


@pytest.fixture
def log(tmp_path):
    return tmp_path / "rank0.log"


@pytest.fixture
def state(tmp_path):
    return tmp_path / "state.json"


# -- lines -----------------------------------------------------------------------------

def test_append_partial_line_waits_for_its_newline(log, state):
    write(log, b"alpha\nbe")
    with Tailer(state) as t:
        t.add(str(log))
        first = t.poll_file(str(log))
        assert datas(first) == [b"alpha"]
        assert (first[0].offset, first[0].end, first[0].path) == (0, 6, str(log))
        assert t.poll_file(str(log)) == []
        write(log, b"ta\r\ngamma\n")
        lines = t.poll_file(str(log))
        assert datas(lines) == [b"beta\r", b"gamma"]  # \r kept: bytes are bytes
        assert [(ln.offset, ln.end) for ln in lines] == [(6, 12), (12, 18)]
        assert t.positions()[str(log)] == Position(str(log), lines[-1].file, 18)


def test_partial_line_flushed_after_quiet_timeout_then_rest_is_its_own_line(log, state):
    clock = Clock()
    write(log, b"done\nhalf")
    with Tailer(state, clock=clock, partial_flush_s=5) as t:
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"done"]
        assert t.next_deadline() == clock.t + 5 and t.due_paths() == []
        clock.t += 5
        assert t.due_paths() == [str(log)]
        flushed = t.poll_file(str(log))
        assert datas(flushed) == [b"half"] and flushed[0].end == 9  # no newline in it
        assert t.next_deadline() is None
        write(log, b" rest\n")
        assert datas(t.poll_file(str(log))) == [b" rest"]


def test_resume_after_restart_from_the_committed_line(log, state):
    write(log, b"1\n2\n3\n")
    with Tailer(state) as t:
        t.add(str(log))
        lines = t.poll_file(str(log))
        t.commit_through(lines[1])  # the consumer took 1 and 2 durably
    write(log, b"4\n")
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"3", b"4"]  # 3 was unconfirmed: again


def test_restart_confirmed_lines_are_not_repeated_unconfirmed_come_again(log, state):
    write(log, b"".join(b"line %d\n" % i for i in range(100)))
    with Tailer(state) as t:
        t.add(str(log))
        got = poll_all(t, log)
        assert len(got) == 100
        t.commit(t.positions())
    write(log, b"".join(b"line %d\n" % i for i in range(100, 150)))
    with Tailer(state) as t:
        t.add(str(log))
        got = poll_all(t, log)
        assert datas(got) == [b"line %d" % i for i in range(100, 150)]  # nothing repeated
        t.commit_through(got[9])
        # not confirmed: 110..149; the agent dies here
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(poll_all(t, log)) == [b"line %d" % i for i in range(110, 150)]


def test_long_lines_are_cut_and_the_rest_skipped(log, state):
    mx = 200
    long = b"x" * 1000
    write(log, b"short\n" + long + b"\nafter\n")
    with Tailer(state, max_line_bytes=mx, read_chunk=64) as t:  # the line spans chunks
        t.add(str(log))
        lines = poll_all(t, log)
    assert datas(lines)[0] == b"short" and datas(lines)[2] == b"after"
    cut = lines[1]
    keep = mx - len(b" [line cut by firstfault: 1000 bytes dropped]")  # room for the marker
    assert cut.data == b"x" * keep + b" [line cut by firstfault: %d bytes dropped]" % (1000 - keep)
    assert len(cut.data) <= mx  # the dropped count may have fewer digits than the total
    assert (cut.offset, cut.end) == (6, 1007)  # the real extent of the line
    assert lines[2].offset == 1007


def test_long_lines_at_the_default_limit_among_short_ones(log, state):
    """The default limit takes the fast check (a newline in every 32 KiB window) first."""
    short = [b"s%d" % i for i in range(3000)]
    body = b"\n".join(short[:1000] + [b"L" * 70_000] + short[1000:2000] + [b"M" * 65_536]
                      + short[2000:]) + b"\n"
    write(log, body)
    with Tailer(state) as t:
        t.add(str(log))
        got = datas(poll_all(t, log))
    assert got[:1000] == short[:1000] and got[1001:2001] == short[1000:2000] and got[2002:] == short[2000:]
    assert got[1000].startswith(b"L" * 1000) and got[1000].endswith(b"bytes dropped]")
    assert got[2001] == b"M" * 65_536  # exactly at the limit: kept whole
    assert tail_file._short_lines(b"x\n" * 40_000, 65_536) and not tail_file._short_lines(b"x" * 40_000, 65_536)


def test_cut_backs_off_to_a_utf8_character_start():
    head = ("é" * 200).encode()  # 2 bytes each
    out = cut_line(head[:128], len(head), 128)
    kept = out[:out.index(b" [line cut")]
    assert kept.decode("utf-8") == "é" * (len(kept) // 2) and len(out) <= 128
    assert out.endswith(b"%d bytes dropped]" % (len(head) - len(kept)))


def test_long_partial_line_flushed_cut_at_rotation(log, state):
    write(log, b"y" * 500)  # no newline, over the limit
    with Tailer(state, max_line_bytes=128) as t:
        t.add(str(log))
        assert t.poll_file(str(log)) == []
        os.rename(log, str(log) + ".1")
        lines = t.poll_file(str(log))
        assert len(lines) == 1 and lines[0].data.endswith(b"bytes dropped]") and lines[0].end == 500


def test_invalid_utf8_kept_byte_exact(log, state):
    raw = [b"ok \xe2\x9c\x93", b"bad \xff\xfe\x80", b"cut \xe2\x9c", b"\x00nul\x1b[31m"]
    write(log, b"\n".join(raw) + b"\n")
    with Tailer(state) as t:
        t.add(str(log))
        lines = t.poll_file(str(log))
    assert datas(lines) == raw
    assert to_text(raw[0]) == "ok ✓"
    assert to_text(raw[1]) == "bad \\xff\\xfe\\x80" and lines[2].text == "cut \\xe2\\x9c"
    assert "\ufffd" not in "".join(ln.text for ln in lines)  # escaped, never replaced


def test_batches_and_lines_agree(log, state):
    write(log, b"a\nbb\n" + b"z" * 300 + b"\nccc\n")
    with Tailer(None, max_line_bytes=128) as t1, Tailer(None, max_line_bytes=128) as t2:
        t1.add(str(log))
        t2.add(str(log))
        lines = t1.poll_file(str(log))
        batches = t2.poll_batches(str(log))
    flat = [ln for b in batches for ln in b]
    assert [tuple(x)[:3] + tuple(x)[4:6] for x in flat] == [tuple(x)[:3] + tuple(x)[4:6] for x in lines]
    for b in batches:
        assert b.offsets == [ln.offset for ln in b] and b.ends[-1] == b.stop
        assert b.position == Position(str(log), b.file, b.stop)


# -- rotation ----------------------------------------------------------------------------

def test_rename_rotation_drains_old_then_reads_new_from_zero(log, state):
    write(log, b"old 1\n")
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"old 1"]
        write(log, b"old 2\nold partial")
        os.rename(log, str(log) + ".1")
        write(log, b"new 1\n")
        lines = t.poll_file(str(log))
        assert datas(lines) == [b"old 2", b"old partial", b"new 1"]
        assert lines[0].file != lines[2].file and lines[2].offset == 0
        assert [e.kind for e in t.take_events()] == [ROTATED]


def test_poll_path_is_poll_batches_take_events_and_more_in_one_call(log, state):
    write(log, b"old 1\n")
    with Tailer(state) as t:
        t.add(str(log))
        batches, events, more = t.poll_path(str(log))
        assert [b.data for b in batches] == [[b"old 1"]] and events == [] and more is False
        write(log, b"old 2\n")
        os.rename(log, str(log) + ".1")
        write(log, b"new 1\nnew 2\n")
        batches, events, more = t.poll_path(str(log), max_bytes=8)  # the old file's rest, then stop
        assert [d for b in batches for d in b.data] == [b"old 2"] and more is True
        assert [e.kind for e in events] == [ROTATED] and t.take_events() == []
        batches, events, more = t.poll_path(str(log))
        assert [d for b in batches for d in b.data] == [b"new 1", b"new 2"]
        assert events == [] and more is False == t.more(str(log))


def test_a_poll_asks_for_what_the_stat_says_is_new_not_a_whole_chunk(log, state, monkeypatch):
    """The read after the path's stat asks for the new bytes plus SIZE_SLACK: a 256 KiB
    request costs ~20x a small one in the allocation alone. Bytes written after the stat
    are still read (up to the slack), and a backlog is still read in whole chunks."""
    asked = []
    pread = os.pread

    def spy(fd, n, off):
        asked.append(n)
        return pread(fd, n, off)

    write(log, b"a\nb\n")
    with Tailer(state, read_chunk=256 << 10) as t:
        t.add(str(log))
        t.poll_file(str(log))
        monkeypatch.setattr(os, "pread", spy)
        write(log, b"c\nd\n")
        assert datas(t.poll_file(str(log))) == [b"c", b"d"]
        slack = tail_file.FileReader.SIZE_SLACK
        assert max(asked) == 4 + slack < 256 << 10
        asked.clear()
        write(log, b"x" * 99 + b"\n" + b"y" * (300 << 10) + b"\n")  # a backlog
        lines = t.poll_file(str(log))
        assert datas(lines)[0] == b"x" * 99 and asked[-1] == 256 << 10 and t.more(str(log))


def test_truncate_starts_again_from_zero_and_says_so(log, state):
    write(log, b"a\nb\npart")
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"a", b"b"]
        write(log, b"ial\nunread\n")  # gone with the truncation: no copy of it anywhere
        os.truncate(log, 0)
        write(log, b"fresh\n")
        lines = t.poll_file(str(log))
        assert datas(lines) == [b"part", b"fresh"]  # the held partial line, then the new content
        assert lines[1].offset == 0 and lines[1].file.ino == lines[0].file.ino
        assert lines[1].file != lines[0].file  # a new content of the same inode
        events = t.take_events()
        assert [e.kind for e in events] == [TRUNCATED] and events[0].offset == 8
        assert events[0].detail.endswith("reading from 0")


def test_copytruncate_reads_the_rest_of_the_old_content_from_its_copy(log, state):
    write(log, b"a\nb\npart")
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"a", b"b"]
        write(log, b"ial\nunread 1\nunread 2\n")  # written before logrotate's copy, not yet read
        shutil.copyfile(log, str(log) + "-20261202")
        os.truncate(log, 0)
        write(log, b"fresh\n")
        lines = poll_all(t, log)
        assert datas(lines) == [b"partial", b"unread 1", b"unread 2", b"fresh"]
        assert [ln.offset for ln in lines] == [4, 12, 21, 0]  # offsets of the old content go on
        assert lines[0].file == lines[2].file != lines[3].file
        events = t.take_events()
        assert [e.kind for e in events] == [ROTATED] and events[0].offset == 8  # nothing lost
        assert events[0].detail.endswith(f"the rest is read from its copy {log}-20261202")
        t.commit(t.positions())
    with Tailer(state) as t:  # nothing comes twice
        t.add(str(log))
        assert poll_all(t, log) == []


def test_a_copy_is_known_by_its_first_bytes_and_the_held_line(log, state):
    write(log, b"head\npart")
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"head"]
        write(log.with_name(log.name + ".1"), b"head\nother\n")  # same first bytes, not the copy
        write(log.with_name("other" + log.name), b"head\npart two\n")  # not named after the log
        os.truncate(log, 0)
        write(log, b"fresh\n")
        assert datas(t.poll_file(str(log))) == [b"part", b"fresh"]
        assert t.take_events()[0].detail.endswith("reading from 0")


def test_truncate_then_rewrite_past_the_old_offset_is_seen_by_the_fingerprint(log, state):
    write(log, b"first run line 1\n")
    with Tailer(state) as t:
        t.add(str(log))
        assert len(t.poll_file(str(log))) == 1
        write(log, b"second run, longer line 1\nsecond run line 2\n", "wb")  # > 17 bytes
        assert datas(t.poll_file(str(log))) == [b"second run, longer line 1", b"second run line 2"]
        assert [e.kind for e in t.take_events()] == [TRUNCATED]


def test_delete_recreate_drains_the_deleted_file_while_open(log, state):
    write(log, b"1\n")
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"1"]
        write(log, b"2\n")
        os.unlink(log)
        assert datas(t.poll_file(str(log))) == [b"2"]  # still open: drained
        assert [e.kind for e in t.take_events()] == [DELETED]
        write(log, b"3\n")
        assert datas(t.poll_file(str(log))) == [b"3"]
        t.commit(t.positions())
    with Tailer(state) as t:
        t.add(str(log))
        assert t.poll_file(str(log)) == []


def test_restart_drains_a_file_rotated_while_stopped(log, state):
    write(log, b"1\n2\n")
    with Tailer(state) as t:
        t.add(str(log))
        t.commit_through(t.poll_file(str(log))[0])
    write(log, b"3\n")
    os.rename(log, str(log) + ".1")
    write(log, b"new\n")
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"2", b"3", b"new"]
        assert [e.kind for e in t.take_events()] == [ROTATED]


def test_restart_reports_a_file_deleted_while_stopped_as_lost(log, state):
    write(log, b"1\n2\n")
    with Tailer(state) as t:
        t.add(str(log))
        t.commit_through(t.poll_file(str(log))[0])
    os.unlink(log)
    write(log, b"other\n")
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"other"]
        events = t.take_events()
        assert [e.kind for e in events] == [LOST] and events[0].offset == 2


def test_restart_after_copytruncate_while_stopped_reads_the_copy_then_the_new_content(log, state):
    write(log, b"old one\nold two\n")
    with Tailer(state) as t:
        t.add(str(log))
        t.commit_through(t.poll_file(str(log))[0])
    write(log, b"old three\n")
    shutil.copyfile(log, str(log) + ".1")
    write(log, b"new\n", "wb")
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(poll_all(t, log)) == [b"old two", b"old three", b"new"]
        events = t.take_events()
        assert [e.kind for e in events] == [ROTATED] and f"now {log}.1" in events[0].detail


def test_restart_after_truncate_while_stopped_reads_the_new_content(log, state):
    write(log, b"old one\nold two\n")
    with Tailer(state) as t:
        t.add(str(log))
        t.commit_through(t.poll_file(str(log))[0])
    write(log, b"new\n", "wb")
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"new"]
        assert [e.kind for e in t.take_events()] == [LOST]


def _writer_between_check_and_read(state, writes) -> Tailer:
    """A tailer whose file is written right after it checked the first bytes and before
    it reads: the race a file created empty and then written runs into."""
    t = Tailer(state)
    check = t._poller.reader.check_fingerprint

    def check_then_write(f):
        ok = check(f)
        if writes:
            path, data = writes.pop(0)
            write(path, data)
        return ok
    t._poller.reader.check_fingerprint = check_then_write
    return t


def test_lines_read_past_the_first_bytes_checked_are_covered_by_the_fingerprint(log, state):
    write(log, b"")
    writes = [(log, b"hello\n"), (log, b"world\n")]  # one after each check of the first bytes
    with _writer_between_check_and_read(state, writes) as t:
        t.add(str(log))
        lines = t.poll_file(str(log))  # opened empty, checked again; both arrive before the read
        assert datas(lines) == [b"hello", b"world"] and not writes
        assert t.fingerprint(str(log), lines[0].file) == (12, tail_file.fingerprint(b"hello\nworld\n"))


def test_a_fingerprint_is_not_extended_over_bytes_that_are_not_the_ones_read(log, state):
    write(log, b"ab\n")
    with Tailer(state) as t:
        t.add(str(log))
        [line] = t.poll_file(str(log))
        f = t._paths[str(log)].files[-1]
        known = (f.fp_len, f.fp)
        with open(log, "r+b") as w:  # the head rewritten: not the bytes this content began with
            w.write(b"XY\ncd\n")
        t._poller.reader.extend_fingerprint(f, b"cd\n")  # as if "cd" had been read at offset 3
        assert (f.fp_len, f.fp) == known


# -- advance: positions the consumer kept past the last commit --------------------------

def _where(t: Tailer, line: Line) -> tuple[int, int, int, int, str]:
    """advance()'s (dev, ino, offset, fp_len, fp) just past ``line``, as a consumer keeps it."""
    return (line.file.dev, line.file.ino, line.end, *t.fingerprint(line.path, line.file))


def test_advance_resumes_past_the_commit_and_ignores_other_contents(log, state):
    write(log, b"1\n2\n3\n4\n")
    with Tailer(state) as t:
        t.add(str(log))
        lines = t.poll_file(str(log))
        t.commit_through(lines[0])
        kept = _where(t, lines[2])  # the consumer took 2 and 3, then died before committing
        assert t.fingerprint(str(log), lines[0].file) == (8, tail_file.fingerprint(b"1\n2\n3\n4\n"))
        with pytest.raises(TailError, match="after add"):
            t.advance(str(log), *kept)
    dev, ino, offset, fp_len, fp = kept
    for args, resumed in [((dev, ino + 1, offset, fp_len, fp), [b"2", b"3", b"4"]),  # unknown inode
                          ((dev, ino, offset, fp_len, "0" * 32), [b"2", b"3", b"4"]),  # other bytes
                          ((dev, ino, 99, fp_len, fp), [b"2", b"3", b"4"]),  # past the end
                          ((dev, ino, 0, 0, tail_file.fingerprint(b"")), [b"2", b"3", b"4"]),  # back
                          (kept, [b"4"])]:
        with Tailer(state) as t:
            assert t.advance(str(log), *args) == (args[1] == ino)
            t.add(str(log))
            assert datas(t.poll_file(str(log))) == resumed, args
    assert committed_offsets(state) == [6]  # the last one was saved (the file was opened)


def test_advance_after_copytruncate_ignores_the_old_content(log, state):
    write(log, b"old one\nold two\nold three\n")
    with Tailer(state) as t:
        t.add(str(log))
        lines = t.poll_file(str(log))
        t.commit_through(lines[0])
        kept = _where(t, lines[2])
        write(log, b"new one\nnew two\nnew three, longer than the old\n", "wb")
        assert datas(t.poll_file(str(log))) == [b"new one", b"new two",
                                                b"new three, longer than the old"]
        # the truncation was saved (offset 0 of the new content); the agent dies here
    with Tailer(state) as t:
        assert t.advance(str(log), *kept)  # the same inode, but its old bytes
        t.add(str(log))
        assert datas(t.poll_file(str(log)))[0] == b"new one"


def test_advance_after_copytruncate_while_stopped_resumes_in_the_copy(log, state):
    write(log, b"old one\nold two\nold three\n")
    with Tailer(state) as t:
        t.add(str(log))
        lines = t.poll_file(str(log))
        t.commit_through(lines[0])
        kept = _where(t, lines[1])  # the consumer took "old two" too, then the agent died
    write(log, b"old four\n")
    shutil.copyfile(log, str(log) + ".1")
    write(log, b"new one\n", "wb")
    with Tailer(state) as t:
        assert t.advance(str(log), *kept)
        t.add(str(log))
        assert datas(poll_all(t, log)) == [b"old three", b"old four", b"new one"]


def test_advance_into_a_rotated_files_successor_drops_the_drained_file(log, state):
    write(log, b"1\n2\n")
    with Tailer(state) as t:
        t.add(str(log))
        t.commit_through(t.poll_file(str(log))[0])
        os.rename(log, str(log) + ".1")
        write(log, b"new 1\nnew 2\n")
        lines = t.poll_file(str(log))
        assert datas(lines) == [b"new 1", b"new 2"]
        kept = _where(t, lines[0])  # taken through "new 1" (so all of the old file)
    assert committed_offsets(state) == [2, 0]  # the old file, then the new one
    with Tailer(state) as t:  # without advance: from the commit, in the rotated file
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"2", b"new 1", b"new 2"]
    with Tailer(state) as t:
        assert t.advance(str(log), *kept)
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"new 2"]
        assert t.take_events() == []  # the rotated file is not looked for: it was taken


def test_committed_at_is_the_commit_time_even_when_the_file_is_saved_later(log, state, tmp_path):
    assert committed_at_ns(str(state)) == 0  # nothing saved: every row the consumer kept counts
    write(log, b"1\n")
    with Tailer(state) as t:
        t.add(str(log))
        t.poll_file(str(log))  # the file opened: saved, nothing committed yet
        assert committed_at_ns(str(state)) == 0
        t.commit(t.positions())
        at = os.stat(state).st_mtime_ns
        assert committed_at_ns(str(state)) == at
        time.sleep(0.02)
        other = tmp_path / "rank1.log"
        write(other, b"x\n")
        t.add(str(other))
        t.poll_file(str(other))  # saved again (a new file), offsets of the commit before
        assert os.stat(state).st_mtime_ns > at and committed_at_ns(str(state)) == at
    with Tailer(state) as t:  # kept across a restart until the next commit
        t.add(str(log))
        t.add(str(other))
        t.poll_file(str(other))
        assert committed_at_ns(str(state)) == at
    state.write_text("{not json")
    assert committed_at_ns(str(state)) == 0


def committed_offsets(state: Path) -> list[int]:
    import json
    return [e["offset"] for e in json.loads(state.read_text())["files"]]


# -- the commit contract and the state file ----------------------------------------------

def test_state_file_format_and_atomic_write(log, state, tmp_path):
    write(log, b"x\ny\n")
    with Tailer(state) as t:
        t.add(str(log))
        lines = t.poll_file(str(log))
        t.commit_through(lines[0])
    import json
    doc = json.loads(state.read_text())
    st = os.stat(log)
    assert doc == {"format": "firstfault.tail", "version": 1, "files": [
        {"path": str(log), "dev": st.st_dev, "ino": st.st_ino, "fp_len": 4,
         "fp": tail_file.fingerprint(b"x\ny\n"), "offset": 2}]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.log", "state.json"]


def test_commit_past_what_was_returned_is_refused_and_stale_positions_ignored(log, state):
    write(log, b"a\nb\n")
    with Tailer(state) as t:
        t.add(str(log))
        lines = t.poll_file(str(log))
        with pytest.raises(TailError):
            t.commit([Position(str(log), lines[0].file, 99)])
        t.commit_through(lines[1])
        t.commit_through(lines[0])  # backwards: ignored
        write(log, b"c\n", "wb")  # truncated: lines[0] belongs to a content now gone
        assert datas(t.poll_file(str(log))) == [b"c"]
        t.commit_through(lines[1])  # stale: ignored
        with pytest.raises(TailError):
            t.poll_file("/nowhere")


def test_corrupt_state_is_moved_aside_and_reported(log, state):
    state.write_text("{not json")
    write(log, b"a\n")
    with Tailer(state) as t:
        assert [e.kind for e in t.take_events()] == [STATE_RESET]
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"a"]
    assert Path(str(state) + ".corrupt").exists()


def test_state_of_another_version_is_refused(state):
    state.write_text('{"format": "firstfault.tail", "version": 2, "files": []}')
    with pytest.raises(StateError, match="version 2"):
        Tailer(state)


# -- the random model test --------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_random_operations_against_a_model(tmp_path, seed):
    rng = random.Random(seed)
    model = Model(tmp_path, rng, mx=rng.choice([128, 200]), chunk=rng.choice([7, 64, 1000, 1 << 16]),
                  fp_bytes=rng.choice([16, 1024]))
    for _ in range(300):
        model.step()
    model.finish()
    assert sum(len(v) for v in model.accepted.values()) > 100
