"""The CRI log format: records, stamps, partial lines joined, the kubelet's paths."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from firstfault.common.crilog import CriJoiner, join_lines, parse_pod_log_path, parse_record, pod_log_globs, stamp_ns
from tests.common.criwriter import records, rfc3339nano

UID = "5b1c7a2e-3f4d-4e6a-9b8c-0d1e2f3a4b5c"
T0 = int(datetime(2026, 12, 3, 20, 32, 39, tzinfo=timezone.utc).timestamp()) * 1_000_000_000


def cut(head: bytes, total: int) -> bytes:
    return head + b" [cut %d]" % total


@pytest.mark.parametrize("text, ns", [
    (b"2026-12-03T20:32:39Z", T0),
    (b"2026-12-03T20:32:39.5Z", T0 + 500_000_000),
    (b"2026-12-03T20:32:39.123456789Z", T0 + 123_456_789),
    (b"2026-12-03T22:32:39.000001+02:00", T0 + 1000),
    (b"2026-12-03T15:02:39.1-05:30", T0 + 100_000_000),
])
def test_rfc3339_nano_stamps_in_any_zone(text, ns):
    assert stamp_ns(text) == ns


@pytest.mark.parametrize("text", [b"2026-12-03 20:32:39Z", b"2026-13-03T20:32:39Z", b"2026-12-03T20:32:39",
                                  b"2026-12-03T20:32:39.1234567890Z", b"stdout"])
def test_what_is_no_stamp(text):
    assert stamp_ns(text) is None


def test_the_writer_stamps_as_go_does():
    assert rfc3339nano(T0) == "2026-12-03T20:32:39Z"
    assert rfc3339nano(T0 + 120_000_000) == "2026-12-03T20:32:39.12Z"
    assert stamp_ns(rfc3339nano(T0 + 7).encode()) == T0 + 7


def test_a_record_its_stream_tag_and_content_spaces_kept():
    r = parse_record(b"2026-12-03T20:32:39.5Z stderr F   File \"train.py\", line 3")
    assert r == (T0 + 500_000_000, "stderr", False, b'  File "train.py", line 3')
    assert parse_record(b"2026-12-03T20:32:39Z stdout P:x part") == (T0, "stdout", True, b"part")
    assert parse_record(b"2026-12-03T20:32:39Z stdout F ") == (T0, "stdout", False, b"")
    assert parse_record(b"2026-12-03T20:32:39Z stdout F") == (T0, "stdout", False, b"")


@pytest.mark.parametrize("line", [b"plain text", b"2026-12-03T20:32:39Z stdin F x", b"2026-12-03T20:32:39Z",
                                  b"yesterday stdout F x", b""])
def test_what_is_no_record(line):
    assert parse_record(line) is None


def test_a_long_line_split_by_the_runtime_is_one_line_again():
    long = b"x" * 40_000
    data = records("stderr", long, T0, buf=16384) + records("stdout", b"ok", T0 + 5)
    lines = data.split(b"\n")[:-1]
    assert len(lines) == 4  # three records for the long line (P P F), one for "ok"
    got = join_lines(lines, 1 << 20, cut)
    assert [(j.content, j.stream, j.time_ns, j.records) for j in got] == [
        (long, "stderr", T0, 3), (b"ok", "stdout", T0 + 5, 1)]
    assert got[0].start == 0 and got[0].end == got[1].start and got[1].end == len(data)


def test_streams_interleave_between_a_partial_and_its_full_record():
    data = (records("stderr", b"a" * 10, T0, buf=6) + records("stdout", b"between", T0 + 1)).split(b"\n")[:-1]
    lines = [data[0], data[2], data[1]]  # stderr P, stdout F, stderr F
    j = CriJoiner(1 << 20, cut)
    assert j.feed(lines[0], 0, 10) == [] and j.held_start() == 0
    [between] = j.feed(lines[1], 10, 20)
    assert between.content == b"between" and j.held_start() == 0
    [whole] = j.feed(lines[2], 20, 30)
    assert (whole.content, whole.start, whole.end) == (b"a" * 10, 0, 30) and j.held_start() is None


def test_a_joined_line_over_the_limit_is_cut_and_the_rest_not_held():
    lines = records("stdout", b"y" * 100, T0, buf=30).split(b"\n")[:-1]
    [got] = join_lines(lines, 40, cut)
    assert got.content == b"y" * 40 + b" [cut 100]"


def test_an_open_line_is_flushed_as_it_is_when_its_file_ends():
    j = CriJoiner(1 << 20, cut)
    j.feed(b"2026-12-03T20:32:39Z stderr P half a li", 0, 40)
    [got] = j.flush(40)
    assert (got.content, got.stream, got.end) == (b"half a li", "stderr", 40) and j.held_start() is None


def test_a_line_that_is_no_record_stays_a_line_of_its_own():
    [got] = join_lines([b"not a cri record"], 1 << 20, cut)
    assert (got.content, got.stream, got.time_ns) == (b"not a cri record", "", 0)


def test_the_kubelet_paths():
    p = parse_pod_log_path(f"/var/log/pods/training_llama-worker-3_{UID}/pytorch/2.log")
    assert p == ("training", "llama-worker-3", "pytorch", UID, 2, None, None)
    r = parse_pod_log_path(f"/var/log/pods/training_llama-worker-3_{UID}/pytorch/0.log.20261203-203239.gz")
    assert (r.restart, r.rotated) == (0, "20261203-203239")
    cid = "f" * 64
    c = parse_pod_log_path(f"/var/log/containers/llama-worker-3_training_pytorch-{cid}.log")
    assert (c.namespace, c.pod, c.container, c.container_id, c.pod_uid) == (
        "training", "llama-worker-3", "pytorch", cid, None)
    assert parse_pod_log_path("/logs/run_x/attempt_0/1/stderr.log") is None
    assert parse_pod_log_path(f"/var/log/pods/training_llama_{UID}/pytorch/x.log") is None
    assert pod_log_globs("/var/log/pods/") == ["/var/log/pods/*_*_*/*/*.log"]


@pytest.mark.parametrize("size", [1, 7, 64, 1 << 20])
def test_rejoin_gives_whole_records_whatever_the_chunks(size):
    from firstfault.common.crilog import rejoin
    data = (records("stderr", b"e" * 50, T0, buf=16) + records("stdout", b"between", T0 + 1)
            + b"not a record\n" + records("stdout", b"last", T0 + 2))
    chunks = [data[i:i + size] for i in range(0, len(data), size)]
    got = b"".join(rejoin(chunks, 1 << 20, cut)).split(b"\n")[:-1]
    assert got == [b"2026-12-03T20:32:39.000000000Z stderr F " + b"e" * 50,
                   b"2026-12-03T20:32:39.000000001Z stdout F between", b"not a record",
                   b"2026-12-03T20:32:39.000000002Z stdout F last"]
    assert [parse_record(x) for x in got][3] == (T0 + 2, "stdout", False, b"last")
