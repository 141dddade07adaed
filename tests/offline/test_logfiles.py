"""Reading inputs from disk: layouts, and bad inputs that must not stop the rest."""

import gzip
import json
import shutil
from pathlib import Path

from firstfault.cli import main
from firstfault.offline.logfiles import discover

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
EXC = REAL / "torchrun-exception-rank1-of-2"


def run(capsys, *args) -> tuple[int, dict | None, str]:
    code = main(["analyze", *args, "--format", "json"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out else None), out.err


def test_layouts_name_ranks():
    srcs = discover([str(EXC / "logs"), str(REAL / "deepspeed-exception-rank2-of-4" / "logs")])
    torchrun = [s for s in srcs if "attempt_" in s.path]
    assert {s.local_rank for s in torchrun} == {0, 1} and all(s.attempt == 0 for s in torchrun)
    assert any(s.kind == "error.json" for s in torchrun)
    ds = [s for s in srcs if "_rank" in s.path]
    assert sorted(s.rank for s in ds) == [0, 1, 2, 3]


def test_node_equals_path_and_checkpoints_skipped(tmp_path):
    srcs = discover([f"gpu-01={EXC}"])
    assert srcs and all(s.node == "gpu-01" for s in srcs)
    assert not any("global_step" in s.path or s.path.endswith(".pt") for s in srcs)
    assert not any(s.path.endswith("scenario.json") for s in srcs)


def test_bad_inputs_are_named_and_the_rest_analysed(tmp_path, capsys):
    (tmp_path / "empty.log").write_bytes(b"")
    (tmp_path / "blob.log").write_bytes(b"\x00\x01\x02binary" * 100)
    missing = tmp_path / "gone.log"
    code, rep, err = run(capsys, str(EXC / "logs"), str(tmp_path / "empty.log"), str(tmp_path / "blob.log"),
                         str(missing))
    assert code == 0
    assert rep["first_failure"]["rank"] == 1
    assert rep["partial"] is True
    reasons = {Path(g["file"]).name: g["reason"] for g in rep["gaps"] if "file" in g}
    assert reasons["empty.log"] == "empty"
    assert reasons["blob.log"] == "binary, not a log"
    assert "No such file" in reasons["gone.log"]
    assert "gone.log" in err and "blob.log" in err


def test_nothing_readable_exits_1(tmp_path, capsys):
    (tmp_path / "empty.log").write_bytes(b"")
    code, rep, err = run(capsys, str(tmp_path / "empty.log"))
    assert code == 1 and rep is None and "no input could be read" in err


def test_gzip_logs_read_directly(tmp_path, capsys):
    dst = tmp_path / "logs"
    shutil.copytree(EXC / "logs", dst)
    for p in dst.rglob("*.log"):
        p.with_suffix(".log.gz").write_bytes(gzip.compress(p.read_bytes()))
        p.unlink()
    code, rep, _ = run(capsys, str(dst))
    assert code == 0 and rep["first_failure"]["rank"] == 1


def test_output_file_and_formats(tmp_path, capsys):
    out = tmp_path / "r.md"
    assert main(["analyze", str(EXC), "--format", "md", "--output", str(out)]) == 0
    md = out.read_text()
    assert md.startswith("## firstfault report") and "**First failure: rank 1" in md
    assert main(["analyze", str(EXC)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("FIRST FAILURE") and "Checkpoint:" in text


def test_markdown_escapes_fences_and_tables():
    from firstfault.reports import render

    rep = {"first_failure": {"rank": 0, "node": "n|1", "summary": "s", "signature": "x", "category": "c",
                             "phase": "p", "confidence": "high", "first_action": "a",
                             "evidence": [{"origin": "o", "at": None, "text": "```\nrm -rf /\n```"}]},
           "blame": "code", "ranks": {"0": {"node": "a|b", "first_error": None, "exit": None, "last_progress": None}},
           "checkpoint": {"verdict": "unknown"}, "context": {}}
    md = render(rep, "md")
    assert "````\n```\nrm -rf /\n```\n````" in md
    assert "a\\|b" in md
