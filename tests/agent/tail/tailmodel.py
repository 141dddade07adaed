"""The random model of a followed file stream, shared by tests/agent/tail/test_tailer.py (the
tailer alone) and tests/agent/sources/test_ranklog.py (the ranklog source and a real spool).

It follows Vector's file-source tests: random write / partial write / rename / copytruncate / truncate /
delete-recreate / restart / commit sequences, interleaved with polls, checked
against a model that knows which bytes must arrive. Every written chunk starts
with a tag naming its path, file and content generation, so any line (or piece of
a line) says where it came from.

What the model allows to be lost (the tailer's documented known issues), and only that:
  * a file renamed away before any poll opened it: all of it;
  * truncate without a copy, or copytruncate of a content whose first bytes no tailer
    saw (so its copy cannot be recognised): the bytes after what the tailer had read
    (it flushes the partial line it held); if the agent was restarted since and had
    not read the file again, everything after the last confirmed line. A copy of a
    content whose first bytes were seen is found beside the path and read to its end;
  * a restart: in a deleted file or a truncated-away content, what was not confirmed
    (the bytes are gone, so it cannot come again). Everything else arrives exactly
    once, in order, with the offsets of the bytes in the file.

``Model`` drives the files and a Tailer; a consumer other than the bare tailer
overrides ``_poll_lines`` (how a poll's lines are read), ``op_commit`` and
``_new_tailer``.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

from firstfault.agent.tail import Line, Tailer, cut_line


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
        self.copied = False  # copytruncate left a copy of it beside the path

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
        g.copied = copy
        if copy and g.fp_known:
            pass  # its copy is recognised by its first bytes and read to its end
        elif f.open_now:
            g.limit(g.read_to)  # the tailer flushes what it held; the rest is gone
        else:
            self._gone_unread(f, g)
        g.dead = True
        f.gens.append(Gen(name, f.fno, len(f.gens)))
        self.partial[name] = False

    # -- the tailer's side
    def _poll_lines(self, path: str) -> list[Line]:
        return self.tailer.poll_file(path)

    def op_poll(self, name: str) -> None:
        path = self.paths[name]
        while True:
            self.received[name] += self._poll_lines(path)
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
                    if g.dead and not (g.copied and g.fp_known):
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

