"""A Debian container booted with systemd as PID 1 (systemd-nspawn), for the deploy tests.

``ensure_rootfs()`` debootstraps Debian bookworm once per machine into
/var/cache/firstfault/bookworm (under a lock; a half-made tree never takes the
final name). ``Container`` boots it with ``--volatile=overlay`` (the cached tree
stays pristine: every write lands in a tmpfs), without registering with a host
systemd (``--register=no --keep-unit``: the host need not run systemd), and runs
commands inside through nsenter into the container's PID 1 namespaces.

Needs root, systemd-container and debootstrap (apt), and the Debian mirror the
first time.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

CACHE = Path("/var/cache/firstfault")
ROOTFS = CACHE / "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = "systemd,systemd-sysv,dbus,python3,python3-venv,util-linux,procps,iproute2"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def missing_tools() -> str | None:
    """Why the container tests can not run here; None when they can."""
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("systemd-nspawn", "debootstrap", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} missing (apt install systemd-container debootstrap)"
    if not os.path.exists("/dev/kmsg"):
        return "no /dev/kmsg"
    return None


def ensure_rootfs() -> Path:
    """The cached bookworm tree, made once (several minutes, needs the mirror)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (ROOTFS / "usr/bin/python3").exists():
            tmp = CACHE / "bookworm.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            subprocess.run(["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm",
                            str(tmp), MIRROR], check=True, capture_output=True, timeout=1800)
            tmp.rename(ROOTFS)
    return ROOTFS


class Container:
    """One booted container; ``run(cmd)`` runs a shell command inside, as root."""

    def __init__(self, name: str, log: Path, *, binds_ro: dict[str, str] | None = None,
                 binds: tuple[str, ...] = ()) -> None:
        self.name, self.log = name, log
        args = ["systemd-nspawn", "-D", str(ensure_rootfs()), "--volatile=overlay", "--register=no",
                "--keep-unit", f"--machine={name}", "--console=passive", "--capability=CAP_SYSLOG",
                *[f"--bind={b}" for b in binds],
                *[f"--bind-ro={src}:{dst}" for src, dst in (binds_ro or {}).items()], "--boot"]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.leader = self._find_leader(60)
            # systemctl fails until PID 1 serves its private socket; then --wait waits for the boot
            # ("offline": no manager to talk to yet)
            state = self.wait_for("systemd answering", lambda: self.run(
                "systemctl is-system-running --wait", check=False, timeout=180).stdout.strip().replace(
                "offline", ""), timeout=60)
            if state not in ("running", "degraded"):
                raise RuntimeError(f"container {name} did not boot: {state}\n{self.tail()}")
        except BaseException:
            self.stop()
            raise

    def _find_leader(self, timeout: float) -> int:
        """The container's PID 1 (systemd), a child of systemd-nspawn."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.proc.returncode}\n{self.tail()}")
            try:
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            except FileNotFoundError:
                children = []
            for pid in children:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                    return int(pid)
            time.sleep(0.1)
        raise RuntimeError(f"no systemd in container {self.name} after {timeout} s\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        return self.log.read_bytes()[-n:].decode("utf-8", "replace")

    def run(self, cmd: str, *, check: bool = True, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        r = subprocess.run(["nsenter", "-t", str(self.leader), "-a", "--", "/usr/bin/env", "-i",
                            f"PATH={PATH}", "LANG=C.UTF-8", *(f"{k}={v}" for k, v in (env or {}).items()),
                            "/bin/sh", "-c", cmd],
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"in {self.name}: {cmd!r} exited {r.returncode}\n{r.stdout}{r.stderr}")
        return r

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.run(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait_for(self, what: str, pred, timeout: float = 60, every: float = 0.5):
        """pred()'s first truthy value, polled; AssertionError naming ``what`` after timeout."""
        deadline = time.monotonic() + timeout
        while True:
            value = pred()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"in {self.name}: {what} not within {timeout} s")
            time.sleep(every)

    def stop(self) -> None:
        """Power off (systemd-nspawn turns SIGTERM into a clean shutdown); kill after 60 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
