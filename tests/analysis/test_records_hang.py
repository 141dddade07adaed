"""Hang evidence as agents ship it: rank.stacks (py-spy, faulthandler) and rank.flight_recorder
records flow into the stack and Flight Recorder analysis."""

from pathlib import Path

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.events import KIND_FLIGHT_RECORDER, KIND_STACK
from firstfault.analysis.frdump import parse_dump, to_message
from firstfault.analysis.records import events_from_records
from firstfault.analysis.report import Inputs, build_report
from firstfault.wire import Record
from tests.analysis.shipped import ship_file

DATA = Path(__file__).resolve().parents[1] / "data"
CAT = load_catalog()


def _stacks(text, rank, pid, seq, source="stacks", tool="py-spy", at=1_796_200_000_000_000_000):
    return Record(node="vm", stream="s", seq=seq, source=source, kind="rank.stacks", message=text,
                  observed_ns=at, occurred_ns=at, rank=rank, local_rank=rank, pid=pid,
                  fields={"tool": tool, "trigger": "stall"})


def test_py_spy_record_is_a_stack_event_with_frames():
    text = (DATA / "formats" / "py-spy-dump-hung-rank.log").read_text()
    [ev] = events_from_records([_stacks(text, 1, 3794, 0)])
    assert ev.kind == KIND_STACK and ev.rank == 1 and ev.pid == 3794 and ev.clock == "agent"
    assert [f.func for f in ev.frames] == ["<module>", "main", "load_next_batch"]
    assert ev.fields == {"tool": "py-spy", "trigger": "stall"}


def test_faulthandler_record_puts_the_current_thread_last():
    text = (DATA / "formats" / "faulthandler-segfault.log").read_text().split("\n", 2)[2]  # from "Thread 0x"
    [ev] = events_from_records([_stacks(text, 0, None, 0, source="ranklog", tool="faulthandler")])
    assert ev.kind == KIND_STACK and ev.source == "ranklog"
    assert ev.frames[-1].func == "string_at" and ev.frames[0].func == "_bootstrap"
    assert [f.func for f in ev.frames[-4:]] == ["<module>", "forward", "copy_tensor_to_device", "string_at"]


def test_the_hung_ranks_stack_names_it_in_a_real_hang():
    folder = DATA / "real" / "torchrun-hang-rank1-of-2"
    records = []
    for p in sorted((folder / "logs").rglob("*.log")):
        records += ship_file(p, "vm", int(p.parent.name), len(records))
    hung = (DATA / "formats" / "py-spy-dump-hung-rank.log").read_text()
    records.append(_stacks(hung, 1, 3794, len(records)))
    rep = build_report(events_from_records(records), CAT, Inputs())
    ff = rep["first_failure"]
    assert ff["rank"] == 1 and ff["inferred"]
    assert "stack dump of rank 1" in ff["inferred_from"][0] and "load_next_batch" in ff["inferred_from"][0]


def test_flight_recorder_records_name_the_odd_rank():
    records = []
    for p in sorted((DATA / "flight_recorder" / "branch-4").glob("rank_*")):
        rank = int(p.name.split("_")[1])
        records.append(Record(node="vm", stream="s", seq=len(records), source="flightrec",
                              kind="rank.flight_recorder", message=to_message(parse_dump(p.read_bytes())),
                              observed_ns=1, occurred_ns=1, rank=rank, fields={"path": str(p)}))
    records.append(Record(node="vm", stream="s", seq=9, source="flightrec", kind="rank.flight_recorder",
                          message="{not json", observed_ns=1, rank=3, fields={"path": "/tmp/x3"}))
    evs = list(events_from_records(records))
    assert [e.kind for e in evs] == [KIND_FLIGHT_RECORDER] * 5 and "error" in evs[-1].fields
    rep = build_report(evs, CAT, Inputs(world_size=4))
    assert rep["flight_recorder"]["culprits"] == [1] and rep["flight_recorder"]["basis"] == "mismatch"
    assert rep["first_failure"]["rank"] == 1 and rep["first_failure"]["confidence"] == "medium"
    assert rep["first_failure"]["inferred_from"][0].startswith("Flight Recorder: Collective #3")
    assert any(g.get("source") == "flight_recorder" and "/tmp/x3" in g["reason"] for g in rep["gaps"])
