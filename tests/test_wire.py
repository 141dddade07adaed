"""Tests of firstfault/wire.py: round trips, every limit, golden frames.

Goldens: tests/data/wire/*.bin freeze the format; regenerate them only on purpose
with FIRSTFAULT_UPDATE_GOLDENS=1 (see tests/data/wire/README.md).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firstfault import wire
from firstfault.wire import (
    MAX_BATCH_RECORDS,
    MAX_FIELDS,
    MAX_FRAME_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_NAME_BYTES,
    Ack,
    Batch,
    BatchColumns,
    Error,
    FrameError,
    Hello,
    Ping,
    Pong,
    Record,
    VersionError,
    Welcome,
    WireError,
    clock_offset,
    decode_message,
    encode_batch,
    encode_message,
)
from firstfault.wiredecode import FrameDecoder, decode_batch, decode_batch_columns

DATA = Path(__file__).resolve().parent / "data" / "wire"
UPDATE = os.environ.get("FIRSTFAULT_UPDATE_GOLDENS") == "1"

NODE, STREAM = "gpu-07", "0f3c6d1e9a2b4c58"
BOOT_ID = "9b1e3c2a-5f4d-4e8b-a7c6-1d2e3f4a5b6c"
BOOT_WALL_NS = 1796204318295656000  # wall clock at boot, so occurred = boot + mono

# Rank 0 announces a checkpoint; 0.66 s later the kernel OOM-kills rank 1
# (pid 24215, CPU-offloading) at its memory cgroup limit; procs sees it exit.
DEEPSPEED_LINE = Record(
    node=NODE, stream=STREAM, seq=1200, source="ranklog", kind="rank.line",
    message="[2026-12-02 10:11:59,782] [INFO] [logging.py:123:log_dist] [Rank 0] "
            "[Torch] Checkpoint global_step10 is about to be saved!",
    occurred_ns=1796206319782000000, observed_ns=1796206319790113000,
    job="12345", rank=0, local_rank=0, pid=24211, severity=6,
    fields={"path": "/var/log/train/12345/20261202101030_rank0.log", "offset_bytes": 48213})
OOM_KILL_LINE = Record(
    node=NODE, stream=STREAM, seq=1201, source="kmsg", kind="kernel.line",
    message="oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
            "mems_allowed=0,oom_memcg=/slurm/uid_1000/job_12345,"
            "task_memcg=/slurm/uid_1000/job_12345/step_0/task_1,task=python3,"
            "pid=24215,uid=0",
    occurred_ns=BOOT_WALL_NS + 2002145344000, observed_ns=1796206320443871000,
    boot_id=BOOT_ID, mono_ns=2002145344000, severity=6, fields={"kmsg_seq": 2230})
OOM_KILLED_LINE = Record(
    node=NODE, stream=STREAM, seq=1202, source="kmsg", kind="kernel.line",
    message="Memory cgroup out of memory: Killed process 24215 (python3) "
            "total-vm:31587640kB, anon-rss:15212336kB, file-rss:65536kB, "
            "shmem-rss:0kB, UID:0 pgtables:31124kB oom_score_adj:0",
    occurred_ns=BOOT_WALL_NS + 2002145391000, observed_ns=1796206320443902000,
    boot_id=BOOT_ID, mono_ns=2002145391000, severity=3, fields={"kmsg_seq": 2231})
RANK_EXIT = Record(
    node=NODE, stream=STREAM, seq=1203, source="procs", kind="proc.exit",
    message="python3 (pid 24215) exited: signal 9 (SIGKILL)",
    observed_ns=1796206320510334000, job="12345", rank=1, local_rank=1, pid=24215,
    severity=4, fields={"exitcode": -9, "signal": "SIGKILL", "core_dumped": False,
                        "rss_bytes": 15577432064, "uptime_s": 931.25, "error_file": None})
CGROUP_SAMPLE = Record(
    node=NODE, stream=STREAM, seq=1204, source="cgroup", kind="cgroup.oom", message="",
    observed_ns=1796206320600000000, job="12345", severity=4,
    fields={"cgroup": "/slurm/uid_1000/job_12345", "usage_bytes": 1610612736,
            "limit_bytes": 1610612736, "oom_kill": 1})
GPU_XID = Record(  # NVML Xid events carry no timestamp: observed only
    node=NODE, stream=STREAM, seq=1207, source="nvml", kind="gpu.xid", message="",
    observed_ns=1796206321004417000, severity=3,
    fields={"xid": 79, "gpu_index": 3, "pci_bus_id": "00000000:3B:00.0"})

GOLDENS = {
    "hello": Hello(node=NODE, stream=STREAM, token="example-token",
                   agent_ns=1796206318000000000, agent_name="firstfault-agent",
                   agent_version="0.1.0"),
    "welcome": Welcome(high_seq=1199, collector_ns=1796206318001250000,
                       max_batch_records=5000),
    "batch": Batch((DEEPSPEED_LINE, OOM_KILL_LINE, OOM_KILLED_LINE, RANK_EXIT)),
    "batch-seqs": Batch((CGROUP_SAMPLE, GPU_XID)),  # non-contiguous: explicit seq list
    "ack": Ack(1203),
    "ping": Ping(1796206330000000000),
    "pong": Pong(1796206330000000000, 1796206330003012000, 1796206330003020000),
    "error": Error(code="version",
                   reason="hello: protocol version 2 is not supported; this peer speaks 1"),
}


def frame(obj) -> bytes:
    """A frame around any msgpack value, bypassing encode-side checks."""
    body = msgpack.packb(obj)
    return struct.pack(">I", len(body)) + body


def decode_all(data: bytes, **kw) -> list:
    decoder = FrameDecoder(**kw)
    msgs = list(decoder.feed(data))
    assert decoder.pending == 0
    return msgs


def batch_map(**changes) -> dict:
    m = Batch((DEEPSPEED_LINE, OOM_KILL_LINE)).to_wire()
    m.update(changes)
    return m


# --- goldens -------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_golden_frame(name):
    msg, path = GOLDENS[name], DATA / f"{name}.bin"
    if UPDATE:
        path.write_bytes(encode_message(msg))
    data = path.read_bytes()
    assert decode_all(data) == [msg]
    assert encode_message(msg) == data, f"{path.name} changed: the wire format moved"


def test_every_golden_file_is_checked():
    assert {p.stem for p in DATA.glob("*.bin")} == set(GOLDENS)


def test_golden_batches_use_both_seq_forms():
    assert msgpack.unpackb((DATA / "batch.bin").read_bytes()[4:])["seq"] == 1200
    assert msgpack.unpackb((DATA / "batch-seqs.bin").read_bytes()[4:])["seq"] == [1204, 1207]


def test_docstring_example_ack_bytes():
    assert encode_message(Ack(41)) == bytes.fromhex("0000000f82a474797065a361636ba373657129")


def test_goldens_fed_byte_by_byte():
    stream = b"".join((DATA / f"{name}.bin").read_bytes() for name in sorted(GOLDENS))
    decoder, got = FrameDecoder(), []
    for i in range(len(stream)):
        got.extend(decoder.feed(stream[i:i + 1]))
    assert got == [GOLDENS[name] for name in sorted(GOLDENS)]
    assert decoder.pending == 0


def test_truncated_frame_yields_nothing_and_waits():
    data = encode_message(GOLDENS["batch"])
    decoder = FrameDecoder()
    assert list(decoder.feed(data[:-1])) == []
    assert decoder.pending == len(data) - 1
    assert list(decoder.feed(data[-1:])) == [GOLDENS["batch"]]


# --- round trips ---------------------------------------------------------------

def test_record_defaults():
    r = Record(node="n", stream="s", seq=0, source="agent", kind="agent.status",
               message="started", observed_ns=1)
    assert (r.severity, r.fields, r.occurred_ns, r.rank) == (6, {}, None, None)
    assert decode_batch(encode_batch([r])) == [r]


def test_welcome_without_stored_records():
    msg = Welcome(high_seq=None, collector_ns=5)
    assert decode_all(encode_message(msg)) == [msg]


def test_unknown_kinds_sources_and_keys_decode():
    r = Record(node="n", stream="s", seq=3, source="ebpf", kind="net.retransmit",
               message="x", observed_ns=1, fields={"new_counter": 1})
    m = Batch((r,)).to_wire()
    m["cols"]["new_column"] = ["ignored"]
    m["new_key"] = {"nested": [1, 2]}
    assert decode_all(frame(m)) == [Batch((r,))]
    hello = GOLDENS["hello"].to_wire() | {"compression": "zstd"}
    assert decode_all(frame(hello)) == [GOLDENS["hello"]]


def test_seq_forms():
    contiguous = [DEEPSPEED_LINE, OOM_KILL_LINE, OOM_KILLED_LINE]
    assert Batch(tuple(contiguous)).to_wire()["seq"] == 1200
    assert Batch((DEEPSPEED_LINE, OOM_KILLED_LINE)).to_wire()["seq"] == [1200, 1202]


def test_clock_offset_ntp_example():
    # The responder's clock runs 5 ms ahead; 1 ms each way; 0.5 ms between t2 and t3.
    t1 = 1_000_000_000
    t2 = t1 + 1_000_000 + 5_000_000
    t3 = t2 + 500_000
    t4 = t3 - 5_000_000 + 1_000_000
    assert clock_offset(t1, t2, t3, t4) == (5_000_000, 2_000_000)


names = st.text(min_size=1, max_size=20).filter(lambda s: len(s.encode()) <= MAX_NAME_BYTES)
uints = st.integers(0, 2**63 - 1)
field_values = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                         st.floats(allow_nan=False), st.text(max_size=30))


@st.composite
def record_lists(draw):
    n = draw(st.integers(1, 8))
    if draw(st.booleans()):
        start = draw(st.integers(0, 2**63 - n))
        seqs = list(range(start, start + n))
    else:
        seqs = sorted(draw(st.sets(uints, min_size=n, max_size=n)))
    node, stream = draw(names), draw(names)
    return [Record(
        node=node, stream=stream, seq=seq, source=draw(names), kind=draw(names),
        message=draw(st.text(max_size=200)), occurred_ns=draw(st.none() | uints),
        observed_ns=draw(uints), boot_id=draw(st.none() | names),
        mono_ns=draw(st.none() | uints), job=draw(st.none() | names),
        rank=draw(st.none() | uints), local_rank=draw(st.none() | uints),
        pid=draw(st.none() | uints), severity=draw(st.integers(0, 7)),
        fields=draw(st.dictionaries(names, field_values, max_size=5)),
    ) for seq in seqs]


@settings(max_examples=60, database=None)
@given(record_lists(), st.integers(1, 64))
def test_random_batches_round_trip(records, chunk):
    data = encode_batch(records)
    assert decode_batch(data) == records
    decoder, got = FrameDecoder(), []
    for i in range(0, len(data), chunk):
        got.extend(decoder.feed(data[i:i + chunk]))
    assert got == [Batch(tuple(records))]


@settings(max_examples=300, database=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_wire_errors(data):
    try:
        list(FrameDecoder(max_frame_bytes=1 << 16).feed(data))
    except WireError:
        pass


@settings(max_examples=300, database=None)
@given(st.data())
def test_corrupted_golden_raises_only_wire_errors(data):
    frame_bytes = bytearray((DATA / "batch.bin").read_bytes())
    i = data.draw(st.integers(4, len(frame_bytes) - 1))
    frame_bytes[i] = data.draw(st.integers(0, 255))
    try:
        list(FrameDecoder().feed(bytes(frame_bytes)))
    except WireError:
        pass


# --- limits and malformed input ------------------------------------------------

def test_oversize_length_prefix_rejected_before_body():
    decoder = FrameDecoder()
    with pytest.raises(FrameError, match="exceeds") as e:
        decoder.feed(struct.pack(">I", MAX_FRAME_BYTES + 1))  # no body sent at all
    assert e.value.code == wire.ERR_TOO_LARGE
    with pytest.raises(FrameError):
        FrameDecoder(max_frame_bytes=100).feed(struct.pack(">I", 101) + b"\x80")
    assert decode_all(frame({"type": "ack", "seq": 1}), max_frame_bytes=15) == [Ack(1)]


def test_encode_refuses_frames_over_the_limit():
    big = [Record(node="n", stream="s", seq=i, source="ranklog", kind="rank.line",
                  message="x" * 60_000, observed_ns=1) for i in range(200)]
    with pytest.raises(WireError, match="MAX_FRAME_BYTES") as e:
        encode_batch(big)
    assert e.value.code == wire.ERR_TOO_LARGE


def test_long_message_rejected_on_encode_and_decode():
    long = Record(node="n", stream="s", seq=1, source="ranklog", kind="rank.line",
                  message="x" * (MAX_MESSAGE_BYTES + 1), observed_ns=1)
    with pytest.raises(WireError, match="'message'"):
        encode_batch([long])
    m = batch_map()
    m["cols"]["message"][0] = "x" * (MAX_MESSAGE_BYTES + 1)
    with pytest.raises(FrameError, match="max_str_len") as e:
        decode_all(frame(m))
    assert e.value.code == wire.ERR_TOO_LARGE


def test_name_limits_count_utf8_bytes():
    ok = "é" * (MAX_NAME_BYTES // 2)  # 256 bytes
    assert decode_all(frame(batch_map(node=ok)))[0].records[0].node == ok
    with pytest.raises(WireError, match="batch.node"):
        decode_all(frame(batch_map(node=ok + "é")))  # 129 characters, 258 bytes
    with pytest.raises(WireError, match="batch.stream"):
        decode_all(frame(batch_map(stream="")))


def test_too_many_records():
    records = [Record(node="n", stream="s", seq=i, source="agent", kind="agent.status",
                      message="", observed_ns=1) for i in range(MAX_BATCH_RECORDS + 1)]
    with pytest.raises(WireError, match="count"):
        encode_batch(records)
    with pytest.raises(WireError, match="count"):
        decode_all(frame(batch_map(count=MAX_BATCH_RECORDS + 1)))
    long_column = batch_map()
    long_column["cols"]["source"] = ["kmsg"] * (MAX_BATCH_RECORDS + 1)
    with pytest.raises(FrameError, match="max_array_len"):
        decode_all(frame(long_column))


@pytest.mark.parametrize("column, value", [
    ("rank", "3"), ("rank", True), ("rank", -1), ("rank", 2**63), ("pid", 1.5),
    ("severity", 8), ("severity", None), ("observed_ns", None), ("occurred_ns", "now"),
    ("source", ""), ("source", None), ("kind", 7), ("message", None), ("job", ""),
    ("boot_id", b""), ("source", [1]), ("job", {"a": 1}), ("fields", None), ("fields", {"a": [1]}), ("fields", {"": 1}),
    ("fields", {"a": 2**63}), ("fields", {"a": "x" * 1025}), ("fields", {"a": {"b": 1}}),
    ("fields", {f"k{i}": i for i in range(MAX_FIELDS + 1)}),
])
def test_bad_column_values_rejected(column, value):
    m = batch_map()
    m["cols"][column][1] = value
    with pytest.raises(WireError, match=f"record 1 column '{column}'"):
        decode_all(frame(m))


@pytest.mark.parametrize("changes, match", [
    ({"seq": -1}, "batch.seq"),
    ({"seq": [1200]}, "batch.seq"),  # wrong length
    ({"seq": [1201, 1200]}, "strictly increasing"),
    ({"seq": [1200, 1200]}, "strictly increasing"),
    ({"seq": 2**63 - 1}, "passes"),
    ({"count": 0}, "batch.count"),
    ({"count": 3}, "column 'source'"),
    ({"cols": [1, 2]}, "batch.cols"),
    ({"node": None}, "batch.node"),
])
def test_bad_batch_headers_rejected(changes, match):
    with pytest.raises(WireError, match=match):
        decode_all(frame(batch_map(**changes)))


def test_missing_column_and_key():
    m = batch_map()
    del m["cols"]["pid"]
    with pytest.raises(WireError, match="column 'pid'"):
        decode_all(frame(m))
    with pytest.raises(WireError, match="missing key 'agent_ns'"):
        decode_message({k: v for k, v in GOLDENS["hello"].to_wire().items() if k != "agent_ns"})


@pytest.mark.parametrize("msg, match", [
    (Ack(-1), "ack.seq"), (Ping(True), "ping.t1"), (Pong(1, 2, None), "pong.t3"),
    (Error(code="", reason="x"), "error.code"),
    (Error(code="x", reason="r" * 1025), "error.reason"),
    (Welcome(high_seq=1, collector_ns=1, max_frame_bytes=MAX_FRAME_BYTES + 1), "max_frame_bytes"),
    (Hello(node="n", stream="s", token="t" * 257, agent_ns=1, agent_name="a",
           agent_version="1"), "hello.token"),
])
def test_bad_message_fields_rejected_on_encode_and_decode(msg, match):
    with pytest.raises(WireError, match=match):
        encode_message(msg)
    body = {"type": msg.TYPE} | {k: getattr(msg, k) for k in msg.CHECKS}
    with pytest.raises(WireError, match=match):
        decode_all(frame(body))


def test_encode_rejects_inconsistent_batches():
    with pytest.raises(WireError, match="at least one"):
        encode_batch([])
    other = Record(node="gpu-08", stream=STREAM, seq=1201, source="kmsg",
                   kind="kernel.line", message="", observed_ns=1)
    with pytest.raises(WireError, match="share node and stream"):
        encode_batch([DEEPSPEED_LINE, other])
    with pytest.raises(WireError, match="strictly increasing"):
        encode_batch([OOM_KILL_LINE, DEEPSPEED_LINE])
    lone_surrogate = Record(node="n", stream="s", seq=1, source="ranklog",
                            kind="rank.line", message="bad \udcff", observed_ns=1)
    with pytest.raises(WireError, match="cannot encode"):
        encode_batch([lone_surrogate])


@pytest.mark.parametrize("msg", [
    Hello(version=2, node="n", stream="s", token="", agent_ns=1, agent_name="a",
          agent_version="9"),
    Welcome(version=0, high_seq=None, collector_ns=1),
])
def test_unknown_protocol_version_rejected(msg):
    with pytest.raises(VersionError, match="protocol version") as e:
        decode_all(encode_message(msg))
    assert e.value.code == wire.ERR_VERSION
    with pytest.raises(VersionError):  # before anything else is read
        decode_message({"type": msg.TYPE, "version": msg.version})


@pytest.mark.parametrize("data, match", [
    (frame({"seq": 1}), "no 'type'"),
    (frame({"type": "subscribe"}), "unknown message type"),
    (frame({"type": 1}), "unknown message type"),
    (frame([1, 2]), "must be a map"),
    (frame("ack"), "must be a map"),
    (struct.pack(">I", 0), "malformed"),
    (struct.pack(">I", 2) + b"\x81\xa4", "malformed"),  # msgpack cut inside the frame
    (struct.pack(">I", 3) + b"\x80\x80\x80", "extra data"),
    (struct.pack(">I", 1) + b"\xc1", "malformed"),  # never-used msgpack byte
    (struct.pack(">I", 9) + b"\x81\xa4type\xa2\xff\xfe", "utf-8"),
    (frame({"type": "ack", "seq": b"\x01\x02"}), "max_bin_len"),
    (frame({"type": "ack", "seq": msgpack.ExtType(5, b"xy")}), "max_ext_len"),
    (frame({1: 2}), "strict_map_key"),
    (frame({f"k{i}": i for i in range(65)}), "max_map_len"),
    (struct.pack(">I", 5001) + b"\x91" * 5000 + b"\x01", "malformed"),  # nesting depth
])
def test_malformed_frames_rejected(data, match):
    with pytest.raises(FrameError, match=match):
        decode_all(data)


def test_frames_after_a_good_one_are_yielded_in_order():
    decoder = FrameDecoder()
    it = decoder.feed(encode_message(Ack(1)) + frame({"type": "nope"}))
    assert next(it) == Ack(1)
    with pytest.raises(FrameError):
        next(it)


def test_decode_batch_wants_exactly_one_batch():
    data = encode_batch([DEEPSPEED_LINE])
    for bad in (data + data, data[:-1], encode_message(Ack(1)), data + b"\x00"):
        with pytest.raises(FrameError, match="exactly one"):
            decode_batch(bad)


def test_known_names():
    assert "rank.line" in wire.KINDS and "agent.gap" in wire.KINDS
    assert {"rank.stacks", "rank.flight_recorder"} <= wire.KINDS
    assert wire.SOURCES == {"ranklog", "kmsg", "journal", "cgroup", "procs", "nvml", "marks",
                            "stacks", "flightrec", "agent"}
    assert wire.SEVERITY_NAMES[6] == "info"
    assert all(kind.count(".") == 1 for kind in wire.KINDS)


# --- columns: the collector's fast path ----------------------------------------

@pytest.mark.parametrize("name", ["batch", "batch-seqs"])
def test_golden_batches_as_columns(name):
    cols = decode_batch_columns((DATA / f"{name}.bin").read_bytes())
    batch = GOLDENS[name]
    assert cols.records() == list(batch.records) and len(cols) == len(batch.records)
    assert list(cols.seqs) == [r.seq for r in batch.records]
    assert list(cols.cols) == list(wire._COLUMN_NAMES)
    assert cols.cols["message"] == [r.message for r in batch.records]
    # valid columns pass the fast checks (the slow per-value check never runs)
    assert all(wire._FAST_CHECKS[k](v) for k, v in cols.cols.items())


@pytest.mark.parametrize("name", ["batch", "batch-seqs"])
def test_columns_keep_the_bytes_the_frame_carried(name):
    """Each column's bytes as received (array header and values), which the store keeps
    as they are: the msgpack of its values, taken from the golden frame itself."""
    frame = (DATA / f"{name}.bin").read_bytes()
    cols = decode_batch_columns(frame).cols
    assert isinstance(cols, wire.PackedColumns) and len(cols.packed) == len(wire.COLUMNS)
    for name_, raw in zip(wire.COLUMNS, cols.packed):
        assert raw == msgpack.packb(cols[name_]) and raw in frame


def _body(**change) -> bytes:
    m = msgpack.unpackb((DATA / "batch.bin").read_bytes()[4:])
    m.update(change)
    return msgpack.packb(m)


BAD_BODIES = {
    "trailing bytes": _body() + b"\x00",
    "cols a list": _body(cols=[1, 2]),
    "a column name not a str": msgpack.packb({**msgpack.unpackb(_body()), "cols": {1: [1]}},
                                             strict_types=False),
    "too many columns": _body(cols={f"c{i}": [1] for i in range(65)}),
    "a message over 64 KiB": _body(cols={**msgpack.unpackb(_body())["cols"],
                                         "message": ["x" * (64 * 1024 + 1)]}),
    "truncated": _body()[:-3],
    "a list at the top": msgpack.packb([1, 2]),
    "a key not a str": msgpack.packb({1: 2}),
    "a column of a wrong type": _body(cols={**msgpack.unpackb(_body())["cols"], "rank": ["0"]}),
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_columns_decoder_refuses_what_the_plain_one_refuses(name):
    """Keeping the columns' bytes changes no error: code and reason as without."""
    body = BAD_BODIES[name]
    frame = len(body).to_bytes(4, "big") + body
    errors = []
    for columns in (False, True):
        with pytest.raises(WireError) as e:
            decode_all(frame, batch_columns=columns)
        errors.append((type(e.value), e.value.code, str(e.value)))
    assert errors[0] == errors[1]


