"""Benchmark: `firstfault analyze` on a large multi-rank log set.

Generates a DeepSpeed ``--enable_each_rank_log`` folder of RANKS rank logs (line
shapes as DeepSpeed 0.19.8, torch 2.13 and gloo/NCCL print them; see
tests/data/real) in which one rank fails with a CUDA out-of-memory traceback
and every other rank then reports an NCCL watchdog timeout; then runs
``firstfault analyze DIR --format json`` in a child process, one core, and
reports MB/s and the child's peak RSS. Two sizes are run so that memory can be
seen not to grow with the input.

    python3 bench/analyze.py [--ranks 256] [--mb 1024] [--out bench/out] [--keep] [--grep N]

``--grep N``: then N interleaved rounds on the large set of ``grep -rcF`` with the
analysis's own needles (``scan_needles(load_catalog())``: the automaton's words, the
progress needles left out as the scanner leaves them out of its one pass) and of
analyze, CPU time of each (getrusage of the children) and their ratio per round: the
anchor, since the shared machine moves the absolute figures.

The data set is cached in --out and reused when its parameters match.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time

FAIL_RANK_FRACTION = 0.53  # which rank fails, as a fraction of the world size


def _stamp(t: float) -> str:
    lt = time.gmtime(t)
    return time.strftime("%Y-%m-%d %H:%M:%S", lt) + f",{int((t % 1) * 1000):03d}"


def _rank_lines(rank: int, world: int, steps: int, t0: float, rnd: random.Random):
    """Yield one rank's log lines for `steps` training steps."""
    yield f"[{_stamp(t0)}] [INFO] [real_accelerator.py:260:get_accelerator] Setting ds_accelerator to cuda (auto detect)\n"
    yield f"[{_stamp(t0 + 0.5)}] [INFO] [comm.py:821:init_distributed] Initializing TorchBackend in DeepSpeed with backend nccl\n"
    if rank == 0:
        yield f"[{_stamp(t0 + 1)}] [INFO] [logging.py:107:log_dist] [Rank 0] DeepSpeed info: version=0.19.8, git-hash=unknown, git-branch=unknown\n"
        yield f"[{_stamp(t0 + 1)}] [INFO] [config.py:678:print]   world_size ................... {world}\n"
        yield (f"[{_stamp(t0 + 1)}] [INFO] [config.py:678:print]   zero_config .................. stage=3 "
               "contiguous_gradients=True reduce_scatter=True reduce_bucket_size=500000000 "
               "offload_param=None offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='cpu', "
               "nvme_path=None, buffer_count=4, pin_memory=True)\n")
    t = t0 + 2
    fail_step = steps - 3
    fail_rank = int(world * FAIL_RANK_FRACTION)
    for step in range(1, steps + 1):
        t += 0.35 + rnd.random() * 0.01
        loss = 2.5 / (1 + step / 500) + rnd.random() * 0.05
        yield f"step {step} loss {loss:.4f} lr 0.0001 tokens/s {48000 + rnd.randrange(4000)}\n"
        if rank == 0:
            yield (f"[{_stamp(t)}] [INFO] [logging.py:107:log_dist] [Rank 0] step={step}, skipped=0, "
                   f"lr=[0.0001], mom=[(0.9, 0.999)]\n")
            yield (f"[{_stamp(t)}] [INFO] [timer.py:264:stop] epoch=0/micro_step={step}/global_step={step}, "
                   f"RunningAvgSamplesPerSec={180 + rnd.random():.6f}, CurrSamplesPerSec={181 + rnd.random():.6f}, "
                   "MemAllocated=21.33GB, MaxMemAllocated=27.9GB\n")
        if step % 50 == 0 and rank == 0:  # stage3.py warns on global rank 0 only
            yield (f"[{_stamp(t)}] [WARNING] [stage3.py:2171:step] 1 pytorch allocator cache flushes since last "
                   "step. this happens when there is high memory pressure and is detrimental to performance.\n")
        if step == fail_step:
            if rank == fail_rank:
                yield f"[rank{rank}]: Traceback (most recent call last):\n"
                yield f'[rank{rank}]:   File "/work/train.py", line 88, in <module>\n'
                yield f"[rank{rank}]:     loss = engine(batch)\n"
                yield f'[rank{rank}]:   File "/usr/lib/python3/dist-packages/deepspeed/runtime/engine.py", line 2105, in forward\n'
                yield f"[rank{rank}]:     loss = self.module(*inputs, **kwargs)\n"
                yield f'[rank{rank}]:   File "/work/model.py", line 41, in forward\n'
                yield f"[rank{rank}]:     h = self.mlp(x)\n"
                yield (f"[rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                       "GPU 0 has a total capacity of 79.10 GiB of which 1.05 GiB is free. Of the allocated memory "
                       "75.20 GiB is allocated by PyTorch, and 1.12 GiB is reserved by PyTorch but unallocated.\n")
                return
            t += 600
            yield (f"[rank{rank}]:[E1202 10:{(rank % 50):02d}:00.000000000 ProcessGroupNCCL.cpp:632] [Rank {rank}] "
                   f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={step * 7}, OpType=ALLGATHER, "
                   "NumelIn=1048576, NumelOut=268435456, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.\n")
            return


