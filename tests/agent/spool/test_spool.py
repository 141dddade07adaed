"""Tests of firstfault/agent/spool/: round trips, restarts, acks, torn tails, corruption,
overflow, disk full (a real 1 MiB tmpfs as root, and an injected failing write),
a kill -9 loop (slow) and a random model check.

Records are tuples in wire column order (``row``) unless a test is about Records.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firstfault.agent import spool as spool_mod
from firstfault.agent.spool import InvalidRecordError, Spool, SpoolError, SpoolFullError
from firstfault.agent.spool import format as spoolformat
from firstfault.agent.spool import writer as spool_writer
from firstfault.agent.spool.columns import MESSAGE, Columns, Runs
from firstfault.agent.spool.format import HEADER, pack_column
from firstfault.wire import MAX_MESSAGE_BYTES, Record, encode_batch
from firstfault.wiredecode import decode_batch, decode_batch_columns

ROOT = Path(__file__).resolve().parents[3]
T0 = 1796206319790113000
LINE = ("[2026-12-02 10:11:59,782] [INFO] [logging.py:107:log_dist] [Rank 0] step={i}, "
        "skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]")


def row(i: int, message: str | None = None) -> tuple:
    """A rank line observed at T0 + i ms (wire column order)."""
    return ("ranklog", "rank.line", message if message is not None else LINE.format(i=i),
            T0 + i * 10**6 - 8_113_000, T0 + i * 10**6, None, None, "12345", 0, 0, 24211, 6,
            {"offset_bytes": i * 150})


def open_spool(path, **kw) -> Spool:
    kw.setdefault("node", "gpu-07")
    kw.setdefault("max_bytes", 64 << 20)
    kw.setdefault("fsync", "never")
    return Spool(path, **kw)


def read_all(sp: Spool) -> list[Record]:
    out, after = [], None
    while recs := sp.read_after(after, max_records=777):
        out += recs
        after = recs[-1].seq
    return out


def data(recs):
    return [r for r in recs if r.kind != "agent.gap"]


def gaps(recs):
    return [r.fields for r in recs if r.kind == "agent.gap"]


def segments(path) -> list[Path]:
    return sorted(Path(path).glob("*.seg"))


def entry_offsets(seg: Path) -> list[tuple[int, int]]:
    """(offset, end) of each entry, by walking the len fields (independent of the spool)."""
    buf, out, pos = seg.read_bytes(), [], 0
    while pos + 16 <= len(buf):
        n = HEADER.unpack_from(buf, pos)[0]
        out.append((pos, pos + 16 + n))
        pos += 16 + n
    assert pos == len(buf)
    return out


def flip(seg: Path, offset: int) -> None:
    b = bytearray(seg.read_bytes())
    b[offset] ^= 0x40
    seg.write_bytes(bytes(b))


def covered(recs) -> list[int]:
    """Every seq named by a record or by a gap's range (ranges may overlap), sorted."""
    seqs = {r.seq for r in recs}
    for g in gaps(recs):
        seqs.update(range(g["first_seq"], g["last_seq"] + 1))
    return sorted(seqs)


# --- the format ------------------------------------------------------------------

def test_docstring_example_is_what_the_encoder_writes(tmp_path):
    doc = spoolformat.__doc__  # the on-disk spec
    block = doc[doc.index("len | crc | seq") - 60:doc.index("Known issues")]
    hexes = "".join(re.findall(r"^\s+((?:[0-9a-f]{2} )+[0-9a-f]{2})", block, re.M))
    example = bytes.fromhex(hexes.replace(" ", ""))
    r = ("ranklog", "rank.line", "step 1", None, 1796206319790113000, None, None, None, None,
         None, None, 6, {})
    with open_spool(tmp_path) as sp:
        assert sp.append([r]) == 1
    assert len(example) == 74
    assert (tmp_path / "00000000000000000001.seg").read_bytes() == example
    assert example[:16] == HEADER.pack(58, 0xCCC142E1, 1)


def test_meta_names_node_stream_and_format(tmp_path):
    with open_spool(tmp_path) as sp:
        stream = sp.stream
    meta = json.loads((tmp_path / "meta").read_text())
    assert meta["format"] == 1 and meta["node"] == "gpu-07" and meta["stream"] == stream
    assert re.fullmatch(r"[0-9a-f]{16}", stream)


# --- round trips -------------------------------------------------------------------

def test_append_read_ack_round_trip(tmp_path):
    with open_spool(tmp_path, segment_bytes=8192) as sp:
        assert sp.append([]) == 0
        assert sp.read_after(None) == []
        assert sp.append([row(i) for i in range(5)]) == 5
        recs = [Record(node="x", stream="y", seq=0, source="kmsg", kind="kernel.line",
                       message=f"oom {i}", observed_ns=T0 + i, fields={"kmsg_seq": i})
                for i in range(3)]
        assert sp.append(recs) == 8  # node, stream and seq of a Record are the spool's
        assert sp.append(row(i) for i in range(5, 2505)) == 2508
        got = read_all(sp)
        assert [r.seq for r in got] == list(range(1, 2509))
        assert {(r.node, r.stream) for r in got} == {("gpu-07", sp.stream)}
        assert got[0] == Record(node="gpu-07", stream=sp.stream, seq=1, **dict(
            zip(spool_mod.COLUMNS, row(0))))
        assert [r.message for r in got[5:8]] == ["oom 0", "oom 1", "oom 2"]
        assert got[7].fields == {"kmsg_seq": 2} and got[-1].message == LINE.format(i=2504)
        # batches of columns, bounded by count and bytes, resumable anywhere
        b = sp.read_batch_after(None, max_records=10)
        assert b.seqs == range(1, 11) and len(b.cols["message"]) == 10
        assert (b.node, b.stream, list(b.cols)) == ("gpu-07", sp.stream, list(spool_mod.COLUMNS))
        assert sp.read_batch_after(2000, max_records=3).seqs == range(2001, 2004)
        small = sp.read_batch_after(0, max_bytes=1)
        assert 1 <= len(small.seqs) <= 1000 and small.seqs.start == 1
        assert sp.read_batch_after(2508) is None
        sp.ack(2000)
        assert sp.stats().acked_seq == 2000 and sp.stats().oldest_unacked_seq <= 2001
        assert [r.seq for r in sp.read_after(2000)][:2] == [2001, 2002]


