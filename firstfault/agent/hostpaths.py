"""Where the host's /proc, /sys, /dev and /run are, so sources never hard-code them.

On a node the defaults hold. In a container that mounts the host at ``/host``,
``HostPaths.from_root("/host")`` gives ``/host/proc``, ``/host/sys``, ... (as
node_exporter's ``--path.procfs``/``--path.sysfs``). Tests point single roots at
fixture trees: ``HostPaths(proc="tests/data/proc/rank0")``.

Invariants: paths are plain strings without a trailing slash; nothing here touches
the file system, so building a HostPaths never fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HostPaths:
    """The roots of the host's pseudo file systems (strings, no trailing slash)."""

    proc: str = "/proc"
    sys: str = "/sys"
    dev: str = "/dev"
    run: str = "/run"

    @classmethod
    def from_root(cls, root: str = "/") -> HostPaths:
        """Paths under ``root``: ``from_root("/host").proc == "/host/proc"``."""
        root = root.rstrip("/")
        return cls(proc=f"{root}/proc", sys=f"{root}/sys", dev=f"{root}/dev", run=f"{root}/run")

    def __post_init__(self) -> None:
        for name in ("proc", "sys", "dev", "run"):
            value = getattr(self, name)
            if len(value) > 1 and value.endswith("/"):
                object.__setattr__(self, name, value.rstrip("/"))

    @property
    def is_default_proc(self) -> bool:
        """Whether /proc is this process' own /proc (pids here are our pid namespace's)."""
        return os.path.realpath(self.proc) == "/proc"

    # Common files, named once here.
    @property
    def kmsg(self) -> str:
        return f"{self.dev}/kmsg"

    @property
    def boot_id(self) -> str:
        return f"{self.proc}/sys/kernel/random/boot_id"

    @property
    def cgroup_root(self) -> str:
        """The cgroup file system mount point (v1 controllers or the v2 tree live below)."""
        return f"{self.sys}/fs/cgroup"

    def pid(self, pid: int, name: str = "") -> str:
        """``/proc/<pid>`` or ``/proc/<pid>/<name>``."""
        return f"{self.proc}/{pid}/{name}" if name else f"{self.proc}/{pid}"
