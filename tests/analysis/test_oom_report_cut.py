"""judge.oom_reported: the kernel prints its OOM report (mm/oom_kill.c dump_header: the allocation that
invoked the killer, the task table, the victim's "oom-kill:constraint=..." summary) only as it kills. A
paste that shows the report with its "Killed process" line cut off shows a kill, not "no failure".
The lines are the real capture in tests/data/kernel/memcg-oom.dmesg (this VM's memcg OOM)."""

from __future__ import annotations

from pathlib import Path

from firstfault.analysis import judge
from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.events import Event
from firstfault.analysis.findings import Finding
from firstfault.analysis.identify import link_kernel
from tests.offline.scoring import first_failure_of

CATALOG = load_catalog()

CAPTURE = (Path(__file__).resolve().parents[1] / "data" / "kernel" / "memcg-oom.dmesg").read_text().splitlines()
REPORT = CAPTURE[:CAPTURE.index(next(x for x in CAPTURE if "Killed process" in x))]  # cut before the kill line


def test_the_report_without_its_kill_line_is_the_kill_at_low_confidence():
    ff = first_failure_of("\n".join(REPORT) + "\n")
    assert (ff["category"], ff["confidence"]) == ("host-memory", "low")
    assert ff["signature"] in ("kernel.oom_invoked", "kernel.oom_kill_constraint")


def test_the_victim_summary_cut_mid_line_still_says_it():
    cut = [x for x in REPORT if "oom-kill:constraint=" in x][0].split(",mems_allowed")[0]
    ff = first_failure_of(cut + "\n")
    assert (ff["signature"], ff["category"]) == ("kernel.oom_kill_constraint", "host-memory")


def test_with_its_kill_line_the_kill_line_is_the_failure():
    ff = first_failure_of("\n".join(CAPTURE[:CAPTURE.index(REPORT[-1]) + 2]) + "\n")
    assert ff["signature"] == "kernel.memcg_oom_kill"


def test_a_report_of_another_process_is_no_failure_of_this_job():
    """The launcher named every rank's pid and the victim is none of them (identify.link_kernel): that
    OOM report, its kill line cut off, is another process's; it is no failure of this job."""
    victim = next(x for x in REPORT if "oom-kill:constraint=" in x).split("] ", 1)[1]
    report = Finding(Event(text=victim, source="kernel", node="n1"), CATALOG.match(victim))
    assert judge.oom_reported([report]) is not None
    elsewhere = link_kernel([report], {4242: 0}, {0: "n1"}, {})
    assert judge.oom_reported(elsewhere) is None
