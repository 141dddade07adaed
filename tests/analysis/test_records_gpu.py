"""An Xid that NVML delivered goes through the read side (records -> report) like the driver's
NVRM Xid line: the report names the Xid, the GPU, the node and, through the agents' process
records, the rank; the same Xid seen in the kernel log and through NVML is one failure.

The incident is the real capture torchrun-kill-in-save-rank1-of-2 (rank 1, pid 4713, dies by
SIGKILL; the launcher notices at 11:37:13.573 UTC). Into it goes, 300 ms before, a GPU fault on
rank 1's GPU: the real NVRM Xid 13 line of tests/data/kernel/nvrm.kmsg (pid '<unknown>', as
the driver writes it when it cannot tell), shipped by the agent's kmsg code, and the same Xid
as the agent's nvml source reports it, made by that source's code over the fake pynvml of the
agent tests.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest

from firstfault.agent.clock import BootWall
from firstfault.agent.sources.kmsg import KmsgStream
from firstfault.agent.sources.nvml import Nvml, NvmlSource
from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.findings import read_findings
from firstfault.analysis.records import events_from_records
from firstfault.analysis.report import Inputs, build_report
from firstfault.wire import Record
from tests.analysis.shipped import ship_file
from tests.analysis.test_records import REAL

TESTS = Path(__file__).resolve().parents[1]
CAT = load_catalog()
INCIDENT = REAL / "torchrun-kill-in-save-rank1-of-2"
KILL_NS = int(datetime(2026, 12, 2, 11, 37, 13, 573000, tzinfo=timezone.utc).timestamp() * 1e9)
XID_NS = KILL_NS - 300_000_000
UUID = "GPU-8a47641b-dff6-f09f-618c-c3eb58fb430d"  # nvrm.kmsg: "NVRM: GPU at PCI:0000:3b:00: GPU-8a47..."
RANK_PIDS = {0: 4712, 1: 4713}  # the launcher's failure summary


def _fake_pynvml():
    name = "fake_pynvml_for_collector"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TESTS / "agent" / "sources" / "fake_pynvml.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def kernel_xid(node: str = "vm") -> list[Record]:
    """The real Xid 13 line, read by the agent's kmsg code with its stamp at XID_NS."""
    raw = next(line for line in (TESTS / "data" / "kernel" / "nvrm.kmsg").read_bytes().splitlines(True)
               if b"): 13, pid='<unknown>'" in line)
    usec = int(raw.split(b",")[2])
    boot = BootWall(ns=XID_NS - usec * 1000, error_ns=50, at_boottime_ns=usec * 1000)
    drafts = KmsgStream("boot-1", last_seq=int(raw.split(b",")[1]) - 1).feed(raw, boot, observed_ns=XID_NS + 10**6)
    return [d.to_record(node, "kmsg-stream", 7000 + i) for i, d in enumerate(drafts)]


def nvml_xid(monkeypatch, gpu: int = 1, xid: int = 13, node: str = "vm") -> Record:
    """The same Xid as the agent's nvml source reports it, received 2 ms after the kernel's stamp."""
    fp = _fake_pynvml()
    gpus = [fp.FakeGpu("GPU-2c1f0b6e-5d3e-4e2a-9a41-7f5e6c1d9b20", "00000000:1B:00.0", procs=[(4712, 2**30)]),
            fp.FakeGpu(UUID, "00000000:3B:00.0", procs=[(4713, 2**30)])]
    fake = fp.FakeNvml(gpus)
    fp.install(monkeypatch, fake)
    src, nvml = NvmlSource(), Nvml().open()
    try:
        found = src.gpus(nvml)
        es = nvml.event_set()
        src.register(nvml, found[gpu], es)
        fake.push(gpu, fp.nvmlEventTypeXidCriticalError, xid)
        ev = nvml.wait(es, 1000)
        draft = src.event_draft(nvml, found, ev, XID_NS + 2_000_000)
        nvml.free(es)
    finally:
        nvml.close()
    return draft.to_record(node, "nvml-stream", 9000)


def procs() -> list[Record]:
    return [Record(node="vm", stream="procs-stream", seq=100 + r, source="procs", kind="proc.start",
                   message="python3 train.py", occurred_ns=KILL_NS - 14 * 10**9, observed_ns=KILL_NS - 14 * 10**9,
                   pid=pid, rank=r, local_rank=r) for r, pid in RANK_PIDS.items()]


