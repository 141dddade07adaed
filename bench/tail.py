"""Benchmark: firstfault/agent/tail/ reading 8 rank logs appended at once, and idle.

Generates FILES rank logs of DeepSpeed-style lines (~150 bytes, LINES in all) once,
then measures in this process (pinned to one core with --cpu):

  baseline  the least a Python reader does (pread a chunk, split, count), side by side
  batches   Tailer.poll_batches round-robin over the files until all are read:
            lines/s and CPU µs/line of reading read_chunk chunks and splitting them
            (columns: no object per line; what a columnar shipper would use)
  lines     the same through Tailer.poll_file (one Line tuple per line)
  follow    FollowLoop end to end: the files exist empty, a child process appends
            all the data (1 MiB writes, round-robin over the files) and the loop,
            woken by inotify, reads it; one commit (write+fsync of the state)
            every ~100k lines. CPU is this process only (the follow loop and its inotify reads),
            not the writer's. Wall time runs until the last line arrived.
  idle      the FollowLoop with nothing to read for IDLE_S seconds: CPU %

and the peak RSS of the process. The page cache holds the files (a log tailer
reads what was just written), so this is CPU, not disk.

    python3 bench/tail.py [--lines 2000000] [--files 8] [--idle-s 10] [--cpu 0]
                          [--read-chunk 262144] [--out bench/out/tail] [--json]

glibc hands out fresh (page-faulting) memory for 1 MiB buffers until its dynamic mmap
threshold has grown: compare --read-chunk 1048576, with and without
MALLOC_MMAP_THRESHOLD_=8388608 MALLOC_TRIM_THRESHOLD_=33554432 in the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from firstfault.agent.tail import Tailer  # noqa: E402
from firstfault.agent.tail.follow import FollowLoop  # noqa: E402

WRITER = r"""
import os, sys
srcs, dsts = sys.argv[1::2], sys.argv[2::2]
ins = [open(s, "rb") for s in srcs]
outs = [os.open(d, os.O_WRONLY | os.O_APPEND) for d in dsts]
live = list(range(len(ins)))
while live:
    for i in list(live):
        chunk = ins[i].read(1 << 20)
        if not chunk:
            live.remove(i)
            continue
        os.write(outs[i], chunk)
