"""``firstfault agent`` as a real process against a real collector process (SQLite):
config checking, READY and /metrics, a /dev/kmsg line arriving, the SIGTERM flush,
and exactly-once delivery across SIGKILLs of the agent and of the collector (kernel
lines; rank log lines followed through ``--ranklog GLOB``)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pytest

from firstfault.collector.store.base import Selection
from firstfault.collector.store.sqlite import SqliteStore
from firstfault.wire import Hello
from tests.agent.sources.conftest import needs_kmsg
from tests.collector.server.ingest_helpers import Agent, CollectorProcess

ROOT = Path(__file__).resolve().parents[2]
needs_root = needs_kmsg  # the tests marked so write /dev/kmsg
QUIET = ("--procs-enabled", "false", "--cgroup-enabled", "false")


def agent_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "firstfault", "agent", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AgentProcess:
    """``firstfault agent`` as a subprocess; stderr collected; ``metrics`` its address."""

    def __init__(self, state_dir, collector, *extra: str, node: str = "node-a",
                 env: dict | None = None) -> None:
        self.proc = subprocess.Popen(
            agent_cmd("--collector", f"{collector[0]}:{collector[1]}", "--state-dir", str(state_dir),
                      "--node", node, "--metrics", "127.0.0.1:0", "--log-level", "debug", *extra),
            cwd=ROOT, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self.metrics: str | None = None
        self.started = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.started.wait(30), "agent did not start:\n" + "".join(self.lines)

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            m = re.search(r"agent started .* metrics=(\S+)", line)
            if m:
                self.metrics = m.group(1)
                self.started.set()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(30)


def write_kmsg(text: str) -> None:
    with open("/dev/kmsg", "wb", buffering=0) as f:  # a fresh open: 10 writes per open per 5 s
        f.write(f"<6>{text}\n".encode())


def messages(db, node: str, grep: str) -> list[str]:
    with SqliteStore(db) as store:
        return [r.message for r in store.records(Selection(nodes=(node,), grep=grep))]


def settle(cond, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} not reached"
        time.sleep(0.05)


def test_check_config_accepts_a_good_config_and_lists_every_problem(tmp_path):
    cfg = tmp_path / "agent.toml"
    cfg.write_text('node = "n1"\ncollectors = ["127.0.0.1:7140"]\n[sources.cgroup]\ninterval_s = 2\n')
    ok = subprocess.run(agent_cmd("--config", str(cfg), "--check-config", "--state-dir",
                                  str(tmp_path)), cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "configuration ok" in ok.stdout and "sources.cgroup = on (interval_s=2)" in ok.stdout
    cfg.write_text('collectors = ["10.0.0.9:7140"]\nfsync = "x"\n[sources.cgroup]\nbogus = 1\n'
                   '[sources.nosuch]\n')
    bad = subprocess.run(agent_cmd("--config", str(cfg), "--check-config", "--spool-fsync", "often"),
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2
    for problem in ("fsync: unknown key", "spool-fsync: expected one of always, interval, never",
                    "sources.cgroup.bogus: unknown option", "unknown source 'nosuch'",
                    "10.0.0.9:7140 is not a loopback address: a token is required"):
        assert problem in bad.stderr, bad.stderr


@needs_root
@pytest.mark.root
def test_a_kmsg_line_reaches_the_collector_ready_metrics_and_sigterm_flush(tmp_path):
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    col = CollectorProcess(tmp_path / "c.db")
    agent = AgentProcess(tmp_path / "agent", col.ingest, *QUIET,
                         env={"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "1000000"})
    try:
        assert notify.recv(4096).startswith(b"READY=1\nSTATUS=")
        text = f"firstfault-agent-test {uuid.uuid4().hex}"
        write_kmsg(text)
        settle(lambda: messages(tmp_path / "c.db", "node-a", text) == [text], what="the kmsg line")
        assert b"WATCHDOG=1" in notify.recv(4096)  # every WATCHDOG_USEC / 2
        with urllib.request.urlopen(f"http://{agent.metrics}/metrics", timeout=10) as r:
            body = r.read().decode()
        assert re.search(r'firstfault_agent_records_total\{source="kmsg"\} [1-9]', body)
        assert "firstfault_agent_connected 1" in body
        assert agent.stop() == 0
        assert any("agent stopped flushed=True unacked=0" in line for line in agent.lines)
        rest = notify.recv(4096)
        while b"STOPPING=1" not in rest:
            rest = notify.recv(4096)
    finally:
        if agent.proc.poll() is None:
            agent.stop(signal.SIGKILL)
        col.stop()
        notify.close()


@needs_root
@pytest.mark.root
@pytest.mark.slow
def test_every_line_arrives_exactly_once_across_agent_and_collector_kills(tmp_path):
    port, db, state = free_port(), tmp_path / "c.db", tmp_path / "agent"
    col = CollectorProcess(db, "--listen", f"127.0.0.1:{port}")
    agent = AgentProcess(state, col.ingest, *QUIET)
    tag = uuid.uuid4().hex[:12]
    total = 900
    try:
        for i in range(total):
            write_kmsg(f"ff-once {tag} {i:05d}")
            time.sleep(0.002)
            if i == 100:  # the agent dies under load (before kmsg saved any state) and comes back
                agent.stop(signal.SIGKILL)
                agent = AgentProcess(state, col.ingest, *QUIET)
            if i == 600:  # the collector dies while the agent spools, and comes back
                col.stop(signal.SIGKILL)
                time.sleep(0.5)
                col = CollectorProcess(db, "--listen", f"127.0.0.1:{port}")
        want = [f"ff-once {tag} {i:05d}" for i in range(total)]
        settle(lambda: len(set(messages(db, "node-a", tag))) == total, 60, "every line")
        assert agent.stop() == 0
        got = messages(db, "node-a", tag)
        dups = {m: n for m, n in Counter(got).items() if n > 1}
        assert not dups, f"{len(dups)} lines stored more than once"
        assert sorted(got) == want
    finally:
        if agent.proc.poll() is None:
            agent.stop(signal.SIGKILL)
        col.stop()


@needs_root
@pytest.mark.root
def test_a_real_nvrm_xid_line_written_to_dev_kmsg_arrives_as_a_kernel_record(tmp_path):
    from firstfault.analysis.catalog import load_catalog
    raw = next(ln for ln in (ROOT / "tests/data/kernel/nvrm.kmsg").read_text().splitlines()
               if "): 79, " in ln)
    text = raw.split(";", 1)[1]  # the driver's text: NVRM: Xid (PCI:...): 79, ... fallen off the bus.
    col = CollectorProcess(tmp_path / "c.db")
    agent = AgentProcess(tmp_path / "agent", col.ingest, *QUIET)
    try:
        write_kmsg(text)
        settle(lambda: text in messages(tmp_path / "c.db", "node-a", "fallen off the bus"),
               what="the Xid line")
        with SqliteStore(tmp_path / "c.db") as store:
            rec = next(r for r in store.records(Selection(nodes=("node-a",), grep="fallen off"))
                       if r.message == text)
        assert rec.source == "kmsg" and rec.kind == "kernel.line" and rec.boot_id
        m = load_catalog().match(rec.message)
        assert m is not None and m.signature.id == "nvidia.xid" and m.category == "hardware"
    finally:
        agent.stop()
        col.stop()


def _write_rank_logs(logs: list[Path], stop: threading.Event, rotate_at: int,
                     rotated: threading.Event | None = None) -> int:
    """Numbered lines into every rank file (20 lines a write, ~7,500 lines/s in all), a
    Python traceback in each every 2,000 lines, rank 0's file rotated by rename once (then
    ``rotated`` is set); returns how many rounds it wrote."""
    i = 0
    while not stop.is_set():
        for r, p in enumerate(logs):
            block = "".join(f"[rank{r}]: step {i + k:06d} loss 2.31\n" for k in range(20))
            if i % 2000 == 0:
                block += (f"[rank{r}]: Traceback (most recent call last):\n"
                          f'[rank{r}]:   File "/job/train.py", line {i}, in <module>\n'
                          f"[rank{r}]: ValueError: bad batch {i}\n")
            with open(p, "a") as f:
                f.write(block)
        i += 20
        if i == rotate_at:
            os.rename(logs[0], f"{logs[0]}.1")
            if rotated is not None:
                rotated.set()
        time.sleep(0.008)
    return i


def _file_lines(*paths: Path) -> list[str]:
    return [ln for p in paths for ln in p.read_text().splitlines()]


def _stored_lines(db, node: str) -> dict[str, list[str]]:
    """Per path, the lines of its ranklog records in the store (a traceback line by line);
    checks every record's identity from the --ranklog glob and --job."""
    out: dict[str, list[str]] = {}
    with SqliteStore(db) as store:
        for r in store.records(Selection(nodes=(node,))):
            if r.source != "ranklog" or r.kind not in ("rank.line", "rank.traceback"):
                continue
            path = r.fields["path"]
            assert (r.job, r.rank) == ("train-7", int(re.search(r"rank(\d)\.log$", path)[1]))
            out.setdefault(path, []).extend(r.message.split("\n"))
    return out