def incident(with_launcher: bool = True) -> list[Record]:
    records: list[Record] = []
    for p in sorted((INCIDENT / "logs").rglob("*.log")):
        records += ship_file(p, "vm", int(p.parent.name), len(records))
    if with_launcher:
        records += ship_file(INCIDENT / "launcher.log", "vm", None, len(records))
    return records


def report(records: list[Record]) -> dict:
    records = sorted(records, key=lambda r: (r.occurred_ns or r.observed_ns, r.stream, r.seq))
    return build_report(events_from_records(records), CAT, Inputs())


def test_the_nvml_record_is_what_the_agent_ships(monkeypatch):
    r = nvml_xid(monkeypatch)
    assert (r.source, r.kind, r.pid, r.occurred_ns) == ("nvml", "gpu.xid", 4713, XID_NS + 2_000_000)
    assert r.message == f"NVML: Xid 13 on GPU 1 (PCI:00000000:3B:00.0 {UUID})"
    [k] = kernel_xid()
    assert k.message.startswith("NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>'") and k.occurred_ns == XID_NS


def test_kernel_and_nvml_report_of_one_xid_is_one_failure_that_names_rank_gpu_and_node(monkeypatch):
    rep = report(incident() + kernel_xid() + [nvml_xid(monkeypatch)] + procs())
    ff = rep["first_failure"]
    assert (ff["signature"], ff["rank"], ff["node"], ff["pid"]) == ("nvidia.xid", 1, "vm", 4713)
    assert ff["category"] == "user-code" and rep["blame"] == "code"  # Xid 13: application
    assert ff["summary"] == "Rank 1 on vm: GPU 0000:3b:00 reported Xid 13 (Graphics Engine Exception)."
    [ev] = ff["evidence"]
    assert ev["gpu"] == {"gpu": 1, "uuid": UUID, "pci_bus_id": "00000000:3B:00.0"}
    assert ev["text"].startswith("NVRM: Xid (PCI:0000:3b:00): 13")
    assert ev["linked_by"] == (f"NVML reported the same Xid (Xid 13 on GPU 1 (PCI:00000000:3B:00.0 {UUID})); "
                               "pid 4713 is rank 1")
    assert [d["signature"] for d in rep["distinct_failures"]] == ["nvidia.xid"]  # not twice
    assert rep["distinct_failures"][0]["ranks"] == [1]
    assert rep["ranks"]["1"]["exit"]["signal"] == "SIGKILL"  # what followed the Xid on that rank


def test_nvml_alone_names_the_rank_through_the_process_records(monkeypatch):
    # no launcher log: only the agents' process records tie pid 4713 to rank 1
    rep = report(incident(with_launcher=False) + [nvml_xid(monkeypatch)] + procs())
    ff = rep["first_failure"]
    assert (ff["signature"], ff["rank"], ff["node"], ff["pid"], ff["clock"]) == (
        "nvidia.xid_nvml", 1, "vm", 4713, "agent")
    assert ff["summary"] == "Rank 1 on vm: GPU 1 (00000000:3B:00.0) reported Xid 13 (Graphics Engine Exception) through NVML."
    assert ff["evidence"][0]["linked_by"] == "pid 4713 is rank 1"
    without = report(incident(with_launcher=False) + [nvml_xid(monkeypatch)])
    assert without["first_failure"]["signature"] == "nvidia.xid_nvml" and without["first_failure"]["rank"] is None


def xid_findings(records: list[Record]) -> list[str]:
    read = read_findings(events_from_records(records), CAT)
    return sorted(f.sig for f in read.findings if f.sig.startswith("nvidia.xid"))


def test_one_xid_in_both_is_one_finding(monkeypatch):
    assert xid_findings(kernel_xid() + [nvml_xid(monkeypatch)]) == ["nvidia.xid"]


@pytest.mark.parametrize("what", ["other GPU", "other code", "other node", "a minute later"])
def test_different_xids_stay_apart(monkeypatch, what):
    if what == "a minute later":
        nv = nvml_xid(monkeypatch)
        nv = replace(nv, occurred_ns=nv.occurred_ns + 60 * 10**9, observed_ns=nv.observed_ns + 60 * 10**9)
    else:
        nv = nvml_xid(monkeypatch, **{"other GPU": dict(gpu=0), "other code": dict(xid=31),
                                      "other node": dict(node="vm2")}[what])
    assert xid_findings(kernel_xid() + [nv]) == ["nvidia.xid", "nvidia.xid_nvml"]
