"""A report read from marks (analysis/reads.py, Store.needed) equals the report read
from every record: real jobs' logs, and adversarial streams (progress ties, times out
of order, lines without rank or time, resends, late fills, prune cutting blocks)."""

import json
import random
import re
from pathlib import Path

import pytest

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.memory import TIMER_NEEDLE
from firstfault.analysis.parse import parse_stamp, strip_prefixes
from firstfault.analysis.reads import ReportMarker, needles, progress_needles
from firstfault.analysis.scan import Needles
from firstfault.collector import query
from firstfault.collector.store.base import Selection
from firstfault.collector.store.sqlite import SqliteStore
from firstfault.wire import Record
from tests.analysis.shipped import ship_file
from tests.collector.frames import insert_frames

ROOT = Path(__file__).resolve().parents[1]

REAL = ROOT / "data" / "real"
T0 = 1_796_206_319_782_000_000
S = 1_000_000_000
CATALOG = load_catalog()
# Needles other than progress lines': a line holding one is read whole by a report (an error, a
# memory figure); DeepSpeed's throughput line (MemAllocated=) is a progress line whose memory
# figure the memory view keeps per second (memory.TimerLines): counted apart (_timer_lines)
_READ_WHOLE = [w for w in Needles(needles(CATALOG)).words
               if w not in set(progress_needles(CATALOG)) and w != TIMER_NEEDLE]


def _progress_only(records) -> list[Record]:
    """The rank lines that hold progress needles and nothing else a report reads."""
    return [r for r in records if r.source == "ranklog" and not any(w in r.message for w in _READ_WHOLE)
            and TIMER_NEEDLE not in r.message]


def _timer_lines(records) -> list[Record]:
    """DeepSpeed's throughput lines holding nothing else a report reads whole."""
    return [r for r in records if r.source == "ranklog" and TIMER_NEEDLE in r.message
            and not any(w in r.message for w in _READ_WHOLE)]


def _saves_reading(needed: list[Record], every: list[Record], share: float) -> None:
    """What marks promise: of the progress-only lines only the latest of each (stream, rank)
    and block is read, less than ``share`` of them, and fewer records than all."""
    assert len(_progress_only(needed)) < len(_progress_only(every)) * share
    assert len(needed) < len(every)


class Clock:
    now = T0 + 86400 * S

    def __call__(self) -> int:
        return self.now


def _stores(tmp_path, request=None, backend="sqlite"):
    """(clock, a store that marks, one that does not) on ``backend``."""
    clock = Clock()
    if backend == "postgres":
        from firstfault.collector.store.postgres import PostgresStore

        pg = request.getfixturevalue("postgres")
        marked = PostgresStore(pg.create_database(), marker=ReportMarker(CATALOG), now_ns=clock)
        plain = PostgresStore(pg.create_database(), now_ns=clock)
        request.addfinalizer(marked.close)
        request.addfinalizer(plain.close)
        return clock, marked, plain
    marked = SqliteStore(tmp_path / "marked.db", marker=ReportMarker(CATALOG), now_ns=clock)
    plain = SqliteStore(tmp_path / "plain.db", now_ns=clock)
    return clock, marked, plain


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.slow)]


def _report(store, job):
    rep = query.report(store, job, CATALOG)
    rep.pop("generated_at", None)
    return rep


def _stamped(r: Record) -> Record:
    """The record as an agent that reads each line's own time sends it."""
    st = parse_stamp(strip_prefixes(r.message.partition("\n")[0]).text, year=2026)
    return r if st is None else Record(**{**{f: getattr(r, f) for f in r.__slots__},
                                          "occurred_ns": st.ns})


def _rank_of(path: Path) -> int | None:
    if path.parent.name.isdigit():  # torchrun --log-dir: attempt_0/<rank>/stderr.log
        return int(path.parent.name)
    return int(path.stem.rsplit("rank", 1)[1]) if "_rank" in path.stem else None


def _insert(store, batch: list[Record], via: str) -> int:
    return store.insert(batch) if via == "records" else insert_frames(store, batch)


@pytest.mark.parametrize("case", sorted(p.name for p in REAL.iterdir() if p.is_dir()))
@pytest.mark.parametrize("stamped,backend,via", [
    (False, "sqlite", "frames"), (True, "sqlite", "frames"), (True, "sqlite", "records"),
    pytest.param(True, "postgres", "frames", marks=pytest.mark.slow)])
