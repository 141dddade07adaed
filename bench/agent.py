"""Benchmark: ``firstfault agent`` as a real process, end to end, beside rsyslog.

The agent runs as ``python -m firstfault agent`` pinned to core 0 (``taskset``);
this process (the writer, the sinks, the proxy) runs on core 1. Every line is a
~150-byte DeepSpeed-style line ending in ``t_ns=<write time>``, appended to one of
FILES rank logs (``logs/rank{rank}.log``; ``--files 8,64,256`` runs each count in
every round) by the writer just after it took the stamp.
CPU is the child's utime + stime from /proc/PID/stat (every thread), RSS its
VmRSS / VmHWM from /proc/PID/status.

  throughput  the agent (ranklog only) waits on 8 empty files; the writer appends
              LINES lines as fast as it can (1 MiB writes); the figure is the time
              and agent CPU until the sink acked the last line. Sink: ``AckSink``, a
              minimal loopback collector that speaks the wire (hello -> welcome,
              batch -> ack at once) and stores nothing, so the agent is the limit
              (the real collector stores ~50k records/s, bench/RESULTS.md).
  steady      RATE lines/s over the 8 files for SECONDS, sources ranklog + procs +
              cgroup (interval 1 s; the writer process carries RANK/WORLD_SIZE, so
              procs finds it and cgroup samples its cgroup at 1 Hz); nvml has no GPU
              here (the agent skips it), kmsg off. Shipped to a real ``firstfault
              collector`` (SQLite) through ``AckSink`` as a proxy that forwards both
              ways and notes, per batch, each line's write stamp and the time the
              collector's ack covering it came back: write -> acked latency; also
              write -> read (the record's observed_ns) and write -> batch at the proxy.
              The writer writes each file every WRITE_MS (2: ~4,000 writes/s).
  backlog     the collector away while LINES lines are written; then it comes up and
              the agent sends its spool: time to drain and the agent's RSS meanwhile.
  idle        no writes for IDLE seconds (all sources of "steady" on).
  rsyslog     the same throughput and steady phases for a private rsyslogd (Debian's
              rsyslog 8, imfile inotify on the same 8 files, omfwd TCP to a line sink
              here; latency = write -> line received by the sink, no acks in omfwd).

    python3 bench/agent.py [--lines 1000000] [--rate 10000] [--seconds 30]
        [--idle 20] [--fsync-interval-ms 20] [--write-ms 2] [--no-samplers]
        [--phases throughput,steady,backlog] [--no-rsyslog] [--read-gap-s S]
        [--base DIR (also the agent of another checkout: before/after)] [--repeat N]
        [--files 8[,64,256]]

``--repeat N`` runs every phase for every shipper N times, in turn (the order rotates
each round so the machine's noise hits all alike), and prints the medians, and the
ratio of each agent's CPU to rsyslog's in the same round (median, min..max): the
anchor, since the machine's load moves the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from firstfault import wire  # noqa: E402

FILES = [8]  # files followed in the current run (--files)
GAP: list[float | None] = [None]  # --read-gap-s
NO_REDACT = [False]  # --no-redact
TICK = os.sysconf("SC_CLK_TCK")
LINE = ("[2026-12-02 10:{m:02d}:{s:02d},{ms:03d}] [INFO] [logging.py:96:log_dist] [Rank {r}] "
        "step={i}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)] t_ns={t}\n")


def line(rank: int, i: int, t_ns: int) -> str:
    return LINE.format(m=i // 60000 % 60, s=i // 1000 % 60, ms=i % 1000, r=rank, i=i, t=t_ns)


def stamp(message: str) -> int:
    return int(message.rsplit("t_ns=", 1)[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid: int, part: slice = slice(11, 13)) -> float:
    """utime + stime of ``pid`` (all its threads), seconds; ``part`` 11:12 utime only."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return sum(map(int, parts[part])) / TICK


def thread_cpu_s(pid: int) -> dict[str, float]:
    """utime + stime of each named thread of ``pid`` (the agent names them: ff-ranklog,
    ff-shipper, ff-spool-flush, ...), summed by name; the main thread as ``main``."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except FileNotFoundError:  # ended meanwhile
            continue
        name = "main" if tid == str(pid) else head.split("(", 1)[1]
        out[name] = out.get(name, 0.0) + sum(map(int, rest.split()[11:13])) / TICK
    return out


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in KiB."""
    got = {}
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith(("VmRSS:", "VmHWM:")):
                got[ln[:5]] = int(ln.split()[1])
    return got["VmRSS"], got["VmHWM"]


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else float("nan")