"""


def _line(rank: int, step: int) -> str:
    ms = step % 1000
    return (f"[2026-12-02 10:{(step // 60000) % 60:02d}:{(step // 1000) % 60:02d},{ms:03d}] [INFO] "
            f"[logging.py:107:log_dist] [Rank {rank}] step={step}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)], "
            f"loss={2.5 / (1 + step / 500):.4f} tokens/s={48000 + step % 4000}\n")


def generate(out: str, files: int, lines: int) -> list[str]:
    os.makedirs(out, exist_ok=True)
    stamp = os.path.join(out, "params.json")
    want = {"files": files, "lines": lines}
    paths = [os.path.join(out, f"src{r}.log") for r in range(files)]
    if os.path.exists(stamp) and json.load(open(stamp)) == want and all(map(os.path.exists, paths)):
        return paths
    per = lines // files
    for r, p in enumerate(paths):
        with open(p, "w") as fh:
            fh.write("".join(_line(r, s) for s in range(per)))
    json.dump(want, open(stamp, "w"))
    return paths


def _cpu() -> float:
    return time.process_time()


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _result(n: int, t0: float, c0: float, f0: int) -> dict:
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    return {"lines": n, "wall_s": wall, "cpu_s": cpu, "lines_per_s": n / wall,
            "cpu_us_per_line": cpu / n * 1e6, "page_faults": _faults() - f0}


def run_baseline(srcs: list[str], chunk: int) -> dict:
    """The least a Python reader does: pread a chunk, split, count (no positions, no checks)."""
    n = 0
    t0, c0, f0 = time.perf_counter(), _cpu(), _faults()
    for p in srcs:
        fd, off, pending = os.open(p, os.O_RDONLY), 0, b""
        while data := os.pread(fd, chunk, off):
            off += len(data)
            parts = (pending + data).split(b"\n")
            pending = parts.pop()
            n += len(parts)
        os.close(fd)
    return _result(n, t0, c0, f0)


def run_direct(srcs: list[str], columns: bool, chunk: int) -> dict:
    with Tailer(None, read_chunk=chunk) as t:
        for p in srcs:
            t.add(p)
        n = 0
        t0, c0, f0 = time.perf_counter(), _cpu(), _faults()
        live = list(srcs)
        while live:
            for p in list(live):
                if columns:
                    n += sum(len(b) for b in t.poll_batches(p))
                else:
                    n += len(t.poll_file(p))
                if not t.more(p):
                    live.remove(p)
        return _result(n, t0, c0, f0)


def run_follow(srcs: list[str], out: str, total: int, idle_s: float, chunk: int) -> tuple[dict, dict]:
    d = os.path.join(out, "follow")
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(d):
        os.unlink(os.path.join(d, name))
    dsts = [os.path.join(d, f"rank{r}.log") for r in range(len(srcs))]
    for p in dsts:
        open(p, "wb").close()
    tailer = Tailer(os.path.join(d, "state.json"), read_chunk=chunk)
    got = [0, 0]
    done = threading.Event()

    def on_batches(batches):
        got[0] += sum(len(b) for b in batches)
        if got[0] - got[1] >= 100_000:
            tailer.commit_through(*batches)
            got[1] = got[0]
        if got[0] >= total:
            done.set()

    stop = threading.Event()
    loop = FollowLoop(tailer, os.path.join(d, "rank{rank}.log"), None, stop, on_batches=on_batches)
    th = threading.Thread(target=loop.run, name="follow")
    th.start()
    time.sleep(0.5)
    t0, c0, f0 = time.perf_counter(), _cpu(), _faults()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, *[x for pair in zip(srcs, dsts) for x in pair]])
    if not done.wait(600):
        raise SystemExit(f"follow: only {got[0]} of {total} lines arrived")
    follow = _result(got[0], t0, c0, f0)
    writer.wait()
    time.sleep(1.0)
    c1, t1 = _cpu(), time.perf_counter()
    time.sleep(idle_s)
    idle = {"seconds": time.perf_counter() - t1, "cpu_s": _cpu() - c1}
    idle["cpu_percent"] = 100 * idle["cpu_s"] / idle["seconds"]
    with open("/proc/self/statm") as fh:
        idle["rss_mib"] = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    loop.stop()
    th.join(30)
    return follow, idle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU")
    ap.add_argument("--read-chunk", type=int, default=256 << 10, help="Tailer read_chunk, bytes")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "tail"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate_only:
        generate(args.out, args.files, args.lines)
        return
    # Generate in a child, so that this process's peak RSS is the tailer's alone.
    subprocess.run([sys.executable, os.path.abspath(__file__), "--generate-only", "--out", args.out,
                    "--files", str(args.files), "--lines", str(args.lines)], check=True)
    srcs = generate(args.out, args.files, args.lines)
    total = sum(os.path.getsize(p) for p in srcs)
    n_total = (args.lines // args.files) * args.files
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    res = {"files": args.files, "lines": n_total, "bytes": total, "bytes_per_line": total / n_total,
           "pinned_cpu": args.cpu, "read_chunk": args.read_chunk,
           "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}}
    res["baseline"] = run_baseline(srcs, args.read_chunk)
    res["batches"] = run_direct(srcs, columns=True, chunk=args.read_chunk)
    res["lines_api"] = run_direct(srcs, columns=False, chunk=args.read_chunk)
    res["follow"], res["idle"] = run_follow(srcs, args.out, n_total, args.idle_s, args.read_chunk)
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["idle_rss_mib"] = res["idle"].pop("rss_mib")
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{args.files} files, {n_total:,} lines, {total / 2**20:.0f} MiB "
          f"({res['bytes_per_line']:.0f} B/line), read_chunk={args.read_chunk}, pinned cpu={args.cpu}, "
          f"{res['malloc_env'] or 'default malloc'}")
    for k in ("baseline", "batches", "lines_api", "follow"):
        r = res[k]
        print(f"  {k:10s} {r['lines_per_s'] / 1e3:6.0f}k lines/s wall, {1 / r['cpu_us_per_line']:5.2f}M "
              f"lines per CPU-second, {r['cpu_us_per_line']:.3f} µs CPU/line "
              f"(wall {r['wall_s']:.2f} s, CPU {r['cpu_s']:.2f} s, {r['page_faults']} page faults)")
    i = res["idle"]
    print(f"  idle       {i['cpu_percent']:.3f}% CPU over {i['seconds']:.1f} s")
    print(f"  RSS        peak {res['peak_rss_mib']:.0f} MiB, idle loop {res['idle_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
