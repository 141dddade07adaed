"""Capture real /proc files of real rank processes for tests/agent/sources (run as root).

    python3 tests/data/proc/capture.py

Writes, next to this file, one /proc-shaped tree per scenario (``<scenario>/<pid>/``
with ``environ cmdline cgroup stat statm``, ``<scenario>/stat`` = /proc/stat at
capture, ``<scenario>/roles.json`` = which pid is what, with the versions seen).
Every process runs with a clean environment (PATH, HOME, LANG, OMP_NUM_THREADS
only), so no secret of the capturing shell lands in a file.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ("environ", "cmdline", "cgroup", "stat", "statm")
ENV = {"PATH": os.environ["PATH"], "HOME": "/root", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}

WORKER = r"""
import os, subprocess, sys, time
out = os.environ["FF_CAP_OUT"]
# one helper child with the same environment, as a DataLoader worker would have
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.path.join(out, f"rank{os.environ['RANK']}.pid"), "w") as f:
    f.write(f"{os.getpid()} {helper.pid}")
time.sleep(120)
"""


def copy_proc(pid: int, dest: Path) -> None:
    d = dest / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (d / name).write_bytes(Path(f"/proc/{pid}/{name}").read_bytes())


def cgroups(tag: str) -> list[Path]:
    """A v1 memory cgroup and, on a hybrid host, a v2 one, both .../job_4242."""
    made = []
    for root in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/unified")):
        if root.is_dir():
            p = root / tag / "job_4242"
            p.mkdir(parents=True)
            made.append(p)
    return made


def remove(cgs: list[Path]) -> None:
    for p in cgs:
        for d in (p, p.parent):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def launcher(scenario: str, argv: list[str], extra_env: dict[str, str]) -> None:
    dest = HERE / scenario
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    tmp = Path(tempfile.mkdtemp(prefix="ff-pcap-"))
    (tmp / "worker.py").write_text(WORKER)
    cgs = cgroups(f"ff-pcap-{os.getpid()}-{scenario}")
    join = "; ".join(f"echo $$ > {p}/cgroup.procs" for p in cgs)
    cmd = ["sh", "-c", f'{join}; exec "$@"', "sh", *argv, str(tmp / "worker.py")]
    proc = subprocess.Popen(cmd, env={**ENV, **extra_env, "FF_CAP_OUT": str(tmp)},
                            cwd=tmp, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while len(list(tmp.glob("rank*.pid"))) < 2:
            if time.time() > deadline or proc.poll() is not None:
                raise SystemExit(f"{scenario}: workers did not start (rc={proc.poll()})")
            time.sleep(0.2)
        time.sleep(0.5)
        ranks, helpers = {}, []
        for f in sorted(tmp.glob("rank*.pid")):
            pid, helper = map(int, f.read_text().split())
            ranks[f.stem[4:]] = pid
            helpers.append(helper)
        for pid in (proc.pid, *ranks.values(), *helpers):
            copy_proc(pid, dest)
        shutil.copy("/proc/stat", dest / "stat")
        # launchers between the agent and the workers (deepspeed: runner -> launch.py)
        between = sorted({int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
                          for p in ranks.values()} - {proc.pid})
        for pid in between:
            copy_proc(pid, dest)
        roles = {"launcher": proc.pid, "intermediate": between, "ranks": ranks,
                 "helpers": helpers, "argv": argv, "cgroups": [str(p) for p in cgs],
                 "captured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "kernel": platform.release(), "python": platform.python_version()}
        (dest / "roles.json").write_text(json.dumps(roles, indent=1) + "\n")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        # torchrun starts its workers in their own sessions: kill what the cgroup holds
        for pid in (cgs[0] / "cgroup.procs").read_text().split() if cgs else ():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        time.sleep(0.5)
        remove(cgs)
        shutil.rmtree(tmp)


def zombies() -> None:
    """Unreaped children: one killed by SIGKILL, one that exited with code 3."""
    dest = HERE / "zombie"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    roles = {}
    for role, code in (("sigkill", "import time; time.sleep(60)"), ("exit3", "raise SystemExit(3)")):
        p = subprocess.Popen([sys.executable, "-c", code], env={**ENV, "RANK": "0", "LOCAL_RANK": "0"})
        if role == "sigkill":
            time.sleep(0.3)
            p.send_signal(signal.SIGKILL)
        while Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.05)
        d = dest / str(p.pid)
        d.mkdir()
        (d / "stat").write_bytes(Path(f"/proc/{p.pid}/stat").read_bytes())
        roles[role] = {"pid": p.pid, "returncode": p.wait()}
    (dest / "roles.json").write_text(json.dumps(roles, indent=1) + "\n")


if __name__ == "__main__":
    if os.geteuid() != 0:
        raise SystemExit("run as root (cgroups, other processes' environ)")
    launcher("torchrun", ["torchrun", "--standalone", "--nproc_per_node", "2"], {})
    launcher("deepspeed", ["deepspeed", "--num_gpus", "2"], {"DS_ACCELERATOR": "cpu"})
    zombies()
