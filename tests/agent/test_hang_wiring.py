"""The daemon wires the hang sources: stacks follows procs' ranks, ranklog tells stacks (and the
checkpoints source: the save dirs DeepSpeed's lines name) of lines."""

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
    assert built["checkpoints"].ranks == built["procs"].ranks
    save = b"[Rank 0] Saving model checkpoint: /ckpt/run/global_step4/mp_rank_00_model_states.pt"
    built["ranklog"].watch(("j1", 0, 0, {}), save, 0)  # one hook tells both
    assert "j1" in built["stacks"]._jobs and built["checkpoints"]._told == {"j1": {"/ckpt/run"}}


def test_stacks_can_be_turned_off(tmp_path):
    cfg = load_config(None, {(None, "collectors"): ["127.0.0.1:7140"], (None, "state_dir"): str(tmp_path)},
                      {"ranklog": {"dirs": [str(tmp_path)]}, "stacks": {"enabled": False}})
    built = {s.name: s for s in build_sources(cfg)[0]}
    assert "stacks" not in built and built["ranklog"].watch == built["checkpoints"].watch
    cfg = load_config(None, {(None, "collectors"): ["127.0.0.1:7140"], (None, "state_dir"): str(tmp_path)},
                      {"ranklog": {"dirs": [str(tmp_path)]}, "stacks": {"enabled": False},
                       "checkpoints": {"enabled": False}})
    built = {s.name: s for s in build_sources(cfg)[0]}
    assert built["ranklog"].watch is None
