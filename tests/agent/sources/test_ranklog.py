"""ranklog: real files in temp folders, real inotify, a real spool; tracebacks on real captures.

The engine (RankLines) is driven directly where a test needs exact control of time
and polls; the whole source runs in its SourceRunner thread (FollowLoop, inotify)
where a test is about pickup, rotation, layouts, restarts and leaks. Every test
also fails if it leaves an inotify watch behind (counted in /proc/self/fdinfo).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from firstfault.agent.sources import get
from firstfault.agent.sources.ranklog import COMMIT_BYTES, KIND_RANK_GAP, RankLines, RanklogSource
from firstfault.agent.spool import COLUMNS, Spool
from firstfault.agent.tail import Tailer, to_text
from firstfault.wire import KIND_RANK_LINE, KIND_RANK_TRACEBACK, Batch, Record
from firstfault.wiredecode import decode_batch
from tests.agent.sources.conftest import DATA
from tests.agent.tail.tailmodel import Clock, Model, write

REAL, FORMATS = DATA / "real", DATA / "formats"


# -- fixtures and helpers ------------------------------------------------------------------

def inotify_watches() -> tuple[int, int]:
    """(inotify instances, watches) of this process, from /proc/self/fd and fdinfo."""
    instances = watches = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}") as f:
                watches += sum(1 for ln in f if ln.startswith("inotify wd:"))
            instances += 1
        except OSError:
            continue
    return instances, watches


@pytest.fixture(autouse=True)
def no_watch_leaks():
    before = inotify_watches()
    yield
    deadline = time.monotonic() + 5
    while inotify_watches() > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert inotify_watches() <= before, f"inotify left open: {inotify_watches()} > {before}"


class Rows:
    """``emit`` for tests: ``many(rows)`` takes wire-column tuples as the spool does and
    checks they make a valid wire batch; single Drafts (the runner's status) too."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.cond = threading.Condition()

    def __call__(self, draft) -> None:
        self.many([tuple(getattr(draft, c) for c in COLUMNS)])

    def many(self, rows: list[tuple]) -> None:
        with self.cond:
            recs = tuple(Record(node="n", stream="s", seq=len(self.records) + i, **dict(zip(COLUMNS, r)))
                         for i, r in enumerate(rows))
            Batch(recs).to_wire()  # what the receiver checks
            self.records += recs
            self.cond.notify_all()

    def of(self, kind: str) -> list[Record]:
        with self.cond:
            return [r for r in self.records if r.kind == kind]

    def wait_for(self, pred, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not pred(self):
                left = deadline - time.monotonic()
                last = [r.message for r in self.records[-5:]]
                assert left > 0, f"not there after {timeout} s; last: {last}"
                self.cond.wait(min(left, 0.1))


def spool_emit(spool: Spool):
    """The agent's sink shape: one Draft, ``many`` rows or ``columns`` in one spool append."""
    def emit(draft) -> None:
        spool.append([draft])
    emit.many = spool.append
    emit.columns = spool.append_columns
    return emit


def read_all(spool: Spool) -> list[Record]:
    out: list[Record] = []
    while batch := spool.read_after(out[-1].seq if out else None):
        out += batch
    return out


def lines_of(records: list[Record], path: str | None = None) -> list[str]:
    """Every line the records carry (a traceback's lines one by one), in record order."""
    return [ln for r in records if path is None or r.fields.get("path") == path
            for ln in r.message.split("\n") if r.kind in (KIND_RANK_LINE, KIND_RANK_TRACEBACK)]


def file_lines(path: Path) -> list[str]:
    return [to_text(x) for x in path.read_bytes().split(b"\n")[:-1]]


def ship_files(paths: list[Path], **kw) -> Rows:
    """Every line of ``paths`` through a Tailer and the engine, then quiet long enough."""
    rows, clock = Rows(), Clock()
    with Tailer(None, clock=clock) as t:
        engine = RankLines(t, rows, **kw)
        for p in paths:
            t.add(str(p))
            while True:
                engine.batches(t.poll_batches(str(p)))
                if not t.more(str(p)):
                    break
        clock.t += 60
        assert engine.tick() is None
    return rows


def committed(state: Path, path: Path) -> int:
    return max(e["offset"] for e in json.loads(state.read_text())["files"] if e["path"] == str(path))


TB = [b"[rank1]: Traceback (most recent call last):",
      b'[rank1]:   File "/work/main/tests/realjobs/train.py", line 226, in <module>',
      b"[rank1]:     record(main)()"]


# -- options -------------------------------------------------------------------------------

@pytest.mark.parametrize("opts, name", [
    ({"globs": "/logs/*.log"}, "globs"), ({"globs": ["logs/*.log"]}, "globs"),
    ({"globs": ["/logs/{1job}.log"]}, "globs"), ({"globs": ["/logs/{rank:(}.log"]}, "globs"),
    ({"dirs": ["/logs/*"]}, "dirs"), ({"dirs": ["logs"]}, "dirs"), ({"dirs": [""]}, "dirs"),
    ({"job_label": 7}, "job_label"), ({"max_line_bytes": 100}, "max_line_bytes"),
    ({"max_line_bytes": 1 << 20}, "max_line_bytes"), ({"max_line_bytes": True}, "max_line_bytes"),
    ({"traceback_flush_s": 0}, "traceback_flush_s"), ({"partial_flush_s": -1}, "partial_flush_s"),
    ({"safety_poll_s": "5"}, "safety_poll_s"), ({"read_gap_s": 0}, "read_gap_s"),
])
def test_bad_option_values_raise_naming_the_option(opts, name):
    with pytest.raises(ValueError, match=name):
        RanklogSource(**opts)


def test_options_make_the_followed_patterns():
    assert get("ranklog") is RanklogSource and RanklogSource.unavailable(None) is None
    src = RanklogSource(globs=["/logs/{job}/rank{rank}.log"], dirs=["/runs/tr/"], job_label="")
    assert src.job_label is None and src.state_path is None
    assert src.patterns() == ["/logs/{job}/rank{rank}.log", "/runs/tr/*/attempt_*/*/stdout.log",
                              "/runs/tr/*/attempt_*/*/stderr.log", "/runs/tr/*/attempt_*/*/error.json",
                              "/runs/tr/*_rank*.log"]
    assert RanklogSource(state_dir="/var/lib/ff", job_label="j1").state_path == "/var/lib/ff/ranklog.json"


def test_the_agent_config_reaches_the_source(tmp_path):
    from firstfault.agent.config import parse_args
    from firstfault.agent.daemon import build_sources
    cfg, _ = parse_args(["--collector", "127.0.0.1:7140", "--state-dir", str(tmp_path), "--job", "j-7",
                      "--ranklog", "/logs/{job}/rank{rank}.log", "--ranklog", "/more/r{rank}.log",
                      "--ranklog-dirs", "/runs", "--ranklog-traceback-flush-s", "0.5",
                      "--kmsg-enabled", "false", "--cgroup-enabled", "false", "--procs-enabled", "false"])
    (src,) = [s for s in build_sources(cfg, create_dirs=True)[0] if s.name == "ranklog"]
    assert isinstance(src, RanklogSource) and src.job_label == "j-7" and src.traceback_flush_s == 0.5
    assert src.globs == ["/logs/{job}/rank{rank}.log", "/more/r{rank}.log"] and src.dirs == ["/runs"]
    assert src.state_path == str(tmp_path / "sources" / "ranklog" / "ranklog.json")


def test_identity_from_named_parts_layouts_and_the_label():
    with Tailer(None) as t:
        engine = RankLines(t, Rows(), job_label="label")
        t.add("/n/gpu-3/r7.log", {"node": "gpu-3", "rank": "7"})
        t.add("/x/rank-a.log", {"rank": "a"})
        t.add("/runs/20261202113547_rank5.log")
        t.add("/tr/myrun_ab_c1234/attempt_2/3/stderr.log", {"job": "j9"})
        assert engine.identity("/n/gpu-3/r7.log") == ("label", 7, None, {"path": "/n/gpu-3/r7.log",
                                                                          "node": "gpu-3"})
        assert engine.identity("/x/rank-a.log") == ("label", None, None, {"path": "/x/rank-a.log"})
        assert engine.identity("/runs/20261202113547_rank5.log")[:3] == ("label", 5, None)
        assert engine.identity("/tr/myrun_ab_c1234/attempt_2/3/stderr.log") == (
            "j9", None, 3, {"path": "/tr/myrun_ab_c1234/attempt_2/3/stderr.log", "attempt": 2})
        t.add("/tr/myrun_ab_c1234/attempt_0/0/stdout.log")
        assert engine.identity("/tr/myrun_ab_c1234/attempt_0/0/stdout.log")[0] == "myrun"


# -- tracebacks on real captures -----------------------------------------------------------

def test_a_torchrun_rank_traceback_is_one_record(tmp_path):
    path = next((REAL / "torchrun-exception-rank1-of-2" / "logs").glob("*/attempt_0/1/stderr.log"))
    rows = ship_files([path])
    want = file_lines(path)
    assert lines_of(rows.records) == want  # every line once, in order
    (tb,) = rows.of(KIND_RANK_TRACEBACK)
    first = want.index("[rank1]: Traceback (most recent call last):")
    last = next(i for i, ln in enumerate(want) if ln.startswith("[rank1]: ValueError: feature vector"))
    assert tb.message == "\n".join(want[first:last + 1]) and tb.severity == 3
    assert tb.occurred_ns is None and tb.local_rank == 1 and tb.fields["path"] == str(path)
    assert len(rows.of(KIND_RANK_LINE)) == len(want) - (last + 1 - first)


def test_interleaved_ranks_each_get_their_traceback():
    """torchrun's --tee console: four tracebacks whose lines interleave, one per prefix; then the
    launcher's ChildFailedError, whose message (the failure table) holds each failed worker's
    callstack glued after ``  traceback : ``: each of those is a traceback of its own."""
    path = REAL / "torchrun-pasted-exception-rank2-of-4" / "launcher.log"
    rows = ship_files([path])
    assert Counter(lines_of(rows.records)) == Counter(file_lines(path))
    tbs = rows.of(KIND_RANK_TRACEBACK)
    heads = [tb.message.split("\n")[0] for tb in tbs]
    assert heads == ["[default2]:[rank2]: Traceback (most recent call last):",
                     "[default3]:[rank3]: Traceback (most recent call last):",
                     "[default1]:[rank1]: Traceback (most recent call last):",
                     "Traceback (most recent call last):"] + ["  traceback : Traceback (most recent call last):"] * 3
    for tb, head in zip(tbs[:3], heads):
        prefix = head[:head.index("Traceback")]
        assert all(ln.startswith(prefix) for ln in tb.message.split("\n"))
    assert tbs[0].message.split("\n")[-1].startswith("[default2]:[rank2]: ValueError: feature vector")
    child = tbs[3].message.split("\n")
    first = next(i for i, ln in enumerate(child) if ln.startswith("torch.distributed.elastic.multiprocessing"
                                                                  ".errors.ChildFailedError:"))
    assert "Root Cause (first observed failure):" not in child and child[first + 1].startswith("=====")
    assert child[-1].startswith("  error_file: ")  # the table goes on after the first callstack
    assert [tb.message.split("\n")[-2].strip().split(":")[0] for tb in tbs[4:]] == [
        "RuntimeError", "RuntimeError", "ValueError"]


@pytest.mark.parametrize("name", ["py311-chained-during-handling", "py311-chained-direct-cause",
                                  "py311-exception-group-nested", "py311-exception-group-taskgroup",
                                  "rich-traceback-chained-nocolor", "py311-keyboardinterrupt"])
def test_each_traceback_shape_is_one_record(name):
    """These captures hold one whole traceback each (chained, groups, rich panels)."""
    path = FORMATS / f"{name}.log"
    rows = ship_files([path])
    assert [r.kind for r in rows.records] == [KIND_RANK_TRACEBACK]
    assert rows.records[0].message == "\n".join(file_lines(path))


def test_a_deepspeed_rank_log_and_the_lines_around_its_traceback():
    path = next((REAL / "deepspeed-exception-rank2-of-4" / "logs").glob("*_rank2.log"))
    rows = ship_files([path])
    assert lines_of(rows.records) == file_lines(path)
    (tb,) = rows.of(KIND_RANK_TRACEBACK)
    assert tb.rank == 2 and tb.message.startswith("[rank2]: Traceback (most recent call last):")


def test_a_huge_traceback_is_cut_to_the_wire_limit(tmp_path):
    log = tmp_path / "rank0.log"
    frames = b"".join(b'  File "/x/model.py", line %d, in forward\n    return self.f(x)  # \xff\n' % i
                      for i in range(5000))
    after = b"[2026-12-02 10:00:00,000] [INFO] [x.py:1:f] after"
    write(log, b"Traceback (most recent call last):\n" + frames + b"RecursionError: maximum\n" + after + b"\n")
    rows = ship_files([log])
    tbs = rows.of(KIND_RANK_TRACEBACK)
    assert all(len(tb.message.encode()) <= 65536 for tb in tbs)
    assert tbs[0].message.endswith("bytes dropped]") and "\\xff" in tbs[0].message
    # the frames after a cut are a fragment of their own, the logger line that follows is a line
    assert len(tbs) >= 2 and tbs[1].message.startswith('  File "/x/model.py", line ')
    assert rows.records[-1].message == after.decode() and len(lines_of(rows.records)) >= 3


# -- held tracebacks: quiet flush, commits, restarts -----------------------------------------

def test_an_open_traceback_waits_for_a_chain_then_ships_when_quiet(tmp_path):
    log, state, clock, rows = tmp_path / "rank1.log", tmp_path / "state.json", Clock(), Rows()
    with Tailer(state, clock=clock) as t:
        engine = RankLines(t, rows, traceback_flush_s=1.0, commit_s=0)
        t.add(str(log))
        write(log, b"step 4\n" + b"\n".join(TB) + b"\n[rank1]: ValueError: boom\n[rank1]: \n")
        engine.batches(t.poll_batches(str(log)))
        assert [r.message for r in rows.records] == ["step 4"]  # the traceback may go on
        assert committed(state, log) == 0  # emitted: committed at the end of the wake
        assert engine.tick() == clock.t + 1.0
        assert committed(state, log) == len(b"step 4\n")  # held lines are not committed
        clock.t += 0.5
        engine.tick()
        write(log, b"[rank1]: During handling of the above exception, another exception occurred:\n"
                   b"[rank1]: \n[rank1]: Traceback (most recent call last):\n"
                   b"[rank1]:   File \"x.py\", line 1, in <module>\n[rank1]: RuntimeError: again\n")
        engine.batches(t.poll_batches(str(log)))
        assert len(rows.records) == 1
        clock.t += 1.0
        assert engine.tick() is None
        (tb,) = rows.of(KIND_RANK_TRACEBACK)
        assert tb.message.split("\n") == file_lines(log)[1:]  # one record, chain included
        assert committed(state, log) == log.stat().st_size


def test_positions_are_committed_commit_s_after_the_last_commit_or_after_commit_bytes(tmp_path):
    log, state, clock, rows = tmp_path / "rank0.log", tmp_path / "state.json", Clock(), Rows()
    with Tailer(state, clock=clock) as t:
        engine = RankLines(t, rows, commit_s=0.25)
        t.add(str(log))
        write(log, b"step 1\n")
        engine.batches(t.poll_batches(str(log)))
        assert engine.tick() == clock.t + 0.25  # emitted: due for a commit then
        assert committed(state, log) == 0 and [r.message for r in rows.records] == ["step 1"]
        clock.t += 0.25
        assert engine.tick() is None  # committed: nothing left to do
        assert committed(state, log) == len(b"step 1\n")
        start = clock.t
        big = b"x" * 1000 + b"\n"
        write(log, big * (COMMIT_BYTES // len(big)))  # just under COMMIT_BYTES
        while True:  # wakes at the same clock time
            engine.batches(t.poll_batches(str(log)))
            engine.tick()
            if not t.more(str(log)):
                break
        assert committed(state, log) == len(b"step 1\n")
        write(log, big)
        engine.batches(t.poll_batches(str(log)))
        engine.tick()
        assert committed(state, log) == log.stat().st_size  # past COMMIT_BYTES: committed at once
        assert clock.t == start


def test_lines_after_an_open_traceback_wait_for_it_and_a_restart_repeats_none(tmp_path):
    """Other ranks' lines after a held traceback are held too (the commit can not pass
    them), so an agent stopped while it is open sends every line exactly once."""
    log, state, rows = tmp_path / "console.log", tmp_path / "state.json", Rows()
    write(log, b"\n".join([TB[0], b"[rank0]: step 5", TB[1]]) + b"\n")
    with Tailer(state) as t:
        engine = RankLines(t, rows, commit_s=0)
        t.add(str(log))
        engine.batches(t.poll_batches(str(log)))
        engine.tick()
    assert rows.records == [] and committed(state, log) == 0  # nothing emitted, nothing committed
    x = b"[rank1]: [2026-12-02 10:00:01,000] [INFO] [x.py:1:f] x"  # a record: it ends the message
    write(log, b"\n".join([TB[2], b"[rank1]: ValueError: boom", b"[rank0]: step 6", x]) + b"\n")
    clock = Clock()
    with Tailer(state, clock=clock) as t:  # the restarted agent
        engine = RankLines(t, rows, commit_s=0)
        t.add(str(log))
        engine.batches(t.poll_batches(str(log)))
        assert engine.tick() is None
    assert [r.kind for r in rows.records] == [KIND_RANK_TRACEBACK, KIND_RANK_LINE, KIND_RANK_LINE,
                                              KIND_RANK_LINE]
    assert rows.records[0].message.split("\n") == [to_text(x) for x in TB] + ["[rank1]: ValueError: boom"]
    assert [r.message for r in rows.records[1:]] == ["[rank0]: step 5", "[rank0]: step 6", x.decode()]
    assert committed(state, log) == log.stat().st_size


def test_rotation_ends_an_open_traceback(tmp_path):
    log, rows = tmp_path / "rank0.log", Rows()
    write(log, b"Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n")
    with Tailer(None) as t:
        engine = RankLines(t, rows)
        t.add(str(log))
        engine.batches(t.poll_batches(str(log)))
        os.rename(log, tmp_path / "rank0.log.1")
        write(log, b"new file\n")
        engine.batches(t.poll_batches(str(log)))
    assert [r.kind for r in rows.records] == [KIND_RANK_TRACEBACK, KIND_RANK_LINE]


# -- the whole source: inotify, rotation, layouts, restarts, leaks --------------------------

def test_a_new_rank_file_is_picked_up_by_inotify(tmp_path, running):
    rows = Rows()
    src = RanklogSource(globs=[str(tmp_path / "logs" / "{job}" / "rank{rank}.log")], job_label="fallback",
                        state_dir=str(tmp_path), safety_poll_s=3600)  # no polling to fall back on
    before = inotify_watches()
    with running(src, rows):
        time.sleep(0.3)
        (tmp_path / "logs" / "j42").mkdir(parents=True)
        write(tmp_path / "logs" / "j42" / "rank3.log", b"hello \xff from rank 3\n")
        rows.wait_for(lambda r: r.of(KIND_RANK_LINE))
        assert inotify_watches()[1] > before[1]  # what the leak check counts is real
    (rec,) = rows.of(KIND_RANK_LINE)
    assert (rec.message, rec.job, rec.rank, rec.local_rank, rec.source) == (
        "hello \\xff from rank 3", "j42", 3, None, "ranklog")
    log = tmp_path / "logs" / "j42" / "rank3.log"
    st, data = log.stat(), log.read_bytes()  # the last row of a path says where it reaches
    assert rec.fields == {"path": str(log), "dev": st.st_dev, "ino": st.st_ino,
                          "end_offset": len(data), "fp_len": len(data),
                          "fp": hashlib.blake2b(data, digest_size=16).hexdigest()}
    assert rec.occurred_ns is None and abs(rec.observed_ns - time.time_ns()) < 60e9


def test_rotation_by_rename_copytruncate_and_delete_recreate(tmp_path, running):
    rows, log = Rows(), tmp_path / "rank0.log"
    src = RanklogSource(globs=[str(tmp_path / "rank{rank}.log")], state_dir=str(tmp_path))
    with running(src, rows):
        write(log, b"a1\na2\n")
        rows.wait_for(lambda r: len(lines_of(r.records)) == 2)
        write(log, b"a3\n")
        os.rename(log, tmp_path / "rank0.log.1")  # logrotate create: a3 is drained from the old file
        write(log, b"b1\n")
        rows.wait_for(lambda r: len(lines_of(r.records)) == 4)
        write(log, b"b2\n")
        shutil.copyfile(log, tmp_path / "rank0.log.2")
        os.truncate(log, 0)  # copytruncate: b2, if not read yet, is read from the copy
        write(log, b"c1\n")
        rows.wait_for(lambda r: len(lines_of(r.records)) == 6)
        assert not rows.of(KIND_RANK_GAP)
        os.truncate(log, 0)  # a truncation with no copy: what was not read is gone, a gap
        ino = log.stat().st_ino
        write(log, b"t1\n")
        rows.wait_for(lambda r: len(lines_of(r.records)) == 7)
        write(log, b"c2\n")
        os.unlink(log)
        write(log, b"d1\n")  # delete-recreate: c2 is drained from the deleted file
        rows.wait_for(lambda r: len(lines_of(r.records)) == 9)
    assert lines_of(rows.records) == ["a1", "a2", "a3", "b1", "b2", "c1", "t1", "c2", "d1"]
    (gap,) = rows.of(KIND_RANK_GAP)
    assert gap.fields["reason"] == "truncated" and gap.rank == 0 and gap.severity == 4
    assert (gap.fields["ino"], gap.fields["offset"]) == (ino, 3)  # the file, after "c1\n"


def test_both_launcher_layouts_are_detected_under_dirs(tmp_path, running):
    tr, ds = tmp_path / "tr", tmp_path / "ds"
    shutil.copytree(REAL / "torchrun-exception-rank1-of-2" / "logs", tr)
    shutil.copytree(REAL / "deepspeed-exception-rank2-of-4" / "logs", ds)
    files = sorted(p for p in [*tr.rglob("*"), *ds.rglob("*")] if p.is_file())
    want = sum(p.read_bytes().count(b"\n") + (not p.read_bytes().endswith(b"\n")) for p in files)
    rows = Rows()
    src = RanklogSource(dirs=[str(tr), str(ds)], state_dir=str(tmp_path), partial_flush_s=0.2,
                        traceback_flush_s=0.2)
    with running(src, rows):
        rows.wait_for(lambda r: len(lines_of(r.records)) == want)
        run = next(tr.iterdir())
        (run / "attempt_1" / "0").mkdir(parents=True)  # the next attempt, while running
        write(run / "attempt_1" / "0" / "stdout.log", b"attempt 1 starts\n")
        rows.wait_for(lambda r: len(lines_of(r.records)) == want + 1)
    by_path = {}
    for r in rows.records:
        if r.kind != "agent.status":
            by_path.setdefault(r.fields["path"], []).append(r)
    assert sorted(by_path) == sorted(map(str, files + [run / "attempt_1" / "0" / "stdout.log"]))
    for path, recs in by_path.items():
        assert lines_of(recs) == file_lines(Path(path)) or path.endswith("error.json")
    err = by_path[str(run / "attempt_0" / "1" / "error.json")]
    assert len(err) == 1 and json.loads(err[0].message)["message"]["message"].startswith("ValueError")
    r1 = by_path[str(run / "attempt_0" / "1" / "stderr.log")][0]
    assert (r1.job, r1.rank, r1.local_rank, r1.fields["attempt"]) == (
        "e4ccfcb9-c3ba-46bf-8895-b4409b29c29b", None, 1, 0)
    assert by_path[str(run / "attempt_1" / "0" / "stdout.log")][0].fields["attempt"] == 1
    ds2 = by_path[str(next(ds.glob("*_rank2.log")))]
    assert {(r.rank, r.job) for r in ds2} == {(2, None)}
    assert sum(r.kind == KIND_RANK_TRACEBACK for r in ds2) == 1


def _write_ranks(paths: list[Path], start: int, stop: int, pause_s: float = 0.0) -> None:
    for i in range(start, stop):
        time.sleep(pause_s)
        for p in paths:
            if i % 400 == 7:
                write(p, b"\n".join(TB) + b"\n[rank1]: ValueError: at %d\n" % i)
            write(p, b"%s line %d \xc3\xa9\n" % (p.stem.encode(), i))


def test_restart_mid_stream_with_a_real_spool_delivers_every_line_exactly_once(tmp_path, running):
    """Stopped mid-stream, and crashed by a failing spool append, the source sends each
    line once: the spool's records hold every file's lines, in order, no more."""
    logs = [tmp_path / f"rank{r}.log" for r in range(3)]
    spool_dir = tmp_path / "spool"
    glob = str(tmp_path / "rank{rank}.log")
    _write_ranks(logs, 0, 500)

    spool = Spool(spool_dir, node="n1", max_bytes=64 << 20, fsync="interval")
    emit = spool_emit(spool)
    appends = []

    def failing_once(rows):  # the spool append fails once, mid-stream: the run dies, then retries
        appends.append(len(rows))
        if len(appends) == 3:
            raise OSError("injected: spool write failed")
        spool.append(rows)
    crashy = lambda d: emit(d)  # noqa: E731
    crashy.many = failing_once
    writer = threading.Thread(target=_write_ranks, args=(logs, 500, 3000, 0.0005))
    with running(RanklogSource(globs=[glob], state_dir=str(tmp_path), traceback_flush_s=0.2), crashy,
                 backoff_initial_s=0.05):
        writer.start()
        deadline = time.monotonic() + 20
        while len(appends) < 5 and time.monotonic() < deadline:  # appends after the failure
            time.sleep(0.005)
    writer.join()  # it went on writing while the source stood still
    spool.close()
    assert len(appends) >= 5

    spool = Spool(spool_dir, node="n1", max_bytes=64 << 20, fsync="interval")
    total = sum(len(file_lines(p)) for p in logs)
    try:
        with running(RanklogSource(globs=[glob], state_dir=str(tmp_path), traceback_flush_s=0.2),
                     spool_emit(spool)):
            deadline = time.monotonic() + 30
            while len(lines_of(read_all(spool))) < total and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        records = read_all(spool)
        spool.close()
    ours = [r for r in records if r.source == "ranklog"]
    for p in logs:
        assert lines_of(ours, str(p)) == file_lines(p), p
        tbs = [r for r in ours if r.kind == KIND_RANK_TRACEBACK and r.fields["path"] == str(p)]
        assert len(tbs) == 8 and all(len(tb.message.split("\n")) == 4 for tb in tbs)
    assert [r.seq for r in records] == list(range(1, len(records) + 1))


def test_a_full_disk_holds_the_lines_in_their_files_and_loses_none(tmp_path, running, monkeypatch):
    """The spool's disk (and the state dir's) full for a while: reading waits, the rows are
    offered again, no gap is written and the source is never restarted; every line once."""
    import errno

    from firstfault.agent.spool import writer as spool_writer
    from firstfault.agent.spool.intake import SpoolIntake
    from firstfault.agent.tail import state as tail_state

    logs = [tmp_path / f"rank{r}.log" for r in range(3)]
    spool = Spool(tmp_path / "spool", node="n1", max_bytes=64 << 20, fsync="never")
    sink, full = SpoolIntake(spool), threading.Event()
    assert spool_writer.os is tail_state.os  # one os.write for the spool and the tail state
    real_write = os.write

    def write_until_full(fd, data):
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)
    monkeypatch.setattr(spool_writer.os, "write", write_until_full)
    _write_ranks(logs, 0, 200)
    source = RanklogSource(globs=[str(tmp_path / "rank{rank}.log")], state_dir=str(tmp_path),
                           traceback_flush_s=0.2)
    with running(source, sink) as runner:
        time.sleep(0.5)
        full.set()
        _write_ranks(logs, 200, 1200)
        deadline = time.monotonic() + 10
        while not sink.spool_full_held and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(1.2)  # held: offered again every HOLD_RETRY_S, commits fail meanwhile
        full.clear()
        total = sum(len(file_lines(p)) for p in logs)
        deadline = time.monotonic() + 20
        while len(lines_of(read_all(spool))) < total and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runner.failures == 0
    records = read_all(spool)
    spool.close()
    assert sink.spool_full_held >= 2 and sink.spool_full_records == 0
    assert not [r for r in records if r.kind in ("agent.gap", KIND_RANK_GAP)]
    for p in logs:
        assert lines_of(records, str(p)) == file_lines(p), p


def test_lines_reach_the_spool_as_read_valid_text_undecoded(tmp_path):
    """Chunks of ASCII or UTF-8 lines go to the spool as the bytes read (packed as str);
    a chunk with an invalid byte goes as text with ``\\xNN``; each path's last line
    carries its position. What the spool hands the shipper is a valid wire batch."""
    logs = [tmp_path / f"rank{r}.log" for r in range(3)]
    write(logs[0], b"".join(b"[rank0]: step %d ok\n" % i for i in range(40)))
    write(logs[1], "[rank1]: étape 1 ✓\n[rank1]: 損失 0.5\n".encode())
    write(logs[2], b"[rank2]: fine\n[rank2]: bad \xff byte\n")
    spool = Spool(tmp_path / "spool", node="n1", max_bytes=64 << 20, fsync="never")
    with Tailer(str(tmp_path / "ranklog.json")) as t:
        engine = RankLines(t, spool_emit(spool))
        for p in logs:
            t.add(str(p))
        engine.batches([b for p in logs for b in t.poll_batches(str(p))])
    recs = read_all(spool)
    assert [r.message for r in recs] == [*(f"[rank0]: step {i} ok" for i in range(40)),
                                         "[rank1]: étape 1 ✓", "[rank1]: 損失 0.5",
                                         "[rank2]: fine", "[rank2]: bad \\xff byte"]
    assert [r.fields["path"] for r in recs] == [str(logs[k]) for k in [0] * 40 + [1, 1, 2, 2]]
    assert [i for i, r in enumerate(recs) if "end_offset" in r.fields] == [39, 41, 43]
    assert recs[39].fields["end_offset"] == os.path.getsize(logs[0])
    _, frame = spool.read_frame_after(None)
    assert [r.message for r in decode_batch(frame)] == [r.message for r in recs]
    spool.close()


def test_a_wake_mixing_text_and_undecoded_lines_goes_out_as_a_valid_batch(tmp_path):
    """One wake's chunks: a chunk with an invalid byte (its lines as text), a valid one (its
    lines' bytes as read), a traceback (grouped as text), and text again. Not one message
    may go out as msgpack bin (the collector refuses the whole frame, and the agent would
    send it again and again: found by the fault suite)."""
    logs = [tmp_path / f"rank{r}.log" for r in range(4)]
    write(logs[0], b"[rank0]: bad \xff byte\n[rank0]: next\n")
    write(logs[1], b"".join(b"[rank1]: step %d ok\n" % i for i in range(5)))
    write(logs[2], b"[rank2]: Traceback (most recent call last):\n"
                   b'[rank2]:   File "/job/train.py", line 9, in <module>\n'
                   b"[rank2]: ValueError: bad batch\n[rank2]: after\n")
    write(logs[3], b"[rank3]: also \xfe bad\n")
    spool = Spool(tmp_path / "spool", node="n1", max_bytes=64 << 20, fsync="never")
    with Tailer(str(tmp_path / "ranklog.json")) as t:
        engine = RankLines(t, spool_emit(spool), traceback_flush_s=0.0)
        for p in logs:
            t.add(str(p))
        engine.batches([b for p in logs for b in t.poll_batches(str(p))])
        engine.tick()
    _, frame = spool.read_frame_after(None)
    got = [r.message for r in decode_batch(frame)]
    spool.close()
    assert "[rank1]: step 4 ok" in got and "[rank0]: bad \\xff byte" in got and "[rank3]: also \\xfe bad" in got
    assert any(m.startswith("[rank2]: Traceback") for m in got)


def test_a_kill_before_the_commit_is_caught_up_from_the_spool(tmp_path, running):
    """Rows spooled after the last commit (a rotated file drained, its successor read, a
    new file opened after other paths were emitted, a traceback held open) are found in
    the spool at restart: every line once, none twice."""
    logs = [tmp_path / f"rank{r}.log" for r in range(3)]
    glob, state = str(tmp_path / "rank{rank}.log"), tmp_path / "ranklog.json"
    spool = Spool(tmp_path / "spool", node="n1", max_bytes=64 << 20, fsync="never")
    _write_ranks(logs[:2], 0, 50)
    with Tailer(state) as t:  # the source's engine, driven as a FollowLoop would
        engine = RankLines(t, spool_emit(spool), commit_s=0)

        def wake(paths):
            for p in paths:
                t.add(str(p))
                engine.batches(t.poll_batches(str(p)))
        wake(logs[:2])
        engine.tick()  # committed: 50 lines of ranks 0 and 1
        _write_ranks(logs[:2], 50, 80)
        os.rename(logs[0], str(logs[0]) + ".1")
        _write_ranks(logs, 80, 100)  # rank 2 is new
        write(logs[1], b"\n".join(TB) + b"\n")  # a traceback, open at the kill
        wake(logs)  # emitted, then the agent is killed: no commit
    rotated = Path(str(logs[0]) + ".1")
    spooled = lines_of(read_all(spool))
    assert len(spooled) == sum(len(file_lines(p)) for p in [rotated, *logs]) - len(TB)  # not held

    src = RanklogSource(globs=[glob], state_dir=str(tmp_path), traceback_flush_s=0.2)
    since = src.saved_at_ns()
    assert since == json.loads(state.read_text())["committed_at_ns"] > 0  # saved since (rank 2)
    src.catch_up(spool.recent_rows(since, "ranklog"))
    with running(src, spool_emit(spool)):
        write(logs[1], b"[rank1]: ValueError: the end\n")
        _write_ranks(logs, 100, 110)
        total = sum(len(file_lines(p)) for p in [rotated, *logs])
        deadline = time.monotonic() + 20
        while len(lines_of(read_all(spool))) < total and time.monotonic() < deadline:
            time.sleep(0.05)
    records = read_all(spool)
    spool.close()
    assert lines_of(records, str(logs[0])) == file_lines(rotated) + file_lines(logs[0])
    for p in logs[1:]:
        assert lines_of(records, str(p)) == file_lines(p), p
    tb = [r for r in records if r.kind == KIND_RANK_TRACEBACK and r.fields["path"] == str(logs[1])]
    assert tb[-1].message.split("\n") == [*map(to_text, TB), "[rank1]: ValueError: the end"]


def test_no_thread_or_inotify_watch_left_after_stop(tmp_path, running):
    threads, watches = set(threading.enumerate()), inotify_watches()
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        write(tmp_path / d / "rank0.log", b"x\n")
    rows = Rows()
    with running(RanklogSource(globs=[str(tmp_path / "{job}" / "rank{rank}.log")],
                               dirs=[str(tmp_path / "runs")]), rows):
        rows.wait_for(lambda r: len(r.of(KIND_RANK_LINE)) == 2)
        assert inotify_watches()[0] == watches[0] + 1 and inotify_watches()[1] > watches[1]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (inotify_watches() != watches
                                           or set(threading.enumerate()) - threads):
        time.sleep(0.02)
    assert inotify_watches() == watches and not set(threading.enumerate()) - threads


# -- the random model, through the source's engine and a real spool --------------------------

class SpoolModel(Model):
    """tests/agent/tail/tailmodel.py's Model with the ranklog engine and a real Spool as the
    consumer: a poll's lines are emitted into the spool and committed at once; a
    restart closes and reopens both. What must arrive is the model's own."""

    def __init__(self, tmp: Path, *a, **kw):
        self.spool_dir = tmp / "spool"
        self.spool = None
        super().__init__(tmp, *a, **kw)

    def _new_tailer(self) -> Tailer:
        if self.spool is not None:
            self.spool.close()
        self.spool = Spool(self.spool_dir, node="n1", max_bytes=64 << 20, fsync="never")
        t = super()._new_tailer()
        self.engine = RankLines(t, spool_emit(self.spool), clock=self.kw["clock"])
        return t

    def _poll_lines(self, path: str):
        batches = self.tailer.poll_batches(path)
        self.engine.events(self.tailer.take_events())
        self.engine.batches(batches)  # emitted into the spool,
        self.engine.commit()  # then committed (the FollowLoop's wake would tick)
        return [ln for b in batches for ln in b.lines()]

    def op_poll(self, name: str) -> None:
        super().op_poll(name)
        self._accept(name, len(self.received[name]))  # the engine committed them

    def op_commit(self) -> None:
        pass  # the engine commits after each emit

    def finish(self) -> None:
        super().finish()  # what the tailer delivered is what the model expects
        records = read_all(self.spool)
        self.spool.close()
        for name in self.names:
            assert lines_of(records, self.paths[name]) == [to_text(ln.data) for ln in self.accepted[name]]


@pytest.mark.parametrize("seed", range(6))
def test_random_file_operations_arrive_in_the_spool_exactly_once(tmp_path, seed):
    rng = random.Random(seed)
    model = SpoolModel(tmp_path, rng, mx=rng.choice([128, 200]), chunk=rng.choice([7, 64, 1 << 16]),
                       fp_bytes=rng.choice([16, 1024]))
    for _ in range(300):
        model.step()
    model.finish()
    assert sum(len(v) for v in model.accepted.values()) > 100
