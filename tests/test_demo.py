"""``firstfault demo``: the real daemons and a real failing job on this machine, the report
from the collector's HTTP API, and nothing left behind. As root the victim rank is killed by
the real kernel OOM killer in a real memory cgroup: the agent's kmsg, cgroup and procs
records are all the collector has to name it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.agent.sources.conftest import needs_kmsg

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def demo(*args: str) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "-m", "firstfault", "demo", "--format", "json", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


def leftovers() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [ln for ln in ps.splitlines() if "firstfault-demo-" in ln or "firstfault.demo_rank" in ln]


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="the memory cgroup needs root")
@needs_kmsg  # the kill's witness is the agent's kmsg source
def test_a_rank_killed_by_the_kernel_oom_killer_is_named_from_the_agents_records():
    rep, err = demo("--mode", "oom")
    first = rep["first_failure"]
    assert first["rank"] == 2 and first["signature"] == "kernel.memcg_oom_kill"
    assert first["category"] == "host-memory" and rep["blame"] == "resources"
    assert any(ev.get("linked_by", "").endswith("is rank 2") for ev in first["evidence"])
    assert rep["ranks"]["2"]["exit"]["signal"] == "SIGKILL"
    # memory by phase over the collector: the agents' samples and the kernel's figures of the victim
    victim = rep["memory"]["ranks"]["2"]["series"]
    assert victim["cgroup"]["limit"] == 256 << 20 and "cgroup.memory" in victim["cgroup"]["sources"]
    assert {"proc.start", "kernel OOM report"} <= set(victim["rss"]["sources"])
    assert "is READY" in err and "OOM-killed by the kernel" in err
    assert not leftovers()
    memcgs = [p for root in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup"))
              if root.is_dir() for p in root.glob("firstfault-demo-*")]
    assert not memcgs


def test_a_rank_that_raises_is_named_with_its_traceback():
    rep, err = demo("--mode", "exception", "--ranks", "3")
    first = rep["first_failure"]
    assert first["rank"] == 2
    assert "expected 16 features per sample, got 17" in json.dumps(first["evidence"])
    assert not leftovers()


def test_the_demo_names_the_page_of_the_failed_job_and_serves_it_until_interrupted():
    import re
    import signal
    import urllib.request

    p = subprocess.Popen([sys.executable, "-m", "firstfault", "demo", "--mode", "exception", "--ranks", "3",
                          "--serve", "yes"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in p.stderr:
            m = re.search(r"the report page, rank 2 on the timeline: (http://127\.0\.0\.1:\d+/jobs/\S+)", line)
            if m:
                url = m[1]
                break
        assert url, "the demo named no page"
        with urllib.request.urlopen(url, timeout=60) as r:
            assert "default-src 'none'" in r.headers["Content-Security-Policy"]
            page = r.read().decode()
        assert "First failure: <span id='ff-who'>rank 2" in page and '"label":"rank 2"' in page
        p.send_signal(signal.SIGINT)
        assert p.wait(60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert not leftovers()


def test_a_real_failing_job_through_agent_and_collector_makes_exactly_one_notice():
    """The real daemons and a real 2-rank job; the collector sends its notice to a receiver on
    loopback: exactly one, whose rank and checkpoint are the report's; the demo shows it."""
    from tests.collector.notify.receiver import Receiver

    rx = Receiver()
    try:
        rep, err = demo("--mode", "exception", "--ranks", "2", "--notify", rx.url)
        rx.wait(lambda: rx.delivered(), timeout=10)
        time.sleep(1)  # nothing more comes
        (got,) = rx.delivered()
        assert len(rx.requests) == 1
        assert got["job"] == rep["job"] and got["revision"] == 1 and got["settled"] is True
        assert got["first_failure"]["rank"] == rep["first_failure"]["rank"] == 1
        assert got["first_failure"]["signature"] == rep["first_failure"]["signature"]
        assert got["checkpoint"]["verdict"] == rep["checkpoint"]["verdict"]
        assert got["checkpoint"]["resume_from"] == rep["checkpoint"]["resume_from"]
        assert got["decided_by"] == "ranks-exited"
        assert "the collector's notice, as it sent it:" in err and f'"id": "{rep["job"]}#1"' in err
        assert "its delivery: notice delivered target=demo type=webhook" in err
    finally:
        rx.close()
    assert not leftovers()