def test_columns_decoder_leaves_other_messages_alone():
    data = encode_message(Ack(3)) + (DATA / "batch.bin").read_bytes()
    msgs = decode_all(data, batch_columns=True)
    assert msgs[0] == Ack(3) and isinstance(msgs[1], BatchColumns)
    assert isinstance(decode_all(data)[1], Batch)
    with pytest.raises(FrameError, match="exactly one"):
        decode_batch_columns(encode_message(Ack(3)))


def test_columns_drop_unknown_columns():
    m = batch_map()
    m["cols"]["future_column"] = [1, 2]
    (got,) = decode_all(frame(m), batch_columns=True)
    assert "future_column" not in got.cols and got.records() == [DEEPSPEED_LINE, OOM_KILL_LINE]


@pytest.mark.parametrize("column, value", [
    ("rank", True), ("observed_ns", None), ("severity", None), ("source", ""),
    ("job", 1), ("fields", {"a": [1]}), ("message", None), ("pid", 2**63)])
def test_bad_column_values_rejected_as_columns(column, value):
    m = batch_map()
    m["cols"][column][1] = value
    with pytest.raises(WireError, match=f"record 1 column '{column}'"):
        decode_all(frame(m), batch_columns=True)


@settings(max_examples=60, database=None)
@given(record_lists())
def test_random_batches_round_trip_as_columns(records):
    assert decode_batch_columns(encode_batch(records)).records() == records