# --- the sinks -------------------------------------------------------------------

class AckSink:
    """A loopback collector endpoint. Without ``upstream``: welcome, then ack every
    batch at once, store nothing. With it: a proxy to the real collector that
    forwards both ways. Either way, per batch: (last seq, write stamps) and, when an
    ack covers it, (ack time - stamp) into ``latencies_ms`` (if ``stamps``)."""

    def __init__(self, upstream: tuple[str, int] | None = None) -> None:
        self.upstream, self.port = upstream, free_port()
        self.acked, self.records, self.lines = 0, 0, 0
        self.connected_at: float | None = None
        self.latencies_ms: list[float] = []
        self.read_ms: list[float] = []  # write -> the agent read it (its observed_ns)
        self.sent_ms: list[float] = []  # write -> the batch reached the sink
        self._inflight: list[tuple[int, list[int]]] = []
        self._loop = asyncio.new_event_loop()
        self._server = None
        threading.Thread(target=self._loop.run_forever, daemon=True).start()

    def start(self) -> AckSink:
        async def up():
            self._server = await asyncio.start_server(self._conn, "127.0.0.1", self.port)
        asyncio.run_coroutine_threadsafe(up(), self._loop).result()
        return self

    def stop(self) -> None:
        async def down():
            self._server.close()
            for t in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                t.cancel()
        asyncio.run_coroutine_threadsafe(down(), self._loop).result()

    async def _frames(self, reader):
        while True:
            head = await reader.readexactly(4)
            body = await reader.readexactly(int.from_bytes(head, "big"))
            yield head + body, msgpack.unpackb(body, raw=False)

    def _batch(self, m: dict) -> None:
        count, seq = m["count"], m["seq"]
        last = seq + count - 1 if type(seq) is int else seq[-1]
        self.records += count
        msgs = m["cols"]["message"]
        ts = [stamp(x) for x in msgs if "t_ns=" in x]
        now = time.time_ns()
        self.read_ms += [(o - stamp(x)) / 1e6 for x, o in zip(msgs, m["cols"]["observed_ns"])
                         if "t_ns=" in x]
        self.sent_ms += [(now - t) / 1e6 for t in ts]
        self._inflight.append((last, ts))

    def _ack(self, seq: int) -> None:
        now = time.time_ns()
        self.acked = max(self.acked, seq)
        while self._inflight and self._inflight[0][0] <= seq:
            ts = self._inflight.pop(0)[1]
            self.lines += len(ts)
            self.latencies_ms += [(now - t) / 1e6 for t in ts]

    async def _conn(self, reader, writer) -> None:
        self.connected_at = self.connected_at or time.monotonic()
        try:
            if self.upstream is None:
                async for raw, m in self._frames(reader):
                    if m["type"] == "hello":
                        writer.write(wire.encode_message(wire.Welcome(
                            version=wire.PROTOCOL_VERSION, high_seq=None,
                            collector_ns=time.time_ns(),
                            max_frame_bytes=wire.MAX_FRAME_BYTES,
                            max_batch_records=wire.MAX_BATCH_RECORDS)))
                    elif m["type"] == "batch":
                        self._batch(m)
                        writer.write(wire.encode_message(wire.Ack(seq=self._inflight[-1][0])))
                        self._ack(self._inflight[-1][0])
                return
            ur, uw = await asyncio.open_connection(*self.upstream)
            await asyncio.gather(self._pump(reader, uw, up=True), self._pump(ur, writer, up=False))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _pump(self, reader, writer, up: bool) -> None:
        try:
            async for raw, m in self._frames(reader):
                if up and m["type"] == "batch":
                    self._batch(m)
                elif not up and m["type"] == "ack":
                    self._ack(m["seq"])
                elif not up and m["type"] == "welcome" and m.get("high_seq") is not None:
                    self._ack(m["high_seq"])
                writer.write(raw)
        finally:
            writer.close()