def test_real_jobs_report_the_same_from_marks(tmp_path, request, case, stamped, backend, via):
    _, marked, plain = _stores(tmp_path, request, backend)
    for k, path in enumerate(sorted((REAL / case).rglob("*.log"))):
        rank = _rank_of(path)
        records = [_stamped(r) if stamped else r
                   for r in ship_file(path, f"node-{k % 2}", rank, 0)]
        records = [Record(**{**{f: getattr(r, f) for f in r.__slots__}, "job": "j"})
                   for r in records]
        for i in range(0, len(records), 97):  # progress lines of a rank span blocks
            _insert(marked, records[i:i + 97], via)
            plain.insert(records[i:i + 97])
    assert _report(marked, "j") == _report(plain, "j")
    n_all = len(list(plain.records(Selection(job="j"))))
    n_marked = len(list(marked.needed(Selection(job="j"), ReportMarker(CATALOG).name)))
    assert n_marked <= n_all


def _line(rnd: random.Random, rank: int, step: int, t: int) -> str:
    stamp = "[2026-12-02 10:{:02d}:{:02d},{:03d}]".format(*divmod(t // S % 3600, 60),
                                                           t // 10**6 % 1000)
    k = rnd.random()
    if k < 0.3:
        return f"{stamp} [INFO] [logging.py:107:log_dist] [Rank {rank}] step={step}, skipped=0, lr=[0.1]"
    if k < 0.55:
        return (f"{stamp} [INFO] [timer.py:264:stop] epoch=0/micro_step={step}/global_step={step}, "
                f"RunningAvgSamplesPerSec=1.0, CurrSamplesPerSec=1.0, MemAllocated={rnd.choice((1, 1.5, 2))}GB, "
                f"MaxMemAllocated={rnd.choice((2, 2.5))}GB")  # ties and falls within a second
    if k < 0.6:
        return f"[rank{rank}]: note, skipped=3 batches of bad data"  # a needle, not progress
    if k < 0.62:
        return f"{stamp} [WARNING] [stage3.py:2171:step] 1 pytorch allocator cache flushes since last step."
    if k < 0.63:
        return "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    return f"[rank{rank}]: epoch 0 step {step} loss 1.{rnd.randrange(1000):03d}"


def _adversarial(rnd: random.Random, n: int, node: str) -> list[Record]:
    out = []
    t = T0
    for seq in range(n):
        t += rnd.choice((0, 0, 10_000_000, 20_000_000, -3_000_000))  # ties and steps back
        rank = rnd.choice((0, 1, 2, None))
        kind = "rank.line"
        fields = {"path": f"/logs/rank{rank}.{rnd.randrange(2)}.log"} if rnd.random() < 0.3 else {}
        source, message = "ranklog", _line(rnd, rank or 0, seq // 10, t)
        if rnd.random() < 0.01:
            source, kind, message, rank = "kmsg", "kernel.line", "Out of memory: Killed process 24001", None
        occurred = None if rnd.random() < 0.05 else t
        out.append(Record(node=node, stream="s1", seq=seq, source=source, kind=kind, message=message,
                          occurred_ns=occurred, observed_ns=t + 5_000_000,
                          job=None if kind == "kernel.line" else "j", rank=rank,
                          pid=None if rank is None else 24000 + rank, fields=fields))
    return out


@pytest.mark.parametrize("seed,backend,via", [
    *((s, "sqlite", "frames" if s % 2 else "records") for s in range(4)),
    *(pytest.param(s, "postgres", "frames", marks=pytest.mark.slow) for s in range(2))])
def test_adversarial_streams_report_the_same_from_marks(tmp_path, request, seed, backend, via):
    rnd = random.Random(seed)
    clock, marked, plain = _stores(tmp_path, request, backend)
    streams = [_adversarial(rnd, 3000, node) for node in ("gpu-01", "gpu-02")]
    for records in streams:
        order = list(range(0, len(records), 113))
        rnd.shuffle(order)  # late fills: batches below the high mark
        for i in order:
            batch = records[i:i + 113]
            if rnd.random() < 0.3:  # holes in a batch's seqs, and a resend overlapping it
                batch = [r for r in batch if rnd.random() < 0.7]
            for s in (marked, plain):
                _insert(s, batch, via)
                _insert(s, records[max(0, i - 50):i + 20], via)
    assert _report(marked, "j") == _report(plain, "j")
    assert list(marked.records(Selection(job="j"))) == list(plain.records(Selection(job="j")))
    clock.now = T0 + 8 * S + 3600 * S  # cuts the streams (~16 s) and their blocks
    assert marked.prune(max_age_s=3600, max_bytes=None) == plain.prune(max_age_s=3600, max_bytes=None) > 0
    assert _report(marked, "j") == _report(plain, "j")
    needed = list(marked.needed(Selection(job="j"), ReportMarker(CATALOG).name))
    # late fills and resends make blocks of a few dozen records, each with its own latest lines
    _saves_reading(needed, list(plain.records(Selection(job="j"))), share=1 / 2)


def test_group_commits_are_marked_at_once_and_unmarked_blocks_later(tmp_path):
    """insert_columns_many (the server's group commit) marks as it writes; blocks a store
    without a marker wrote wait in ``pending`` until a store with one marks them, a
    step at a time (mark_pending), and the report is the same all along."""
    from firstfault.collector.store.blocks import COLUMNS

    rnd = random.Random(7)
    _, marked, plain = _stores(tmp_path)
    records = _adversarial(rnd, 4000, "gpu-01")
    batches = [("gpu-01", "s1", [r.seq for r in records[i:i + 500]],
                {c: [getattr(r, c) for r in records[i:i + 500]] for c in COLUMNS})
               for i in range(0, len(records), 500)]
    assert marked.insert_columns_many(batches) == plain.insert_columns_many(batches) == [500] * 8
    name = ReportMarker(CATALOG).name
    every = list(plain.records(Selection(job="j")))
    everything = len(every)
    _saves_reading(list(marked.needed(Selection(job="j"), name)), every, share=1 / 10)  # 500-record blocks
    assert marked._db.execute("SELECT count(*) FROM pending").fetchone()[0] == 0
    assert plain.mark_pending() == 0  # no marker, nothing to do
    plain.close()
    later = SqliteStore(tmp_path / "plain.db", marker=ReportMarker(CATALOG), now_ns=Clock())
    assert len(list(later.needed(Selection(job="j"), name))) == everything  # unmarked: whole
    blocks = later._db.execute("SELECT count(*) FROM pending").fetchone()[0]
    assert 0 < later.mark_pending(max_records=1000) < blocks  # a step, not all at once
    while later.mark_pending():
        pass
    assert later._db.execute("SELECT count(*) FROM pending").fetchone()[0] == 0
    _saves_reading(list(later.needed(Selection(job="j"), name)), every, share=1 / 10)
    assert _report(later, "j") == _report(marked, "j")
    later.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_node_whose_lines_hold_no_needle_is_still_seen(tmp_path, request, backend):
    """The report lists the nodes that sent records of the job: one of plain lines only
    is seen through its blocks' last records."""
    _, marked, plain = _stores(tmp_path, request, backend)
    quiet = [Record(node="gpu-02", stream="s", seq=i, source="ranklog", kind="rank.line",
                    message=f"[rank1]: epoch 0 batch {i} done", occurred_ns=T0 + i * S,
                    observed_ns=T0 + i * S, job="j", rank=1) for i in range(300)]
    loud = [Record(node="gpu-01", stream="s", seq=0, source="ranklog", kind="rank.line",
                   message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                   occurred_ns=T0, observed_ns=T0, job="j", rank=0)]
    for s in (marked, plain):
        s.insert(loud)
        for i in range(0, 300, 100):
            s.insert(quiet[i:i + 100])
    rep = _report(marked, "j")
    assert rep == _report(plain, "j")
    assert "gpu-02" in json.dumps(rep["nodes"])
    assert len(list(marked.needed(Selection(job="j"), ReportMarker(CATALOG).name))) == 1 + 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rank_of_plain_lines_in_a_busy_block_is_still_known_with_its_node(tmp_path, request,
                                                                             backend):
    """Every rank that logged is in the report with its node, even one whose lines hold
    no needle and are never a block's last: each rank's last record of a block is marked."""
    _, marked, plain = _stores(tmp_path, request, backend)
    lines = [Record(node="gpu-01", stream="s", seq=i, source="ranklog", kind="rank.line",
                    message=f"[rank{i % 3}]: epoch 0 step {i} loss 1.0", occurred_ns=T0 + i * S,
                    observed_ns=T0 + i * S, job="j", rank=i % 3) for i in range(300)]
    lines.append(Record(node="gpu-01", stream="s", seq=300, source="ranklog", kind="rank.line",
                        message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                        occurred_ns=T0 + 300 * S, observed_ns=T0 + 300 * S, job="j", rank=0))
    for s in (marked, plain):
        s.insert(lines)
    rep = _report(marked, "j")
    assert rep == _report(plain, "j")
    assert {r: v["node"] for r, v in rep["ranks"].items()} == {"0": "gpu-01", "1": "gpu-01", "2": "gpu-01"}
    assert not [g for g in rep["gaps"] if g.get("rank") is not None]


def _throughput(rnd: random.Random, n: int, node: str) -> list[Record]:
    """A long run's DeepSpeed throughput lines (timer.py's format) from 4 ranks, ~500 a second
    each, memory rising and falling, some lines with no pid or time."""
    out, t, mem = [], T0, [8.0] * 4
    for seq in range(n):
        t += rnd.choice((0, 1_000_000, 2_000_000, -1_000_000))
        rank = seq % 4
        mem[rank] = max(1.0, mem[rank] + rnd.choice((-0.25, 0.0, 0.0, 0.25)))
        stamp = "[2026-12-02 10:{:02d}:{:02d},{:03d}]".format(*divmod(t // S % 3600, 60), t // 10**6 % 1000)
        msg = (f"{stamp} [INFO] [timer.py:264:stop] epoch=0/micro_step={seq}/global_step={seq}, "
               f"RunningAvgSamplesPerSec=9.5, CurrSamplesPerSec=9.6, MemAllocated={mem[rank]:.2f}GB, "
               f"MaxMemAllocated={mem[rank] + rnd.choice((0, 0.5)):.2f}GB")
        out.append(Record(node=node, stream="s1", seq=seq, source="ranklog", kind="rank.line", message=msg,
                          occurred_ns=None if rnd.random() < 0.02 else t, observed_ns=t + 5_000_000, job="j",
                          rank=rank, pid=None if rnd.random() < 0.02 else 24000 + rank,
                          fields={"path": f"/logs/rank{rank}.log"} if rank % 2 else {}))
    return out


@pytest.mark.parametrize("seed,backend", [(0, "sqlite"), (1, "sqlite"), pytest.param(0, "postgres", marks=pytest.mark.slow)])
def test_throughput_lines_are_read_per_second_and_report_the_same(tmp_path, request, seed, backend):
    """The memory view keeps, per (stream, pid) and second, the throughput lines no later one
    beats (memory.TimerLines); the marker keeps those of each block, before and after prune."""
    rnd = random.Random(seed)
    clock, marked, plain = _stores(tmp_path, request, backend)
    records = _throughput(rnd, 12_000, "gpu-01")
    order = list(range(0, len(records), 500))
    rnd.shuffle(order)  # late fills: blocks interleave in time
    for i in order:
        for s in (marked, plain):
            _insert(s, records[i:i + 500], "frames" if i % 1000 else "records")
    rep = _report(marked, "j")
    assert rep == _report(plain, "j")
    every = list(plain.records(Selection(job="j")))
    needed = list(marked.needed(Selection(job="j"), ReportMarker(CATALOG).name))
    assert len(_timer_lines(needed)) < len(_timer_lines(every)) / 4
    # the series' peak is the highest figure of all the lines, not of a sample of them
    top = max(max(float(x) for x in re.findall(r"MemAllocated=([\d.]+)GB", r.message)) for r in every
              if r.rank == 0)
    assert rep["memory"]["ranks"]["0"]["series"]["allocated"]["peak"] == int(top * (1 << 30))
    clock.now = T0 + 3 * S + 3600 * S  # cuts the stream (~6 s) inside blocks and seconds
    assert marked.prune(max_age_s=3600, max_bytes=None) == plain.prune(max_age_s=3600, max_bytes=None) > 0
    assert _report(marked, "j") == _report(plain, "j")


def _progress(step: int) -> str:
    return (f"[2026-12-02 10:11:{step % 60:02d},000] [INFO] [logging.py:107:log_dist] [Rank 0] "
            f"step={step}, skipped=0, lr=[0.0001], loss=1.0, samples/s=180.00")


@pytest.mark.parametrize("fields", [
    [{}, {"path": "/logs/a"}, {}, {"path": "/logs/a"}, {"path": "/logs/b"}],
    [{"path": ""}, {"path": "/logs/a"}, {}, {"path": "/logs/a"}, {"path": "/logs/b"}],
    [{}, {"path": "/logs/a"}, {"path": ""}, {"path": "/logs/a"}, {"path": "/logs/b"}],
    [None, {"path": "/logs/a"}, {"path": ""}, {"path": "/logs/a"}, {"path": "/logs/b"}],
])
def test_the_latest_progress_line_of_each_file_is_marked_an_empty_path_none(fields):
    """Records 2 and 3 are the latest of no file (no path, an empty one, no fields) and
    of file a, record 4 the block's last: records 0 and 1, earlier ones, are left."""
    n = len(fields)
    got = ReportMarker(load_catalog()).mark(
        source=["ranklog"] * n, kind=["rank.line"] * n, message=[_progress(s) for s in range(n)],
        occurred_ns=[10**18 + s for s in range(n)], rank=[0] * n, fields=fields)
    assert got == [2, 3, 4]
