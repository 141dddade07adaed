"""``firstfault demo``: the whole path on this machine in one command, and a real failure.

Starts a collector (SQLite, loopback ports it picks) and an agent on this host
(both as the real daemons, ``firstfault collector`` / ``firstfault agent``; the
agent's READY comes over sd_notify), then runs a small job of ``--ranks``
processes (firstfault/demo_rank.py) with the environment torchrun gives its
workers; their output goes to rank log files the agent follows. One rank fails for
real:

- ``oom`` (as root, with a memory cgroup controller): the victim runs in its own
  memory cgroup with a small limit and is SIGKILLed by the kernel's OOM killer:
  no traceback; the agent's kmsg, cgroup and procs sources are the witnesses;
- ``exception`` (anywhere else): the victim raises, a real Python traceback.

Like torchrun, the launcher stops the other ranks (SIGTERM) once one has died. The
agent is then stopped (SIGTERM: it flushes its spool to the collector) and
``firstfault report JOB`` asks the collector's HTTP API, which prints the report. The
demo then names the collector's page of the job (``http://127.0.0.1:PORT/jobs/JOB``:
swimlanes, memory by phase) and, run from a terminal (or ``--serve yes``), keeps the
collector up until Ctrl-C so it can be opened.
Everything it started is stopped on the way out, even on errors or Ctrl-C; the
work folder (logs, database, spool) is removed unless ``--keep``.

``--notify URL`` (``--notify-type webhook|slack``) gives the collector that target
(collector.toml's ``[[notify.target]]``, docs/NOTICE.md): once the job's first failure is
settled the collector sends its notice there, and the demo shows on stderr the notice it
sent (a second target, a command, keeps a copy in the work folder) and the collector's
log line of the delivery.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
OOM_LIMIT_BYTES = 256 << 20


def say(msg: str) -> None:
    print(f"firstfault demo: {msg}", file=sys.stderr, flush=True)


class Daemon:
    """A firstfault daemon as a subprocess; its stderr goes to a log file and is watched."""

    def __init__(self, name: str, args: list[str], log_path: Path, ready: str,
                 env: dict | None = None) -> None:
        self.name, self.log_path = name, log_path
        self.proc = subprocess.Popen([sys.executable, "-m", "firstfault", *args],
                                     stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})}, start_new_session=True)
        self.found: dict[str, str] = {}
        self._ready_re, self._seen = re.compile(ready), threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with open(self.log_path, "a", encoding="utf-8") as out:
            for line in self.proc.stderr:
                out.write(line)
                out.flush()
                for m in self._ready_re.finditer(line):
                    self.found.update({k: v for k, v in m.groupdict().items() if v})
                if self.found and all(self.found.get(k) for k in self._ready_re.groupindex):
                    self._seen.set()
        self._seen.set()

    def wait_ready(self, timeout: float = 60) -> dict[str, str]:
        if not self._seen.wait(timeout) or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} did not start; its log: {self.log_path}")
        return self.found

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait()


# --- a memory cgroup for the victim ---------------------------------------------------

def make_memcg(name: str, limit: int) -> Path | None:
    """A memory cgroup with ``limit`` bytes and no swap (v1 or v2); None if not possible."""
    v1 = CGROUP / "memory"
    try:
        if v1.is_dir():
            path = v1 / name
            path.mkdir()
            (path / "memory.limit_in_bytes").write_text(str(limit))
            if (path / "memory.memsw.limit_in_bytes").exists():
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
            return path
        if "memory" in (CGROUP / "cgroup.subtree_control").read_text().split():
            path = CGROUP / name
            path.mkdir()
            (path / "memory.max").write_text(str(limit))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
            return path
    except OSError as e:
        say(f"no memory cgroup ({e}); the victim will raise instead")
    return None


def remove_memcg(path: Path) -> None:
    root = path.parent
    for _ in range(50):
        try:
            for pid in (path / "cgroup.procs").read_text().split():
                try:
                    (root / "cgroup.procs").write_text(pid)
                except OSError:
                    pass  # gone meanwhile
            path.rmdir()
            return
        except OSError:
            time.sleep(0.1)
    say(f"could not remove the cgroup {path}")


# --- the job ---------------------------------------------------------------------------

def run_job(workdir: Path, job: str, ranks: int, victim: int, mode: str,
            memcg: Path | None) -> dict[int, int]:
    """Start the ranks, wait for the first to die, SIGTERM the rest; {rank: exit code}."""
    logdir = workdir / "logs" / job
    logdir.mkdir(parents=True)
    port = _free_port()
    procs: dict[int, subprocess.Popen] = {}
    for r in range(ranks):
        env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(ranks),
               "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "TORCHELASTIC_RUN_ID": job, "PYTHONUNBUFFERED": "1"}
        join = _joiner(memcg) if r == victim and memcg is not None else None
        with open(logdir / f"rank{r}.log", "ab") as out:
            procs[r] = subprocess.Popen(
                [sys.executable, "-m", "firstfault.demo_rank", "--victim", str(victim),
                 "--mode", mode], stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=join)
    codes: dict[int, int] = {}
    try:
        while not codes:
            time.sleep(0.05)
            codes = {r: p.returncode for r, p in procs.items() if p.poll() is not None}
        dead = ", ".join(f"rank {r} exit {c}" for r, c in codes.items())
        say(f"{dead}; stopping the other ranks (SIGTERM), as torchrun would")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for r, p in procs.items():
            try:
                codes[r] = p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[r] = p.wait()
    return codes


def _joiner(memcg: Path):
    """A preexec_fn: the child moves itself into ``memcg`` before it execs."""
    def join() -> None:
        (memcg / "cgroup.procs").write_text(str(os.getpid()))
    return join


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _notify_socket(workdir: Path) -> tuple[socket.socket, str]:
    path = str(workdir / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(60)
    return s, path


NOTICE_WAIT_S = 60


def notify_config(workdir: Path, url: str, kind: str, job: str) -> Path:
    """A collector.toml with the demo's notify targets: ``url`` and a copy to notice.json,
    both for the demo's job only (the agent also sees other rank processes of this machine)."""
    only = json.dumps("^" + re.escape(job) + "$")
    copy = [sys.executable, "-c", "import shutil, sys; shutil.copyfileobj(sys.stdin.buffer, "
            f"open({str(workdir / 'notice.json')!r}, 'wb'))"]
    path = workdir / "collector.toml"
    path.write_text("[notify]\n"
                    f"queue_dir = {json.dumps(str(workdir / 'notices'))}\n"
                    "quiet_s = 5\n"
                    "[[notify.target]]\n"
                    'name = "demo"\n'
                    f"type = {json.dumps(kind)}\n"
                    f"url = {json.dumps(url)}\n"
                    f"job = {only}\n"
                    "[[notify.target]]\n"
                    'name = "copy"\n'
                    'type = "command"\n'
                    f"command = {json.dumps(copy)}\n"
                    f"job = {only}\n")
    return path