class LineSink:
    """rsyslog's omfwd target: counts LF-framed lines, notes write -> receipt latency."""

    def __init__(self) -> None:
        self.port, self.lines = free_port(), 0
        self.latencies_ms: list[float] = []
        self._srv = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            c, _ = self._srv.accept()
            threading.Thread(target=self._read, args=(c,), daemon=True).start()

    def _read(self, c: socket.socket) -> None:
        rest = b""
        while data := c.recv(1 << 20):
            now = time.time_ns()
            chunk = rest + data
            cut = chunk.rfind(b"\n") + 1
            rest, done = chunk[cut:], chunk[:cut]
            n = done.count(b"\n")
            self.lines += n
            self.latencies_ms += [(now - int(x.rsplit(b"t_ns=", 1)[1])) / 1e6
                                  for x in done.split(b"\n")[:n] if b"t_ns=" in x]


# --- the shippers under test ---------------------------------------------------

class Shipper:
    """A pinned child process: agent or rsyslogd."""

    def __init__(self, argv: list[str], cpu: int, env: dict | None = None, cwd: str = ROOT) -> None:
        self.proc = subprocess.Popen(["taskset", "-c", str(cpu), *argv], cwd=cwd,
                                     env={**os.environ, **(env or {})}, stderr=subprocess.PIPE,
                                     text=True)
        self.err: list[str] = []
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True).start()

    @property
    def pid(self) -> int:
        if self.proc.poll() is not None:
            raise SystemExit(f"{self.proc.args[3]} exited {self.proc.returncode}:\n"
                             + "".join(self.err[-20:]))
        return self.proc.pid

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_agent(work: str, port: int, cpu: int, fsync_ms: int, samplers: bool,
                tree: str = ROOT) -> Shipper:
    """The agent of the checkout ``tree`` (another one than this: a before/after run)."""
    off = ["--kmsg-enabled", "false"]
    extra = ["--ranklog-read-gap-s", str(GAP[0])] if GAP[0] is not None and tree == ROOT else []
    if NO_REDACT[0] and tree == ROOT:
        extra += ["--redact-enabled", "false"]
    if samplers:
        off += ["--cgroup-interval-s", "1"]
    else:
        off += ["--procs-enabled", "false", "--cgroup-enabled", "false"]
    a = Shipper([sys.executable, "-m", "firstfault", "agent", "--collector", f"127.0.0.1:{port}",
                 "--state-dir", os.path.join(work, "state"), "--node", "bench", "--metrics", "",
                 "--log-level", "warning",
                 "--job", "bench", "--ranklog", os.path.join(work, "logs", "rank{rank}.log"),
                 "--spool-fsync-interval-ms", str(fsync_ms), *off, *extra], cpu,
                env={"PYTHONPATH": tree}, cwd=tree)
    return a


RSYSLOG_CONF = """\
global(workDirectory="{work}/rs")
module(load="imfile" mode="inotify")
{inputs}
action(type="omfwd" target="127.0.0.1" port="{port}" protocol="tcp"
       template="RSYSLOG_FileFormat")
"""


def start_rsyslog(work: str, port: int, cpu: int) -> Shipper:
    os.makedirs(os.path.join(work, "rs"), exist_ok=True)
    inputs = "\n".join(f'input(type="imfile" file="{work}/logs/rank{r}.log" tag="rank{r}")'
                       for r in range(FILES[0]))
    conf = os.path.join(work, "rsyslog.conf")
    with open(conf, "w") as f:
        f.write(RSYSLOG_CONF.format(work=work, inputs=inputs, port=port))
    return Shipper(["rsyslogd", "-n", "-f", conf, "-i", os.path.join(work, "rs", "pid")], cpu)


def fresh(work: str) -> list[str]:
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "logs"))
    paths = [os.path.join(work, "logs", f"rank{r}.log") for r in range(FILES[0])]
    for p in paths:
        open(p, "wb").close()
    return paths


# --- the writer ------------------------------------------------------------------

WRITER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from bench.agent import line
paths, (mode, n, rate, seconds, _) = sys.argv[2:-5], sys.argv[-5:]
FILES = len(paths)
n, rate, seconds = int(n), int(rate), float(seconds)
fds = [os.open(p, os.O_WRONLY | os.O_APPEND) for p in paths]
if mode == "burst":  # n lines built first, then written as fast as possible, 1 MiB writes
    per, t = n // FILES, time.time_ns()
    data = ["".join(line(r, i, t) for i in range(per)).encode() for r in range(FILES)]
    print("ready", flush=True)
    sys.stdin.readline()
    for r, fd in enumerate(fds):
        for k in range(0, len(data[r]), 1 << 20):
            os.write(fd, data[r][k:k + (1 << 20)])
