"""flightrec: Flight Recorder dumps found from a real rank process's environment, shipped once."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import time

import pytest

from firstfault.agent.sources.flightrec import FlightrecSource, dump_prefix
from firstfault.agent.sources.procs import Identity
from firstfault.analysis.frdump import from_message
from firstfault.wire import KIND_RANK_FLIGHT_RECORDER
from tests.agent.sources.conftest import DATA, IS_ROOT

REAL = DATA / "flight_recorder" / "sleep-2"


def test_dump_prefix_follows_torch():
    assert dump_prefix({"RANK": "0"}) is None  # Flight Recorder off
    assert dump_prefix({"TORCH_FR_BUFFER_SIZE": "0"}) is None
    on = {"TORCH_FR_BUFFER_SIZE": "2000", "HOME": "/home/u"}
    assert dump_prefix(on) == "/home/u/.cache/torch/comm_lib_trace_rank_"
    assert dump_prefix({**on, "XDG_CACHE_HOME": "/c"}) == "/c/torch/comm_lib_trace_rank_"
    assert dump_prefix({**on, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/a/t_"}) == "/a/t_"
    assert dump_prefix({**on, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/a/t_", "TORCH_FR_DUMP_TEMP_FILE": "/b/f_"}) == "/b/f_"
    assert dump_prefix({"TORCH_NCCL_TRACE_BUFFER_SIZE": "10", "TORCH_FR_DUMP_TEMP_FILE": "fr/r_"}, "/w") == "/w/fr/r_"
    assert dump_prefix({"TORCH_FR_BUFFER_SIZE": "10", "TORCH_FR_DUMP_TEMP_FILE": "fr/r_"}) is None


def test_option_checks():
    with pytest.raises(ValueError, match="absolute"):
        FlightrecSource(prefixes=["rel/x_"])
    with pytest.raises(ValueError, match="max_file_bytes"):
        FlightrecSource(max_file_bytes=10)


@pytest.mark.skipif(not IS_ROOT, reason="reads another process's environ (root here)")
def test_a_ranks_dumps_are_shipped_once_and_a_hostile_one_is_a_gap(tmp_path):
    work = tmp_path / "job"
    (work / "fr").mkdir(parents=True)
    env = {**os.environ, "RANK": "1", "TORCH_FR_BUFFER_SIZE": "64", "TORCH_FR_DUMP_TEMP_FILE": "fr/rank_"}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=work, env=env)
    state = tmp_path / "state"
    state.mkdir()
    try:
        ident = Identity("job-a", 1, 1, {})
        alive = {rank.pid: ident}
        src = FlightrecSource(ranks=lambda: dict(alive), settle_s=0, state_dir=str(state))
        time.sleep(0.2)
        assert src.poll() == []  # learns fr/rank_ from the rank's environment and cwd
        shutil.copy(REAL / "rank_1", work / "fr" / "rank_1")

        class Evil:
            def __reduce__(self):
                return (os.remove, (str(work / "fr" / "rank_1"),))
        (work / "fr" / "rank_0").write_bytes(pickle.dumps({"version": "x", "entries": [Evil()]}, protocol=2))
        alive.clear()  # the ranks are gone when their dumps are read: the prefix is kept
        rank.kill()
        assert src.poll() == []  # seen once: not read before it settled
        got = src.poll()
        assert (work / "fr" / "rank_1").exists()
        by_kind = {d.kind: d for d in got}
        d = by_kind[KIND_RANK_FLIGHT_RECORDER]
        assert (d.job, d.rank, d.pid) == ("job-a", 1, rank.pid)
        assert d.fields["format"] == "pickle" and d.fields["entries_total"] == 3 == d.fields["entries_shipped"]
        assert [e.seq for e in from_message(d.message).entries] == [1, 2, 3]
        gap = by_kind["rank.gap"]
        assert gap.rank == 0 and gap.fields["reason"] == "unreadable_dump" and "refused" in gap.fields["detail"]
        assert src.poll() == []  # shipped once
        again = FlightrecSource(ranks=lambda: {}, prefixes=[str(work / "fr" / "rank_")], settle_s=0,
                                state_dir=str(state))
        again.poll()
        assert [x.kind for x in again.poll()] == []  # a restart ships nothing twice
        os.utime(work / "fr" / "rank_1")  # written again (a later timeout): new
        again.poll()
        assert [x.rank for x in again.poll() if x.kind == KIND_RANK_FLIGHT_RECORDER] == [1]
    finally:
        rank.kill()
        rank.wait()