def test_sequential_reads_equal_one_read(tmp_path):
    with open_spool(tmp_path, segment_bytes=4096) as sp:
        for k in range(40):
            sp.append([row(k * 10 + j) for j in range(1 + k % 9)])
        whole = sp.read_after(None, max_records=10_000, max_bytes=1 << 30)
        assert read_all(sp) == whole
        pieces, after = [], 17
        while b := sp.read_batch_after(after, max_records=4, max_bytes=700):
            pieces += b.records()
            after = b.seqs[-1]
        assert pieces == [r for r in whole if r.seq > 17]


def test_frames_carry_what_column_reads_carry(tmp_path):
    with open_spool(tmp_path, segment_bytes=4096) as sp:
        assert sp.read_frame_after(None) is None
        for k in range(40):
            sp.append([row(k * 10 + j) for j in range(1 + k % 9)])
        sp.append([row(999, message="ünïcode \\xff")])
        for after, max_records, max_bytes in ((None, 10_000, 1 << 30), (17, 4, 700),
                                              (3, 5, 1 << 30)):
            want, got = [], []
            a = after
            while b := sp.read_batch_after(a, max_records, max_bytes):
                want.append(b)
                a = b.seqs[-1]
            a = after
            while f := sp.read_frame_after(a, max_records, max_bytes):
                seqs, frame = f
                got.append(decode_batch_columns(frame))
                assert list(got[-1].seqs) == list(seqs)
                a = seqs[-1]
            assert got == want and len(want) >= 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 150), st.booleans()), min_size=1, max_size=16),
       st.lists(st.tuples(st.integers(-1, 40), st.integers(200, 3000), st.integers(20_000, 400_000)),
                min_size=1, max_size=6))
def test_frames_from_memory_are_the_frames_from_disk(tmp_path_factory, appends, reads):
    """The latest entries' columns, kept in memory for the shipper, make exactly the
    frames the segment files give (batch bounds, seqs, bytes), with gap records and
    entries not yet durable ("interval") in between."""
    path = tmp_path_factory.mktemp("recent")
    with open_spool(path, fsync="interval", fsync_interval_ms=10_000, segment_bytes=256 << 10,
                    max_bytes=8 << 20) as sp:
        k = 0
        for n, gap in appends:
            sp.append_columns(as_columns([row(k + i) for i in range(n)]))
            k += n
            if gap:  # a gap record (not kept in memory) breaks the chain
                sp.state.pending.append({"reason": "corrupt", "dropped_records": None, "dropped_bytes": 1,
                                    "first_seq": 1, "last_seq": 1, "from_ns": None, "to_ns": None})
                sp.append_columns(as_columns([row(k)]))
                k += 1
            if n % 3:
                sp.durability.flush_once()  # durable up to here; what follows is not (yet)
        for after, max_records, max_bytes in reads:  # each a shipper's walk from there
            a = after * 37 if after >= 0 else None
            while True:
                got = sp.read_frame_after(a, max_records, max_bytes)
                recent, sp.reader.recent = sp.reader.recent, type(sp.reader.recent)()
                try:
                    want = sp.read_frame_after(a, max_records, max_bytes)
                finally:
                    sp.reader.recent = recent
                assert got == want
                if got is None:
                    break
                a = got[0][-1]


def test_seqs_increase_across_restarts(tmp_path):
    with open_spool(tmp_path) as sp:
        stream = sp.stream
        assert sp.append([row(i) for i in range(3)]) == 3
    with open_spool(tmp_path) as sp:
        assert sp.stream == stream
        assert sp.append([row(3)]) == 4
        sp.ack(4)
    with open_spool(tmp_path) as sp:  # everything acked: the seq still goes on
        assert sp.append([row(4)]) == 5
        assert [r.seq for r in read_all(sp)] == [1, 2, 3, 4, 5]
        assert sp.stats().acked_seq == 4


def test_ack_deletes_whole_segments_and_is_remembered(tmp_path):
    with open_spool(tmp_path, segment_bytes=4096) as sp:
        for i in range(200):
            sp.append([row(i)])
        segs = segments(tmp_path)
        assert len(segs) > 5
        bases = [int(s.stem) for s in segs]
        sp.ack(bases[3] - 1)  # everything in the first three segments
        assert [int(s.stem) for s in segments(tmp_path)] == bases[3:]
        sp.ack(bases[3])  # part of a segment: it stays
        assert [int(s.stem) for s in segments(tmp_path)] == bases[3:]
        sp.ack(10)  # lower than the mark: ignored
        assert sp.stats().acked_seq == bases[3]
        st_ = sp.stats()
        assert st_.oldest_unacked_seq == bases[3] + 1 and st_.unacked_records == 200 - bases[3]
        sp.ack(10**6)  # all of it: the active segment stays, the seq is kept
        assert [int(s.stem) for s in segments(tmp_path)] == bases[-1:]
        assert sp.stats().acked_seq == 200
    assert json.loads((tmp_path / "meta").read_text())["acked_seq"] == 200
    with open_spool(tmp_path, segment_bytes=4096) as sp:
        assert sp.append([row(0)]) == 201
        assert sp.stats().oldest_unacked_seq == 201


def test_rolled_acked_segment_goes_at_once(tmp_path):
    with open_spool(tmp_path, segment_bytes=4096) as sp:
        for i in range(60):  # the shipper keeps up: each roll leaves an all-acked segment
            sp.ack(sp.append([row(i)]))
        assert [int(s.stem) > 1 for s in segments(tmp_path)] == [True]


def test_big_appends_split_into_entries(tmp_path):
    with open_spool(tmp_path, segment_bytes=64 << 10) as sp:
        sp.append([row(i) for i in range(2500)])
        sizes = [b - a for s in segments(tmp_path) for a, b in entry_offsets(s)]
        assert len(sizes) > 3 and max(sizes) <= (64 << 10) // 4 + 16
        assert [r.seq for r in read_all(sp)] == list(range(1, 2501))