def generate(out: str, ranks: int, mb: int) -> tuple[str, int]:
    """Write the data set (or reuse it); return its folder and size in bytes."""
    folder = os.path.join(out, f"ranks{ranks}-mb{mb}")
    meta = os.path.join(folder, ".meta.json")
    if os.path.exists(meta):
        with open(meta) as f:
            return folder, json.load(f)["bytes"]
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    per_rank = mb * 1_000_000 // ranks
    steps = max(10, per_rank // 52)  # ~50 bytes per step on most ranks
    total = 0
    t0 = 1_796_205_000.0
    for r in range(ranks):
        rnd = random.Random(r)
        path = os.path.join(folder, f"2026-12-02_10:00:00_rank{r}.log")
        with open(path, "w") as f:
            buf = []
            for line in _rank_lines(r, ranks, steps, t0, rnd):
                buf.append(line)
                if len(buf) >= 4096:
                    f.write("".join(buf))
                    buf.clear()
            f.write("".join(buf))
        total += os.path.getsize(path)
    with open(meta, "w") as f:
        json.dump({"bytes": total, "ranks": ranks, "steps": steps}, f)
    return folder, total


def _env() -> dict:
    """The children's environment: bytecode cached, as an installed tool has it (pip compiles it at
    install), whatever PYTHONDONTWRITEBYTECODE this shell has; else each run compiles every module."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run(folder: str) -> dict:
    """Analyse the folder in a child process pinned to one core; time, peak RSS and the verdict."""
    cmd = [sys.executable, "-m", "firstfault", "analyze", folder, "--format", "json", "--tz", "UTC"]
    if hasattr(os, "sched_setaffinity"):
        cmd = ["taskset", "-c", "0", *cmd] if shutil.which("taskset") else cmd
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(),
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"analyze failed ({p.returncode}): {p.stderr[-2000:]}")
    rep = json.loads(p.stdout)
    ff = rep["first_failure"] or {}
    return {
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "peak_rss_mb": after.ru_maxrss / 1024,  # Linux: KiB; the largest child so far
        "rank": ff.get("rank"),
        "signature": ff.get("signature"),
    }


def _child_cpu(cmd: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # into a pipe, not /dev/null: GNU grep stops at the first match when its output is /dev/null
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode not in (0, 1):
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}): {p.stderr[-2000:]!r}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def against_grep(folder: str, out: str, rounds: int) -> None:
    """analyze's CPU against grep -rcF's with the same needles, in interleaved rounds."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from firstfault.analysis.catalog import load_catalog
    from firstfault.analysis.reads import scan_needles
    n = scan_needles(load_catalog())
    progress = {w.decode() for w in n.progress}
    words = os.path.join(out, "needles.txt")
    with open(words, "w") as f:
        f.write("".join(w + "\n" for w in n.words if w not in progress))
    grep = ["grep", "-rcF", "-f", words, folder]
    analyze = [sys.executable, "-m", "firstfault", "analyze", folder, "--format", "json", "--tz", "UTC"]
    ratios, gs, ans = [], [], []
    for r in range(rounds):
        pair = [("grep", grep), ("analyze", analyze)]
        got = dict((name, _child_cpu(cmd)) for name, cmd in (pair if r % 2 == 0 else pair[::-1]))
        gs.append(got["grep"])
        ans.append(got["analyze"])
        ratios.append(got["analyze"] / got["grep"])
        print(f"round {r + 1}: grep -rcF ({len(n.words) - len(progress)} needles) cpu={got['grep']:.2f} s "
              f"analyze cpu={got['analyze']:.2f} s ratio={ratios[-1]:.2f}", flush=True)
    med = sorted(ratios)[len(ratios) // 2]
    print(f"analyze CPU / grep's, same rounds: median {med:.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}, "
          f"n={rounds}); grep median {sorted(gs)[rounds // 2]:.2f} s, analyze {sorted(ans)[rounds // 2]:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--mb", type=int, default=1024, help="size of the large data set in MB")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    ap.add_argument("--keep", action="store_true", help="keep the generated data sets")
    ap.add_argument("--grep", type=int, default=0, metavar="N",
                    help="N interleaved rounds of grep -rcF with the same needles, and analyze")
    a = ap.parse_args()
    rows = []
    # the small set first: ru_maxrss of children is a running maximum
    for mb in (a.mb // 4, a.mb):
        folder, size = generate(a.out, a.ranks, mb)
        res = run(folder)
        expect = int(a.ranks * FAIL_RANK_FRACTION)
        ok = res["rank"] == expect and res["signature"] == "cuda.oom"
        rows.append((a.ranks, size, res, ok))
        print(f"ranks={a.ranks} input={size / 1e6:,.0f} MB wall={res['wall_s']:.1f} s cpu={res['cpu_s']:.1f} s "
              f"rate={size / 1e6 / res['wall_s']:,.1f} MB/s peak_rss={res['peak_rss_mb']:.0f} MB "
              f"first_failure=rank {res['rank']} {res['signature']} ({'right' if ok else 'WRONG, expected rank ' + str(expect)})",
              flush=True)
    if a.grep:
        against_grep(folder, a.out, a.grep)
    if not a.keep:
        shutil.rmtree(a.out, ignore_errors=True)
    if not all(ok for *_, ok in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