fields_maps = st.one_of(
    st.dictionaries(st.text(max_size=3), field_values, max_size=3),
    st.dictionaries(st.sampled_from(["", "a", "b", "x" * 257]), st.one_of(
        field_values, st.integers(-2**63 - 1, -2**63 + 1), st.integers(2**63 - 2, 2**63 + 1),
        st.sampled_from(["y" * 256, "y" * 1025, "\u00e9" * 513]), st.just([1]), st.just({})),
        max_size=3),
    st.just({f"k{i}": i for i in range(MAX_FIELDS + 1)}), st.just({"k": [1]}))
column_values = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 9), st.integers(2**63 - 2, 2**63 + 1),
    st.floats(allow_nan=False), st.sampled_from(["", "a", "x" * 257, "\u00e9" * 129]),
    st.text(max_size=5), fields_maps, st.just([1]))


@settings(max_examples=600, database=None)
@given(st.sampled_from(wire._COLUMN_NAMES), st.lists(column_values, min_size=1, max_size=6))
def test_fast_column_checks_never_pass_a_bad_value(name, col):
    ok = dict(wire._COLUMNS)[name][0]
    if wire._FAST_CHECKS[name](col):
        assert all(map(ok, col)), (name, col)


@settings(max_examples=300, database=None)
@given(st.lists(fields_maps, min_size=1, max_size=6))
def test_fast_fields_check_agrees_on_maps(col):
    if wire._FAST_CHECKS["fields"](col):
        assert all(map(wire._fields_ok, col)), col


