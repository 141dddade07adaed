"""The fast scanner: only lines with needles become Events; tracebacks whole; times bracketed."""

import random

from firstfault.analysis import scan, timeline
from firstfault.analysis.events import KIND_STREAM
from firstfault.analysis.scan import Needles, StreamInfo, scan_stream

NEEDLES = Needles(["global_step=", "Connection closed by peer", "NCCL WARN"])

LOG = b"""[2026-12-02 10:11:59,782] [INFO] [logging.py:123:log_dist] [Rank 0] DeepSpeed setup
[2026-12-02 10:12:00,000] [INFO] [timer.py:264:stop] epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=1
[default1]:[rank1]: Traceback (most recent call last):
[default0]:[rank0]: Traceback (most recent call last):
[default1]:[rank1]:   File "/x/train.py", line 10, in <module>
[default0]:[rank0]:   File "/x/train.py", line 11, in <module>
[default1]:[rank1]:     main()
[default1]:[rank1]:   File "/x/model.py", line 5, in forward
[default1]:[rank1]:     raise ValueError("boom")
[default1]:[rank1]: ValueError: boom
[default0]:[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:15546
plain output line without needles
[2026-12-02 10:12:01,000] [INFO] [launch.py:1:x] done
"""


def _events(data: bytes, chunk: int | None = None, **kw):
    chunks = [data] if chunk is None else [data[i : i + chunk] for i in range(0, len(data), chunk)]
    evs = list(scan_stream(chunks, StreamInfo("s", **kw), NEEDLES))
    return [e for e in evs if e.kind != KIND_STREAM], evs[-1]


def _view(evs):
    return [(e.kind, e.rank, e.exc_type, e.origin, e.occurred_ns, e.fields.get("after_ns"), e.fields.get("before_ns"))
            for e in evs]


def test_interleaved_tracebacks_per_rank_with_time_bounds():
    evs, summary = _events(LOG)
    assert [(e.kind, e.rank, e.exc_type, e.origin) for e in evs] == [
        ("line", None, None, "s:2"),
        ("traceback", 1, "ValueError", "s:3"),
        ("traceback", 0, "RuntimeError", "s:4"),
    ]
    tb1 = evs[1]
    assert tb1.local_rank == 1 and tb1.fields["message"] == "ValueError: boom"
    assert [f.func for f in tb1.frames] == ["<module>", "forward"]
    assert tb1.occurred_ns is None
    assert tb1.fields["after_ns"] == evs[0].occurred_ns
    assert tb1.fields["before_ns"] - tb1.fields["after_ns"] == 1_000_000_000
    assert summary.kind == KIND_STREAM and summary.fields["lines"] == 13
    assert summary.fields["last_ns"] - summary.fields["first_ns"] == 1_218_000_000


def test_chunking_does_not_change_the_result():
    whole, _ = _events(LOG)
    for size in (1, 7, 64, 333):
        parts, _ = _events(LOG, chunk=size)
        assert _view(parts) == _view(whole), size


def test_lines_without_needles_are_not_events_and_memory_is_bounded():
    filler = b"[2026-12-02 10:12:00,000] [INFO] [x.py:1:f] step ok\n" * 50_000
    evs, summary = _events(filler + b"gpu-1:12:13 [0] NCCL WARN NET/IB : Got completion with error\n")
    assert len(evs) == 1 and evs[0].pid == 12 and evs[0].node == "gpu-1"
    assert summary.fields["lines"] == 50_001


def test_no_trailing_newline_and_long_lines():
    evs, _ = _events(b"x" * 200_000 + b" NCCL WARN boom")
    assert len(evs) <= 1  # the needle lies past the cut: not required to be found
    evs, _ = _events(b"Connection closed by peer at end")
    assert len(evs) == 1 and evs[0].text == "Connection closed by peer at end"


def test_random_bytes_never_raise():
    rnd = random.Random(7)
    for _ in range(200):
        data = bytes(rnd.randrange(256) for _ in range(rnd.randrange(300)))
        data += rnd.choice([b"", b"Traceback (most recent call last):\n", b"NCCL WARN\n"])
        _events(data, chunk=rnd.randrange(1, 50))


def test_end_of_stream_closes_open_traceback_with_mtime_bound():
    evs, _ = _events(b"[2026-12-02 10:12:00,000] [INFO] x\nTraceback (most recent call last):\n  File \"a.py\", line 1, in f\n",
                     observed_ns=5)
    assert evs[0].kind == "traceback" and evs[0].exc_type is None and evs[0].fields["before_ns"] == 5


