"""The fault-injection harness: the real daemons, real faults, every written line counted.

Used by tests/faults/test_faults.py (a short schedule, in CI) and bench/faults.py (the long
run whose figures are in bench/RESULTS.md). Needs root: a network namespace, a veth pair
and a tmpfs; a C compiler for the clock library (clockstep.c).

    writers ──▶ logs/rank{0..7}.log ──▶ agent (netns ff-*, state on a small tmpfs,
                                               wall clock steppable) ══veth══▶ collector (SQLite)

Eight writers (one thread) append numbered lines, and now and then a numbered Python
traceback, to eight rank logs at a steady rate. ``Rig.run(plan)`` injects the faults of
a seeded plan (``plan()``) one at a time: each waits, happens, ends, and the time until
a line written after its end is stored at the collector is its recovery time. Then the
writers stop, the agent drains and stops, and ``Rig.count()`` compares every line
written with every line stored, per rank log: lost and duplicated lines, and which of
them an explicit gap record accounts for (``Counts``).

Faults (``KINDS``):
    agent_kill          kill -9 the agent; restart it after 0-3 s
    collector_kill      kill -9 the collector; restart it on its port after 0-5 s
    link_cut            the veth link down for 1-15 s, then up again
    half_open           link down, kill -9 the collector (or, every other time, the agent),
                        restart it, link up: the survivor's connection is half-open (its
                        peer vanished without a FIN or RST)
    disk_full           link down (the spool grows), the spool's tmpfs filled to its last
                        64 KiB for 2-6 s, then freed, link up
    clock_step          the agent's wall clock stepped by -3600..+3600 s (held, not undone)
    rotate_rename       a storm of 3-12 rotations by rename (logrotate ``create``) on random
                        ranks, 50-300 ms apart
    rotate_copytruncate the same by copy then truncate (logrotate ``copytruncate``)
    rotate_delete       the same by delete and recreate
    rotate_while_down   kill -9 the agent, rotate 1-3 ranks by any of the three, restart it
                        (what was deleted unread is gone from disk: an explicit gap)

A lost line is in an explicit gap when a gap record of the agent names it: an
``agent.gap`` of the spool (disk full) counts the lines it lost per rank log in its
``origins`` field, a ``rank.gap`` (``lost``, ``truncated``) names the file (path, inode)
and the byte offset after which its lines are gone. A duplicate is in an explicit gap
when a ``rank.gap`` ``state_reset`` says the rank log's positions were forgotten.

Every loop here is bounded in count and time; only loopback and the namespace's own
addresses are ever connected to.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NODE, JOB = "fault-node", "faults"
KINDS = ("agent_kill", "collector_kill", "link_cut", "half_open", "disk_full", "clock_step",
         "rotate_rename", "rotate_copytruncate", "rotate_delete", "rotate_while_down")
ROTATIONS = ("rename", "copytruncate", "delete")
LINE = re.compile(r"^\[rank(\d+)\]: ")
STEP = re.compile(r"^\[rank0\]: ff-fault step (\d+) ")


def cannot_run() -> str | None:
    """Why this machine cannot run the harness (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespace, veth, tmpfs)"
    for tool in ("ip", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"needs the {tool} command"
    if shutil.which("cc") is None:
        return "needs a C compiler (cc) for tests/faults/clockstep.c"
    probe = f"ffprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode:
        return f"cannot make a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip() or r.returncode}")
    return r


# --- the environment: a namespace, a small disk, a steppable clock ---------------------

