"""`analyze` on a folder of Flight Recorder dumps (real dumps torch wrote here)."""

import json
import pickle
import shutil
from pathlib import Path

import pytest

from firstfault.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "flight_recorder"


@pytest.mark.parametrize("case,fmt,culprit", [("sleep-2", "", 1), ("branch-4", "json", 1), ("groups-4", "", 1)])
def test_analyze_reads_a_folder_of_dumps(case, fmt, culprit, capsys):
    assert main(["analyze", str(DATA / case / fmt), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["flight_recorder"]["culprits"] == [culprit]
    assert rep["first_failure"]["rank"] == culprit and rep["first_failure"]["inferred"]
    assert not [g for g in rep["gaps"] if g.get("source") == "flight_recorder"]


def test_a_hostile_dump_is_a_gap_and_the_rest_still_counts(tmp_path, capsys):
    for p in (DATA / "sleep-2").glob("rank_*"):
        shutil.copy(p, tmp_path / p.name)

    class Evil:
        def __reduce__(self):
            return (shutil.rmtree, (str(tmp_path),))

    (tmp_path / "rank_7").write_bytes(pickle.dumps({"version": "2.10", "entries": [Evil()]}, protocol=2))
    assert main(["analyze", str(tmp_path), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert tmp_path.exists() and (tmp_path / "rank_0").exists()
    [gap] = [g for g in rep["gaps"] if g.get("source") == "flight_recorder"]
    assert gap["file"].endswith("rank_7") and "refused: opcode GLOBAL" in gap["reason"]
    assert rep["flight_recorder"]["culprits"] == [1]
