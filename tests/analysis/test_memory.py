"""Memory by lifecycle phase (analysis/memory.py, memlines.py): each line shape from its
source's format string, a real run with DeepSpeed's memory_breakdown and a kernel OOM kill,
and the agents' samples over records."""

import json
import re
from pathlib import Path

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.memlines import figures, point
from firstfault.analysis.records import events_from_records
from firstfault.analysis.report import Inputs, build_report
from firstfault.cli import main
from firstfault.wire import Record

GIB, KIB = 1 << 30, 1 << 10
REAL = Path(__file__).resolve().parents[1] / "data" / "real" / "torchrun-oom-memory-rank1-of-2"


def see_memory_usage(ma, max_ma, ca, max_ca):
    """deepspeed/runtime/utils.py see_memory_usage: an f-string continued with backslashes."""
    return f"MA {ma} GB         Max_MA {max_ma} GB         CA {ca} GB         Max_CA {max_ca} GB "


def summary_row(name, cur, peak, unit="KiB"):
    """torch/cuda/memory.py memory_summary: f" {submetric_name:<21} | {formatter(current...)} | ..." in "|...|"."""
    return f"| {name:<21} | {cur:6d} {unit} | {peak:6d} {unit} | {cur:6d} {unit} | {0:6d} {unit} |"


def test_every_line_shape_gives_its_figures_in_bytes():
    f = figures(see_memory_usage(0.36, 0.4, 0.5, 1))
    assert [(x.series, x.value, x.peak) for x in f] == [("allocated", int(0.36 * GIB), int(0.4 * GIB)),
                                                        ("reserved", int(0.5 * GIB), None)]
    (vm,) = figures("CPU Virtual Memory:  used = {} GB, percent = {}%".format(2.0, 8.0))
    assert (vm.series, vm.value, vm.limit) == ("host_used", 2 * GIB, 25 * GIB)
    progress = ("epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={}, "
                "MemAllocated={}GB, MaxMemAllocated={}GB").format(0, 4, 4, 16.3, 15.1, 0.38, 0.5)
    assert [(x.series, x.value, x.peak) for x in figures(progress)] == [("allocated", int(0.38 * GIB), int(0.5 * GIB))]
    assert [(x.series, x.value, x.peak) for x in figures(summary_row("Allocated memory", 12345, 23456))] == \
        [("allocated", 12345 * KIB, 23456 * KIB)]
    assert figures(summary_row("GPU reserved memory", 40, 41, "MiB"))[0].value == 40 << 20
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate " + "2.00 GiB" + ". GPU " + "1" +
           " has a total capacity of " + "79.10 GiB" + " of which " + "1.02 GiB" + " is free. " +
           "Process 24215 has 78.07 GiB memory in use. " + "Of the allocated memory " + "75.31 GiB" +
           " is allocated by PyTorch, and " + "1.20 GiB" + " is reserved by PyTorch but unallocated.")
    alloc, reserved = figures(oom)
    assert (alloc.value, alloc.limit, alloc.gpu) == (int(75.31 * GIB), int(79.10 * GIB), 1)
    assert reserved.value == int(75.31 * GIB) + int(1.20 * GIB)
    old = "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; " \
          "14.52 GiB already allocated; 3.44 MiB free; 14.65 GiB reserved in total by PyTorch)"
    assert [x.value for x in figures(old)] == [int(14.52 * GIB), int(14.65 * GIB)]
    (cg,) = figures("memory: usage %dkB, limit %dkB, failcnt %d" % (1048576, 1048576, 80))
    assert (cg.series, cg.value, cg.limit) == ("cgroup", GIB, GIB)
    (rss,) = figures("Memory cgroup out of memory: Killed process %d (%s) total-vm:%dkB, anon-rss:%dkB, file-rss:%dkB, "
                     "shmem-rss:%dkB, UID:%d pgtables:%dkB oom_score_adj:%d" % (4271, "python3", 1983668, 1000, 20, 4, 0,
                                                                               2660, 0))
    assert (rss.series, rss.value, rss.pid) == ("rss", 1024 * KIB, 4271)
    assert figures("MA says nothing here") == [] and figures("") == []
    assert point("Engine before step") == ("optimizer-step", "open", "Engine before step")
    assert point("Engine after backward")[:2] == ("backward", "close")
    assert point("DeepSpeed Engine: After args sanity test")[0] == "init"