class NetNS:
    """A network namespace joined to the host by a veth pair (a /30 of 10.213.0.0/16)."""

    def __init__(self, tag: str) -> None:
        self.name, self.host_if, self.ns_if = f"ff-{tag}", f"ffh{tag}"[:15], f"ffa{tag}"[:15]
        used = _sh("ip", "-o", "-4", "addr").stdout
        n = int(tag) % 16384
        while f"10.213.{n // 64 % 256}.{n % 64 * 4 + 1}/" in used:
            n += 1
        net = f"10.213.{n // 64 % 256}"
        self.host_ip, self.ns_ip = f"{net}.{n % 64 * 4 + 1}", f"{net}.{n % 64 * 4 + 2}"
        _sh("ip", "netns", "add", self.name)
        try:
            _sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _sh("ip", "link", "set", self.ns_if, "netns", self.name)
            _sh("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _sh("ip", "link", "set", self.host_if, "up")
            for cmd in (("addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if),
                        ("link", "set", self.ns_if, "up"), ("link", "set", "lo", "up")):
                _sh("ip", "netns", "exec", self.name, "ip", *cmd)
        except BaseException:
            self.close()
            raise

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        _sh("ip", "link", "set", self.host_if, "down")

    def restore(self) -> None:
        _sh("ip", "link", "set", self.host_if, "up")

    def close(self) -> None:
        _sh("ip", "netns", "del", self.name, check=False)
        _sh("ip", "link", "del", self.host_if, check=False)


class SmallDisk:
    """A tmpfs of ``size`` bytes at ``path``; ``fill()`` leaves only ``left`` bytes free."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        _sh("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))
        self.filler = path / "filler"

    def fill(self, left: int = 64 << 10) -> None:
        st = os.statvfs(self.path)
        free = st.f_bavail * st.f_frsize - left
        with open(self.filler, "ab") as f:
            chunk = b"\0" * (1 << 20)
            while free > 0:
                try:
                    free -= f.write(chunk[:min(free, len(chunk))])
                except OSError:
                    break

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        _sh("umount", "-l", str(self.path), check=False)


class WallClock:
    """The agent's wall clock offset: clockstep.c, preloaded, reads it from ``offset_file``."""

    def __init__(self, work: Path) -> None:
        self.lib, self.offset_file = work / "libclockstep.so", work / "clock-offset"
        _sh("cc", "-shared", "-fPIC", "-O2", "-o", str(self.lib),
            str(Path(__file__).with_name("clockstep.c")), "-ldl")
        self.offset_file.write_bytes(struct.pack("=q", 0))
        self.offset_ns = 0

    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": str(self.lib), "FF_CLOCK_OFFSET_FILE": str(self.offset_file)}

    def step(self, seconds: float) -> None:
        self.offset_ns += int(seconds * 1e9)
        fd = os.open(self.offset_file, os.O_WRONLY)
        try:
            os.pwrite(fd, struct.pack("=q", self.offset_ns), 0)
        finally:
            os.close(fd)


# --- the daemons ------------------------------------------------------------------------

class Daemon:
    """A firstfault daemon as a subprocess, its stderr appended to ``log``."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.argv, self.log, self.env = argv, log, {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        with open(self.log, "a") as out:
            out.write(f"--- start {self.starts} at {time.time():.3f}\n")
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT)
        self.starts += 1

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 60) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 40) -> str:
        try:
            return "".join(self.log.read_text(errors="replace").splitlines(True)[-n:])
        except OSError:
            return ""


def wait_port(host: str, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), 0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout} s")


# --- the writers ------------------------------------------------------------------------

@dataclass
class Written:
    text: str
    ino: int
    offset: int


class RankWriters(threading.Thread):
    """``ranks`` rank logs, ``rate`` lines/s each, a 4-line traceback every ``tb_every``
    lines; rotations requested with ``rotate()`` happen in this thread between writes."""

    TICK_S = 0.02

    def __init__(self, logs: Path, ranks: int = 8, rate: float = 100.0, tb_every: int = 500) -> None:
        super().__init__(name="ff-writers", daemon=True)
        self.logs, self.rate, self.tb_every = logs, rate, tb_every
        self.paths = [logs / f"rank{r}.log" for r in range(ranks)]
        self.written: list[list[Written]] = [[] for _ in range(ranks)]
        self.steps = [0] * ranks
        self.rotations: Counter[str] = Counter()
        self.requests: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self._names = 0
        for p in self.paths:
            p.touch()

    def next_step(self, rank: int) -> int:
        with self.lock:
            return self.steps[rank]

    def rotate(self, kind: str, rank: int) -> None:
        """Rotate rank's log by ``kind`` (rename, copytruncate, delete); returns once done."""
        done = threading.Event()
        self.requests.put((kind, rank, done))
        if not done.wait(10):
            raise TimeoutError("the writers did not rotate within 10 s")

    def run(self) -> None:
        owed, t = 0.0, time.monotonic()
        while not self.stopping.is_set():
            owed += self.rate * self.TICK_S
            n, owed = int(owed), owed - int(owed)
            for r in range(len(self.paths)):
                self._append(r, n)
            while True:
                try:
                    kind, rank, done = self.requests.get_nowait()
                except queue.Empty:
                    break
                self._rotate(kind, rank)
                done.set()
            t += self.TICK_S
            self.stopping.wait(max(0.0, t - time.monotonic()))

    def _append(self, r: int, n: int) -> None:
        texts = []
        with self.lock:
            for _ in range(n):
                s = self.steps[r]
                self.steps[r] += 1
                texts.append(f"[rank{r}]: ff-fault step {s:07d} loss 2.{s % 97:02d} lr 1e-4")
                if s % self.tb_every == self.tb_every - 1:
                    texts += [f"[rank{r}]: Traceback (most recent call last):",
                              f'[rank{r}]:   File "/job/train.py", line {s}, in <module>',
                              f"[rank{r}]:     step(batch)",
                              f"[rank{r}]: ValueError: ff-fault bad batch {s:07d}"]
        if not texts:
            return
        with open(self.paths[r], "ab") as f:
            ino, off = os.fstat(f.fileno()).st_ino, f.tell()
            data = "".join(t + "\n" for t in texts).encode()
            f.write(data)
        for t in texts:
            self.written[r].append(Written(t, ino, off))
            off += len(t.encode()) + 1

    def _rotate(self, kind: str, r: int) -> None:
        p = self.paths[r]
        self._names += 1
        rotated = p.with_name(f"{p.name}.{self._names}")
        if kind == "rename":
            os.rename(p, rotated)
        elif kind == "copytruncate":
            shutil.copyfile(p, rotated)
            os.truncate(p, 0)
        elif kind == "delete":
            p.unlink()
        else:
            raise ValueError(kind)
        self.rotations[kind] += 1


# --- what the collector has ---------------------------------------------------------------

class Probe:
    """Reads the collector's SQLite file (read-only) while it runs: the newest rank-0 step."""

    def __init__(self, db: Path) -> None:
        self.db = db

    def newest_step(self) -> int:
        from firstfault.collector.store.blocks import MESSAGE, unpack
        try:
            con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=1)
        except sqlite3.Error:
            return -1
        try:
            rows = con.execute("SELECT data FROM blocks ORDER BY bid DESC LIMIT 6").fetchall()
        except sqlite3.Error:
            return -1
        finally:
            con.close()
        best = -1
        for (data,) in rows:
            for msg in unpack(data)[MESSAGE]:
                m = STEP.match(msg)
                if m:
                    best = max(best, int(m[1]))
        return best

    def wait_for(self, step: int, timeout: float) -> float | None:
        """Seconds until a rank-0 line of at least ``step`` is stored (None: not in time)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.newest_step() >= step:
                return time.monotonic() - t0
            time.sleep(0.1)
        return None


# --- the plan -------------------------------------------------------------------------------

@dataclass
class Fault:
    kind: str
    wait_s: float  # before it
    hold_s: float = 0.0  # how long it lasts (down, full, dead)
    amount: float = 0.0  # clock step seconds; rotations in a storm
    ranks: tuple[int, ...] = ()
    recovery_s: float | None = None
    detail: str = ""


def plan(seed: int, n: int, ranks: int = 8) -> list[Fault]:
    """``n`` faults (every kind at least once when n >= len(KINDS)), seeded."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    kinds = kinds[:n] + [rng.choice(KINDS) for _ in range(n - len(kinds))]
    out = []
    for k in kinds:
        f = Fault(k, wait_s=rng.uniform(0.5, 3.0))
        if k == "agent_kill":
            f.hold_s = rng.uniform(0, 3)
        elif k in ("collector_kill", "half_open"):
            f.hold_s = rng.uniform(0, 5)
            f.amount = rng.randint(0, 1)  # half_open: 0 the collector vanishes, 1 the agent
        elif k == "link_cut":
            f.hold_s = rng.uniform(1, 15)
        elif k == "disk_full":
            f.hold_s = rng.uniform(2, 6)
        elif k == "clock_step":
            f.amount = rng.choice((-1, 1)) * rng.uniform(30, 3600)
        elif k == "rotate_while_down":
            f.ranks = tuple(rng.sample(range(ranks), rng.randint(1, 3)))
            f.detail = ",".join(rng.choice(ROTATIONS) for _ in f.ranks)
            f.hold_s = rng.uniform(0.5, 3)
        else:
            f.amount = rng.randint(3, 12)
            f.ranks = tuple(rng.randrange(ranks) for _ in range(int(f.amount)))
            f.hold_s = rng.uniform(0.05, 0.3)  # between rotations
        out.append(f)
    return out


# --- the rig -----------------------------------------------------------------------------------

@dataclass
class Counts:
    written: int = 0
    stored: int = 0
    lost: int = 0
    lost_in_gaps: int = 0
    duplicated: int = 0
    duplicated_in_gaps: int = 0
    gaps: Counter = field(default_factory=Counter)  # (kind, reason) -> records
    gap_lines_declared: int = 0  # lines the spool's gaps say they lost
    gap_lines_overclaimed: int = 0  # lines a spool gap names as lost that were stored (or never written)
    examples: list[str] = field(default_factory=list)

    @property
    def lost_outside(self) -> int:
        return self.lost - self.lost_in_gaps

    @property
    def duplicated_outside(self) -> int:
        return self.duplicated - self.duplicated_in_gaps


class Rig:
    """The whole setup; a context manager that leaves nothing behind."""

    def __init__(self, work: Path, *, rate: float = 100.0, ranks: int = 8, disk_bytes: int = 32 << 20) -> None:
        self.work = work
        names = _sh("ip", "netns", "list").stdout
        self.tag = next(t for t in (f"{random.randrange(10000):04d}" for _ in range(100))
                        if f"ff-{t}" not in names)
        self.logs, self.db = work / "logs", work / "collector.db"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._closers: list = []
        self.rate, self.ranks, self.disk_bytes = rate, ranks, disk_bytes
        self.faults: list[Fault] = []

    def __enter__(self) -> Rig:
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _setup(self) -> None:
        work = self.work
        self.ns = NetNS(self.tag)
        self._closers.append(self.ns.close)
        self.disk = SmallDisk(work / "agent-disk", self.disk_bytes)
        self._closers.append(self.disk.close)
        self.clock = WallClock(work)
        token = work / "token"
        token.write_text(f"ff-fault-{random.getrandbits(64):016x}\n")
        token.chmod(0o600)
        with socket.socket() as s:
            s.bind((self.ns.host_ip, 0))
            self.port = s.getsockname()[1]
        py = [sys.executable, "-m", "firstfault"]
        self.collector = Daemon(py + [
            "collector", "--listen", f"{self.ns.host_ip}:{self.port}", "--http", "127.0.0.1:0",
            "--db", str(self.db), "--token-file", str(token), "--log-level", "info",
            "--limits-read-timeout-s", "30"], work / "collector.log")
        self.agent = Daemon(self.ns.prefix() + py + [
            "agent", "--collector", f"{self.ns.host_ip}:{self.port}", "--token-file", str(token),
            "--node", NODE, "--job", JOB, "--state-dir", str(self.disk.path / "agent"),
            "--ranklog", str(self.logs / "rank{rank}.log"), "--metrics", "",
            "--spool-max-bytes", str(8 << 20), "--log-level", "info",
            "--kmsg-enabled", "false", "--procs-enabled", "false", "--cgroup-enabled", "false",
            "--nvml-enabled", "false", "--marks-enabled", "false"],
            work / "agent.log", env=self.clock.env())
        self._closers.append(self.agent.kill9)
        self._closers.append(self.collector.kill9)
        self.writers = RankWriters(self.logs, self.ranks, self.rate)
        self._closers.append(self._stop_writers)
        self.probe = Probe(self.db)

    def close(self) -> None:
        while self._closers:
            try:
                self._closers.pop()()
            except Exception as e:  # noqa: BLE001 - clean up the rest
                print(f"cleanup failed: {e}", file=sys.stderr)

    def _stop_writers(self) -> None:
        self.writers.stopping.set()
        if self.writers.is_alive():
            self.writers.join(10)

    def start_collector(self) -> None:
        self.collector.start()
        wait_port(self.ns.host_ip, self.port)

    # -- running ---------------------------------------------------------------------------

    def run(self, faults: list[Fault], *, warmup_s: float = 3.0, recover_timeout_s: float = 90.0,
            log=print) -> None:
        """Start everything, inject ``faults`` one after another, stop the writers, drain."""
        self.start_collector()
        self.agent.start()
        self.writers.start()
        self.t_start = time.monotonic()
        time.sleep(warmup_s)
        for i, f in enumerate(faults):
            time.sleep(f.wait_s)
            self._inject(f)
            step = self.writers.next_step(0)
            f.recovery_s = self.probe.wait_for(step, recover_timeout_s)
            self.faults.append(f)
            log(f"fault {i + 1}/{len(faults)} {f.kind} hold={f.hold_s:.2f} amount={f.amount:g} "
                f"{f.detail} recovered_in={'%.2f s' % f.recovery_s if f.recovery_s is not None else 'NO'}")
        self.writers.stopping.set()
        self.writers.join(10)
        self.t_writing = time.monotonic() - self.t_start
        last = self.writers.next_step(0) - 1
        self.drain_s = self.probe.wait_for(last, recover_timeout_s)
        time.sleep(2.0)  # tracebacks are shipped a second after their last line
        self.agent_exit = self.agent.stop()
        self.collector_exit = self.collector.stop()

    def _inject(self, f: Fault) -> None:
        k = f.kind
        if k == "agent_kill":
            self.agent.kill9()
            time.sleep(f.hold_s)
            self.agent.start()
        elif k == "collector_kill":
            self.collector.kill9()
            time.sleep(f.hold_s)
            self.start_collector()
        elif k == "link_cut":
            self.ns.cut()
            time.sleep(f.hold_s)
            self.ns.restore()
        elif k == "half_open":
            self.ns.cut()
            time.sleep(0.5)
            gone = self.agent if f.amount else self.collector
            gone.kill9()
            time.sleep(f.hold_s)
            if gone is self.agent:
                self.agent.start()
            else:
                self.start_collector()
            self.ns.restore()
            f.detail = "agent vanished" if f.amount else "collector vanished"
        elif k == "disk_full":
            self.ns.cut()
            time.sleep(0.5)
            self.disk.fill()
            time.sleep(f.hold_s)
            self.disk.free()
            self.ns.restore()
        elif k == "clock_step":
            self.clock.step(f.amount)
        elif k == "rotate_while_down":
            self.agent.kill9()
            for r, how in zip(f.ranks, f.detail.split(",")):
                self.writers.rotate(how, r)
            time.sleep(f.hold_s)
            self.agent.start()
            f.detail = f"ranks={','.join(map(str, f.ranks))} by {f.detail}"
        else:
            how = k.removeprefix("rotate_")
            for r in f.ranks:
                self.writers.rotate(how, r)
                time.sleep(f.hold_s)
            f.detail = f"ranks={','.join(map(str, f.ranks))}"

    # -- counting --------------------------------------------------------------------------

    def count(self) -> Counts:
        from firstfault.collector.store.base import Selection
        from firstfault.collector.store.sqlite import SqliteStore

        got: list[Counter] = [Counter() for _ in range(self.ranks)]
        c = Counts()
        spool_origins: Counter = Counter()  # path -> lines a spool gap says it lost
        file_gaps: dict[int, list[tuple[int, int]]] = {}  # rank -> [(ino, offset)]
        resets: set[int] = set()
        with SqliteStore(self.db) as store:
            for r in store.records(Selection(nodes=(NODE,))):
                if r.kind in ("agent.gap", "rank.gap", "kernel.gap"):
                    c.gaps[(r.kind, r.fields.get("reason"))] += 1
                if r.kind == "agent.gap":
                    origins = json.loads(r.fields.get("origins") or "{}")
                    spool_origins.update(origins)
                    c.gap_lines_declared += r.fields.get("dropped_records") or 0
                elif r.kind == "rank.gap":
                    rank = self._rank_of(r.fields.get("path"))
                    if r.fields.get("reason") == "state_reset" or rank is None:
                        resets.update(range(self.ranks) if rank is None else (rank,))
                    else:
                        file_gaps.setdefault(rank, []).append(
                            (r.fields.get("ino", -1), r.fields.get("offset") or 0))
                if r.source != "ranklog" or r.kind not in ("rank.line", "rank.traceback"):
                    continue
                rank = self._rank_of(r.fields.get("path"))
                for ln in r.message.split("\n"):
                    got[rank if rank is not None else 0][ln] += 1
        for rank in range(self.ranks):
            written = self.writers.written[rank]
            want = Counter(w.text for w in written)
            c.written += len(written)
            c.stored += sum(got[rank].values())
            lost, dup = want - got[rank], got[rank] - want
            n_lost, n_dup = sum(lost.values()), sum(dup.values())
            c.lost += n_lost
            c.duplicated += n_dup
            if rank in resets:
                c.duplicated_in_gaps += n_dup
            explained = 0
            budget = spool_origins.get(str(self.writers.paths[rank]), 0)
            if n_lost:
                for w in written:
                    if lost.get(w.text, 0) <= 0:
                        continue
                    lost[w.text] -= 1
                    if any(ino in (w.ino, -1) and w.offset >= off for ino, off in file_gaps.get(rank, ())):
                        explained += 1
                    elif budget > 0:
                        budget -= 1
                        explained += 1
                    elif len(c.examples) < 10:
                        c.examples.append(f"lost: {w.text} (ino {w.ino} offset {w.offset})")
            c.lost_in_gaps += explained
            c.gap_lines_overclaimed += budget  # what the spool's gaps named for this log and no lost line used
            for text in list(dup)[:3]:
                if len(c.examples) < 10 and rank not in resets:
                    c.examples.append(f"duplicated x{dup[text] + 1}: {text}")
        return c

    def _rank_of(self, path) -> int | None:
        if not isinstance(path, str):
            return None
        m = re.search(r"rank(\d+)\.log$", path)
        return int(m[1]) if m else None


def summary(rig: Rig, c: Counts) -> dict:
    """The figures of a run, as bench/faults.py prints them."""
    by_kind: dict[str, list[float | None]] = {}
    for f in rig.faults:
        by_kind.setdefault(f.kind, []).append(f.recovery_s)
    rec = {k: {"n": len(v), "recovered": sum(x is not None for x in v),
               "median_s": round(statistics.median([x for x in v if x is not None]), 2)
               if any(x is not None for x in v) else None,
               "max_s": round(max((x for x in v if x is not None), default=0), 2)}
           for k, v in sorted(by_kind.items())}
    return {"lines_written": c.written, "lines_stored": c.stored, "seconds": round(rig.t_writing, 1),
            "faults": sum(len(v) for v in by_kind.values()), "by_kind": rec,
            "rotations": dict(rig.writers.rotations),
            "lost": c.lost, "lost_in_gaps": c.lost_in_gaps, "lost_outside_gaps": c.lost_outside,
            "duplicated": c.duplicated, "duplicated_outside_gaps": c.duplicated_outside,
            "gap_records": {f"{k}/{r}": n for (k, r), n in sorted(c.gaps.items(), key=str)},
            "gap_lines_declared": c.gap_lines_declared,
            "gap_lines_overclaimed": c.gap_lines_overclaimed,
            "drain_s": None if rig.drain_s is None else round(rig.drain_s, 2),
            "agent_starts": rig.agent.starts, "collector_starts": rig.collector.starts,
            "examples": c.examples}
