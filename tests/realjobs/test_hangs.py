"""Real hung DeepSpeed jobs (torchrun, gloo) with the agent running (tests/realjobs/hangs.py).

For each scenario: the agent's stacks source took py-spy dumps of every rank while all of
them still lived, before gloo's timeout and before torchrun's SIGTERM; and the
collector's report names the rank that stopped and its phase from those stacks (and
the Flight Recorder dumps the agent shipped), not from any hint line.
"""

import functools
import importlib.util
import json
import os
from datetime import datetime

import pytest

from firstfault.agent.sources.stacks import find_py_spy
from tests.realjobs import hangs

HAVE_STACK = all(importlib.util.find_spec(m) is not None for m in ("torch", "deepspeed"))
pytestmark = [
    pytest.mark.realjob,
    pytest.mark.skipif(not HAVE_STACK, reason="needs torch and deepspeed (pip install -e '.[realjobs]')"),
    pytest.mark.skipif(not find_py_spy(), reason="needs py-spy (pip install -e '.[stacks]')"),
    pytest.mark.skipif(os.geteuid() != 0, reason="py-spy needs ptrace rights over the ranks (root here)"),
]
# the frame each hung rank's stack must show, by scenario
HUNG_FRAME = {"agent-hang-rank1-of-2": "__next__", "agent-sleep-rank2-of-4": "check_features",
              "agent-branch-rank1-of-4": "broadcast", "agent-stall-in-save-rank1-of-2": "stalled_write"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs a hang scenario the first time a test asks: (hang.json, timeline records, report)."""
    root = tmp_path_factory.mktemp("hangs")

    @functools.cache
    def get(name):
        out = root / name
        info = hangs.run_with_agent(name, out, timeout_s=300)
        records = [json.loads(ln) for ln in (out / "timeline.jsonl").read_text().splitlines() if ln.strip()]
        return info, records, json.loads((out / "report.json").read_text())

    return get


def _ns(at: str) -> int:
    return int(datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() * 1e9)


@pytest.mark.parametrize("name", list(hangs.HANGS))
def test_stacks_of_every_rank_are_captured_before_the_job_is_killed(name, runs):
    info, records, _ = runs(name)
    world, hung = info["world_size"], info["expected"]["rank"]
    spy = [r for r in records if r["kind"] == "rank.stacks" and r["source"] == "stacks"]
    assert {r["rank"] for r in spy} == set(range(world))
    timeout_at = min(_ns(r["at"]) for r in records if "Timed out waiting" in r["message"])
    pid = next(r["pid"] for r in spy if r["rank"] == hung)  # the rank's process (compilers it ran have RANK too)
    killed_at = min(_ns(r["at"]) for r in records if r["kind"] == "proc.exit" and r["pid"] == pid)
    before = [r for r in spy if r["rank"] == hung and _ns(r["at"]) < min(timeout_at, killed_at)]
    assert before, "no stack of the hung rank from before the timeout and the kill"
    assert before[-1]["fields"]["trigger"] == "stall" and before[-1]["pid"]
    assert f" {HUNG_FRAME[name]} (" in before[-1]["message"] or f".{HUNG_FRAME[name]} (" in before[-1]["message"]
    waiting = [r for r in spy if r["rank"] != hung and _ns(r["at"]) < timeout_at]
    assert {r["rank"] for r in waiting} == set(range(world)) - {hung}
    assert all("distributed_c10d.py" in r["message"] for r in waiting[-(world - 1):])


@pytest.mark.parametrize("name", list(hangs.HANGS))
def test_report_names_the_rank_and_phase_from_the_stacks(name, runs):
    info, _, rep = runs(name)
    ff = rep["first_failure"]
    assert ff["inferred"] and ff["rank"] == info["expected"]["rank"]
    assert ff["phase"] == info["expected"]["phase"] and ff["phase_from"] == "stack dump"
    assert ff["category"] == info["expected"]["category"]  # a save that hung: storage, inferred (low)
    assert any("stack dump" in h or "Flight Recorder" in h for h in ff["inferred_from"])
    assert rep["flight_recorder"]["culprits"] == [info["expected"]["rank"]]
    assert rep["flight_recorder"]["basis"] == ("mismatch" if "branch" in name else "behind")
