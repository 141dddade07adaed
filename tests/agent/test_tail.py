"""Tests of agent/tail.py and agent/follow.py: lines, rotation, the commit contract, a random model, inotify.

The model test (test_random_operations_against_a_model) follows Vector's file-source
tests: random write / partial write / rename / copytruncate / truncate /
delete-recreate / restart / commit sequences, interleaved with polls, checked
against a model that knows which bytes must arrive. Every written chunk starts
with a tag naming its path, file and content generation, so any line (or piece of
a line) says where it came from.

What the model allows to be lost (the tailer's documented known issues), and only that:
  * a file renamed away before any poll opened it: all of it;
  * copytruncate/truncate: the bytes after what the tailer had read (it flushes the
    partial line it held); if the agent was restarted since and had not read the
    file again, everything after the last confirmed line;
  * a restart: in a deleted file or a truncated-away content, what was not confirmed
    (the bytes are gone, so it cannot come again). Everything else arrives exactly
    once, in order, with the offsets of the bytes in the file.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from agent import tailfile
from agent.follow import FollowLoop, compile_glob
from agent.tail import (DELETED, LOST, ROTATED, STATE_RESET, TRUNCATED, Line, Position,
                        StateError, Tailer, TailError, cut_line, to_text)


# -- leak fixture ----------------------------------------------------------------------

def _fds(tmp: Path) -> tuple[int, list[str]]:
    inotify, ours = 0, []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == "anon_inode:inotify":
            inotify += 1
        elif target.startswith(str(tmp)):
            ours.append(target)
    return inotify, ours


@pytest.fixture(autouse=True)
def no_leaks(tmp_path):
    """Every test leaves no thread, no inotify instance and no open file of its own."""
    threads = set(threading.enumerate())
    inotify, _ = _fds(tmp_path)
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
        if not left and _fds(tmp_path)[0] <= inotify:
            break
        time.sleep(0.02)
    assert not left, f"threads left running: {left}"
    now_inotify, ours = _fds(tmp_path)
    assert now_inotify <= inotify, "inotify instance left open"
    assert not ours, f"files left open: {ours}"


# -- helpers -----------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def write(path: Path, data: bytes, mode: str = "ab") -> None:
    with open(path, mode) as fh:
        fh.write(data)


def datas(lines: list[Line]) -> list[bytes]:
    return [ln.data for ln in lines]


def poll_all(t: Tailer, path) -> list[Line]:
    out = []
    while True:
        out += t.poll_file(str(path))
        if not t.more(str(path)):
            return out


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
    assert tailfile._short_lines(b"x\n" * 40_000, 65_536) and not tailfile._short_lines(b"x" * 40_000, 65_536)


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


def test_copytruncate_starts_again_from_zero_and_says_so(log, state):
    write(log, b"a\nb\npart")
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"a", b"b"]
        shutil.copyfile(log, str(log) + ".1")
        os.truncate(log, 0)
        write(log, b"fresh\n")
        lines = t.poll_file(str(log))
        assert datas(lines) == [b"part", b"fresh"]  # the held partial line, then the new content
        assert lines[1].offset == 0 and lines[1].file.ino == lines[0].file.ino
        assert lines[1].file != lines[0].file  # a new content of the same inode
        events = t.take_events()
        assert [e.kind for e in events] == [TRUNCATED] and events[0].offset == 8


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


def test_restart_after_copytruncate_while_stopped_reads_the_new_content(log, state):
    write(log, b"old one\nold two\n")
    with Tailer(state) as t:
        t.add(str(log))
        t.commit_through(t.poll_file(str(log))[0])
    write(log, b"new\n", "wb")
    with Tailer(state) as t:
        t.add(str(log))
        assert datas(t.poll_file(str(log))) == [b"new"]
        assert [e.kind for e in t.take_events()] == [LOST]


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
         "fp": tailfile._fingerprint(b"x\ny\n"), "offset": 2}]}
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


# -- the random model test --------------------------------------------------------------

TAG = re.compile(rb"\+?(\w)\.(\d+)\.(\d+)\.\d+\|")


class Gen:
    """One content of one inode."""

    def __init__(self, name: str, fno: int, gno: int):
        self.tag = f"{name}.{fno}.{gno}".encode()
        self.data = bytearray()
        self.deliver_to: int | None = None  # None: everything
        self.bounds: set[int] = set()  # quiet flushes: a line ends there
        self.confirmed = 0
        self.read_to = 0  # how far the current tailer has read
        self.fp_known = False  # a tailer saw its first bytes (saved): it can be found by them
        self.dead = False

    def limit(self, end: int) -> None:
        self.deliver_to = end if self.deliver_to is None else min(self.deliver_to, end)

    def expected(self, path: str, mx: int) -> list[tuple]:
        c = bytes(self.data)
        stop = len(c) if self.deliver_to is None else self.deliver_to
        out, s = [], 0
        while s < stop:
            nl = c.find(b"\n", s, stop)
            b = min((x for x in self.bounds if s < x <= stop), default=None)
            if b is not None and (nl < 0 or b <= nl):
                e, nxt = b, b
            elif nl >= 0:
                e, nxt = nl, nl + 1
            else:
                e, nxt = stop, stop
            piece = c[s:e]
            out.append((path, s, piece if len(piece) <= mx else cut_line(piece[:mx], len(piece), mx), nxt))
            s = nxt
        return out


class RealFile:
    def __init__(self, name: str, fno: int):
        self.fno, self.name = fno, name
        self.gens = [Gen(name, fno, 0)]
        self.where: str | None = None  # file name, None once deleted
        self.opened_ever = False  # some tailer opened it: it is in the state file
        self.open_now = False  # the current tailer holds it open
        self.drained = False  # the current tailer read it to its end after it left the path

    @property
    def gen(self) -> Gen:
        return self.gens[-1]


class Model:
    def __init__(self, tmp: Path, rng: random.Random, mx: int, chunk: int, fp_bytes: int):
        self.tmp, self.rng, self.mx = tmp, rng, mx
        self.kw = dict(max_line_bytes=mx, read_chunk=chunk, fingerprint_bytes=fp_bytes,
                       partial_flush_s=5, clock=Clock())
        self.names = ["a", "b"]
        self.paths = {n: str(tmp / f"{n}.log") for n in self.names}
        self.files: dict[str, list[RealFile]] = {n: [] for n in self.names}
        self.cur: dict[str, RealFile | None] = {n: None for n in self.names}
        self.partial = {n: False for n in self.names}
        self.received: dict[str, list[Line]] = {n: [] for n in self.names}
        self.accepted: dict[str, list[Line]] = {n: [] for n in self.names}
        self.seq = 0
        self.rotations = 0
        self.state = str(tmp / "state.json")
        self.tailer = self._new_tailer()

    def _new_tailer(self) -> Tailer:
        t = Tailer(self.state, **self.kw)
        for p in self.paths.values():
            t.add(p)
        return t

    # -- byte makers
    def _payload(self) -> bytes:
        r = self.rng.random()
        n = self.rng.randrange(300, 700) if r < 0.05 else self.rng.randrange(0, 40)
        alphabet = b"abc xyz\r\t\xff\xc3\xa9\xe2\x9c\x93\x80"
        return bytes(self.rng.choice(alphabet) for _ in range(n))

    def _chunk(self, name: str, start_line: bool) -> bytes:
        g = self.cur[name].gen
        self.seq += 1
        tag = b"%s.%d|" % (g.tag, self.seq)
        return (tag if start_line else b"+" + tag) + self._payload()

    # -- operations on files
    def _ensure_file(self, name: str) -> RealFile:
        if self.cur[name] is None:
            f = RealFile(name, sum(len(v) for v in self.files.values()))
            f.where = self.paths[name]
            self.files[name].append(f)
            self.cur[name] = f
            self.partial[name] = False
        return self.cur[name]

    def _append(self, name: str, data: bytes) -> None:
        f = self.cur[name]
        write(Path(self.paths[name]), data)
        f.gen.data += data

    def op_write(self, name: str) -> None:
        self._ensure_file(name)
        data = b""
        if self.partial[name]:
            data += self._chunk(name, False) + b"\n"
        for _ in range(self.rng.randrange(1, 6)):
            data += self._chunk(name, True) + b"\n"
        self._append(name, data)
        self.partial[name] = False

    def op_partial(self, name: str) -> None:
        self._ensure_file(name)
        self._append(name, self._chunk(name, not self.partial[name]))
        self.partial[name] = True

    def _gone_unread(self, f: RealFile, g: Gen) -> None:
        """f's content g can no longer be read from where the tailer stands."""
        if not f.opened_ever:
            g.limit(0)
        elif not f.open_now and not f.drained:
            g.limit(g.confirmed)

    def op_rename(self, name: str) -> None:
        f = self.cur[name]
        if f is None:
            return
        self.rotations += 1
        f.where = f"{self.paths[name]}.{self.rotations}"
        os.rename(self.paths[name], f.where)
        if not f.open_now and not f.gen.fp_known:
            f.gen.limit(f.gen.confirmed)  # never seen, or seen empty: cannot be recognised
        self.cur[name] = None

    def op_delete(self, name: str, rotated: bool = False) -> None:
        if rotated:
            olds = [f for f in self.files[name] if f.where and f is not self.cur[name]]
            if not olds:
                return
            f = self.rng.choice(olds)
        else:
            f = self.cur[name]
            if f is None:
                return
            self.cur[name] = None
        os.unlink(f.where)
        f.where = None
        self._gone_unread(f, f.gen)
        for g in f.gens:
            g.dead = True

    def op_truncate(self, name: str, copy: bool) -> None:
        f = self.cur[name]
        if f is None:
            return
        if copy:  # the copy is a file nobody follows
            self.rotations += 1
            shutil.copyfile(self.paths[name], f"{self.paths[name]}.{self.rotations}")
        os.truncate(self.paths[name], 0)
        g = f.gen
        if f.open_now:
            g.limit(g.read_to)  # the tailer flushes what it held; the rest is gone
        else:
            self._gone_unread(f, g)
        g.dead = True
        f.gens.append(Gen(name, f.fno, len(f.gens)))
        self.partial[name] = False

    # -- the tailer's side
    def op_poll(self, name: str) -> None:
        path = self.paths[name]
        while True:
            self.received[name] += self.tailer.poll_file(path)
            if not self.tailer.more(path):
                break
        for f in self.files[name]:
            if f is self.cur[name]:
                f.opened_ever = f.open_now = True
                f.gen.read_to = len(f.gen.data)
                f.gen.fp_known |= bool(f.gen.data)
            elif f.open_now or (f.opened_ever and f.where and not f.drained):
                f.open_now, f.drained = False, True  # drained (also after a restart: found beside)
                f.gen.read_to = len(f.gen.data)
                f.gen.fp_known |= bool(f.gen.data)

    def op_quiet(self) -> None:
        for name in self.names:
            self.op_poll(name)
        self.kw["clock"].t += 10
        for name in self.names:
            f = self.cur[name]
            if f is not None and f.open_now:
                g = f.gen
                last = max([0, *[b for b in g.bounds if b <= len(g.data)],
                            g.data.rfind(b"\n") + 1])
                if last < len(g.data):
                    g.bounds.add(len(g.data))
            self.op_poll(name)

    def _accept(self, name: str, k: int) -> None:
        took, self.received[name] = self.received[name][:k], self.received[name][k:]
        self.accepted[name] += took
        for ln in took:
            g = self.gen_of(ln)
            g.confirmed = max(g.confirmed, ln.end)

    def gen_of(self, ln: Line) -> Gen:
        m = TAG.match(ln.data)
        assert m, ln
        name, fno, gno = m.group(1).decode(), int(m.group(2)), int(m.group(3))
        f = next(f for f in self.files[name] if f.fno == fno)
        return f.gens[gno]

    def op_commit(self) -> None:
        if self.rng.random() < 0.3:
            self.tailer.commit(self.tailer.positions())
            for name in self.names:
                self._accept(name, len(self.received[name]))
            return
        last = []
        for name in self.names:
            k = self.rng.randrange(len(self.received[name]) + 1)
            if k:
                last.append(self.received[name][k - 1])
                self._accept(name, k)
        self.tailer.commit_through(*last)

    def op_restart(self) -> None:
        self.op_commit()
        self.tailer.close()
        for name in self.names:
            self.received[name] = []  # the consumer crashed: unconfirmed lines are gone
            for f in self.files[name]:
                for g in f.gens:
                    g.bounds = {b for b in g.bounds if b <= g.confirmed}
                    if g.dead:
                        g.limit(g.confirmed)
                    g.read_to = 0
                if f.where not in (None, self.paths[name]) and not f.drained and not f.gen.fp_known:
                    f.gen.limit(f.gen.confirmed)  # rotated, undrained, first bytes never seen
                f.open_now = f.drained = False
        self.tailer = self._new_tailer()

    def step(self) -> None:
        name = self.rng.choice(self.names)
        r = self.rng.random()
        if r < 0.30:
            self.op_write(name)
        elif r < 0.40:
            self.op_partial(name)
        elif r < 0.62:
            self.op_poll(name)
        elif r < 0.67:
            self.op_rename(name)
        elif r < 0.71:
            self.op_truncate(name, copy=True)
        elif r < 0.73:
            self.op_truncate(name, copy=False)
        elif r < 0.77:
            self.op_delete(name)
        elif r < 0.79:
            self.op_delete(name, rotated=True)
        elif r < 0.87:
            self.op_commit()
        elif r < 0.93:
            self.op_restart()
        else:
            self.op_quiet()

    def finish(self) -> None:
        self.op_quiet()
        self.tailer.commit(self.tailer.positions())
        for name in self.names:
            self._accept(name, len(self.received[name]))
        self.tailer.close()
        for name in self.names:
            got = [(ln.path, ln.offset, ln.data, ln.end) for ln in self.accepted[name]]
            want = [x for f in self.files[name] for g in f.gens
                    for x in g.expected(self.paths[name], self.mx)]
            assert got == want, f"path {name}: stream differs at index " + str(
                next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want))))
        with Tailer(self.state, **self.kw) as t:  # nothing confirmed comes again
            for p in self.paths.values():
                t.add(p)
                assert poll_all(t, p) == []