@pytest.mark.slow
def test_rank_log_lines_arrive_exactly_once_across_agent_sigkills(tmp_path):
    """``--ranklog GLOB`` end to end (config, build_sources, the source) while a writer
    appends to three rank files and the agent is SIGKILLed at seeded random moments:
    every line (and traceback) is stored once."""
    logs_dir, db, state = tmp_path / "logs", tmp_path / "c.db", tmp_path / "agent"
    logs_dir.mkdir()
    logs = [logs_dir / f"rank{r}.log" for r in range(3)]
    for p in logs:
        p.touch()
    args = (*QUIET, "--kmsg-enabled", "false", "--job", "train-7",
            "--ranklog", str(logs_dir / "rank{rank}.log"))
    rng = random.Random(4)
    col = CollectorProcess(db)
    agent = AgentProcess(state, col.ingest, *args)
    stop = threading.Event()
    rounds: list[int] = []
    rotated = threading.Event()
    writer = threading.Thread(target=lambda: rounds.append(_write_rank_logs(logs, stop, 12_000, rotated)))
    writer.start()
    try:
        for _ in range(6):
            time.sleep(rng.uniform(0.2, 1.2))
            agent.stop(signal.SIGKILL)
            agent = AgentProcess(state, col.ingest, *args)
        assert rotated.wait(60), "the writer did not reach its rotation"  # a loaded machine writes slower
        time.sleep(0.5)
        stop.set()
        writer.join()
        assert rounds[0] > 12_000  # the rotation happened while the agent ran or restarted
        want = {str(logs[0]): _file_lines(Path(f"{logs[0]}.1"), logs[0]),
                **{str(p): _file_lines(p) for p in logs[1:]}}
        total = sum(map(len, want.values()))
        settle(lambda: sum(map(len, _stored_lines(db, "node-a").values())) >= total, 60,
               "every line")
        assert agent.stop() == 0
        got = _stored_lines(db, "node-a")
        assert set(got) == set(want)
        for path, lines in want.items():
            extra = Counter(got[path]) - Counter(lines)
            assert not extra, f"{path}: {sum(extra.values())} lines stored twice, e.g. {list(extra)[:3]}"
            assert sorted(got[path]) == sorted(lines), path  # and none missing
    finally:
        stop.set()
        writer.join()
        if agent.proc.poll() is None:
            agent.stop(signal.SIGKILL)
        col.stop()


