"""``firstfault analyze`` redacts what it prints: a real DeepSpeed run (tests/data/real) whose
launcher command line carries a Hugging Face token and a password, and whose failing rank's
exception names a database URL with a password, as jobs print them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from firstfault.cli import main

CASE = Path(__file__).resolve().parents[1] / "data" / "real" / "deepspeed-exception-rank2-of-4"
HF = "hf_" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1Bc4De7F"


def _with_secrets(tmp_path) -> Path:
    case = tmp_path / "case"
    shutil.copytree(CASE, case, ignore=shutil.ignore_patterns("checkpoints"))
    launcher = case / "launcher.log"
    launcher.write_text("".join(
        ln.rstrip("\n") + f" --hf_token {HF} --db-password hunter2\n" if "[runner.py:618:main] cmd = " in ln
        else ln for ln in launcher.read_text().splitlines(True)))
    rank2 = case / "logs" / "20261202113547_rank2.log"
    rank2.write_text(rank2.read_text().replace(
        "(bad record in batch at step 5)",
        "(bad record in batch at step 5 from postgresql://train:s3cr3tpw@db.example:5432/features)"))
    return case


def _analyze(capsys, case: Path, *extra: str) -> dict:
    assert main(["analyze", str(case / "logs"), str(case / "launcher.log"), "--format", "json",
                 "--tz", "UTC", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_analyze_redacts_and_counts(tmp_path, capsys):
    case = _with_secrets(tmp_path)
    rep = _analyze(capsys, case)
    text = json.dumps(rep)
    assert HF not in text and "hunter2" not in text and "s3cr3tpw" not in text
    assert "--hf_token [redacted:hf-token] --db-password [redacted:flag]" in rep["context"]["launch_command"]
    assert "postgresql://train:[redacted:url-password]@db.example" in rep["first_failure"]["summary"]
    assert rep["redaction"]["enabled"] and rep["redaction"]["secrets"] >= 3
    assert {"hf-token", "flag", "url-password"} <= set(rep["redaction"]["by_pattern"])
    assert rep["first_failure"]["rank"] == 2  # the analysis is the same


def test_no_redact_prints_them_and_more_patterns_can_be_given(tmp_path, capsys):
    case = _with_secrets(tmp_path)
    plain = _analyze(capsys, case, "--no-redact")
    assert HF in plain["context"]["launch_command"] and not plain["redaction"]["enabled"]
    more = _analyze(capsys, case, "--redact", r"features=db\.example:(?P<secret>\d+)")
    assert "db.example:[redacted:features]" in more["first_failure"]["summary"]
    assert main(["analyze", str(case / "logs"), "--redact", "x=[0-9]+"]) == 2
    assert "at least 3 literal characters" in capsys.readouterr().err