@pytest.mark.parametrize("n", [1, 15, 16, 70_000])
def test_encode_packed_columns_makes_the_frame_msgpack_makes_of_the_batch_map(n):
    from firstfault.wire import encode_packed_columns
    cols = {"source": ["ranklog"] * n, "kind": ["rank.line"] * n,
            "message": [f"step {i} é" for i in range(n)], "occurred_ns": [None] * n,
            "observed_ns": list(range(10, 10 + n)), "boot_id": [None] * n, "mono_ns": [None] * n,
            "job": ["j1"] * n, "rank": [3] * n, "local_rank": [None] * n, "pid": [None] * n,
            "severity": [6] * n, "fields": [{"path": "/l/r3.log", "n": i} for i in range(n)]}
    for seqs in (range(7, 7 + n), list(range(7, 7 + 2 * n, 2))):
        seq = seqs.start if type(seqs) is range else seqs
        body = msgpack.packb({"type": "batch", "node": "n1", "stream": "s", "count": n,
                              "seq": seq, "cols": cols})
        head = 1 if n < 16 else 3 if n < 1 << 16 else 5
        packed = [msgpack.packb(c)[head:] for c in cols.values()]
        frame = encode_packed_columns("n1", "s", seqs, packed)
        assert frame == len(body).to_bytes(4, "big") + body
        if n <= wire.MAX_BATCH_RECORDS:
            back = decode_batch_columns(frame)
            assert list(back.seqs) == list(seqs) and back.cols == cols
    big = [msgpack.packb(["x" * 60_000] * 150)[3:]] + packed[1:]  # 9 MB of messages
    with pytest.raises(WireError) as e:
        encode_packed_columns("n1", "s", range(1, 151), big)
    assert e.value.code == wire.ERR_TOO_LARGE


