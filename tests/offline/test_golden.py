"""The whole JSON report of one real incident, frozen (FIRSTFAULT_UPDATE_GOLDENS=1 rewrites it).

A change in what analyze says about a real run shows up here as a diff to review:
update the golden only when the new report is the better one.
"""

import json
import os
from pathlib import Path

from firstfault.cli import main

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden" / "torchrun-oom-rank1-of-2.json"
CASE = Path("tests/data/real/torchrun-oom-rank1-of-2")


def test_report_matches_golden(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = ["analyze", str(CASE / "logs"), str(CASE / "launcher.log"), "--kernel", str(CASE / "dmesg-T.txt"),
            "--checkpoint-dir", str(CASE / "checkpoints"), "--format", "json", "--tz", "UTC", "--job", "golden"]
    assert main(args) == 0
    rep = json.loads(capsys.readouterr().out)
    rep.pop("generated_at")
    if os.environ.get("FIRSTFAULT_UPDATE_GOLDENS") == "1":
        GOLDEN.write_text(json.dumps(rep, indent=2, ensure_ascii=False) + "\n")
    assert rep == json.loads(GOLDEN.read_text())