def test_a_log_without_any_stamp_gives_no_occurred_time_and_keeps_its_order():
    data = (b"step 4\nTraceback (most recent call last):\n  File \"a.py\", line 1, in f\n"
            b"ValueError: boom\ngpu-07:24215:24301 [0] misc/socket.cc:50 NCCL WARN late\n")
    evs, _ = _events(data, observed_ns=1_796_000_000 * 10**9)
    placed = timeline.build(list(evs))
    assert [e.kind for e in placed[:2]] == ["traceback", "line"]  # stream order kept
    assert all(e.occurred_ns is None and e.clock is None for e in placed)
    assert all("before_ns" not in e.fields and "after_ns" not in e.fields for e in placed)


def test_only_the_last_progress_line_before_each_other_hit_becomes_an_event():
    """Progress comes every step; only the last before another hit says something (scan.Needles)."""
    needles = Needles(["Connection closed by peer", "step "], progress=["step "],
                      progress_patterns=[r"\bstep (?P<step>\d+) loss \d"])
    lines = [f"step {i} loss 1.{i}" for i in range(1, 6)] + ["RuntimeError: Connection closed by peer [x]:1"]
    lines += [f"step {i} loss 1.{i}" for i in range(6, 9)] + ["Skipping step 9", "plain"]
    evs = [e for e in scan_stream([("\n".join(lines) + "\n").encode()], StreamInfo("s"), needles)
           if e.kind != KIND_STREAM]
    assert [e.text for e in evs] == ["step 5 loss 1.5", "RuntimeError: Connection closed by peer [x]:1",
                                     "step 8 loss 1.8"]
    mixed = "\n".join(f"[default{r}]:step {i} loss 0.{i}" for i in range(1, 4) for r in range(3)) + "\n"
    evs = [e for e in scan_stream([mixed.encode()], StreamInfo("c"), needles) if e.kind != KIND_STREAM]
    assert sorted((e.local_rank, e.text) for e in evs) == [(0, "step 3 loss 0.3"), (1, "step 3 loss 0.3"),
                                                           (2, "step 3 loss 0.3")]


def test_the_progress_line_above_a_hit_is_read_when_the_hit_shares_a_line_with_progress():
    """A bar redrawn without a newline and then an error on the same line: that line is the hit; the last
    progress line to read is the one above it, not the hit's own line again."""
    needles = Needles(["Connection closed by peer", "step "], progress=["step "],
                      progress_patterns=[r"\bstep (?P<step>\d+) loss \d"])
    lines = ["step 1 loss 1.1", "step 2 loss 1.2", "step 3 loss 1.3RuntimeError: Connection closed by peer [x]:1"]
    evs = [e for e in scan_stream([("\n".join(lines) + "\n").encode()], StreamInfo("s"), needles)
           if e.kind != KIND_STREAM]
    assert [e.text for e in evs] == ["step 2 loss 1.2", lines[2]]


DS_STEP = ("[2026-12-02 10:00:0{s},100] [INFO] [logging.py:107:log_dist] [Rank 0] step={i}, skipped=0, lr=[0.0001]",
           "[2026-12-02 10:00:0{s},100] [INFO] [timer.py:264:stop] epoch=0/micro_step={i}/global_step={i}, "
           "RunningAvgSamplesPerSec=180.1, CurrSamplesPerSec=181.9, MemAllocated=21.3GB, MaxMemAllocated=27.9GB")
DS_NEEDLES = Needles(["MemAllocated=", "NCCL WARN", "step", "%|"], progress=["step", "%|"],
                     progress_patterns=[r"epoch=(?P<epoch>\d+)/micro_step=\d+/global_step=(?P<step>\d+)",
                                        r"\bstep=(?P<step>\d+), skipped=\d+, lr=",
                                        r"^(?P<desc>[^|]*): *\d{1,3}%\|[^|]*\| *\d+/\d+ \[(?P<elapsed>\d+:\d\d)<"],
                     others=["NCCL WARN"])


def _texts(lines, needles=DS_NEEDLES, name="s"):
    data = ("\n".join(lines) + "\n").encode()
    return [e.text for e in scan_stream([data], StreamInfo(name), needles) if e.kind != KIND_STREAM]


def test_a_progress_line_that_is_a_hit_supersedes_the_progress_line_above_it():
    """DeepSpeed prints two progress lines a step (the engine's and the throughput line, which the memory
    view reads): the latest progress is the throughput line, so the engine's line above it is no Event."""
    lines = [t.format(s=i, i=i) for i in range(1, 4) for t in DS_STEP]
    assert _texts(lines) == [lines[1], lines[3], lines[5]]
    # not an example: the last engine line, with no hit after it, is the stream's latest progress
    assert _texts(lines + [DS_STEP[0].format(s=4, i=4)])[-1].endswith("step=4, skipped=0, lr=[0.0001]")
    # not an example: an error on the throughput line's line is read as the error, so the line above counts
    glued = lines[:5] + [lines[5] + "NCCL WARN Net : Connection closed by remote peer"]
    assert _texts(glued) == [lines[1], lines[3], lines[4], glued[5]]


