"""Every bench command bench/RESULTS.md gives starts as written from a fresh clone: the tracked
files copied to a new folder, nothing installed from it and no PYTHONPATH (``python3
bench/x.py`` and ``python3 -m bench.x`` both find the tree's firstfault and tests). Each is run
with ``--help``: the benches themselves take minutes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
COMMAND = re.compile(r"`(?:sudo )?python3 ((?:-m bench\.\w+)|(?:bench/\w+\.py))\b")


def bench_commands() -> list[str]:
    """Each distinct way RESULTS.md runs a bench (``bench/x.py`` or ``-m bench.x``)."""
    return sorted(set(COMMAND.findall(RESULTS.read_text())))


def test_results_name_every_bench():
    named = {c.split("/")[-1].removesuffix(".py").removeprefix("-m bench.") for c in bench_commands()}
    assert named == {p.stem for p in (ROOT / "bench").glob("*.py")}


LEFT_OUT = {".git", ".venv", "build", "__pycache__", ".pytest_cache", ".hypothesis", "out"}  # what a clone has not


def tracked_files() -> list[str]:
    """The files a clone has: git's list in a checkout, else (a tree copied without .git, as the
    container tests have it) every file but what .gitignore keeps out."""
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return [n for n in files.decode().split("\0") if n and (ROOT / n).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                and not LEFT_OUT & set(p.relative_to(ROOT).parts) and not p.name.endswith((".pyc", ".whl"))
                and not any(part.endswith(".egg-info") for part in p.parts)]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clone")
    for name in tracked_files():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, out / name)
    return out


@pytest.mark.parametrize("how", bench_commands())
def test_a_bench_command_starts_as_written_from_a_fresh_clone(clone, how):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, *how.split(), "--help"], cwd=clone, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("usage:"), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
