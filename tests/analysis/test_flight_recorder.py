"""The Flight Recorder analysis on real dumps that torch wrote from real gloo jobs here."""

from pathlib import Path

import pytest

from firstfault.analysis.flight_recorder import analyze
from firstfault.analysis.frdump import Entry, FRDump, parse_dump

DATA = Path(__file__).resolve().parents[1] / "data" / "flight_recorder"


def dumps(case, fmt=""):
    return {int(p.name.split("_")[1]): parse_dump(p.read_bytes()) for p in (DATA / case / fmt).glob("rank_*")}


@pytest.mark.parametrize("fmt", ["", "json"])
def test_sleeping_rank_never_entered_the_collective(fmt):
    a = analyze(dumps("sleep-2", fmt), world_size=2)
    assert a.culprits == [1] and a.basis == "behind"
    [s] = a.stuck
    assert (s.pg, s.desc, s.seq, s.op, s.entered, s.behind) == ("0", "default_pg", 4, "all_reduce", [0], {1: 3})
    assert a.how[0].startswith("rank 1 never entered all_reduce #4 of process group 0 (default_pg)")
    r0, r1 = a.ranks[0][0], a.ranks[1][0]
    assert (r0.entered, r0.entered_op, r1.entered, r1.finished) == (4, "all_reduce", 3, 3)


@pytest.mark.parametrize("fmt", ["", "json"])
def test_rank_in_another_collective_is_the_odd_one_out(fmt):
    a = analyze(dumps("branch-4", fmt), world_size=4)
    assert a.culprits == [1] and a.basis == "mismatch"
    [m] = a.mismatches
    assert m.seq == 3 and m.odd == [1]
    assert m.calls == {"all_reduce(4 Float)": [0, 2, 3], "broadcast(4 Float)": [1]}
    assert "rank 1 took another branch" in a.how[0]
    assert a.stuck == []  # every rank entered #3: nobody is behind


def test_second_group_does_not_hide_the_stuck_world_collective():
    a = analyze(dumps("groups-4"), world_size=4)
    assert a.culprits == [1]
    assert [(s.pg, s.seq, s.behind) for s in a.stuck] == [("0", 3, {1: 2})]
    pair = [g for g in a.ranks[0] if g.pg == "1"]
    assert pair and pair[0].desc == "pair" and pair[0].entered == 1
    assert 2 not in {g.rank for gs in a.ranks.values() for g in gs if g.pg == "1"}


def test_missing_dump_is_named_with_less_certainty():
    d = dumps("groups-4")
    del d[1]
    a = analyze(d, world_size=4)
    assert a.no_dump == [1] and a.culprits == [1] and a.basis == "no-dump"
    assert "rank 1 left no Flight Recorder dump" in a.how[0]


def test_no_hang_no_culprit():
    e = [Entry(pg="0", desc="default_pg", seq=i, p2p_seq=0, op="nccl:all_reduce", record_id=i, state="completed",
               retired=True, is_p2p=False) for i in (1, 2)]
    a = analyze({0: FRDump("2.10", e), 1: FRDump("2.10", list(e))}, world_size=2)
    assert a.culprits == [] and a.stuck == [] and a.mismatches == [] and a.how == []


def test_a_two_sided_tie_names_nobody_as_odd():
    def d(op):
        return FRDump("2.10", [Entry(pg="0", desc="default_pg", seq=1, p2p_seq=0, op=op, record_id=0,
                                     state="scheduled", retired=False, is_p2p=False)])
    a = analyze({0: d("nccl:all_reduce"), 1: d("nccl:broadcast")}, world_size=2)
    [m] = a.mismatches
    assert m.odd == [] and a.culprits == [] and "the ranks disagree" in a.how[0]


def test_report_section_is_plain_json():
    import json
    sec = analyze(dumps("branch-4"), world_size=4).to_report()
    assert json.loads(json.dumps(sec)) == sec
    assert sec["culprits"] == [1] and sec["mismatches"][0]["odd"] == [1]
