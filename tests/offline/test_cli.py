"""The command line: checkpoint exit codes, the progress meter, usage errors."""

import io
import json
import os
import shutil
import stat
import threading
from pathlib import Path

import pytest

from firstfault import cli
from firstfault.offline import commands

REAL = Path(__file__).resolve().parents[1] / "data" / "real"


def test_checkpoint_command_json_and_exit_codes(tmp_path, capsys):
    good = REAL / "torchrun-clean-2" / "checkpoints"
    assert cli.main(["checkpoint", str(good), "--format", "json"]) == 0
    ck = json.loads(capsys.readouterr().out)
    assert ck["verdict"] == "safe" and ck["resume_from"] == "global_step6"

    bad = REAL / "torchrun-kill-in-save-rank1-of-2" / "checkpoints"
    assert cli.main(["checkpoint", str(bad)]) == 1
    text = capsys.readouterr().out
    assert "unsafe" in text and "resume from global_step2" in text

    assert cli.main(["checkpoint", str(tmp_path)]) == 2
    assert "not a DeepSpeed checkpoint" in capsys.readouterr().err


def test_progress_meter_only_on_a_terminal(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    shutil.copytree(REAL / "torchrun-exception-rank1-of-2" / "logs", logs)
    monkeypatch.setattr(commands, "PROGRESS_MIN_BYTES", 1)
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty:
        monkeypatch.setattr("sys.stderr", tty)
        assert cli.main(["analyze", str(logs), "-o", str(tmp_path / "r.txt")]) == 0
    shown = os.read(master, 65536).decode()
    os.close(master)
    assert "analyzing" in shown and "MB" in shown
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert cli.main(["analyze", str(logs), "-o", str(tmp_path / "r.txt")]) == 0
    assert "analyzing" not in __import__("sys").stderr.getvalue()


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["analyze"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["analyze", "x.log", "--tz", "Mars/Olympus"])
    assert e.value.code == 2 and "unknown time zone" in capsys.readouterr().err


def test_output_to_a_fifo_writes_into_it_and_leaves_it_a_fifo(tmp_path):
    """-o /dev/null or a named pipe: written as it is, never replaced by a regular file."""
    logs = tmp_path / "logs"
    shutil.copytree(REAL / "torchrun-exception-rank1-of-2" / "logs", logs)
    fifo = tmp_path / "report.pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert cli.main(["analyze", str(logs), "--format", "json", "-o", str(fifo)]) == 0
    reader.join(timeout=30)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and not (tmp_path / "report.pipe.tmp").exists()
    assert json.loads(got[0])["first_failure"]["rank"] == 1
