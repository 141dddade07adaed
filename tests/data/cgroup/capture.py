"""Capture real cgroup v1 memory files around a real kernel OOM kill (run as root).

    python3 tests/data/cgroup/capture.py

Makes ``/sys/fs/cgroup/memory/ff-ccap-<pid>`` with ``memory.limit_in_bytes`` = 64M,
moves a python child in, copies the memory files the cgroup source reads into
``v1/oom-before/`` (child in, not yet allocating), lets the child allocate 1 MiB at
a time until the kernel kills it, copies them again into ``v1/oom-after/``, then
removes the cgroup. ``v1/`` itself gets the hierarchy root's files, so ``v1`` is a
v1 memory hierarchy a source can be pointed at. ``v1/capture.json`` records when,
the kernel, the child's return code.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = Path("/sys/fs/cgroup/memory")
FILES = ("memory.usage_in_bytes", "memory.limit_in_bytes", "memory.max_usage_in_bytes",
         "memory.failcnt", "memory.stat", "memory.oom_control")


def copy(src: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (dest / name).write_bytes((src / name).read_bytes())


def main() -> None:
    if os.geteuid() != 0 or not (ROOT / "memory.usage_in_bytes").exists():
        raise SystemExit("needs root and the cgroup v1 memory controller at " + str(ROOT))
    out = HERE / "v1"
    shutil.rmtree(out, ignore_errors=True)
    cg = ROOT / f"ff-ccap-{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "memory.limit_in_bytes").write_text("64M")
        child = subprocess.Popen(
            [sys.executable, "-c", "import os, sys\n"
             f"open({str(cg / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
             "sys.stdin.readline()\nb = []\nwhile True:\n    b.append(b'\\x01' * (1 << 20))\n"],
            stdin=subprocess.PIPE, env={"PATH": os.environ["PATH"]})
        while str(child.pid) not in (cg / "cgroup.procs").read_text().split():
            time.sleep(0.05)
        copy(ROOT, out)
        copy(cg, out / "oom-before")
        child.stdin.write(b"go\n")
        child.stdin.flush()
        rc = child.wait(timeout=60)
        copy(cg, out / "oom-after")
        (out / "capture.json").write_text(json.dumps({
            "captured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "kernel": platform.release(), "cgroup": f"/{cg.name}", "limit": "64M",
            "child_returncode": rc}, indent=1) + "\n")
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


if __name__ == "__main__":
    main()