def show_notice(workdir: Path, log_path: Path) -> bool:
    """Wait for the collector's notice (its copy, its delivery line); show both on stderr."""
    deadline = time.monotonic() + NOTICE_WAIT_S
    copy = workdir / "notice.json"
    line = None
    while time.monotonic() < deadline and (line is None or not copy.exists()):
        lines = log_path.read_text(errors="replace").splitlines()
        line = next((ln for ln in lines if re.search(r"notice (delivered|dropped|delivery failed) target=demo ", ln)),
                    None)
        time.sleep(0.2)
    if line is None or not copy.exists():
        say(f"no notice within {NOTICE_WAIT_S} s; the collector's log: {log_path}")
        return False
    say("the collector's notice, as it sent it:")
    sys.stderr.write(json.dumps(json.loads(copy.read_bytes()), indent=2, ensure_ascii=False) + "\n")
    say("its delivery: " + line.split(" ", 2)[-1])
    return "notice delivered" in line


def demo(workdir: Path, *, ranks: int, mode: str, fmt: str, serve: bool = False, keep: bool = False,
         notify_url: str | None = None, notify_type: str = "webhook") -> int:
    job = f"demo-{uuid.uuid4().hex[:8]}"
    victim = min(2, ranks - 1)
    node = socket.gethostname()
    memcg = make_memcg(f"firstfault-{job}", OOM_LIMIT_BYTES) if mode == "oom" else None
    mode = "oom" if memcg is not None else "exception"
    started: list[Daemon] = []
    notify, notify_path = _notify_socket(workdir)
    try:
        extra = ["--config", str(notify_config(workdir, notify_url, notify_type, job))] if notify_url else []
        col = Daemon("collector", ["collector", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                                   "--db", str(workdir / "firstfault.db"), *extra],
                     workdir / "collector.log",
                     r"(?:ingest listening address=(?P<ingest>\S+))|(?:http listening address=(?P<http>\S+))")
        started.append(col)
        addr = col.wait_ready()
        agent = Daemon("agent", ["agent", "--collector", addr["ingest"], "--node", node,
                                 "--state-dir", str(workdir / "agent"), "--metrics", "",
                                 "--ranklog", str(workdir / "logs" / "{job}" / "rank{rank}.log"),
                                 "--procs-interval-s", "0.25", "--cgroup-interval-s", "1"],
                       workdir / "agent.log", r"agent started (?P<started>node)=",
                       env={"NOTIFY_SOCKET": notify_path})
        started.append(agent)
        agent.wait_ready()
        ready = notify.recv(4096)
        if not ready.startswith(b"READY=1"):
            raise RuntimeError(f"agent said {ready!r} instead of READY=1")
        say(f"collector on {addr['ingest']} (HTTP {addr['http']}), agent on node {node} is READY")
        how = ("OOM-killed by the kernel (memory cgroup limit "
               f"{OOM_LIMIT_BYTES >> 20} MiB)" if mode == "oom" else "raising an exception")
        say(f"job {job}: {ranks} ranks; rank {victim} is about to fail for real, {how}")
        run_job(workdir, job, ranks, victim, mode, memcg)
        time.sleep(1.5)  # the agent's sources see the last lines, the exits, the kernel
        say("stopping the agent (SIGTERM flushes its spool to the collector)")
        if agent.stop() != 0:
            say(f"the agent did not stop cleanly; its log: {workdir / 'agent.log'}")
        report = subprocess.run([sys.executable, "-m", "firstfault", "report", job, "--collector",
                                 f"http://{addr['http']}", "--format", fmt],
                                capture_output=True, text=True)
        sys.stdout.write(report.stdout)
        if report.returncode != 0:
            say(f"report failed: {report.stderr.strip()}")
            return report.returncode
        if notify_url and not show_notice(workdir, workdir / "collector.log"):
            return 1
        url = f"http://{addr['http']}/jobs/{job}"
        if keep:
            subprocess.run([sys.executable, "-m", "firstfault", "report", job, "--collector", f"http://{addr['http']}",
                            "--format", "html", "--output", str(workdir / "report.html")], check=False)
            say(f"the report page, to open with no collector: {workdir / 'report.html'}")
        if not serve:
            say(f"the report page was {url} while the demo ran: `firstfault demo --serve yes` keeps it open")
            return 0
        say(f"the report page, rank {victim} on the timeline: {url}  (jobs: http://{addr['http']}/, paste a log: "
            f"http://{addr['http']}/paste); Ctrl-C stops the demo")
        try:
            while col.proc.poll() is None:
                time.sleep(0.5)
            say("the collector stopped")
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        for d in reversed(started):
            d.stop()
        notify.close()
        if memcg is not None:
            remove_memcg(memcg)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="firstfault demo", description=(
        "The whole path on this machine in one command: a collector and an agent (the real daemons), a "
        "small job whose rank fails for real (the kernel's OOM killer as root, else an exception), and "
        "the report from the collector."))
    p.add_argument("--ranks", type=int, default=4, help="ranks of the demo job (default 4)")
    p.add_argument("--mode", choices=("auto", "oom", "exception"), default="auto",
                   help="how the victim fails; auto: oom as root, else exception")
    p.add_argument("--format", choices=("text", "md", "json"), default="text")
    p.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (logs, database, spool, report.html)")
    p.add_argument("--serve", choices=("auto", "yes", "no"), default="auto", nargs="?", const="yes",
                   help="keep the collector and its report page up until Ctrl-C (auto: when run from a "
                   "terminal; --serve alone: yes)")
    p.add_argument("--notify", metavar="URL", help="the collector sends the failed job's notice to URL "
                   "(a webhook receiving JSON, or Slack's incoming webhook with --notify-type slack)")
    p.add_argument("--notify-type", choices=("webhook", "slack"), default="webhook")
    a = p.parse_args(argv)
    if a.notify and not re.match(r"https?://[^/\s]+", a.notify):
        p.error("--notify: expected an http:// or https:// URL")
    if a.ranks < 2:
        p.error("--ranks must be at least 2")
    mode = a.mode if a.mode != "auto" else ("oom" if os.geteuid() == 0 else "exception")
    workdir = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="firstfault-demo-"))
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"firstfault demo: cannot make the work folder {workdir}: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        serve = a.serve == "yes" or (a.serve == "auto" and sys.stdin.isatty() and sys.stderr.isatty())
        return demo(workdir.resolve(), ranks=a.ranks, mode=mode, fmt=a.format, serve=serve, keep=bool(a.keep),
                    notify_url=a.notify, notify_type=a.notify_type)
    except KeyboardInterrupt:
        return 130
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
