"""`firstfault compare` on real DeepSpeed jobs made afresh: the run that fails under ZeRO-3
and its four retries (tests/realjobs/run.py RETRY_SCENARIOS, COMPARISONS; the committed
captures are tests/data/compare). Five runs, one at a time, ~20 s each here.

Run with ``pytest -m realjob tests/realjobs/test_compare_realjobs.py``.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.realjobs import run

REPO = Path(__file__).resolve().parents[2]
HAVE_STACK = all(importlib.util.find_spec(m) is not None for m in ("torch", "deepspeed"))

pytestmark = [
    pytest.mark.realjob,
    pytest.mark.skipif(not HAVE_STACK, reason="needs torch and deepspeed (pip install -e '.[realjobs]')"),
]
EXIT = {"fixed": 0, "not-fixed": 1, "inconclusive": 3}
# the reason that decides each case (docs/COMPARE.md)
DECIDES = {"fixed": "one-change", "not-fixed": "came-back", "three-changes": "too-many-changes",
           "stopped-early": "stopped-early"}


def compare(before, after):
    cmd = [sys.executable, "-m", "firstfault", "compare", str(before), str(after), "--format", "json",
           "--before-checkpoint-dir", str(before / "checkpoints"), "--after-checkpoint-dir", str(after / "checkpoints")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize("case", sorted(run.COMPARISONS))
def test_compare_fresh_runs(jobs, case):
    before_name, after_name, verdict = run.COMPARISONS[case]
    before, _ = jobs(before_name)
    after, doc = jobs(after_name)
    assert not doc["result"].get("timed_out")
    if doc["cancel_after_step"] is not None:
        assert doc["result"]["cancelled"], "the run ended before the runner could cancel it"
    code, c = compare(before, after)
    assert (c["verdict"], code) == (verdict, EXIT[verdict]), c["reasons"]
    assert DECIDES[case] in [r["code"] for r in c["reasons"]]
    assert c["initiating"]["rank"] == 0 and "mat2 must be a matrix" in c["initiating"]["summary"]
