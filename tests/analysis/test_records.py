"""Records as agents ship them give the same verdict as the files they came from.

The records are made from real captured files the way the agent ships them: one
record per line, a whole traceback as one record (per rank prefix), kernel
messages as kernel.line records with the kmsg time converted to wall time.
"""

import json
from pathlib import Path

import pytest

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.records import events_from_records
from firstfault.analysis.report import Inputs, build_report
from firstfault.cli import main
from firstfault.wire import Record
from tests.analysis.shipped import ship_file, ship_kernel

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
CAT = load_catalog()


def _key(rep: dict) -> tuple:
    ff = rep["first_failure"] or {}
    return (ff.get("rank"), ff.get("signature"), ff.get("category"), ff.get("phase"), rep["blame"],
            sorted(rep["ranks"]), [d["signature"] for d in rep["distinct_failures"]])


@pytest.mark.parametrize("name", ["torchrun-exception-rank1-of-2", "deepspeed-exception-rank2-of-4",
                                  "torchrun-oom-rank1-of-2", "torchrun-hang-rank1-of-2"])
def test_records_give_the_files_verdict(name, capsys):
    folder = REAL / name
    scen = json.loads((folder / "scenario.json").read_text())
    records: list[Record] = []
    for p in sorted((folder / "logs").rglob("*.log")):
        rank = int(p.parent.name) if p.parent.name.isdigit() else int(p.stem.rsplit("rank", 1)[1])
        records += ship_file(p, "vm", rank, len(records))
    records += ship_file(folder / "launcher.log", "vm", None, len(records))
    args = ["analyze", str(folder / "logs"), str(folder / "launcher.log"), "--format", "json", "--tz", "UTC"]
    if (folder / "kmsg.txt").exists():
        clock = scen["result"]["kmsg"]["clock"]
        boot_ns = int((clock["wall_s"] - clock["boottime_s"]) * 1e9)
        records += ship_kernel(folder / "kmsg.txt", "vm", boot_ns)
        args += ["--kernel", str(folder / "kmsg.txt"), "--kernel-boot-time", repr(boot_ns / 1e9)]
    records.sort(key=lambda r: (r.occurred_ns or r.observed_ns, r.stream, r.seq))
    from_records = build_report(events_from_records(records), CAT, Inputs())
    assert main(args) == 0
    from_files = json.loads(capsys.readouterr().out)
    assert _key(from_records) == _key(from_files)
    assert from_records["first_failure"]["rank"] == scen["expected"]["rank"]
