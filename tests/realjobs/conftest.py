"""The real jobs of tests/realjobs/run.py, each made once per session when a test first asks for it."""

import pytest

from tests.realjobs import run


@pytest.fixture(scope="session")
def jobs(tmp_path_factory):
    """Runs a scenario (run.ALL_SCENARIOS) the first time a test asks for it; returns its folder and scenario.json."""
    root = tmp_path_factory.mktemp("realjobs")
    done = {}

    def get(name):
        if name not in done:
            for attempt in range(2):  # a kernel window that caught another process's OOM kill is run again
                out = root / f"{name}-{attempt}"
                done[name] = (out, run.run_scenario(name, out, timeout_s=300))
                kmsg = out / "kmsg.txt"
                if not (run.ALL_SCENARIOS[name].kernel and "Killed process" in kmsg.read_text(errors="replace")):
                    break
        return done[name]

    return get
