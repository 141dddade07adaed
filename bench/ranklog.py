"""Benchmark: the ranklog source tailing rank logs into a real spool, on one core.

Uses bench/tail.py's data (FILES DeepSpeed-style rank logs, ~150-byte lines, LINES
in all, generated once) and measures in this process (pinned with --cpu; CPU is
process time: every thread, the spool's fsync flusher and watchdog included):

  tail      Tailer.poll_batches round-robin over the files, nothing else
  rows      + the source's engine (RankLines): decode, rows of the wire columns,
            emitted to a sink that drops them, positions committed once per round
            over the files as at the end of a FollowLoop wake (JSON state: write,
            fsync, rename, fsync of the folder)
  spool     + a real Spool (fsync="interval", 100 ms) taking each poll's rows in
            one append, wire checks on (validate=True: what the agent runs)
  spool-nv  the same with validate=False (the wire checks left to the shipper)
  source    RanklogSource.run end to end in its thread, woken by inotify, while a
            child appends the data (1 MiB writes), into a Spool as in "spool";
            wall time until the last line is in the spool
  wake      one steady wake's work (31 new lines in each file, polled and emitted
            into a spool), 300 times back to back and 300 times 25 ms apart: the
            same work costs more after the thread slept (bench/RESULTS.md)

Every phase reads the same files from the page cache; the spool is a fresh folder
each time (removed after). Goal (issue 4): >= 300k lines/s per core, i.e. <= 3.3
µs CPU a line, end to end.

    python3 bench/ranklog.py [--lines 400000] [--files 8] [--cpu 0] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from firstfault.agent.sources.ranklog import RankLines, RanklogSource  # noqa: E402
from firstfault.agent.spool import Spool  # noqa: E402
from firstfault.agent.tail import Tailer  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_tail", os.path.join(HERE, "tail.py"))
tailbench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tailbench)  # its generator, writer and result helpers


class Counting:
    """A sink: counts rows; ``spool`` set: appends each list in one call."""

    def __init__(self, spool: Spool | None = None) -> None:
        self.spool, self.rows, self.done = spool, 0, threading.Event()
        self.want = None

    def __call__(self, draft) -> None:
        self.many([draft])

    def many(self, rows: list) -> None:
        if self.spool is not None:
            self.spool.append(rows)
        self._count(len(rows))

    def columns(self, records) -> None:  # the agent's sink: columns as they are
        if self.spool is not None:
            self.spool.append_columns(records)
        self._count(records.n)

    def _count(self, n: int) -> None:
        self.rows += n
        if self.want is not None and self.rows >= self.want:
            self.done.set()


def _spool(out: str, validate: bool) -> Spool:
    d = os.path.join(out, "spool")
    shutil.rmtree(d, ignore_errors=True)
    return Spool(d, node="bench", max_bytes=4 << 30, fsync="interval", validate=validate)


def run_direct(srcs: list[str], out: str, mode: str) -> dict:
    spool = _spool(out, validate=mode == "spool") if mode in ("spool", "spool-nv") else None
    state = os.path.join(out, "state.json")
    if os.path.exists(state):
        os.unlink(state)
    sink = Counting(spool)
    with Tailer(state if mode != "tail" else None) as t:
        engine = RankLines(t, sink)
        for p in srcs:
            t.add(p)
        n = 0
        t0, c0, f0 = time.perf_counter(), tailbench._cpu(), tailbench._faults()
        live = list(srcs)
        while live:
            for p in list(live):
                batches = t.poll_batches(p)
                n += sum(len(b) for b in batches)
                if mode != "tail":
                    engine.batches(batches)
                if not t.more(p):
                    live.remove(p)
            if mode != "tail":
                engine.tick()  # a FollowLoop wake's end: one commit for the round
        if spool is not None:
            spool.close()  # its last fsync counts
        res = tailbench._result(n, t0, c0, f0)
    assert mode == "tail" or sink.rows == n, (sink.rows, n)
    return res


def run_source(srcs: list[str], out: str, total: int) -> dict:
    d = os.path.join(out, "follow")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    dsts = [os.path.join(d, f"rank{r}.log") for r in range(len(srcs))]
    for p in dsts:
        open(p, "wb").close()
    spool = _spool(out, validate=True)
    sink = Counting(spool)
    sink.want = total
    src = RanklogSource(globs=[os.path.join(d, "rank{rank}.log")], state_dir=d)
    stop = threading.Event()
    th = threading.Thread(target=src.run, args=(sink, stop), name="ranklog")
    th.start()
    time.sleep(0.5)
    t0, c0, f0 = time.perf_counter(), tailbench._cpu(), tailbench._faults()
    writer = subprocess.Popen([sys.executable, "-c", tailbench.WRITER,
                               *[x for pair in zip(srcs, dsts) for x in pair]])
    if not sink.done.wait(600):
        raise SystemExit(f"source: only {sink.rows} of {total} lines arrived")
    res = tailbench._result(sink.rows, t0, c0, f0)
    writer.wait()
    stop.set()
    th.join(30)
    spool.close()
    return res


def run_wakes(out: str, files: int, wakes: int, sleep_s: float) -> dict:
    """What one FollowLoop wake does at a steady rate (31 new lines in each file: 10k
    lines/s over 8 files read every 25 ms), done ``wakes`` times with ``sleep_s`` between
    them, in this thread: CPU per wake of the polls and of the engine with its spool
    append (fsync off: the disk is not what is measured)."""
    d = os.path.join(out, "wakes")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    paths = [os.path.join(d, f"rank{r}.log") for r in range(files)]
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for p in paths]
    spool = Spool(os.path.join(d, "spool"), node="bench", max_bytes=4 << 30, fsync="never")
    sink = Counting(spool)
    poll = emit = 0.0
    with Tailer(os.path.join(d, "state.json"), fsync=False) as t:
        engine = RankLines(t, sink)
        for p in paths:
            t.add(p)
        for k in range(wakes):
            for r, fd in enumerate(fds):
                os.write(fd, b"".join(b"[2026-12-02 10:11:59,782] [INFO] [logging.py:96:log_dist] "
                                      b"[Rank %d] step=%d, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]\n"
                                      % (r, k * 31 + i) for i in range(31)))
            if sleep_s:
                time.sleep(sleep_s)
            c0 = time.thread_time()
            batches = [b for p in paths for b in t.poll_batches(p)]
            c1 = time.thread_time()
            engine.batches(batches)
            poll, emit = poll + c1 - c0, emit + time.thread_time() - c1
    spool.close()
    for fd in fds:
        os.close(fd)
    shutil.rmtree(d, ignore_errors=True)
    return {"sleep_s": sleep_s, "lines_per_wake": 31 * files, "poll_us_per_wake": poll / wakes * 1e6,
            "emit_us_per_wake": emit / wakes * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=400_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU")
    ap.add_argument("--out", default=os.path.join(HERE, "out", "ranklog"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    subprocess.run([sys.executable, os.path.join(HERE, "tail.py"), "--generate-only", "--out", args.out,
                    "--files", str(args.files), "--lines", str(args.lines)], check=True)
    srcs = tailbench.generate(args.out, args.files, args.lines)
    n_total = (args.lines // args.files) * args.files
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    res = {"files": args.files, "lines": n_total, "pinned_cpu": args.cpu}
    for mode in ("tail", "rows", "spool", "spool-nv"):
        res[mode] = run_direct(srcs, args.out, mode)
    res["source"] = run_source(srcs, args.out, n_total)
    res["wakes"] = [run_wakes(args.out, args.files, 300, gap) for gap in (0.0, 0.025, 0.0, 0.025)]
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    shutil.rmtree(os.path.join(args.out, "spool"), ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{args.files} files, {n_total:,} lines, pinned cpu={args.cpu}")
    for k in ("tail", "rows", "spool", "spool-nv", "source"):
        r = res[k]
        print(f"  {k:9s} {r['lines_per_s'] / 1e3:6.0f}k lines/s wall, {1e3 / r['cpu_us_per_line']:5.0f}k "
              f"lines per CPU-second, {r['cpu_us_per_line']:.3f} µs CPU/line "
              f"(wall {r['wall_s']:.2f} s, CPU {r['cpu_s']:.2f} s)")
    for w in res["wakes"]:
        print(f"  wake      {w['lines_per_wake']} lines, {w['sleep_s'] * 1000:.0f} ms asleep before: "
              f"polls {w['poll_us_per_wake']:.0f} µs, engine + spool append {w['emit_us_per_wake']:.0f} µs")
    print(f"  RSS       peak {res['peak_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
