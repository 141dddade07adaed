"""ranklog: faulthandler dumps become one rank.stacks record; the watch hook sees every line, once a wake per job."""

from pathlib import Path

import pytest

from firstfault.agent.tail import to_text
from firstfault.wire import KIND_RANK_LINE, KIND_RANK_STACKS, KIND_RANK_TRACEBACK
from tests.agent.sources.test_ranklog import ship_files
from tests.agent.tail.tailmodel import write

FORMATS = Path(__file__).resolve().parents[2] / "data" / "formats"


def every_line(records):
    return [ln for r in records for ln in r.message.split("\n")
            if r.kind in (KIND_RANK_LINE, KIND_RANK_TRACEBACK, KIND_RANK_STACKS)]


def lines(path):
    return [to_text(x) for x in path.read_bytes().split(b"\n")[:-1]]


@pytest.mark.parametrize("name,head", [("faulthandler-segfault", "Fatal Python error: Segmentation fault"),
                                       ("faulthandler-abort", "Fatal Python error: Aborted"),
                                       ("faulthandler-dump-traceback-later", "Timeout (0:00:00.300000)!"),
                                       ("faulthandler-dump-traceback", None)])
def test_a_faulthandler_dump_is_one_stacks_record(name, head):
    path = FORMATS / f"{name}.log"
    rows = ship_files([path])
    want = lines(path)
    assert every_line(rows.records) == want
    dumps = rows.of(KIND_RANK_STACKS)
    assert len(dumps) == 1
    d = dumps[0]
    assert d.fields["tool"] == "faulthandler" and d.severity == 4
    body = d.message.split("\n")
    assert body[0].startswith(("Thread 0x", "Current thread 0x")) and body[-1].startswith("  File ")
    assert sum(ln.endswith("(most recent call first):") for ln in body) == \
        sum(ln.endswith("(most recent call first):") for ln in want)
    if head:
        assert rows.records[0].kind == KIND_RANK_LINE and rows.records[0].message == head


def test_a_dump_with_a_rank_prefix_and_lines_after_it(tmp_path):
    log = tmp_path / "console.log"
    src = lines(FORMATS / "faulthandler-register-sigusr1.log")
    write(log, "".join(f"[default1]:{ln}\n" for ln in src).encode() + b"[default0]:rank 0 step 3\n"
          + b"[default1]:after the dump\n")
    rows = ship_files([log])
    (d,) = rows.of(KIND_RANK_STACKS)
    assert all(ln.startswith("[default1]:") for ln in d.message.split("\n"))
    assert rows.records[-1].message == "[default1]:after the dump"


def test_watch_sees_every_chunk_with_its_identity(tmp_path):
    log = tmp_path / "rank3.log"
    write(log, b"one\nRuntimeError: Timed out waiting 4000ms for recv operation to complete\n")
    seen = []
    ship_files([log], watch=lambda ident, text, at: seen.append((ident[0], text, at)))
    assert seen and b"Timed out waiting" in b"".join(x[1] for x in seen)
    assert all(isinstance(x[2], int) for x in seen)


def test_watch_is_told_once_a_wake_per_job_with_every_line(tmp_path):
    """A wake's chunks of several files reach the hook joined, one call per job."""
    from firstfault.agent.sources.ranklog import RankLines
    from firstfault.agent.tail import Tailer
    from tests.agent.sources.test_ranklog import Rows

    paths = {("a", 0): tmp_path / "a" / "rank0.log", ("a", 1): tmp_path / "a" / "rank1.log",
             ("b", 0): tmp_path / "b" / "rank0.log"}
    for (job, rank), p in paths.items():
        p.parent.mkdir(exist_ok=True)
        write(p, b"%s %d one\n%s %d two\n" % (job.encode(), rank, job.encode(), rank))
    seen, rows = [], Rows()
    with Tailer(None) as t:
        engine = RankLines(t, rows, watch=lambda ident, text, at: seen.append((ident[0], text, at)))
        for (job, _), p in paths.items():
            t.add(str(p), {"job": job})
        engine.batches([b for p in paths.values() for b in t.poll_batches(str(p))])
    assert [(job, text.split(b"\n")) for job, text, _ in seen] == [
        ("a", [b"a 0 one", b"a 0 two", b"a 1 one", b"a 1 two"]), ("b", [b"b 0 one", b"b 0 two"])]
    assert all(isinstance(at, int) for _, _, at in seen)
    assert len(rows.of(KIND_RANK_LINE)) == 6


def test_a_wake_of_plain_chunks_beside_a_traceback_or_bad_utf8_ships_each_as_alone(tmp_path):
    """The wake-wide check (every chunk UTF-8 and unmarked) falls back to each chunk's own:
    the rows are those of one chunk a call."""
    from firstfault.agent.sources.ranklog import RankLines
    from firstfault.agent.tail import Tailer
    from tests.agent.sources.test_ranklog import Rows
    from tests.agent.tail.tailmodel import Clock

    texts = [b"plain 1\nplain 2\n",
             b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
             b"ValueError: bad\nafter\n",
             b"caf\xc3\xa9 ok\nbad \xff byte\n", b"plain 3\n"]
    got = []
    for together in (True, False):
        d = tmp_path / str(together)
        d.mkdir()
        rows, clock = Rows(), Clock()
        with Tailer(None, clock=clock) as t:
            engine = RankLines(t, rows, clock=clock)
            batches = []
            for i, data in enumerate(texts):
                write(d / f"rank{i}.log", data)
                t.add(str(d / f"rank{i}.log"))
                batches.append(t.poll_batches(str(d / f"rank{i}.log")))
            if together:
                engine.batches([b for bs in batches for b in bs])
            else:
                for bs in batches:
                    engine.batches(bs)
            clock.t += 60
            engine.tick()
        got.append([(r.kind, r.message, r.fields["path"].rsplit("/", 1)[1]) for r in rows.records])
    assert got[0] == got[1]
    assert [k for k, _, _ in got[0]].count(KIND_RANK_TRACEBACK) == 1
    assert ("rank.line", "bad \\xff byte", "rank2.log") in got[0]