def test_invalid_records_write_nothing(tmp_path):
    with open_spool(tmp_path) as sp:
        with pytest.raises(InvalidRecordError, match="message"):
            sp.append([row(0), row(1, message="x" * (MAX_MESSAGE_BYTES + 1))])
        with pytest.raises(InvalidRecordError, match="severity"):
            sp.append([row(0)[:11] + (9,) + row(0)[12:]])
        with pytest.raises(InvalidRecordError, match="encode"):
            sp.append([row(0, message="lone \ud800 surrogate")])
        assert sp.append([row(0)]) == 1
    with open_spool(tmp_path, validate=False) as sp:  # the caller vouches for its records
        assert sp.append([row(1)]) == 2


def as_columns(rows: list[tuple], runs: bool = True):
    """``rows`` as the ranklog hands them over (firstfault/agent/spool/columns.py): every column
    but the message as Runs (a run per value, one object per run), messages as given."""
    cols = [list(c) for c in zip(*rows)]
    if runs:
        for i, c in enumerate(cols):
            if i != MESSAGE:
                r = Runs()
                for v in c:
                    if r and r[-1][0] == v and type(r[-1][0]) is type(v):
                        r[-1][1] += 1
                    else:
                        r.add(v)
                cols[i] = r
    return Columns(len(rows), cols)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2600), paths=st.integers(1, 9), raw=st.booleans(), seed=st.integers(0, 99))
def test_columns_are_spooled_as_the_same_rows_would_be(tmp_path_factory, n, paths, raw, seed):
    """append_columns (Runs, bytes messages: the ranklog's shape) reads back exactly as
    append(rows) of the same records, across entries of at most ENTRY_MAX_RECORDS."""
    rnd = random.Random(seed)
    rows = [("ranklog", "rank.line", LINE.format(i=i) + rnd.choice(("", " é", " ✓")), None,
             T0 + i // 50, None, None, f"job-{i * paths // n}", i * paths // n, None, None, 6,
             {"path": f"/logs/rank{i * paths // n}.log"}) for i in range(n)]
    cols = as_columns(rows)
    if raw:
        cols.cols[MESSAGE] = [m.encode() for m in cols.cols[MESSAGE]]
    a, b = tmp_path_factory.mktemp("cols"), tmp_path_factory.mktemp("rows")
    with open_spool(a) as sp, open_spool(b) as plain:
        assert sp.append_columns(cols) == plain.append(rows) == n
        got, want = read_all(sp), [replace(r, stream=sp.stream) for r in read_all(plain)]
        assert got == want and [r.message for r in got] == [r[2] for r in rows]
        frames = [s.read_frame_after(None, max_records=n)[1] for s in (sp, plain)]
        assert decode_batch(frames[0]) == [replace(r, stream=sp.stream)  # a valid wire batch
                                           for r in decode_batch(frames[1])]
        sizes = [b - a for s in segments(a) for a, b in entry_offsets(s)]
        assert len(sizes) == -(-n // spoolformat.ENTRY_MAX_RECORDS)


@pytest.mark.parametrize("bad,match", [
    ({"message": [b"\xff\xfe not UTF-8"]}, "UTF-8"),
    ({"message": [b"x" * (MAX_MESSAGE_BYTES + 1)]}, "message"),
    ({"message": [b"ok", 7]}, "message"),
    ({"message": ["text", b"raw"]}, "mixed"),  # the raw one would go out as msgpack bin
    ({"rank": Runs([[0, 1], [-1, 1]])}, "rank"),
    ({"fields": Runs([[{"path": "/a"}, 1], [{"bad": [1]}, 1]])}, "fields"),
    ({"severity": Runs([[6, 3]])}, "values for 2 records"),
    ({"job": ["a"]}, "values for 2 records"),
])
def test_invalid_columns_write_nothing(tmp_path, bad, match):
    rows = [row(0), row(1)]
    cols = as_columns(rows)
    for name, col in bad.items():
        i = spool_mod.COLUMNS.index(name)
        if name == "message" and len(col) == 1:
            col = [b"fine", *col]
        cols.cols[i] = col
    with open_spool(tmp_path) as sp:
        with pytest.raises(InvalidRecordError, match=match):
            sp.append_columns(cols)
        assert sp.append_columns(as_columns(rows)) == 2 and len(read_all(sp)) == 2


def test_runs_cut_and_set():
    r = Runs()
    for v, k in (("a", 3), ("a", 2), ("b", 0), ("b", 1), ("c", 4)):
        r.add(v, k)
    assert r == [["a", 5], ["b", 1], ["c", 4]] and r.values() == list("aaaaabcccc")
    assert r.cut(3, 7) == [["a", 2], ["b", 1], ["c", 1]] and r.cut(5, 6) == [["b", 1]]
    r.set(7, "x")
    assert r.values() == list("aaaaabcxcc")
    r.set(0, "y")
    assert r.values() == list("yaaaabcxcc")
    with pytest.raises(IndexError):
        r.set(10, "z")


def with_column(name: str, values: list) -> list[tuple]:
    i = spool_mod.COLUMNS.index(name)
    return [row(k)[:i] + (v,) + row(k)[i + 1:] for k, v in enumerate(values)]


@pytest.mark.parametrize("name,values", [
    ("rank", [1, True, 1]), ("rank", [1, 1.0, 1]), ("rank", [-1] * 4),  # equal is not the same
    ("severity", [6] * 2 + [9]), ("job", [""] * 3), ("source", ["ranklog"] * 2 + [None]),
    ("fields", [{"path": "/l"}] * 2 + [{"path": "/l", "bad": [1]}]),
    ("message", ["x" * (MAX_MESSAGE_BYTES + 1)] * 3)])
def test_a_repeated_column_is_checked_as_its_first_value_only_when_every_value_packs_alike(
        tmp_path, name, values):
    with open_spool(tmp_path) as sp:
        with pytest.raises(InvalidRecordError, match=f"column '{name}'"):
            sp.append(with_column(name, values))
        fields = with_column("fields", [{"n": 1}, {"n": True}, {"n": 1.0}])  # all allowed
        assert sp.append(fields) == 3
        assert [r.fields["n"] for r in read_all(sp)] == [1, True, 1.0]
        assert [type(r.fields["n"]) for r in read_all(sp)] == [int, bool, float]


def test_a_column_packs_as_msgpack_and_names_the_values_that_can_differ():
    a, a2, b = {"path": "/a"}, {"path": "/a", "ino": 7}, {"path": "/b"}
    cases = [((a,) * 4, (a,)), ((a,) * 7 + (a2,), (a, a2)), ((a,) * 8 + (b,) * 7 + (a2,), (a, b, a2)),
             ((a,) * 3 + ({"path": "/a"},), (a,)),  # apart, but they pack alike
             ((a,) * 3 + (b,), None),  # runs of 2 on average: every map
             ((a, a2, a, a2), None), ((a,), (a,)),
             ((1, True, 1), None), ((7,) * 3, (7,)), (("a", "b"), None)]
    for col, want in cases:
        assert pack_column(col) == (msgpack.packb(col), col if want is None else want)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=60))