else:  # rate lines/s for seconds: every tick the lines owed, one write per file
    t0, i, tick = time.monotonic(), 0, float(sys.argv[-1]) / 1000
    while (now := time.monotonic()) - t0 < seconds:
        due = int((now - t0) * rate)
        for r, fd in enumerate(fds):
            first = i + (r - i) % FILES
            if first < due:  # each line stamped as it is built, just before its write
                os.write(fd, "".join(line(r, k, time.time_ns())
                                     for k in range(first, due, FILES)).encode())
        i = max(i, due)
        time.sleep(tick)
print(n // FILES * FILES if mode == "burst" else i)
"""


RANK_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1"}


def writer(paths: list[str], mode: str, n: int = 0, rate: int = 0, seconds: float = 0,
           tick_ms: float = 2, cpu: int = 1):
    """Start the writer child on ``cpu`` (with a rank's environment, so procs finds it);
    a burst writer builds its lines first. Returns ``run``: go, wait, lines written."""
    p = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", WRITER, ROOT, *paths,
                          mode, str(n), str(rate), str(seconds), str(tick_ms)],
                         env={**os.environ, **RANK_ENV},
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if mode == "burst":
        assert p.stdout.readline() == "ready\n"

    def run() -> int:
        out, _ = p.communicate("go\n")
        if p.returncode:
            raise SystemExit(f"writer failed: {p.returncode}")
        return int(out.split()[-1])
    return run


def settle(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def quiet(pid: int, max_s: float = 30.0) -> None:
    """Wait until the process stops using CPU (start-up done, or backlog spooled)."""
    last = cpu_s(pid)
    for _ in range(int(max_s / 0.5)):
        time.sleep(0.5)
        now = cpu_s(pid)
        if now - last < 0.02:
            return
        last = now


def profile(pid: int) -> subprocess.Popen | None:
    """py-spy on ``pid`` while measuring, if BENCH_PROFILE names an output file."""
    out = os.environ.get("BENCH_PROFILE")
    if not out:
        return None
    return subprocess.Popen(["py-spy", "record", "-p", str(pid), "-o", out, "-f", "raw",
                             "-r", "250",
                             "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(pid: int, run, done) -> dict:
    """CPU and wall of ``pid`` from before ``run()`` until ``done()``; its peak RSS."""
    c0, t0, s0 = cpu_s(pid), time.monotonic(), cpu_s(pid, slice(12, 13))
    th0 = thread_cpu_s(pid)
    prof = profile(pid)
    n = run()
    ok = settle(lambda: done(n), 120)
    wall, cpu = time.monotonic() - t0, cpu_s(pid) - c0
    sys_s = cpu_s(pid, slice(12, 13)) - s0
    threads = {k: round(v - th0.get(k, 0.0), 2) for k, v in thread_cpu_s(pid).items()}
    rss, hwm = rss_kib(pid)
    if prof is not None:
        prof.send_signal(signal.SIGINT)
        prof.wait()
    return {"lines": n, "complete": ok, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "cpu_us_per_line": round(cpu / n * 1e6, 3) if n else None,
            "lines_per_cpu_s": round(n / cpu) if cpu else None,
            "cpu_pct": round(100 * cpu / wall, 2),
            "system_share": round(sys_s / cpu, 2) if cpu else None,
            "rss_mib": round(rss / 1024, 1),
            "hwm_mib": round(hwm / 1024, 1),
            "thread_cpu_s": {k: v for k, v in sorted(threads.items()) if v}}


def latency(r: dict, lat: list[float]) -> dict:
    return {**r, "p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2),
            "max_ms": round(max(lat), 2) if lat else None, "latency_n": len(lat)}


def tree_of(kind: str, args) -> str | None:
    """The checkout whose agent ``kind`` runs ("agent": this one, "agent@base": --base),
    None for rsyslog."""
    return ROOT if kind == "agent" else args.base if kind == "agent@base" else None


def phase_throughput(work: str, kind: str, args) -> dict:
    paths = fresh(work)
    tree = tree_of(kind, args)
    if tree:
        sink = AckSink().start()
        sh = start_agent(work, sink.port, args.cpu, args.fsync_interval_ms, samplers=False, tree=tree)
    else:
        sink = LineSink()
        sh = start_rsyslog(work, sink.port, args.cpu)
    try:
        time.sleep(1)
        quiet(sh.pid)
        sink.latencies_ms = []
        r = measure(sh.pid, writer(paths, "burst", n=args.lines),
                    lambda n: sink.lines >= n)
        r["lines_per_s_wall"] = round(r["lines"] / r["wall_s"])
        return r
    finally:
        sh.stop()
        if tree:
            sink.stop()


def start_collector(work: str, port: int, tree: str = ROOT) -> subprocess.Popen:
    """The collector of the checkout ``tree`` (the agent's: a before/after run compares both)."""
    p = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-m", "firstfault", "collector",
                          "--listen", f"127.0.0.1:{port}", "--http", "127.0.0.1:0",
                          "--db", os.path.join(work, "c.db")], cwd=tree,
                         env={**os.environ, "PYTHONPATH": tree}, stderr=subprocess.DEVNULL)
    settle(lambda: _listening(port), 30)
    return p


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


def phase_steady(work: str, kind: str, args) -> dict:
    paths = fresh(work)
    col = None
    tree = tree_of(kind, args)
    if tree:
        cport = free_port()
        col = start_collector(work, cport, tree)
        sink = AckSink(upstream=("127.0.0.1", cport)).start()
        sh = start_agent(work, sink.port, args.cpu, args.fsync_interval_ms,
                         samplers=not args.no_samplers, tree=tree)
    else:
        sink = LineSink()
        sh = start_rsyslog(work, sink.port, args.cpu)
    try:
        time.sleep(1)
        quiet(sh.pid)
        sink.latencies_ms, sink.read_ms, sink.sent_ms = [], [], []
        col_c0 = cpu_s(col.pid) if col is not None else 0.0
        base = sink.lines
        r = measure(sh.pid, writer(paths, "rate", rate=args.rate, seconds=args.seconds,
                           tick_ms=args.write_ms),
                    lambda n: sink.lines - base >= n)
        r = latency(r, sink.latencies_ms)
        if col is not None:
            r["collector_cpu_pct"] = round(100 * (cpu_s(col.pid) - col_c0) / r["wall_s"], 1)
        if tree:
            r["read_p50_ms"], r["read_p99_ms"] = pct(sink.read_ms, 50), pct(sink.read_ms, 99)
            r["sent_p50_ms"], r["sent_p99_ms"] = pct(sink.sent_ms, 50), pct(sink.sent_ms, 99)
        if args.idle:  # no writes; a rank-like process alive, so cgroup samples at 1 Hz
            rank = subprocess.Popen(["sleep", str(args.idle + 15)], env={**os.environ, **RANK_ENV})
            time.sleep(12)  # procs finds it (young_s), cgroup starts sampling it
            r["idle"] = measure(sh.pid, lambda: time.sleep(args.idle) or 0, lambda n: True)
            rank.kill()
            rank.wait()
        return r
    finally:
        sh.stop()
        if tree:
            sink.stop()
            col.terminate()
            col.wait(30)


def phase_backlog(work: str, args) -> dict:
    """The collector away while LINES lines are written and spooled; then it comes back."""
    paths = fresh(work)
    sink = AckSink()  # not listening yet
    sh = start_agent(work, sink.port, args.cpu, args.fsync_interval_ms, samplers=False)
    try:
        time.sleep(1)
        quiet(sh.pid)
        run, c0 = writer(paths, "burst", n=args.lines), cpu_s(sh.pid)
        spool = {"lines": run()}
        quiet(sh.pid)  # until everything is read and spooled
        spool["cpu_s"] = round(cpu_s(sh.pid) - c0, 2)
        spooled = rss_kib(sh.pid)
        sink.start()
        c0 = cpu_s(sh.pid)
        ok = settle(lambda: sink.lines >= spool["lines"], 300)
        done = time.monotonic()
        rss, hwm = rss_kib(sh.pid)
        send_s = done - (sink.connected_at or done)
        return {"lines": spool["lines"], "complete": ok, "spool_cpu_s": spool["cpu_s"],
                "rss_after_spooling_mib": round(spooled[0] / 1024, 1),
                "send_wall_s": round(send_s, 2), "send_cpu_s": round(cpu_s(sh.pid) - c0, 2),
                "send_lines_per_s": round(spool["lines"] / send_s) if send_s else None,
                "rss_mib": round(rss / 1024, 1), "hwm_mib": round(hwm / 1024, 1)}
    finally:
        sh.stop()
        sink.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--idle", type=float, default=20)
    ap.add_argument("--write-ms", type=float, default=2,
                    help="steady: each file gets one write (of the lines owed) this often")
    ap.add_argument("--fsync-interval-ms", type=int, default=20)
    ap.add_argument("--cpu", type=int, default=0, help="the core the shipper is pinned to")
    ap.add_argument("--phases", default="throughput,steady,backlog")
    ap.add_argument("--no-rsyslog", action="store_true")
    ap.add_argument("--no-samplers", action="store_true", help="steady: ranklog only")
    ap.add_argument("--out", default=os.path.join(HERE, "out", "agent"))
    ap.add_argument("--base", metavar="DIR", help="also the agent of this checkout (before/after)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of every phase and shipper, in turn; medians printed at the end")
    ap.add_argument("--read-gap-s", type=float, help="this checkout's ranklog read_gap_s")
    ap.add_argument("--files", default="8", help="files followed, comma-separated counts, each in every round")
    ap.add_argument("--no-redact", action="store_true",
                    help="this checkout's agent with [redact] enabled = false (what redaction costs)")
    args = ap.parse_args()
    GAP[0] = args.read_gap_s
    NO_REDACT[0] = args.no_redact
    os.sched_setaffinity(0, {1 - args.cpu})
    kinds = ["agent"] + (["agent@base"] if args.base else []) + (
        [] if args.no_rsyslog or not shutil.which("rsyslogd") else ["rsyslog"])
    res: dict = {"date": time.strftime("%Y-%m-%d"), "lines": args.lines, "rate": args.rate,
                 "write_ms": args.write_ms, "fsync_interval_ms": args.fsync_interval_ms,
                 "loadavg": [os.getloadavg()[0]]}
    phases = args.phases.split(",")
    runs: dict[str, list[dict]] = {}
    counts = [int(n) for n in args.files.split(",")]
    ratios: dict[str, list[float]] = {}
    for rep in range(args.repeat):
        order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]  # interleaved, in turn
        for ph in ("throughput", "steady"):
            if ph not in phases:
                continue
            for files in counts:
                FILES[0] = files
                got = {}
                for kind in order:
                    f = phase_throughput if ph == "throughput" else phase_steady
                    r = f(os.path.join(args.out, kind.replace("@", "-")), kind, args)
                    runs.setdefault(f"{ph}.{files}.{kind}", []).append(r)
                    got[kind] = r
                    print(f"{ph}.{files}.{kind}: {json.dumps(r)}", flush=True)
                rs = got.get("rsyslog")
                for kind, r in got.items():  # CPU per line against rsyslog's, this round
                    if rs and kind != "rsyslog" and r["cpu_us_per_line"] and rs["cpu_us_per_line"]:
                        ratios.setdefault(f"{ph}.{files}.{kind}", []).append(
                            round(r["cpu_us_per_line"] / rs["cpu_us_per_line"], 3))
        res["loadavg"].append(os.getloadavg()[0])
    if "backlog" in phases:
        res["backlog.agent"] = r = phase_backlog(os.path.join(args.out, "agent"), args)
        print(f"backlog.agent: {json.dumps(r)}", flush=True)
    shutil.rmtree(args.out, ignore_errors=True)
    res["runs"], res["cpu_ratio_to_rsyslog"] = runs, ratios
    print(json.dumps(res))
    print(f"\nmedians of {args.repeat} interleaved run(s); load average {res['loadavg']}")
    for key, got in runs.items():
        med = {k: statistics.median(r[k] for r in got) for k in MEDIANS if k in got[0]
               and all(r.get(k) is not None for r in got)}
        threads = {}
        for r in got:
            for t, v in r["thread_cpu_s"].items():
                threads.setdefault(t, []).append(v)
        med["thread_cpu_s"] = {t: round(statistics.median(v), 3) for t, v in threads.items()}
        print(f"{key}: {json.dumps(med)}")
    for key, got in ratios.items():
        print(f"{key} CPU / rsyslog's, same rounds: median {statistics.median(got):.2f} "
              f"(min {min(got):.2f}, max {max(got):.2f}, n={len(got)})")


MEDIANS = ("cpu_us_per_line", "lines_per_cpu_s", "cpu_pct", "hwm_mib", "rss_mib", "p50_ms", "p99_ms",
           "read_p50_ms", "read_p99_ms", "sent_p50_ms", "sent_p99_ms", "collector_cpu_pct",
           "lines_per_s_wall")


if __name__ == "__main__":
    main()
