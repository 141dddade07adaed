"""The analysis as a row of stages (report.build_report): each stage's output is a frozen
dataclass, and no stage changes what it was given. Run on real captures (tests/data/real),
read as `firstfault analyze` reads them, and on a collector's records with clock offsets;
the row run here by hand gives the report build_report gives."""

from __future__ import annotations

import copy
import dataclasses
import json
from datetime import timezone
from pathlib import Path

import pytest

from firstfault.analysis import timeline
from firstfault.analysis.assess import Assessment, assess
from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.events import KIND_LINE, KIND_STREAM, Event
from firstfault.analysis.failure_phase import failure_phase
from firstfault.analysis.findings import Finding, Read, read_findings
from firstfault.analysis.identify import Identity, identify
from firstfault.analysis.judge import judge
from firstfault.analysis.memory import MemoryWatcher
from firstfault.analysis.rankstate import RankActivity, RankState, StackDumps, rank_state
from firstfault.analysis.reads import scan_needles
from firstfault.analysis.records import events_from_records
from firstfault.analysis.report import Inputs, build_report, report, watch
from firstfault.analysis.scan import StreamInfo, scan_stream
from firstfault.analysis.timeline import NodeClock
from firstfault.analysis.verdict import Decision, Group, decide
from firstfault.offline import logfiles
from firstfault.wire import Record
from tests.analysis.test_deaths import RESET
from tests.analysis.test_other_jobs_oom import JOB, T0, oom_kill, proc

CAT = load_catalog()
REAL = Path(__file__).resolve().parents[1] / "data" / "real"
# an OOM kill with kernel logs, a hang, a kill during a save, two nodes, a pasted console, a clean run
SCENARIOS = ["torchrun-oom-rank1-of-2", "torchrun-hang-rank1-of-2", "torchrun-kill-in-save-rank1-of-2",
             "torchrun-2node-exception-rank2-of-4", "torchrun-pasted-exception-rank2-of-4", "deepspeed-clean-2"]
S = 1_000_000_000


def read_real(name: str) -> tuple[list[Event], Inputs]:
    """The Events of a capture as `firstfault analyze` reads it (the scanner done with them all)."""
    folder = REAL / name
    paths = json.loads((folder / "scenario.json").read_text()).get("analyze_paths", ["."])
    paths = [str(folder) if p == "." else p.split("=", 1)[0] + "=" + str(folder / p.split("=", 1)[1]) for p in paths]
    res = logfiles.ReadResult()
    events = list(logfiles.read_events(logfiles.discover(paths), scan_needles(CAT), res, tz=timezone.utc))
    return events, Inputs(rank_nodes=dict(res.rank_nodes), launcher=res.launcher, gaps=list(res.gaps))


def records_with_clocks() -> tuple[list[Event], Inputs]:
    """A collector's records of two nodes whose clocks are off: rank 1 on vm is OOM-killed (the
    kernel's real line, test_other_jobs_oom) and the agent sees it die by SIGKILL; rank 0 on vm2
    then reads a reset from its peer."""
    def line(seq, kind, text, rank, at):
        return Record(node="vm2", stream="r0", seq=seq, source="ranklog", kind=kind, message=text, occurred_ns=at,
                      observed_ns=at, job=JOB, rank=rank, fields={})
    records = [
        proc("proc.start", 1, 5001, T0, 1, world_size="2"),
        line(1, "rank.line", "rank 0 step 4 loss 2.3", 0, T0 + S),
        *oom_kill(5001, T0 + 30 * S, 2),
        proc("proc.exit", 1, 5001, T0 + 30 * S + 5 * 10**6, 3, code=-9, signal="SIGKILL"),
        line(2, "rank.traceback", RESET, 0, T0 + 31 * S),
    ]
    records.sort(key=lambda r: r.occurred_ns or r.observed_ns)
    clocks = {"vm": NodeClock(250_000_000, 2_000_000), "vm2": NodeClock(-400_000_000, 3_000_000)}
    return list(events_from_records(records)), Inputs(job=JOB, clocks=clocks)


INPUTS = [pytest.param(lambda n=n: read_real(n), id=n) for n in SCENARIOS] + [
    pytest.param(records_with_clocks, id="records-with-clocks")]


def unchanged(before, after) -> None:
    assert after == before, "a stage changed what it was given"


@pytest.mark.parametrize("make", INPUTS)
def test_no_stage_changes_what_it_was_given_and_the_row_is_build_report(make):
    events, inp = make()
    snap = copy.deepcopy(events)
    mem = MemoryWatcher(clocks=inp.clocks)
    placed = list(timeline.placed(events, inp.clocks))
    unchanged(snap, events)
    snap = copy.deepcopy(placed)
    read = read_findings(watch(placed, mem), CAT)
    unchanged(snap, placed)
    snap = copy.deepcopy(read)
    ident = identify(read.findings, inp.rank_nodes, read.procs)
    unchanged(snap, read)
    snap = copy.deepcopy((read, ident))
    findings = judge(ident.findings, read.procs, read.kernel_span, ident.nodes)
    unchanged(snap, (read, ident))
    snap = copy.deepcopy((read, ident, findings))
    state = rank_state(findings, ident, read.dumps)
    unchanged(snap, (read, ident, findings))
    snap = copy.deepcopy((read, findings, state))
    dec = decide(findings, state, read, ident.nodes, inp.world_size)
    unchanged(snap, (read, findings, state))
    snap = copy.deepcopy((dec, state))
    ass = assess(dec, state, mem, pids=ident.pids, rank_nodes=ident.nodes, disk=inp.disk)
    unchanged(snap, (dec, state))
    snap = copy.deepcopy((dec, state, findings, ass))
    sharded = True if read.ctx.config.get("zero_stage") == 3 else None
    phase = failure_phase(dec, state, findings, ass.saving, sharded, ass.memory["phase_at_failure"],
                          ass.memory["phases_from"])
    unchanged(snap, (dec, state, findings, ass))
    snap = copy.deepcopy((read, findings, state, dec, ass))
    got = report(inp, read, findings, ident.nodes, state, dec, ass, phase)
    unchanged(snap, (read, findings, state, dec, ass))

    # the row run by hand is build_report's
    events2, inp2 = make()
    assert got == build_report(events2, CAT, inp2)


