"""One traceback grammar: the agent and the analysis cut every real log into the same tracebacks.

The agent's ranklog engine (real tailer over the real file) ships tracebacks as records; the
analysis' scanner reads the same file. Both follow firstfault/analysis/traceback.py, so on every
capture in tests/data/formats, tests/data/real and tests/data/fragments they must find the same
tracebacks, line for line (the agent keeps launcher prefixes and what a glued header follows;
the analysis drops both: compared without them).
"""

from collections import Counter
from pathlib import Path

import pytest

from firstfault.analysis import traceback as tb
from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.events import KIND_TRACEBACK
from firstfault.analysis.parse import looks_srun_labelled
from firstfault.analysis.report import scan_needles
from firstfault.analysis.scan import StreamInfo, scan_stream
from firstfault.wire import KIND_RANK_TRACEBACK
from tests.agent.sources.test_ranklog import ship_files

DATA = Path(__file__).resolve().parents[1] / "data"
NEEDLES = scan_needles(load_catalog())


def _logs() -> list[Path]:
    found = sorted(DATA.glob("formats/*.log")) + sorted(DATA.glob("fragments/*.log"))
    found += sorted(p for p in (DATA / "real").rglob("*.log") if p.is_file())
    return found


LOGS = _logs()


def agent_tracebacks(path: Path) -> Counter:
    out = Counter()
    for r in ship_files([path]).of(KIND_RANK_TRACEBACK):
        lines = [tb.visible(tb.split_prefix(ln)[1]) for ln in r.message.split("\n")]
        lines[0] = lines[0][tb.opening(lines[0]):]
        out[tuple(lines)] += 1
    return out


def analysis_tracebacks(path: Path) -> Counter:
    data = path.read_bytes()
    head = data[:8192].decode("utf-8", "replace").splitlines()
    info = StreamInfo(stream=str(path), srun_labels=looks_srun_labelled(head))
    return Counter(tuple(ev.text.split("\n")) for ev in scan_stream([data], info, NEEDLES)
                   if ev.kind == KIND_TRACEBACK)


def test_there_is_something_to_compare():
    assert len(LOGS) >= 40
    assert sum(sum(analysis_tracebacks(p).values()) for p in LOGS) >= 60


@pytest.mark.parametrize("path", LOGS, ids=[str(p.relative_to(DATA)) for p in LOGS])
def test_agent_and_analysis_agree(path):
    assert agent_tracebacks(path) == analysis_tracebacks(path)