def test_the_record_columns_are_named_once():
    """Record's fields after (node, stream, seq) are the batch columns; the spool and the
    collector's blocks take them from here."""
    import dataclasses

    from firstfault.agent.spool import format as spool_format
    from firstfault.collector.store import blocks

    names = tuple(f.name for f in dataclasses.fields(wire.Record))
    assert names[:3] == ("node", "stream", "seq") and names[3:] == wire.COLUMNS
    assert len(wire.COLUMNS) == 13
    assert spool_format.COLUMNS is wire.COLUMNS and blocks.COLUMNS is wire.COLUMNS
    assert (blocks.SOURCE, blocks.JOB, blocks.FIELDS) == tuple(
        wire.COLUMNS.index(c) for c in ("source", "job", "fields"))


@pytest.mark.parametrize("columns", [False, True], ids=["records", "columns"])
def test_a_msgpack_bomb_stops_at_the_container_limit(columns):
    """Found by the ingest fuzzer (bench/fuzz.py): an 8 MiB batch of nested empty maps
    decoded into 8 million dicts (~600 MB, 1.5 s of the collector's event loop). Decoding now
    stops at MAX_CONTAINERS maps and arrays, in the collector's columns decoder too (which
    keeps each column's bytes: it had no limit, found by the ingest fuzz test in CI)."""
    import resource
    import time

    import msgpack

    from firstfault import wire
    inner = b"\xdc" + (800).to_bytes(2, "big") + b"\x80" * 800  # an array of 800 empty maps
    head = msgpack.packb({"type": "batch", "node": "n", "stream": "s", "count": 1, "seq": 1})
    body = (b"\x86" + head[1:] + msgpack.packb("cols") + b"\x81" + msgpack.packb("message")
            + b"\xdc" + (10000).to_bytes(2, "big") + inner * 10000)
    before, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()
    with pytest.raises(wire.FrameError, match="maps and arrays") as e:
        list(FrameDecoder(batch_columns=columns).feed(len(body).to_bytes(4, "big") + body))
    assert e.value.code == wire.ERR_TOO_LARGE
    assert time.process_time() - t0 < 0.5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 << 10  # KiB
    ok = wire.encode_batch([wire.Record(node="n", stream="s", seq=i, source="x", kind="y", message="",
                                        observed_ns=1, fields={"a": 1}) for i in range(10_000)])
    assert len(decode_batch(ok)) == 10_000  # a full batch with a map per record still decodes
    assert len(decode_batch_columns(ok)) == 10_000 and decode_batch_columns(ok).cols is not None