def test_every_stage_output_is_a_frozen_dataclass():
    for cls in (Event, Finding, Read, Identity, RankActivity, StackDumps, RankState, Group, Decision, Assessment):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls.__name__
    events, inp = read_real("torchrun-oom-rank1-of-2")
    read = read_findings(timeline.placed(events), CAT)
    f = read.findings[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.cap = "low"
    with pytest.raises(dataclasses.FrozenInstanceError):
        read.findings = []
    with pytest.raises(dataclasses.FrozenInstanceError):
        events[0].occurred_ns = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.ev.text = ""


def test_the_scanner_makes_an_untimed_line_whole_before_it_yields_it():
    """An untimed line learns its later bound from the stream's next stamp: the scanner holds
    it (and what follows it) until then, so no Event's fields change after it was yielded."""
    body = (b"2026-01-02 03:04:05,000 INFO start\n"
            b"RuntimeError: untimed\n"
            b"[rank0]: Traceback (most recent call last):\n"
            b'[rank0]:   File "t.py", line 1, in <module>\n'
            b"[rank0]: ValueError: boom\n"
            b"2026-01-02 03:04:09,000 ERROR later\n")
    info = StreamInfo(stream="s", rank=0, year=2026)
    got = []
    for ev in scan_stream([body], info, scan_needles(CAT)):
        got.append((ev, copy.deepcopy(ev.fields)))
    assert [ev.text.partition("\n")[0] for ev, _ in got] == ["RuntimeError: untimed", "Traceback (most recent call last):", ""]
    for ev, fields_when_yielded in got:
        assert ev.fields == fields_when_yielded, ev.text
    first, tb = got[0][0], got[1][0]
    later = 1_767_323_049 * S  # 2026-01-02 03:04:09 UTC
    assert first.fields["before_ns"] == later and tb.fields["before_ns"] == later
    assert tb.fields["message"] == "ValueError: boom"


def test_an_untimed_line_is_placed_between_its_stamps_once_the_later_one_came():
    """The scanner learns a line's later bound after it yielded the line: the place stage waits
    for it, so a progress line is placed as every other line (the middle of its two stamps),
    not at the stamp before it; and its node's clock offset is added once."""
    progress = Event(text="rank 0 step 4 loss 1.2", source="ranklog", node="n0", stream="s", seq=2,
                     fields={"after_ns": T0})
    other = Event(text="x", source="ranklog", node="n0", stream="t", seq=1, occurred_ns=T0 + 5 * S)

    def scanner():  # yields the line, then meets the next stamp of its stream
        yield progress
        yield other
        progress.fields["before_ns"] = T0 + 4 * S
        yield Event(text="", source="ranklog", kind=KIND_STREAM, node="n0", stream="s", seq=3)

    clocks = {"n0": NodeClock(offset_ns=S // 2, uncertainty_ns=0)}
    out = list(timeline.placed(scanner(), clocks))
    assert [e.stream for e in out] == ["t", "s", "s"]  # the waiting line let the other stream pass
    placed = out[1]
    assert (placed.occurred_ns, placed.uncertainty_ns, placed.clock) == (T0 + 2 * S + S // 2, 2 * S, "line")
    assert progress.occurred_ns is None  # the Event given is not changed
    read = read_findings(iter(out), CAT)
    kept = next(f for f in read.findings if f.has("progress"))
    assert kept.ev.occurred_ns == T0 + 2 * S + S // 2  # the offset once, not twice


def test_a_timed_line_does_not_pass_an_earlier_untimed_line_of_its_stream():
    first = Event(text="a", source="ranklog", kind=KIND_LINE, stream="s", seq=1, fields={"after_ns": T0})
    second = Event(text="b", source="ranklog", stream="s", seq=2, occurred_ns=T0 + S)
    out = list(timeline.placed([first, second]))
    assert [e.text for e in out] == ["a", "b"] and out[0].occurred_ns == T0  # the input ended: only its earlier bound


def test_what_waits_for_a_later_stamp_is_bounded():
    lines = [Event(text=str(i), source="ranklog", stream="s", seq=i, fields={"after_ns": T0}) for i in range(5)]
    out = timeline.placed(lines, max_waiting=2)
    first = next(out)  # the third waiting line lets the first go on, placed by its earlier stamp alone
    assert (first.text, first.occurred_ns, first.uncertainty_ns) == ("0", T0, S)
    assert [e.text for e in out] == ["1", "2", "3", "4"]