def test_a_token_is_rotated_on_both_daemons_without_a_restart(tmp_path):
    """The README's rotation, done with SIGHUP only: the collector accepts old and new, the
    agent moves to new, the collector drops old and closes the agent's old session; the agent
    reconnects with the new token and every line arrives once. An agent left with the old
    token is refused."""
    col_token, agent_token = tmp_path / "col-token", tmp_path / "agent-token"
    col_token.write_text("old-token\n")
    agent_token.write_text("old-token\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "rank0.log"
    log.touch()
    db = tmp_path / "c.db"
    col = CollectorProcess(db, "--token-file", str(col_token))
    agent = AgentProcess(tmp_path / "agent", col.ingest, *QUIET, "--kmsg-enabled", "false",
                         "--job", "train-7", "--ranklog", str(logs / "rank{rank}.log"),
                         "--token-file", str(agent_token))
    written = 0

    def lines(n: int) -> None:
        nonlocal written
        with open(log, "a") as f:
            f.write("".join(f"[rank0]: rotation step {written + i:04d}\n" for i in range(n)))
        written += n

    def stored() -> list[str]:
        return _stored_lines(db, "node-a").get(str(log), [])
    try:
        lines(50)
        settle(lambda: len(stored()) == written, what="the first lines")
        col_token.write_text("old-token\nnew-token\n")
        col.proc.send_signal(signal.SIGHUP)
        settle(lambda: any("tokens=2 connections_closed=0" in ln for ln in col.lines), what="reload 1")
        agent_token.write_text("new-token\n")
        agent.proc.send_signal(signal.SIGHUP)
        settle(lambda: any("reloaded token_file" in ln for ln in agent.lines), what="agent reload")
        col_token.write_text("new-token\n")
        col.proc.send_signal(signal.SIGHUP)
        settle(lambda: any("tokens=1 connections_closed=1" in ln for ln in col.lines), what="reload 2")
        lines(50)
        settle(lambda: len(stored()) == written, what="the lines after the rotation")
        assert sorted(stored()) == [f"[rank0]: rotation step {i:04d}" for i in range(written)]
        assert agent.proc.poll() is None and col.proc.poll() is None  # neither restarted
        stale = Agent(col.ingest, node="node-b")
        stale.send(Hello(node="node-b", stream="s", token="old-token", agent_ns=1,
                         agent_name="t", agent_version="0"))
        assert stale.expect_error().code == "auth"
        stale.close()
    finally:
        if agent.proc.poll() is None:
            agent.stop(signal.SIGKILL)
        col.stop()


def test_secrets_are_redacted_before_the_spool_and_counted_in_the_report(tmp_path):
    """A rank prints its launch command with a Hugging Face token and an environment dump with
    an AWS key: no byte of either reaches the agent's spool or the collector, the records say
    what was redacted, and the collector's report counts it."""
    hf, aws = "hf_" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1Bc4De7F", "AKIA" + "Z7Q2M4K8P1R5T9W3"
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text(
        f"[rank0]: args: Namespace(local_rank=0, hf_token='{hf}', deepspeed_config='ds.json')\n"
        f"[rank0]: env AWS_ACCESS_KEY_ID={aws} AWS_REGION=us-east-1\n"
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/job/train.py", line 9, in <module>\n'
        f"[rank0]: ValueError: login failed for token={hf}\n")
    db, state = tmp_path / "c.db", tmp_path / "agent"
    col = CollectorProcess(db)
    agent = AgentProcess(state, col.ingest, *QUIET, "--kmsg-enabled", "false", "--job", "train-7",
                         "--ranklog", str(logs / "rank{rank}.log"))
    try:
        settle(lambda: len(_stored_lines(db, "node-a").get(str(logs / "rank0.log"), [])) == 5,
               what="the lines")
        assert agent.stop() == 0
        spooled = b"".join(p.read_bytes() for p in (state / "spool").glob("*.seg"))
        assert spooled and hf.encode() not in spooled and aws.encode() not in spooled
        with SqliteStore(db) as store:
            recs = [r for r in store.records(Selection(nodes=("node-a",))) if r.source == "ranklog"]
        assert not [r for r in recs if hf in r.message or aws in r.message]
        marks = sorted(r.fields.get("redacted") for r in recs if "redacted" in r.fields)
        assert marks == ["aws-access-key-id:1", "hf-token:1", "hf-token:1"], marks  # the traceback too
        with urllib.request.urlopen(f"http://{col.http[0]}:{col.http[1]}/api/jobs/train-7/report",
                                    timeout=30) as r:
            rep = json.loads(r.read())
        assert rep["redaction"]["secrets"] >= 1 and rep["redaction"]["enabled"]
        assert hf not in json.dumps(rep)
    finally:
        if agent.proc.poll() is None:
            agent.stop(signal.SIGKILL)
        col.stop()
