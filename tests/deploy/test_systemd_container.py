"""Proof under a real systemd: a Debian bookworm container booted with systemd as PID 1
(systemd-nspawn), firstfault installed into it by deploy/install.sh from wheels built from
this tree, both units started as shipped (plus a drop-in that shortens the agent's watchdog).

Checked: `systemctl start` returns only after READY=1 (the port answers at once, STATUS is
the daemon's); a line written to /dev/kmsg (on the host: the container's /dev/kmsg is the
host's, bound in) reaches the collector inside the window of a job marked with `firstfault
mark`, as `firstfault timeline` shows; a rank-log line does too (when the ranklog source
exists); a SIGSTOPped agent misses its watchdog and systemd restarts it (NRestarts); with the
collector down the agent spools, and `systemctl stop` of the agent after the collector is
back returns only when the spool is flushed (nothing unacked, the record stored).

Slow: the first run debootstraps Debian (minutes, cached in /var/cache/firstfault); later
runs take about a minute or two (wheels, boot, install).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.deploy.nspawn import Container, missing_tools

ROOT = Path(__file__).resolve().parents[2]
FF = "/opt/firstfault/bin/firstfault"
AGENT, COLLECTOR = "firstfault-agent.service", "firstfault-collector.service"
DROP_IN = """[Service]
WatchdogSec=4
TimeoutAbortSec=2
"""

pytestmark = [pytest.mark.slow, pytest.mark.root,
              pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))]


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nspawn")
    wheels = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", str(ROOT), "-w", str(wheels)],
                   check=True, capture_output=True, timeout=600)
    c = Container(f"ff-{uuid.uuid4().hex[:8]}", tmp / "console.log", binds=("/dev/kmsg",),
                  binds_ro={str(ROOT): "/mnt/src", str(wheels): "/mnt/wheels"})
    try:
        c.run("sh /mnt/src/deploy/install.sh all --wheels /mnt/wheels", timeout=300)
        c.run("sed -i 's/^collectors = .*/collectors = [\"127.0.0.1:7140\"]/' /etc/firstfault/agent.toml")
        c.run("mkdir -p /var/log/ranks && sed -i 's|^globs = \\[\\].*|globs = "
              "[\"/var/log/ranks/{job}/rank{rank}.log\"]|' /etc/firstfault/agent.toml")
        c.run(f"mkdir -p /etc/systemd/system/{AGENT}.d && printf %s {shlex.quote(DROP_IN)} "
              f"> /etc/systemd/system/{AGENT}.d/10-test.conf && systemctl daemon-reload")
        yield c
    finally:
        c.stop()


def write_kmsg(text: str) -> None:
    with open("/dev/kmsg", "w") as f:
        f.write(text + "\n")


def timeline(c: Container, job: str, grep: str) -> list[dict]:
    # --node-context: a kernel line in a marked job that names none of its processes is the node's
    r = c.run(f"{FF} timeline {shlex.quote(job)} --grep {shlex.quote(grep)} --node-context --format jsonl", check=False)
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()] if r.returncode == 0 else []


def metric(c: Container, name: str) -> float | None:
    r = c.run("python3 -c 'import urllib.request as u; "
              "print(u.urlopen(\"http://127.0.0.1:7142/metrics\", timeout=5).read().decode())'", check=False)
    values = [float(line.split()[-1]) for line in r.stdout.splitlines() if line.startswith(name + " ")
              or line.startswith(name + "{")]
    return sum(values) if values else None


def test_start_returns_after_ready(box):
    box.run(f"systemctl start {COLLECTOR}")
    # Type=notify: start returned after READY=1, so both ports answer now, not "soon"
    box.run("python3 -c 'import socket; [socket.create_connection((\"127.0.0.1\", p), 5).close() "
            "for p in (7140, 7141)]'")
    st = box.show(COLLECTOR, "ActiveState", "SubState", "StatusText", "Type", "User")
    assert (st["ActiveState"], st["SubState"], st["Type"], st["User"]) == ("active", "running", "notify",
                                                                           "firstfault")
    assert st["StatusText"].startswith("serving ingest on 0.0.0.0:7140, http on 127.0.0.1:7141")
    box.run(f"systemctl start {AGENT}")
    st = box.show(AGENT, "ActiveState", "StatusText", "User")
    assert (st["ActiveState"], st["User"]) == ("active", "firstfault-agent") and st["StatusText"]
    box.wait_for("the agent connected", lambda: "shipping to" in box.show(AGENT, "StatusText")["StatusText"])


def test_a_kernel_line_reaches_the_collector_in_a_marked_job(box):
    job, needle = "nspawn-kmsg", f"firstfault-nspawn-{uuid.uuid4().hex}"
    box.run(f"{FF} mark start --job {job} --nodes $(hostname)")
    write_kmsg(needle)
    box.run(f"{FF} mark end --job {job}")
    hits = box.wait_for("the kmsg line in the timeline", lambda: timeline(box, job, needle))
    assert [(h["source"], h["kind"], h["message"]) for h in hits] == [("kmsg", "kernel.line", needle)]
    marks = [h for h in timeline(box, job, f"job {job}") if h["kind"] == "job.mark"]
    assert sorted(m["fields"]["event"] for m in marks) == ["end", "start"]
    assert marks[0]["source"] == "marks" and marks[0]["fields"]["uid"] == 0


def test_a_rank_log_line_reaches_the_collector(box):
    job, needle = "nspawn-rank", f"firstfault-rank-{uuid.uuid4().hex}"
    box.run(f"mkdir -p /var/log/ranks/{job} && echo '[rank0]: {needle}' >> /var/log/ranks/{job}/rank0.log")
    hits = box.wait_for("the rank-log line in the timeline", lambda: timeline(box, job, needle))
    assert [(h["source"], h["rank"]) for h in hits] == [("ranklog", 0)]


def test_a_missed_watchdog_restarts_the_agent(box):
    before = box.show(AGENT, "MainPID", "NRestarts", "WatchdogUSec")
    assert before["WatchdogUSec"] == "4s"
    box.run(f"kill -STOP {before['MainPID']}")

    def restarted():
        s = box.show(AGENT, "MainPID", "NRestarts", "ActiveState")
        return s if int(s["NRestarts"]) > int(before["NRestarts"]) and s["ActiveState"] == "active" else None

    after = box.wait_for("a restart", restarted, timeout=60)
    assert after["MainPID"] != before["MainPID"]
    log = box.run(f"journalctl -u {AGENT} --no-pager -o cat").stdout
    assert "Watchdog timeout" in log
    box.wait_for("the agent connected again", lambda: "shipping to" in box.show(AGENT, "StatusText")["StatusText"])


def test_stop_flushes_the_spool(box):
    job, needle = "nspawn-flush", f"firstfault-flush-{uuid.uuid4().hex}"
    box.run(f"systemctl stop {COLLECTOR}")
    box.run(f"{FF} mark start --job {job}")
    write_kmsg(needle)
    box.run(f"{FF} mark end --job {job}")
    box.wait_for("records spooled while the collector is down",
                 lambda: (metric(box, "firstfault_agent_spool_unacked_records") or 0) >= 3)
    box.run(f"systemctl start {COLLECTOR}")
    box.run(f"systemctl stop {AGENT}")  # returns when the agent has exited: after its flush
    log = box.run(f"journalctl -u {AGENT} --no-pager -o cat").stdout.splitlines()
    assert any(line.endswith("agent stopped flushed=True unacked=0") for line in log[-5:]), log[-5:]
    hits = timeline(box, job, needle)
    assert [h["message"] for h in hits] == [needle]
