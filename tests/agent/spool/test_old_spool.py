"""A spool written by the code before firstfault/agent/spool/ became a package (main at
0a3032a, tests/data/spool/make.py) opens with today's code: same stream, same acked seq,
the same records read back; with its newest entry torn, the rest."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

from firstfault.agent.spool import Spool

DATA = Path(__file__).resolve().parents[2] / "data" / "spool"
EXPECTED = json.loads((DATA / "expected.json").read_text())


def _copy(tmp_path: Path) -> Path:
    path = tmp_path / "spool"
    shutil.copytree(DATA / "format1", path)
    return path


def _read(sp: Spool, after: int) -> list[dict]:
    out = []
    while recs := sp.read_after(after, max_records=64):
        out += [json.loads(json.dumps(dataclasses.asdict(r))) for r in recs]
        after = recs[-1].seq
    return out


def test_an_old_spool_reads_back_what_the_old_code_read(tmp_path):
    with Spool(_copy(tmp_path), node="gpu-07", max_bytes=24 << 10, segment_bytes=4096) as sp:
        st = sp.stats()
        assert (sp.stream, st.acked_seq, st.last_seq, st.corrupt_ranges) == (
            EXPECTED["stream"], EXPECTED["acked_seq"], EXPECTED["last_seq"], 0)
        assert _read(sp, EXPECTED["acked_seq"]) == EXPECTED["records_after_ack"]
        assert sp.append([("agent", "agent.test", "after", None, 1, None, None, None, None,
                           None, None, 6, {})]) == EXPECTED["last_seq"] + 1


def test_an_old_spool_with_a_torn_newest_entry_loses_only_that_entry(tmp_path):
    path = _copy(tmp_path)
    newest = max(path.glob("*.seg"))
    size = newest.stat().st_size
    want = EXPECTED["records_after_ack"][:-1]  # the last record is an entry of its own
    os.truncate(newest, size - 20)  # an append cut short: its header says more follows
    with Spool(path, node="gpu-07", max_bytes=24 << 10, segment_bytes=4096) as sp:
        got = _read(sp, EXPECTED["acked_seq"])
        assert got == want and sp.stats().corrupt_ranges == 0  # no gap: torn, not corrupt
