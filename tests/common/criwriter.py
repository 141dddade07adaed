"""Write container logs as a CRI runtime does for the kubelet (containerd's CRI logger).

Each line a program writes becomes records ``<RFC3339Nano> <stream> <P|F> <content>``: a
line longer than the runtime's buffer is split into ``P`` records and ends in an ``F``
one; Go's RFC3339Nano drops trailing zeros of the fraction (and the fraction when it is
zero). Rotation as the kubelet's container log manager does it: rename ``<n>.log`` to
``<n>.log.<YYYYmmdd-HHMMSS>``, the runtime reopens ``<n>.log``; older rotated files gzipped.
"""

from __future__ import annotations

import gzip
import os
from datetime import datetime, timezone
from pathlib import Path

BUF = 16 * 1024  # containerd's default max_container_log_line_size


def rfc3339nano(ns: int) -> str:
    """Go's time.RFC3339Nano of a UTC time: fraction without trailing zeros."""
    secs, frac = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(secs, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{frac:09d}".rstrip("0")
    return f"{base}.{digits}Z" if digits else f"{base}Z"


def records(stream: str, line: bytes, ns: int, buf: int = BUF) -> bytes:
    """The records of one line the program wrote (without its newline)."""
    chunks = [line[i:i + buf] for i in range(0, len(line), buf)] or [b""]
    out = b""
    for i, chunk in enumerate(chunks):
        tag = b"F" if i == len(chunks) - 1 else b"P"
        out += rfc3339nano(ns + i * 1000).encode() + b" " + stream.encode() + b" " + tag + b" " + chunk + b"\n"
    return out


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def rotate(path: Path, when: datetime, gzip_older: bool = True) -> Path:
    """Rename ``path`` to ``<path>.<stamp>`` and gzip the rotated files before it."""
    rotated = Path(f"{path}.{when.strftime('%Y%m%d-%H%M%S')}")
    for old in sorted(path.parent.glob(path.name + ".*")):
        if gzip_older and not old.name.endswith(".gz"):
            old.with_name(old.name + ".gz").write_bytes(gzip.compress(old.read_bytes()))
            old.unlink()
    os.rename(path, rotated)
    path.touch()  # the runtime reopens the log
    return rotated