def test_a_column_of_shared_maps_packs_as_msgpack_and_checks_every_map_that_packs_apart(picks):
    maps = [{"path": "/a"}, {"path": "/a"}, {"path": "/b", "ino": 1}, {"bad": [1]}]
    col = tuple(maps[i] for i in picks)
    packed, checked = pack_column(col)
    assert packed == msgpack.packb(col)
    assert {msgpack.packb(m) for m in col} == {msgpack.packb(m) for m in checked}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, 0, 7, "a", {"path": "/a"}]), st.integers(1, 40)),
                min_size=1, max_size=6))
def test_runs_pack_as_their_values_and_name_each_run_once(runs):
    col = Runs([list(r) for r in runs])
    packed, checked = pack_column(col)
    assert packed == msgpack.packb(col.values())
    assert checked == tuple(v for v, _ in runs)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="fsync"):
        Spool(tmp_path, node="n", max_bytes=1 << 20, fsync="sometimes")
    with pytest.raises(ValueError, match="segment"):
        Spool(tmp_path, node="n", max_bytes=1 << 20, segment_bytes=1 << 20)
    with pytest.raises(ValueError, match="node"):
        Spool(tmp_path, node="", max_bytes=1 << 20)
    with open_spool(tmp_path) as sp:
        with pytest.raises(InvalidRecordError, match="mixed"):
            sp.append([Record(node="n", stream="s", seq=0, source="kmsg", kind="kernel.line",
                              message="", observed_ns=1), row(0)])
        with pytest.raises(InvalidRecordError, match="columns"):
            sp.append([row(0)[:5]])
        assert sp.stats().last_seq is None


def test_one_process_per_spool(tmp_path):
    with open_spool(tmp_path):
        with pytest.raises(SpoolError, match="another process"):
            open_spool(tmp_path)
    open_spool(tmp_path).close()


def test_closed_spool_refuses(tmp_path):
    sp = open_spool(tmp_path)
    sp.close()
    sp.close()
    with pytest.raises(SpoolError, match="closed"):
        sp.append([row(0)])


def test_node_change_starts_a_new_stream_and_keeps_the_backlog(tmp_path):
    with open_spool(tmp_path) as sp:
        old = sp.stream
        sp.append([row(0), row(1)])
        sp.ack(1)
    with open_spool(tmp_path, node="gpu-08") as sp:
        assert sp.stream != old and sp.stats().acked_seq is None
        got = read_all(sp)
        assert [r.seq for r in got] == [1, 2] and got[0].node == "gpu-08"
        assert sp.append([row(2)]) == 3


def test_lost_meta_starts_a_new_stream(tmp_path):
    with open_spool(tmp_path) as sp:
        old = sp.stream
        sp.append([row(0)])
    (tmp_path / "meta").write_text("{not json")
    with open_spool(tmp_path) as sp:
        assert sp.stream != old and sp.append([row(1)]) == 2


def test_newer_format_is_refused(tmp_path):
    open_spool(tmp_path).close()
    meta = json.loads((tmp_path / "meta").read_text())
    (tmp_path / "meta").write_text(json.dumps({**meta, "format": 2}))
    with pytest.raises(SpoolError, match="format 2"):
        open_spool(tmp_path)


# --- crash recovery ------------------------------------------------------------------

def test_torn_tail_at_every_byte_of_the_last_entry(tmp_path):
    with open_spool(tmp_path) as sp:
        for i in range(5):
            sp.append([row(i * 3 + j) for j in range(3)])
        sp.append([row(15)])
    files = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    seg = segments(tmp_path)[-1]
    start, end = entry_offsets(seg)[-1]
    for cut in range(start, end):
        for p in tmp_path.iterdir():
            if p not in files:
                p.unlink()
        for p, b in files.items():
            p.write_bytes(b[:cut] if p == seg else b)
        with open_spool(tmp_path) as sp:
            got = read_all(sp)
            assert [r.seq for r in got] == list(range(1, 16)), cut  # the partial one is gone
            assert not gaps(got)
            assert seg.stat().st_size == start
            # never visible; meta (saved at close) says 16 was given out, so 17 is next
            assert sp.append([row(99)]) == 17


def test_zeroed_tail_is_torn_not_corrupt(tmp_path):
    with open_spool(tmp_path) as sp:
        sp.append([row(i) for i in range(3)])
    seg = segments(tmp_path)[-1]
    with open(seg, "ab") as f:
        f.write(b"\0" * 5000)  # what delayed allocation can leave after a power cut
    with open_spool(tmp_path) as sp:
        got = read_all(sp)
        assert [r.seq for r in got] == [1, 2, 3] and not gaps(got)


