"""analysis/exits.py: each rank's exit from its own process's exit record, then the launcher's."""

from __future__ import annotations

from firstfault.analysis.events import KIND_RECORD, Event
from firstfault.analysis.exits import agent_exits, best_exits


def proc_exit(rank, pid, at, **exit_):
    return Event(text="", source="agent", kind=KIND_RECORD, node="n1", rank=rank, pid=pid, occurred_ns=at,
                 fields={"proc": "exit", "exit": exit_})


def test_the_rank_process_that_ended_last_speaks_for_the_rank():
    helper = proc_exit(1, 150, 10, code=0, signal=None)  # a compile worker an old agent took for rank 1
    rank = proc_exit(1, 101, 20, code=1, signal=None)
    assert agent_exits([rank, helper], {}) == {1: ({"code": 1, "signal": None}, "n1")}
    unknown = proc_exit(1, 101, 20)  # its zombie was not seen: no witness, the helper does not stand in
    assert agent_exits([helper, unknown], {}) == {}
    assert agent_exits([proc_exit(None, 7, 5, code=-6, signal="SIGABRT")], {7: 3}) == {
        3: ({"code": -6, "signal": "SIGABRT"}, "n1")}


def test_the_agents_record_beats_the_launchers_summary_and_keeps_its_words_when_they_agree():
    launcher = {0: {"code": 0, "signal": None}, 1: {"code": -9, "signal": "SIGKILL", "by": "kernel OOM killer"}}
    agent = {0: ({"code": -15, "signal": "SIGTERM"}, "n1"), 1: ({"code": -9, "signal": "SIGKILL"}, "n1")}
    assert best_exits(launcher, agent) == {0: {"code": -15, "signal": "SIGTERM"},
                                           1: {"code": -9, "signal": "SIGKILL", "by": "kernel OOM killer"}}
    assert best_exits({2: {"code": 1}}, {}) == {2: {"code": 1}}
