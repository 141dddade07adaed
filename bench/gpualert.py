"""Outside benchmark: firstfault's category on the GPUAlert corpus (arXiv 2607.01409).

GPUAlert (https://github.com/Parv-01/gpualert-eval, MIT licence) publishes 474 labelled
GPU-training failure logs in 15 classes (360 injected on V100s, 90 synthetic, 24 copied
from public threads) with its harness. Its classes name the error (CUDA OOM, NCCL, missing
module, ...); firstfault's category names whose fault it is (REPORT.md). So each class is
mapped, once and before scoring, to the category a person would give it in firstfault's
vocabulary (CLASS_TO_CATEGORY, with why); a log firstfault finds no failure in counts as
category "none". Every log is pasted on standard input, as a user does.

    git clone https://github.com/Parv-01/gpualert-eval /tmp/gpualert-eval   # not vendored here
    python3 bench/gpualert.py /tmp/gpualert-eval [--show-misses]

Prints accuracy and macro-F1 over the mapped categories, per source and per class.
The corpus is not copied into this repository (third-party log text).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import sys
from pathlib import Path

from firstfault.cli import main as firstfault_main

CLASS_TO_CATEGORY = {
    "cuda_oom": "gpu-memory",
    "ram_oom": "host-memory",       # MemoryError, std::bad_alloc in the process
    "oom_killer": "host-memory",    # the kernel's "Out of memory: Killed process"
    "nan_loss": "numerics",
    "nccl": "network",              # "unhandled system error", watchdog aborts: the fabric or a peer, not the code
    "cuda_runtime": "user-code",    # its injected logs are a device-side assert from an out-of-range index
    "segfault": "unknown",          # a native crash with nothing naming whose
    "file_not_found": "user-code",  # a path the script was given
    "permission": "user-code",
    "missing_module": "config",     # the environment, not the training code
    "div_zero": "user-code",
    "device_mismatch": "user-code",
    "traceback": "user-code",
    "assertion": "user-code",
    "runtime_error": "user-code",
}


def category_of(log: bytes) -> str:
    out = io.StringIO()
    old = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(log))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            firstfault_main(["analyze", "-", "--format", "json", "--tz", "UTC"])
    finally:
        sys.stdin = old
    ff = json.loads(out.getvalue())["first_failure"]
    return ff["category"] if ff else "none"


def macro_f1(pairs: list[tuple[str, str]]) -> float:
    labels = {want for _, want in pairs}
    f1s = []
    for lab in labels:
        tp = sum(1 for got, want in pairs if got == lab and want == lab)
        fp = sum(1 for got, want in pairs if got == lab and want != lab)
        fn = sum(1 for got, want in pairs if got != lab and want == lab)
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(f1s) / len(f1s)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("corpus", help="a checkout of gpualert-eval (holds corpus/labels.jsonl)")
    p.add_argument("--show-misses", action="store_true")
    a = p.parse_args(argv)
    root = Path(a.corpus)
    rows = []
    for line in (root / "corpus" / "labels.jsonl").read_text().splitlines():
        e = json.loads(line)
        got = category_of((root / e["log_path"]).read_bytes())
        rows.append((e["source"], e["mode"], got, CLASS_TO_CATEGORY[e["mode"]], e["id"]))
    print(f"{len(rows)} logs")
    for name, sel in [("all", rows)] + [(s, [r for r in rows if r[0] == s]) for s in sorted({r[0] for r in rows})]:
        pairs = [(r[2], r[3]) for r in sel]
        acc = 100.0 * sum(g == w for g, w in pairs) / len(pairs)
        print(f"{name:10s} n={len(pairs):4d}  accuracy {acc:5.1f}%  macro-F1 {macro_f1(pairs):.3f}")
    print("per class (all sources): right / n, what it said")
    by = collections.defaultdict(list)
    for r in rows:
        by[r[1]].append(r)
    for mode, rs in sorted(by.items()):
        said = collections.Counter(r[2] for r in rs)
        print(f"  {mode:15s} -> {CLASS_TO_CATEGORY[mode]:12s} {sum(r[2] == r[3] for r in rs):3d}/{len(rs):3d}  {dict(said)}")
    if a.show_misses:
        for r in rows:
            if r[2] != r[3]:
                print("  miss", r[4], r[2], "want", r[3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
