"""The tail tests' shared fixture: no test may leak a thread, an inotify instance or a file."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest


def open_fds(tmp: Path) -> tuple[int, list[str]]:
    inotify, ours = 0, []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == "anon_inode:inotify":
            inotify += 1
        elif target.startswith(str(tmp)):
            ours.append(target)
    return inotify, ours


@pytest.fixture(autouse=True)
def no_leaks(tmp_path):
    """Every test leaves no thread, no inotify instance and no open file of its own."""
    threads = set(threading.enumerate())
    inotify, _ = open_fds(tmp_path)
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
        if not left and open_fds(tmp_path)[0] <= inotify:
            break
        time.sleep(0.02)
    assert not left, f"threads left running: {left}"
    now_inotify, ours = open_fds(tmp_path)
    assert now_inotify <= inotify, "inotify instance left open"
    assert not ours, f"files left open: {ours}"
