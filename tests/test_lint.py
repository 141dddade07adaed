"""The code is lint-clean and its imports are in order (ruff, configured in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    pytest.importorskip("ruff", reason="ruff is in the [test] extra")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "firstfault", "tests", "bench"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