def _analyze(capsys, *extra) -> dict:
    assert main(["analyze", str(REAL), "--tz", "UTC", "--format", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_real_run_shows_memory_by_phase_and_the_kill(capsys):
    rep = _analyze(capsys, "--checkpoint-dir", str(REAL / "checkpoints"))
    mem = rep["memory"]
    phases = [p["phase"] for p in mem["phases"]]
    assert phases[0] == "init" and {"forward", "backward", "optimizer-step", "checkpoint-save"} <= set(phases)
    assert phases[-1] == "optimizer-step" and mem["phase_at_failure"] == "optimizer-step"
    # rank 0 logged it: every MA figure of its own log is there, init against steady
    log = next(REAL.glob("logs/*/attempt_0/0/stdout.log")).read_text()
    mas = [float(m) for m in re.findall(r"^MA ([\d.]+) GB", log, re.M)]
    alloc = mem["ranks"]["0"]["series"]["allocated"]
    assert alloc["count"] == len(mas) + len(re.findall(r", MemAllocated=", log))
    assert alloc["init_peak"] == int(0.25 * GIB) and alloc["steady"] == int(0.38 * GIB)
    assert alloc["peak"] == int(max(mas) * GIB)
    # rank 1 printed nothing: the kernel's OOM report holds its memory at the kill
    r1 = mem["ranks"]["1"]["series"]
    assert r1["rss"]["at_failure"]["value"] == (1053296 + 103868) * KIB
    assert r1["cgroup"]["at_failure"]["value"] == r1["cgroup"]["limit"] == GIB
    assert any("rank 1 memory cgroup at the failure: 1.00 GiB of its 1.00 GiB limit (100%" in n for n in mem["notes"])
    # the phase of the kill comes from the step rank 0 never left
    assert rep["first_failure"]["phase"] == "optimizer-step"
    assert "memory_breakdown" in rep["first_failure"]["phase_from"]


def test_the_text_report_has_a_short_memory_table(capsys):
    assert main(["analyze", str(REAL), "--tz", "UTC", "--checkpoint-dir", str(REAL / "checkpoints")]) == 0
    out = capsys.readouterr().out
    table = out.split("Memory by phase:\n")[1].split("\n\n")[0].splitlines()
    assert table[0].split() [:3] == ["rank", "memory", "init"]
    assert table[1].split()[:3] == ["1", "host", "RSS"]  # the failed rank first
    assert "1.00 GiB" in table[2] and "256 MiB" in out


def _rec(seq, kind, t_s, **kw):
    return Record(node="gpu-1", stream="s", seq=seq, source=kind.split(".")[0].replace("proc", "procs").replace(
        "gpu", "nvml"), kind=kind, message="", occurred_ns=int(t_s * 1e9), observed_ns=int(t_s * 1e9), job="j", **kw)


def test_the_agents_samples_give_each_rank_its_memory():
    t = 1_800_000_000
    records = [
        _rec(0, "proc.start", t, rank=1, pid=77, fields={"rss_bytes": 100 << 20, "cmdline": "python train.py"}),
        _rec(1, "proc.memory", t + 10, rank=1, pid=77, fields={"rss_bytes": 300 << 20}),
        _rec(2, "cgroup.memory", t + 10, fields={"cgroup": "/job/1", "version": 1, "pids": "77",
                                                 "usage_bytes": 400 << 20, "limit_bytes": 512 << 20}),
        _rec(3, "cgroup.memory", t + 11, fields={"cgroup": "/job/2", "version": 1, "pids": "78",
                                                 "usage_bytes": 9, "limit_bytes": 9223372036854771712}),
        _rec(4, "proc.start", t, rank=2, pid=78, fields={"rss_bytes": 1 << 20}),
        _rec(5, "gpu.memory", t + 12, pid=77, fields={"gpu": 0, "used_bytes": 7 << 30}),
        _rec(6, "proc.exit", t + 20, rank=1, pid=77, fields={"code": -9, "signal": "SIGKILL", "rss_bytes": 500 << 20,
                                                            "peak_rss_bytes": 510 << 20}),
    ]
    rep = build_report(events_from_records(records), load_catalog(), Inputs(job="j"))
    r1 = rep["memory"]["ranks"]["1"]["series"]
    assert [v for _, v in r1["rss"]["samples"]] == [100 << 20, 300 << 20, 500 << 20]
    assert r1["rss"]["peak"] == 510 << 20 and r1["rss"]["sources"] == ["proc.exit", "proc.memory", "proc.start"]
    assert (r1["cgroup"]["peak"], r1["cgroup"]["limit"]) == (400 << 20, 512 << 20)
    assert r1["gpu"]["peak"] == 7 << 30
    assert rep["memory"]["ranks"]["2"]["series"]["cgroup"]["limit"] is None  # v1's "no limit"


def _staircases(items, bucket_ns, last):
    """Brute force: per second, its ``last`` items and those no later item of it equals or beats."""
    by: dict[int, list] = {}
    for t, order, key in items:
        by.setdefault(t // bucket_ns, []).append((order, key))
    out = set()
    for its in by.values():
        its.sort()
        out |= {o for i, (o, k) in enumerate(its) if i >= len(its) - last or all(k > k2 for _, k2 in its[i + 1:])}
    return out


def test_throughput_lines_kept_per_second_depend_on_the_set_only(monkeypatch):
    """TimerLines keeps each second's last lines and staircase (its peak and the falls after it),
    whatever order the lines come in; past MAX_BUCKETS seconds the seconds pair up, and what
    stays is the staircase of the wider buckets."""
    import random

    from firstfault.analysis import memory

    rnd = random.Random(3)
    items = [(t, (t, seq, f"n/s/{seq}"), rnd.choice((1, 2, 3, 4)))
             for seq, t in enumerate(sorted(rnd.randrange(0, 40 * 10**9) for _ in range(6000)))]
    for max_buckets, width in ((512, 10**9), (10, 4 * 10**9)):  # 40 seconds: 40, 20, then 10 buckets
        monkeypatch.setattr(memory, "MAX_BUCKETS", max_buckets)
        kept = []
        for shuffled in (items, rnd.sample(items, len(items))):
            lines = memory.TimerLines()
            for t, order, key in shuffled:
                lines.add(t, order, key, order)
            kept.append({e[2] for e in lines.entries()})
        assert kept[0] == kept[1] == _staircases(items, width, memory.LAST_PER_BUCKET)
        assert len(kept[0]) < len(items) / 4