@pytest.mark.parametrize("seed", range(8))
def test_random_operations_against_a_model(tmp_path, seed):
    rng = random.Random(seed)
    model = Model(tmp_path, rng, mx=rng.choice([128, 200]), chunk=rng.choice([7, 64, 1000, 1 << 16]),
                  fp_bytes=rng.choice([16, 1024]))
    for _ in range(300):
        model.step()
    model.finish()
    assert sum(len(v) for v in model.accepted.values()) > 100


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
    inotify_before = _fds(tmp_path)[0]
    loop, th, got, events, tailer = _run_loop(tmp_path, [str(logs / "{job}" / "rank{rank}.log")])
    try:
        assert _wait(lambda: len(got) == 1)
        assert _fds(tmp_path)[0] == inotify_before + 1  # what the leak fixture counts is real
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
        assert _wait(lambda: loop._watches and next(iter(loop._watches))[0].endswith("later"))
        write(tmp_path / "later" / "r3.log", b"x\n")
        assert _wait(lambda: datas(got) == [b"x"])
    finally:
        loop.stop()
        th.join(10)


def test_follow_loop_safety_poll_catches_what_events_missed(tmp_path, monkeypatch):
    write(tmp_path / "r0.log", b"a\n")
    monkeypatch.setattr(FollowLoop, "_notify", lambda self, path: None)  # inotify deaf
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
