"""Reading Flight Recorder dumps: real torch-written dumps, and hostile pickles refused."""

import copyreg
import json
import os
import pickle
import pickletools
from pathlib import Path

import pytest

from firstfault.analysis.frdump import (
    FRFormatError,
    from_message,
    load_plain_pickle,
    looks_like_dump,
    parse_dump,
    parse_ranks,
    to_message,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "flight_recorder"


def _dump(case, rank, fmt=""):
    return (DATA / case / fmt / f"rank_{rank}").read_bytes()


def test_real_pickle_dump_of_gloo_collectives():
    d = parse_dump(_dump("sleep-2", 0))
    assert d.fmt == "pickle" and d.version == "2.10"
    assert [(e.pg, e.desc, e.seq, e.op) for e in d.entries] == [("0", "default_pg", i, "gloo:all_reduce")
                                                               for i in (1, 2, 3, 4)]
    assert d.entries[0].input_sizes == ((4,),) and d.entries[0].input_dtypes == ("Float",)
    assert d.entries[-1].frames[0].func == "all_reduce"
    assert any(f.func == "worker" for f in d.entries[-1].frames)
    assert d.status["0"]["last_enqueued"] == 4


def test_real_json_dump_reads_like_the_pickle():
    p, j = parse_dump(_dump("branch-4", 1)), parse_dump(_dump("branch-4", 1, "json"))
    assert j.fmt == "json"
    assert [(e.pg, e.seq, e.op) for e in j.entries] == [(e.pg, e.seq, e.op) for e in p.entries]
    assert j.entries[-1].op == "gloo:broadcast"
    assert j.status["0"]["last_enqueued"] == 3  # written as the string "3" in JSON


def test_looks_like_dump_on_real_heads_only():
    assert looks_like_dump(_dump("sleep-2", 1)[:4096]) and looks_like_dump(_dump("sleep-2", 1, "json")[:4096])
    assert not looks_like_dump(b"[rank0]: RuntimeError: boom\n")
    assert not looks_like_dump(pickle.dumps([1, 2, 3], protocol=2))


def test_compact_message_round_trip_and_limit():
    d = parse_dump(_dump("groups-4", 0))
    back = from_message(to_message(d))
    assert [(e.pg, e.desc, e.seq, e.op, e.frames) for e in back.entries] == \
        [(e.pg, e.desc, e.seq, e.op, e.frames) for e in d.entries]
    assert back.status == d.status and back.entries_total == len(d.entries)
    small = to_message(d, limit=900)
    assert len(small.encode()) <= 900
    cut = from_message(small)
    assert 0 < len(cut.entries) < len(d.entries) and cut.entries[-1].seq == d.entries[-1].seq  # the newest kept
    assert cut.entries_total == len(d.entries)


def test_ranks_are_read_not_evaluated():
    assert parse_ranks("[0, 1, 2]") == (0, 1, 2) and parse_ranks("[]") == ()
    assert parse_ranks("__import__('os').system('true')") == ()


# --- hostile pickles ------------------------------------------------------------------

class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_reduce_to_os_system_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    data = pickle.dumps({"version": "2.10", "entries": [Evil(marker)]}, protocol=2)
    with pytest.raises(FRFormatError, match="refused: opcode GLOBAL posix system"):
        parse_dump(data)
    assert not marker.exists()


def test_stack_global_eval_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    # protocol 4: STACK_GLOBAL builtins.exec, then REDUCE with a code string
    data = (b"\x80\x04\x8c\x08builtins\x94\x8c\x04exec\x94\x93\x94"
            + b"\x8c" + bytes([len(f"open('{marker}','w')")]) + f"open('{marker}','w')".encode()
            + b"\x85R.")
    pickletools.dis(data, out=open(os.devnull, "w"))  # a well-formed pickle
    with pytest.raises(FRFormatError, match="opcode STACK_GLOBAL"):
        load_plain_pickle(data)
    assert not marker.exists()


def test_extension_registry_is_refused():
    copyreg.add_extension("os", "getcwd", 0x7ff1)
    try:
        data = b"\x80\x02\x83\xf1\x7f)R."  # EXT2 0x7ff1 (= os.getcwd), an empty tuple, REDUCE
        assert pickle.loads(data) == os.getcwd()  # what a plain unpickler would do: call it
        # the plain unpickler cached it: CPython's own find_class hook is no longer asked
        with pytest.raises(FRFormatError, match="opcode EXT2"):
            load_plain_pickle(data)
    finally:
        copyreg.remove_extension("os", "getcwd", 0x7ff1)


def test_persistent_id_and_out_of_band_buffers_are_refused():
    class P(pickle.Pickler):
        def persistent_id(self, obj):
            return "x" if obj == "secret" else None
    import io
    buf = io.BytesIO()
    P(buf, protocol=2).dump({"entries": ["secret"]})
    with pytest.raises(FRFormatError, match="BINPERSID"):
        load_plain_pickle(buf.getvalue())
    data = pickle.dumps(pickle.PickleBuffer(b"abc"), protocol=5, buffer_callback=lambda b: False)
    with pytest.raises(FRFormatError):
        load_plain_pickle(data)


def test_the_second_wall_refuses_globals_too():
    from firstfault.analysis import frdump
    with pytest.raises(FRFormatError, match="names posix.system"):
        frdump._Refusing(frdump._Reader(pickle.dumps(os.system, protocol=2))).load()


def test_objects_other_than_plain_data_are_refused():
    with pytest.raises(FRFormatError, match="EMPTY_SET"):
        load_plain_pickle(pickle.dumps({"entries": {1, 2}}, protocol=4))
    deep = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(FRFormatError, match="deep"):
        load_plain_pickle(pickle.dumps(deep, protocol=2))


@pytest.mark.parametrize("data", [b"\x80\x02}q\x00(X", b"\x80\x02K\x01.", b"not a dump", b"{\"entries\": 3}",
                                  b"[" * 100000])
def test_malformed_input_is_a_clear_error(data):
    with pytest.raises(FRFormatError):
        parse_dump(data)


def test_json_with_unexpected_types_loses_only_the_bad_entries():
    doc = {"version": "2.10", "entries": [{"collective_seq_id": "x"}, 5,
                                          {"collective_seq_id": 2, "process_group": ["0", "default_pg"],
                                           "profiling_name": "nccl:all_reduce", "record_id": 7}]}
    d = parse_dump(json.dumps(doc).encode())
    assert [(e.seq, e.op) for e in d.entries] == [(2, "nccl:all_reduce")]
