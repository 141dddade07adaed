"""The daemon wires the hang sources: stacks follows procs' ranks, ranklog tells stacks of lines."""

from firstfault.agent.config import load_config
from firstfault.agent.daemon import build_sources


def test_stacks_and_flightrec_follow_procs_and_ranklog_feeds_stacks(tmp_path):
    cfg = load_config(None, {(None, "collectors"): ["127.0.0.1:7140"], (None, "state_dir"): str(tmp_path)},
                      {"ranklog": {"dirs": [str(tmp_path / "logs")]}, "kmsg": {"enabled": False},
                       "nvml": {"enabled": False}})
    built = {s.name: s for s in build_sources(cfg)[0]}
    assert {"procs", "stacks", "flightrec", "ranklog"} <= set(built)  # on by default
    assert built["stacks"].ranks == built["procs"].ranks
    assert built["flightrec"].ranks == built["procs"].ranks
    assert built["ranklog"].watch == built["stacks"].watch


def test_stacks_can_be_turned_off(tmp_path):
    cfg = load_config(None, {(None, "collectors"): ["127.0.0.1:7140"], (None, "state_dir"): str(tmp_path)},
                      {"ranklog": {"dirs": [str(tmp_path)]}, "stacks": {"enabled": False}})
    built = {s.name: s for s in build_sources(cfg)[0]}
    assert "stacks" not in built and built["ranklog"].watch is None
