"""The fast scanner: only lines with needles become Events; tracebacks whole; times bracketed."""

import random

from firstfault.analysis import timeline
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