def test_a_bar_above_a_progress_hit_is_still_read():
    """A bar of work keeps its longest run beside the latest progress (findings._keep): one between two
    throughput lines is still read, though the throughput line is later progress."""
    bar = "Map (num_proc=8): 40%|####      | 400/1000 [12:30<18:45, 0.53 examples/s]"
    lines = [DS_STEP[1].format(s=1, i=1), bar, DS_STEP[1].format(s=2, i=2)]
    assert _texts(lines) == lines


def test_a_mixed_stream_keeps_each_ranks_last_progress_above_a_progress_hit():
    """In a launcher's console the ranks interleave: one rank's throughput line is not another's progress."""
    lines = [f"[rank{r}]:" + DS_STEP[0].format(s=1, i=1) for r in (0, 1)] + ["[rank0]:" + DS_STEP[1].format(s=1, i=1)]
    data = ("\n".join(lines) + "\n").encode()
    evs = [e for e in scan_stream([data], StreamInfo("console"), DS_NEEDLES) if e.kind != KIND_STREAM]
    assert [(e.rank, e.text) for e in evs] == [(r, line.partition("]:")[2]) for r, line in zip((0, 1, 0), lines)]


def test_the_last_progress_line_is_found_whatever_the_search_window(monkeypatch):
    """last_progress looks for each needle a window at a time; the line it finds is the one a search of
    the whole range finds, also for needles that straddle a window's edge."""
    needles = Needles(["x"], progress=["step", "'loss': ", "%|"],
                      progress_patterns=[r"\bstep \d+ loss", r"'loss': \d", r"\d%\|"])
    shapes = [b"step 3 loss 1.2", b"[rank1]:step 4 loss 2.0", b"noise", b"{'loss': 0.5}", b"[rank2]:{'loss': 1}",
              b"Map: 10%|# | 1/10", b"the step was", b"st", b"ep 5 loss 1", b"-" * 40]

    def whole(data, lo, hi, mixed):  # the definition: the last progress line, per prefix when mixed
        out, seen, end = [], set(), hi
        while end > lo:
            p = max(data.rfind(w, lo, end) for w in needles.progress)
            start = data.rfind(b"\n", 0, p) + 1
            if p < 0 or start < lo:
                break
            stop = data.find(b"\n", p)
            prefix, progress = needles._progress_text(data[start:stop if stop >= 0 else len(data)])
            if prefix not in seen and progress:
                seen.add(prefix)
                out.append(start)
                if not mixed:
                    break
            end = start
        return out

    rnd = random.Random(7)
    for window in (1, 5, 64 * 1024):
        monkeypatch.setattr(scan, "PROGRESS_WINDOW", window)
        for _ in range(500):
            data = b"\n".join(rnd.choice(shapes) for _ in range(rnd.randrange(30))) + b"\n"
            lo = rnd.randrange(len(data))
            hi = rnd.randrange(lo, len(data) + 1)
            for mixed in (False, True):
                assert needles.last_progress(data, lo, hi, mixed) == whole(data, lo, hi, mixed)


def test_a_stamp_that_does_not_parse_leaves_the_one_before():
    """Lines between hits are read for their last stamp only when a hit without one needs it; a stamp-shaped
    line whose date is no date leaves the stamp before it, as if each stretch were read at once."""
    needles = Needles(["Connection closed by peer"])
    lines = ["[2026-12-02 10:00:01,000] [INFO] plain", "RuntimeError: Connection closed by peer [a]:1",
             "[2026-12-02 10:00:02,000] [INFO] plain", "[2026-13-45 99:00:00,000] [INFO] no date",
             "RuntimeError: Connection closed by peer [b]:2", "[2026-12-02 10:00:05,000] [INFO] plain"]
    evs = [e for e in scan_stream([("\n".join(lines) + "\n").encode()], StreamInfo("s"), needles)
           if e.kind != KIND_STREAM]
    second = evs[1].fields
    assert second["before_ns"] - evs[0].fields["after_ns"] == 4_000_000_000  # 10:00:01 to 10:00:05
    assert second["before_ns"] - second["after_ns"] == 3_000_000_000  # from 10:00:02, not 10:00:01
