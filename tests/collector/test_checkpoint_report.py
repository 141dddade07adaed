"""The collector's report says whether the last checkpoint is safe from what the job's agent
inspected on disk (agent/sources/checkpoints.py), with `firstfault checkpoint`'s verdict;
`report --checkpoint-dir` inspects a folder on the head node instead."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.checkpoint import checkpoint_from_disk
from firstfault.cli import main
from firstfault.collector import query
from firstfault.collector.store.sqlite import SqliteStore
from firstfault.common.checkpoint_files import inspect
from firstfault.offline.checkpoint_files import inspect_checkpoint_dir
from firstfault.wire import Record

DATA = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
T0 = 1_796_206_319_782_000_000
S = 1_000_000_000


def rec(seq, kind, source, message="", *, rank=None, pid=None, fields=None, job="77"):
    t = T0 + seq * S
    return Record(node="gpu-01", stream="s", seq=seq, source=source, kind=kind, message=message, occurred_ns=t,
                  observed_ns=t, job=job, rank=rank, pid=pid, fields=fields or {})


def _job(inspection: str | None) -> list[Record]:
    tb = "Traceback (most recent call last):\n  File \"/w/train.py\", line 9, in <module>\nValueError: bad batch"
    out = [rec(1, "rank.line", "ranklog", "rank 0 step 1 loss 2.3", rank=0),
           rec(2, "rank.traceback", "ranklog", tb, rank=1)]
    if inspection is not None:
        out.append(rec(3, "checkpoint.inspection", "checkpoints", inspection, fields={"path": "/w/checkpoints"}))
    return out


def test_the_agents_inspection_gives_the_offline_verdict(tmp_path):
    insp = inspect(DATA / "zero2")
    with SqliteStore(tmp_path / "f.db") as store:
        store.insert(_job(json.dumps(insp)))
        rep = query.report(store, "77", load_catalog())
    offline = checkpoint_from_disk(inspect_checkpoint_dir(DATA / "zero2"))
    ck = rep["checkpoint"]
    assert (ck["verdict"], ck["resume_from"]) == ("safe", "global_step4") == (offline["verdict"], offline["resume_from"])
    assert ck["disk_path"] == str(DATA / "zero2")


def test_an_unreadable_inspection_is_a_gap(tmp_path):
    with SqliteStore(tmp_path / "f.db") as store:
        store.insert(_job('{"schema": "something else"}'))
        rep = query.report(store, "77", load_catalog())
    assert rep["checkpoint"]["verdict"] == "unknown" and rep["partial"]
    assert any(g.get("source") == "checkpoints" for g in rep["gaps"])


def test_report_checkpoint_dir_on_the_head_node(tmp_path, capsys):
    db = tmp_path / "f.db"
    with SqliteStore(db) as store:
        store.insert(_job(None))
    tree = Path(shutil.copytree(DATA / "zero2", tmp_path / "ck"))
    (tree / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"PK\x03\x04cut")
    assert main(["report", "77", "--db", str(db), "--format", "json", "--checkpoint-dir", str(tree)]) == 0
    ck = json.loads(capsys.readouterr().out)["checkpoint"]
    assert (ck["verdict"], ck["resume_from"]) == ("unsafe", "global_step2")
    assert main(["report", "77", "--db", str(db), "--checkpoint-dir", str(tmp_path / "nope")]) == 1
    assert "nope" in capsys.readouterr().err


def test_report_checkpoint_dir_needs_the_store_not_the_read_only_api(capsys):
    assert main(["report", "77", "--collector", "http://127.0.0.1:9", "--checkpoint-dir", str(DATA / "zero2")]) == 1
    assert "--db" in capsys.readouterr().err