@pytest.mark.parametrize("where", ["closed", "newest"])
def test_flipped_byte_in_the_middle_gives_one_gap(tmp_path, where):
    with open_spool(tmp_path, segment_bytes=8192) as sp:
        for i in range(40):
            sp.append([row(i * 2), row(i * 2 + 1)])
    segs = segments(tmp_path)
    seg = segs[0] if where == "closed" else segs[-1]
    ents = entry_offsets(seg)
    a, b = ents[len(ents) // 2]
    first = HEADER.unpack_from(seg.read_bytes(), a)[2]
    flip(seg, (a + b) // 2)
    with open_spool(tmp_path, segment_bytes=8192) as sp:
        got = read_all(sp)
        (g,) = gaps(got)
        assert g["reason"] == "corrupt" and (g["first_seq"], g["last_seq"]) == (first, first + 1)
        assert g["dropped_records"] == 2 and g["dropped_bytes"] == b - a
        assert g["from_ns"] == T0 + (first - 2) * 10**6  # last good before, first good after
        assert g["to_ns"] == T0 + (first + 1) * 10**6
        lost = (first, first + 1)
        assert [r.seq for r in data(got)] == [s for s in range(1, 81) if s not in lost]
        assert [r.message for r in data(got)][-1] == LINE.format(i=79)  # later entries intact
        assert got[-1].kind == "agent.gap" and got[-1].seq == 81 and got[-1].occurred_ns is None
        assert got[-1].source == "agent" and got[-1].severity == 4
        assert "lost 2 records (seq" in got[-1].message
        assert decode_batch(encode_batch([got[-1]])) == [got[-1]]
        assert sp.append([row(80)]) == 82
    with open_spool(tmp_path, segment_bytes=8192) as sp:  # repaired: no second gap
        assert len(gaps(read_all(sp))) == 1 and sp.stats().corrupt_ranges == 0


def test_flipped_length_byte_resyncs_on_the_next_entry(tmp_path):
    with open_spool(tmp_path, segment_bytes=1 << 20) as sp:
        for i in range(30):
            sp.append([row(i)])
    seg = segments(tmp_path)[0]
    a, _ = entry_offsets(seg)[10]
    flip(seg, a + 2)  # len is now far too big: found again by scanning for the next seq
    with open_spool(tmp_path, segment_bytes=1 << 20) as sp:
        got = read_all(sp)
        (g,) = gaps(got)
        assert (g["first_seq"], g["last_seq"], g["dropped_records"]) == (11, 11, 1)
        assert [r.seq for r in data(got)] == [s for s in range(1, 31) if s != 11]


def test_corrupt_last_entry_bounds_the_lost_seqs(tmp_path):
    with open_spool(tmp_path) as sp:
        for i in range(5):
            sp.append([row(i)])
    seg = segments(tmp_path)[-1]
    a, b = entry_offsets(seg)[-1]
    flip(seg, b - 3)  # whole but wrong: it may have been shipped, so its seq is never reused
    with open_spool(tmp_path) as sp:
        got = read_all(sp)
        (g,) = gaps(got)
        assert g["first_seq"] == 5 and g["dropped_records"] is None
        assert g["last_seq"] == 4 + (b - a) // spoolformat.MIN_RECORD_BYTES
        assert [r.seq for r in data(got)] == [1, 2, 3, 4]
        assert sp.append([row(9)]) > g["last_seq"]


def test_a_wholly_corrupt_closed_segment(tmp_path):
    with open_spool(tmp_path, segment_bytes=4096) as sp:
        for i in range(100):
            sp.append([row(i)])
    segs = segments(tmp_path)
    bases = [int(s.stem) for s in segs]
    segs[1].write_bytes(os.urandom(segs[1].stat().st_size))
    with open_spool(tmp_path, segment_bytes=4096) as sp:
        got = read_all(sp)
        (g,) = gaps(got)
        assert (g["first_seq"], g["last_seq"]) == (bases[1], bases[2] - 1)
        assert covered(got) == list(range(1, 102))
    assert not segs[1].exists()


def test_gaps_found_at_open_survive_a_crash_before_they_are_written(tmp_path, monkeypatch):
    with open_spool(tmp_path) as sp:
        for i in range(10):
            sp.append([row(i)])
    seg = segments(tmp_path)[0]
    a, b = entry_offsets(seg)[4]
    flip(seg, (a + b) // 2)

    def crash(self, room=True):
        raise KeyboardInterrupt  # the process dies after the repair, before the gap record

    with monkeypatch.context() as m:
        m.setattr(spool_writer.Writer, "flush_pending", crash)
        with pytest.raises(KeyboardInterrupt):
            open_spool(tmp_path)
    assert json.loads((tmp_path / "meta").read_text())["pending_gaps"][0]["first_seq"] == 5
    with open_spool(tmp_path) as sp:
        (g,) = gaps(read_all(sp))
        assert (g["first_seq"], g["last_seq"]) == (5, 5)
    assert json.loads((tmp_path / "meta").read_text())["pending_gaps"] == []


def test_bytes_that_go_bad_after_open_are_skipped_with_a_gap(tmp_path):
    with open_spool(tmp_path, segment_bytes=8192) as sp:
        for i in range(40):
            sp.append([row(i)])
        seg = segments(tmp_path)[0]
        a, b = entry_offsets(seg)[3]
        flip(seg, (a + b) // 2)
        got = read_all(sp)
        assert [r.seq for r in data(got)] == [s for s in range(1, 41) if s != 4]
        (g,) = gaps(got)
        assert (g["first_seq"], g["last_seq"]) == (4, 4)
        assert len(gaps(read_all(sp))) == 1  # reported once


def test_stray_tmp_files_are_removed(tmp_path):
    with open_spool(tmp_path) as sp:
        sp.append([row(0)])
    (tmp_path / "00000000000000000001.seg.tmp").write_bytes(b"half")
    (tmp_path / "meta.tmp").write_text("{")
    with open_spool(tmp_path) as sp:
        assert [r.seq for r in read_all(sp)] == [1]
    assert not list(tmp_path.glob("*.tmp"))


# --- bounded -------------------------------------------------------------------------

def test_overflow_drops_the_oldest_segments_with_a_gap(tmp_path):
    max_bytes = 64 << 10
    with open_spool(tmp_path, max_bytes=max_bytes, segment_bytes=8192) as sp:
        for i in range(0, 3000, 3):
            sp.append([row(i), row(i + 1), row(i + 2)])
            assert sp.stats().bytes <= max_bytes
            assert sum(s.stat().st_size for s in segments(tmp_path)) == sp.stats().bytes
        got = read_all(sp)
        gs = gaps(got)
        assert gs and all(g["reason"] == "overflow" for g in gs)
        # gaps in dropped segments are carried into the next one: a kept gap still
        # reaches back to seq 1, and every seq is here or named by a gap
        assert min(g["first_seq"] for g in gs) == 1 and min(g["from_ns"] for g in gs) == T0
        assert covered(got) == list(range(1, got[-1].seq + 1))
        kept = data(got)
        assert sum(g["dropped_records"] for g in gs) == 1000 * 3 - len(kept)  # each lost one once
        assert len(kept) > 200 and kept[-1].message == LINE.format(i=2999)
        assert len(gs) <= len(segments(tmp_path))  # one gap per drop: bounded
        assert decode_batch(encode_batch(got[-3000:])) == got[-3000:]  # gaps are wire records


def test_overflow_gap_names_the_range_and_times(tmp_path):
    with open_spool(tmp_path, max_bytes=32 << 10, segment_bytes=8192) as sp:
        i = 0
        while not sp.stats().gaps_written:
            sp.append([row(i)])
            i += 1
        (g,) = gaps(read_all(sp))
        assert g["first_seq"] == 1 and g["last_seq"] == g["dropped_records"]
        assert (g["from_ns"], g["to_ns"]) == (T0, T0 + (g["last_seq"] - 1) * 10**6)
        assert g["dropped_bytes"] > 0 and sp.stats().dropped_records == g["dropped_records"]


def test_overflow_names_only_unacked_records(tmp_path):
    with open_spool(tmp_path, max_bytes=32 << 10, segment_bytes=8192) as sp:
        while len(segments(tmp_path)) < 2:
            sp.append([row(sp.stats().last_seq or 0)])
        first_seg_last = int(segments(tmp_path)[1].stem) - 1
        sp.ack(first_seg_last - 5)  # the first segment stays: 5 records unacked
        while not sp.stats().gaps_written:
            sp.append([row(0)])
        (g,) = gaps(read_all(sp))
        assert (g["first_seq"], g["last_seq"]) == (first_seg_last - 4, first_seg_last)
        assert g["dropped_records"] == 5


def test_carried_gaps_survive_a_restart(tmp_path):
    kw = dict(max_bytes=32 << 10, segment_bytes=8192)
    with open_spool(tmp_path, **kw) as sp:
        while not sp.stats().gaps_written:
            sp.append([row(0)])
    with open_spool(tmp_path, **kw) as sp:  # the gap's segment is found again at open ...
        while sp.stats().gaps_written < 6:
            sp.append([row(0)])
        got = read_all(sp)
        assert min(g["first_seq"] for g in gaps(got)) == 1  # ... and carried when it goes
        assert covered(got) == list(range(1, got[-1].seq + 1))


def test_overflow_with_the_smallest_spool_rolls_the_only_segment(tmp_path):
    with open_spool(tmp_path, max_bytes=8192, segment_bytes=4096) as sp:
        for i in range(300):
            sp.append([row(i)])
            assert sp.stats().bytes <= 8192
        got = read_all(sp)
        assert covered(got) == list(range(1, got[-1].seq + 1))
        assert data(got)[-1].message == LINE.format(i=299)


def test_a_single_record_larger_than_the_spool_is_refused(tmp_path):
    with open_spool(tmp_path, max_bytes=8192, segment_bytes=4096) as sp:
        with pytest.raises(InvalidRecordError, match="max_bytes"):
            sp.append([row(0, message="y" * 9000)])


# --- disk full -----------------------------------------------------------------------

def _fill_until_full(sp: Spool, batch: int = 20):
    for i in range(100_000):
        try:
            sp.append([row(i * batch + j) for j in range(batch)])
        except SpoolFullError as e:
            return e
    raise AssertionError("the disk never filled")


def test_disk_full_on_a_real_tiny_filesystem(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
            capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a 1 MiB tmpfs")
    path = mnt / "spool"
    try:
        with Spool(path, node="gpu-07", max_bytes=64 << 20, segment_bytes=64 << 10,
                   fsync="always") as sp:
            dropped = 0
            for _ in range(3):  # full, and still full
                err = _fill_until_full(sp)
                assert err.accepted_seq is None and err.dropped_records == 20
                dropped += err.dropped_records
            for seg in segments(path):  # no partial entry was left behind
                entry_offsets(seg)
            st_ = sp.stats()
            assert st_.disk_full_errors == 3 and st_.disk_full_records == dropped
            assert st_.pending_gaps >= 1
            spent = st_.last_seq
            sp.ack(spent)  # the collector caught up: closed segments go, space returns
            seq = sp.append([row(0)])
            got = read_all(sp)
            full = [g for g in gaps(got) if g["reason"] == "disk_full"]
            assert sum(g["dropped_records"] for g in full) == dropped
            assert sp.stats().pending_gaps == 0 and got[-1].seq == seq
            assert covered(got)[-1] == seq and set(covered(got)) >= set(range(spent + 1, seq))
        with Spool(path, node="gpu-07", max_bytes=64 << 20, segment_bytes=64 << 10) as sp:
            assert sp.stats().corrupt_ranges == 0
            assert read_all(sp)[-1].seq == seq
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_injected_partial_write(tmp_path, monkeypatch):
    real_write, budget = os.write, [None]

    def write(fd, data):
        if budget[0] is None or fd != sp.state.fd:
            return real_write(fd, data)
        if budget[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real_write(fd, bytes(data[:budget[0]]))  # a short write, then ENOSPC
        budget[0] -= n
        return n

    monkeypatch.setattr(spool_writer.os, "write", write)
    with open_spool(tmp_path, segment_bytes=1 << 20) as sp:
        assert sp.append([row(i) for i in range(10)]) == 10
        budget[0] = 100
        with pytest.raises(SpoolFullError) as err:
            sp.append([row(10 + i) for i in range(2500)])  # three entries, none fits
        assert err.value.dropped_records == 2500 and err.value.accepted_seq is None
        entry_offsets(segments(tmp_path)[-1])  # the short write was cut away
        with pytest.raises(SpoolFullError):  # still full: the streak grows, one gap
            sp.append([row(0)] * 7)
        st_ = sp.stats()
        assert st_.disk_full_errors == 2 and st_.disk_full_records == 2507
        assert st_.pending_gaps == 1
        budget[0] = None  # space returns
        seq = sp.append([row(1)])
        got = read_all(sp)
        (g,) = gaps(got)
        assert g["reason"] == "disk_full" and g["dropped_records"] == 2507
        assert json.loads(g["origins"]) == {"ranklog": 2507}  # no path field: its source
        assert (g["first_seq"], g["last_seq"]) == (11, 2517)
        assert (g["from_ns"], g["to_ns"]) == (T0, T0 + 2509 * 10**6)
        assert [r.seq for r in got] == list(range(1, 11)) + [2518, 2519] and seq == 2519
        assert sp.stats().pending_gaps == 0


def _whole_writes_until_full(monkeypatch) -> list:
    """Spool writes (to its segment files) take whole entries until ``budget[0]`` bytes were
    written, then ENOSPC; None: no limit."""
    real_write, budget = os.write, [None]

    def write(fd, data):
        if budget[0] is not None and os.readlink(f"/proc/self/fd/{fd}").endswith(".seg"):
            if budget[0] < len(data):
                raise OSError(errno.ENOSPC, "No space left on device")
            budget[0] -= len(data)
        return real_write(fd, data)
    monkeypatch.setattr(spool_writer.os, "write", write)
    return budget


def test_disk_full_in_the_middle_of_an_append_keeps_what_was_written(tmp_path, monkeypatch):
    budget = _whole_writes_until_full(monkeypatch)
    with open_spool(tmp_path, segment_bytes=1 << 20) as sp:
        budget[0] = 200_000  # room for the first entry (1000 records) only
        with pytest.raises(SpoolFullError) as err:
            sp.append([row(i) for i in range(2500)])
        assert err.value.accepted_seq == 1000 and err.value.dropped_records == 1500
        budget[0] = None
        assert sp.append([row(0)]) == 2502  # 1001..2500 spent, 2501 the gap
        got = read_all(sp)
        assert [r.seq for r in data(got)] == list(range(1, 1001)) + [2502]
        assert (gaps(got)[0]["first_seq"], gaps(got)[0]["last_seq"]) == (1001, 2500)


def test_a_disk_full_gap_says_from_which_files_its_records_came(tmp_path, monkeypatch):
    full = [False]
    real_write = os.write
    monkeypatch.setattr(spool_writer.os, "write", lambda fd, data: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")) if full[0] and fd == sp.state.fd
        else real_write(fd, data))
    paths = [f"/scratch/job/rank{r}.log" for r in range(12)]
    with open_spool(tmp_path) as sp:
        sp.append([row(0)])
        full[0] = True
        for i in range(540):  # 36 files (12 names, 3 lengths), 15 records each
            with pytest.raises(SpoolFullError):
                sp.append([(*row(i)[:-1], {"path": paths[i % 12] * (1 + i // 12 % 3)})])
        with pytest.raises(SpoolFullError):
            sp.append([("kmsg", "kernel.line", "x", None, T0, None, None, None, None, None,
                        None, 6, {})] * 2)
        full[0] = False
        sp.append([row(1)])
        got = read_all(sp)
    (g,) = gaps(got)
    origins = json.loads(g["origins"])
    assert g["dropped_records"] == 542 and sum(origins.values()) == 542
    assert len(g["origins"].encode()) <= 1000 and origins["(more)"] > 0  # 37 origins do not fit
    assert set(list(origins.values())[:-1]) == {15}  # the largest first: kmsg's 2 is not among them
    assert "from /scratch/job/rank" in next(r.message for r in got if r.kind == "agent.gap")


def test_a_held_append_spends_no_seq_and_writes_no_gap(tmp_path, monkeypatch):
    budget = _whole_writes_until_full(monkeypatch)
    with open_spool(tmp_path, segment_bytes=1 << 20) as sp:
        rows = [row(i) for i in range(2500)]
        budget[0] = 200_000  # room for the first entry (1000 records) only
        with pytest.raises(SpoolFullError) as err:
            sp.append(rows, hold_on_full=True)
        assert err.value.held and err.value.accepted_seq == 1000
        assert err.value.dropped_records == 1500
        budget[0] = None
        assert sp.append(rows[1000:], hold_on_full=True) == 2500  # offered again: no hole
        got = read_all(sp)
        assert [r.seq for r in got] == list(range(1, 2501)) and not gaps(got)
        assert [r.message for r in got] == [r[2] for r in rows]
        assert sp.stats().disk_full_errors == 1 and sp.stats().disk_full_records == 0


# --- durability modes and threads ------------------------------------------------------

def test_interval_mode_shows_records_after_their_fsync(tmp_path):
    with open_spool(tmp_path, fsync="interval", fsync_interval_ms=50) as sp:
        readable = threading.Event()
        sp.watch(readable.set)
        last = sp.append([row(i) for i in range(10)])
        assert readable.wait(5)
        assert [r.seq for r in read_all(sp)] == list(range(1, last + 1))
        assert sp.stats().fsyncs >= 1
        readable.clear()
        assert not readable.wait(0.1)  # nothing new
        threading.Timer(0.1, sp.close).start()
        assert readable.wait(10)  # close tells the watcher too


def test_interval_mode_syncs_in_the_appending_thread_when_due_and_tells_only_of_news(tmp_path):
    """An append made when the last fsync is an interval old is durable (and readable)
    when append returns, the flusher asleep; one sooner waits for the flusher. A segment
    roll whose records were all readable already tells the reader nothing (a reader told
    of news that finds none backs off)."""
    with open_spool(tmp_path, fsync="interval", fsync_interval_ms=300,
                    segment_bytes=4096, max_bytes=1 << 20) as sp:
        told = []
        sp.watch(lambda: told.append(sp.visible_seq))
        first = sp.append([row(0)])
        assert sp.visible_seq == first and told == [first]  # synced by append itself
        second = sp.append([row(1, message="x" * 3900)])  # rolls first: it does not fit
        assert len(segments(tmp_path)) == 2
        assert sp.visible_seq == first and told == [first]  # the roll found nothing new
        deadline = time.monotonic() + 5  # not due when appended: the flusher syncs it later
        while sp.visible_seq < second and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sp.visible_seq == second and told == [first, second]
        assert [r.seq for r in read_all(sp)] == [first, second]


def test_always_mode_fsyncs_every_append(tmp_path):
    with open_spool(tmp_path, fsync="always") as sp:
        before = sp.stats().fsyncs
        for i in range(5):
            sp.append([row(i)])
        assert sp.stats().fsyncs - before == 5
        assert len(read_all(sp)) == 5


@pytest.mark.parametrize("fsync", ["interval", "never"])
def test_one_writer_and_one_reader_at_once(tmp_path, fsync):
    n_batches = 300
    with open_spool(tmp_path, fsync=fsync, fsync_interval_ms=5, max_bytes=256 << 10,
                    segment_bytes=16 << 10) as sp:
        seen: list[int] = []
        done, readable = threading.Event(), threading.Event()
        sp.watch(readable.set)

        def reader():
            after = None
            while not (done.is_set() and not sp.read_batch_after(after)):
                b = sp.read_batch_after(after, max_records=50)
                if b is None:
                    readable.wait(0.05)
                    readable.clear()
                    continue
                seen.extend(b.seqs)
                after = b.seqs[-1]
                sp.ack(after)

        th = threading.Thread(target=reader)
        th.start()
        for i in range(n_batches):
            sp.append([row(i * 3 + j) for j in range(3)])
        time.sleep(0.1)
        done.set()
        th.join(30)
        assert not th.is_alive()
        assert seen == sorted(set(seen)) and seen[-1] == sp.stats().last_seq
        assert len(seen) >= n_batches * 3 - sp.stats().dropped_records


# --- random operations against a model ----------------------------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 40)),
    st.tuples(st.just("read"), st.integers(1, 60)),
    st.tuples(st.just("ack"), st.integers(0, 100)),
    st.tuples(st.just("reopen"), st.just(0)),
), min_size=1, max_size=40)


@settings(max_examples=40)
@given(ops=OPS)
def test_random_operations_keep_the_invariants(tmp_path_factory, ops):
    path = tmp_path_factory.mktemp("model")
    kw = dict(max_bytes=24 << 10, segment_bytes=4096)
    sp = open_spool(path, **kw)
    given_out: list[int] = []  # seqs append returned, in order
    sent = acked = 0
    try:
        for op, n in ops:
            if op == "append":
                last = sp.append([row(len(given_out) + j) for j in range(n)])
                assert not given_out or last - n + 1 > given_out[-1]
                given_out += range(last - n + 1, last + 1)
            elif op == "read":
                b = sp.read_batch_after(sent, max_records=n)
                if b is not None:
                    assert b.seqs[0] > sent and list(b.seqs) == sorted(set(b.seqs))
                    sent = b.seqs[-1]
            elif op == "ack":
                acked = min(sent, acked + n)
                sp.ack(acked)
            else:
                sp.close()
                sp = open_spool(path, **kw)
                sent = acked = max(acked, sp.stats().acked_seq or 0)
            assert sp.stats().bytes <= kw["max_bytes"]
        got = [r for r in read_all(sp)]
        seqs = [r.seq for r in got]
        assert seqs == sorted(set(seqs))
        # every accepted seq above the acked mark is here or named by a gap
        have = set(covered(got))
        assert [s for s in given_out if s > acked and s not in have] == []
    finally:
        sp.close()


# --- kill -9 -----------------------------------------------------------------------------

CHILD = r"""
import sys, time
from firstfault.agent.spool import Spool
sp = Spool(sys.argv[1], node="gpu-07", max_bytes=256 << 20, segment_bytes=64 << 10,
           fsync=sys.argv[2], fsync_interval_ms=20)
i, tag = 0, sys.argv[3]
while True:
    n = 1 + i % 7
    rows = [("ranklog", "rank.line", f"{tag}-{i}-{k} " + "x" * 120, None, time.time_ns(),
             None, None, None, None, None, None, 6, {}) for k in range(n)]
    last = sp.append(rows)
    sys.stdout.write(f"{last} {n}\n")
    sys.stdout.flush()
    i += 1
"""


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["always", "interval", "never"])
def test_kill_9_loses_no_accepted_record(tmp_path, fsync):
    rnd = random.Random(f"kill9-{fsync}")
    promised: dict[int, str] = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for rnd_i in range(8):
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), fsync,
                                 f"r{rnd_i}"], stdout=subprocess.PIPE, env=env, cwd=ROOT)
        time.sleep(rnd.uniform(0.3, 1.5))
        os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        for line in out.decode().split("\n")[:-1]:  # whole lines only
            last, n = map(int, line.split())
            for s in range(last - n + 1, last + 1):
                assert s not in promised, "a seq was given out twice"
                promised[s] = f"r{rnd_i}"
        with Spool(tmp_path, node="gpu-07", max_bytes=256 << 20, segment_bytes=64 << 10,
                   fsync="never") as sp:
            seqs, messages, kinds, after = [], [], set(), None
            while b := sp.read_batch_after(after):  # columns: fast enough for 100k+
                seqs += b.seqs
                messages += b.cols["message"]
                kinds.update(b.cols["kind"])
                after = b.seqs[-1]
            assert seqs == sorted(set(seqs)), "seqs must strictly increase"
            assert kinds <= {"rank.line"}, "no gap: nothing accepted was lost"
            by_seq = dict(zip(seqs, messages))
            missing = [s for s in promised if s not in by_seq]
            assert not missing, f"round {rnd_i}: accepted seqs lost: {missing[:10]}"
            assert all(by_seq[s].startswith(tag + "-") for s, tag in promised.items())
    assert len(promised) > 100
