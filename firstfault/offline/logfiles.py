"""Read log files and folders from disk into Events (the I/O side of ``analyze``).

What a path can be:

- a file: a rank log, a launcher's console output, a pasted log where ranks
  interleave (``[rankN]:``/tee/srun prefixes tell them apart), a kernel log
  (detected from its first lines: /dev/kmsg records, dmesg, dmesg -T,
  journalctl -k), a torchelastic ``error.json``, a PyTorch Flight Recorder dump
  (``<prefix><rank>``, pickle or JSON: firstfault/offline/flight_files.py); ``.gz`` files
  are read through gzip, at most MAX_GZ_RATIO times their size (at least MIN_GZ_LIMIT): a
  gzip bomb stops there, with a gap saying so, after what was read (real logs compress
  5-50x; deflate at most ~1000x).
- a folder, walked in name order: torchrun ``--log-dir`` layouts
  (``<run>/attempt_<k>/<local_rank>/{stdout,stderr}.log`` and ``error.json``),
  DeepSpeed ``--enable_each_rank_log`` files (``<timestamp>_rank<N>.log``), and
  anything else as a plain log. Checkpoint folders (a ``latest`` file,
  ``global_step*``) and binary files are skipped.
- the kubelet's container logs (``/var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log``
  and its rotated ``.log.<time>[.gz]``, the CRI format): a line the runtime split into
  partial records is read as one (firstfault/common/crilog.py ``rejoin``).
- ``NODE=PATH``: everything under PATH is node NODE's.
- ``-``: standard input (a pasted log).

Unreadable, binary and empty inputs do not stop the rest: each becomes a gap
(``{"file": ..., "reason": ...}``) that the report lists.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone, tzinfo

from firstfault.analysis import traceback as tb
from firstfault.analysis.events import KIND_RECORD, KIND_TRACEBACK, Event
from firstfault.analysis.kernel import ParseStats, detect_kernel_format, parse_kernel_log
from firstfault.analysis.parse import looks_srun_labelled
from firstfault.analysis.scan import Needles, StreamInfo, scan_stream
from firstfault.common.crilog import parse_pod_log_path, rejoin
from firstfault.common.layouts import TORCHRUN, parse_log_path
from firstfault.offline.flight_files import dump_rank, flight_recorder_events, looks_like_dump

CHUNK = 1 << 20
MAX_GZ_RATIO = 200  # a .gz is read up to this many times its own size ...
MIN_GZ_LIMIT = 64 << 20  # ... or this many bytes, whichever is more
MAX_CRI_LINE_BYTES = 1 << 20  # a line joined from a CRI log's partial records is cut here (scan cuts again)

_SKIP_DIRS = re.compile(r"^(global_step\d+|\..*|__pycache__)$")
# Not logs: checkpoints and other binary data, and the sources and configs that often sit
# beside logs (a training script's own "raise ValueError" is no failure).
_SKIP_EXT = (".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".pkl", ".npy", ".zip", ".tar", ".json.lock",
             ".py", ".sh", ".json", ".yaml", ".yml", ".toml", ".cfg", ".ini",
             ".md", ".html", ".htm", ".png", ".svg", ".jpg")  # a folder's README and reports are no logs


@dataclass(slots=True)
class Source:
    """One input file and what its path says."""

    path: str  # "-" for stdin
    node: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    kind: str = "log"  # log | kernel | error.json
    attempt: int | None = None


@dataclass(slots=True)
class ReadResult:
    """Everything read: events come through the iterator; the rest fills in as it goes."""

    rank_nodes: dict[int, str | None] = field(default_factory=dict)
    gaps: list[dict] = field(default_factory=list)
    bytes_read: int = 0
    launcher: str | None = None


def _cut(head: bytes, total: int) -> bytes:
    """A joined CRI line over MAX_CRI_LINE_BYTES: its head and how much was dropped."""
    return head + b" [line cut by firstfault: %d bytes dropped]" % (total - len(head))


def _is_checkpoint_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "latest")) or os.path.basename(path).startswith("global_step")


def discover(paths: list[str], *, node: str | None = None, kernel: list[str] | None = None) -> list[Source]:
    """The input files under the given paths, with what their paths say."""
    out: list[Source] = []
    # a kernel log given with --kernel is read as one, not again as a file found in a folder
    explicit = {os.path.realpath(k.split("=", 1)[1] if "=" in k and not os.path.exists(k) else k)
                for k in kernel or []}
    for arg in paths:
        nd = node
        if "=" in arg and not os.path.exists(arg):
            nd, arg = arg.split("=", 1)
        if arg == "-":
            out.append(Source("-", nd))
        elif os.path.isdir(arg):
            found = []
            for dirpath, dirnames, filenames in os.walk(arg):
                dirnames[:] = sorted(d for d in dirnames if not _SKIP_DIRS.match(d)
                                     and not _is_checkpoint_dir(os.path.join(dirpath, d)))
                for name in sorted(filenames):
                    if name.startswith(".") or name == "latest" or (name.endswith(_SKIP_EXT) and name != "error.json"):
                        continue
                    if os.path.realpath(os.path.join(dirpath, name)) in explicit:
                        continue
                    found.append(_source(os.path.join(dirpath, name), nd))
            out += found if nd is not None else _per_node_folders(arg, found)
        else:
            out.append(_source(arg, nd))
    for k in kernel or []:
        nd = node
        if "=" in k and not os.path.exists(k):
            nd, k = k.split("=", 1)
        out.append(Source(k, nd, kind="kernel"))
    return out


def _per_node_folders(top: str, found: list[Source]) -> list[Source]:
    """One folder per node: where two or more folders right under ``top`` each hold a torchrun
    worker layout (local ranks, which repeat on every node), each folder's name is the node of
    the files under it (as ``NODE=PATH`` would say). Otherwise ``found`` as it is."""
    def folder(path: str) -> str:
        return os.path.relpath(path, top).split(os.sep, 1)[0]

    workers = {folder(src.path) for src in found if src.local_rank is not None and os.sep in os.path.relpath(src.path, top)}
    if len(workers) < 2:
        return found
    return [replace(src, node=folder(src.path)) if folder(src.path) in workers else src for src in found]


def _source(path: str, node: str | None) -> Source:
    lp = parse_log_path(path)  # the launchers' layouts: firstfault/common/layouts.py
    if lp is not None and lp.layout == TORCHRUN:
        kind = "error.json" if lp.name == "error.json" else "log"
        return Source(path, node, local_rank=lp.local_rank, kind=kind, attempt=lp.attempt)
    if lp is not None:
        return Source(path, node, rank=lp.rank)
    if path.endswith("error.json"):
        return Source(path, node, kind="error.json")
    return Source(path, node)


def _open(path: str):
    if path == "-":
        buf = sys.stdin.buffer
        return buf if hasattr(buf, "peek") else io.BufferedReader(buf)
    f = open(path, "rb")
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=f)
    return f


def _gz_limit(path: str) -> int | None:
    """How far a .gz file may inflate before it counts as a bomb (None: not gzip)."""
    return max(MIN_GZ_LIMIT, MAX_GZ_RATIO * os.path.getsize(path)) if path.endswith(".gz") else None


def skip_hole(f, limit: int | None = None) -> int:
    """Read past the NULs at the head of ``f`` (a file with ``peek``), at most ``limit``
    bytes of them; how many were skipped. The rest of the file reads as before."""
    skipped = 0
    while hasattr(f, "peek") and (limit is None or skipped < limit):
        head = f.peek(CHUNK)
        n = len(head) - len(head.lstrip(b"\0"))
        if n == 0:
            break
        f.read(n)
        skipped += n
    return skipped


_TEXT_BYTES = bytes(range(0x20, 0x7F)) + b"\t\n\r\f\b\x07\x1b" + bytes(range(0x80, 0x100))
BINARY_SHARE = 0.1  # a sample with more control bytes (NULs and such) than this is no log


def looks_binary(sample: bytes) -> bool:
    """Whether a file's first bytes are binary data, not a log: judged on the whole sample
    (control bytes other than tabs, newlines and escapes above BINARY_SHARE of it), so a
    stray NUL or a few in a log do not hide it."""
    if not sample:
        return False
    return len(sample.translate(None, _TEXT_BYTES)) > BINARY_SHARE * len(sample)


def _chunks(f, res: ReadResult, progress: Callable[[int], None] | None,
            path: str = "") -> Iterator[bytes]:
    limit = _gz_limit(path)
    done = 0
    while True:
        b = f.read(CHUNK)
        if not b:
            return
        done += len(b)
        if limit is not None and done > limit:
            res.gaps.append({"file": path, "reason": f"gzip expands past {limit:,} bytes "
                             f"({MAX_GZ_RATIO}x its size): a gzip bomb? read stopped there"})
            return
        res.bytes_read += len(b)
        if progress:
            progress(len(b))
        yield b


def read_events(
    sources: list[Source],
    needles: Needles,
    res: ReadResult,
    *,
    tz: tzinfo | None = None,
    kernel_boot_ns: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[Event]:
    """Events of every source, one source after another; problems go to res.gaps."""
    tz = tz or datetime.now().astimezone().tzinfo or timezone.utc
    # torchrun log dirs name local ranks; on one node (or one attempt per node) they are the global ranks
    single = len({s.node for s in sources}) <= 1
    for src in sources:
        try:
            f = _open(src.path)
        except OSError as e:
            res.gaps.append({"file": src.path, "reason": e.strerror or str(e)})
            continue
        with f if src.path != "-" else _nullctx(f):
            try:
                mtime = os.fstat(f.fileno()).st_mtime_ns if src.path != "-" and not src.path.endswith(".gz") else None
            except (OSError, io.UnsupportedOperation):
                mtime = None
            # stdin: no mtime; when it was read is no time of the job's (the year of its stamps is this one)
            try:
                # a copytruncate hole: a writer without O_APPEND goes on at its old offset
                # after `truncate -s 0`, leaving NULs before its next line; the log follows
                skip_hole(f, _gz_limit(src.path))
                head = f.peek(8192)[:8192] if hasattr(f, "peek") else b""
            except OSError as e:
                res.gaps.append({"file": src.path, "reason": e.strerror or str(e)})
                continue
            if not head:
                res.gaps.append({"file": src.path, "reason": "empty"})
                continue
            if looks_like_dump(head) and dump_rank(src.path) is not None:  # a Flight Recorder dump
                yield from flight_recorder_events(f, src.path, src.node, mtime, res)
                continue
            if looks_binary(head):
                res.gaps.append({"file": src.path, "reason": "binary, not a log"})
                continue
            year = datetime.fromtimestamp((mtime or time.time_ns()) / 1e9).year
            rank = src.rank if src.rank is not None else (src.local_rank if single else None)
            if rank is not None:
                res.rank_nodes.setdefault(rank, src.node)
            if src.kind == "error.json":
                res.launcher = res.launcher or "torchrun"
                yield from _error_json(f, src, rank, mtime, res)
                continue
            head_lines = head.decode("utf-8", "replace").splitlines()
            if src.kind == "kernel" or (rank is None and detect_kernel_format(head_lines[:20]) is not None
                                        and _mostly_kernel(head_lines)):
                yield from _kernel(f, src, year, tz, kernel_boot_ns, res, progress)
                continue
            info = StreamInfo(
                stream=src.path, source="ranklog" if rank is not None else "launcher", node=src.node, rank=rank,
                local_rank=src.local_rank, year=year, tz=tz, observed_ns=mtime,
                srun_labels=looks_srun_labelled(head_lines),
            )
            if src.attempt is not None:
                res.launcher = res.launcher or "torchrun"
            chunks = _chunks(f, res, progress, src.path)
            if src.path != "-" and parse_pod_log_path(src.path) is not None:  # the kubelet's CRI log
                chunks = rejoin(chunks, MAX_CRI_LINE_BYTES, _cut)
            try:
                yield from scan_stream(chunks, info, needles)
            except OSError as e:
                res.gaps.append({"file": src.path, "reason": f"read failed part way: {e.strerror or e}"})


class _nullctx:
    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self.f

    def __exit__(self, *a):
        return False


def _mostly_kernel(lines: list[str]) -> bool:
    """A file found in a folder counts as a kernel log only when its first lines all fit one format."""
    sample = [ln for ln in lines[:20] if ln.strip()]
    fmt = detect_kernel_format(sample)
    if fmt is None:
        return False
    st = ParseStats()
    list(parse_kernel_log(sample, fmt=fmt, stats=st))
    return st.bad_lines == 0


def _kernel(f, src: Source, year: int, tz, boot_ns, res: ReadResult, progress) -> Iterator[Event]:
    st = ParseStats()
    data = b"".join(_chunks(f, res, progress, src.path))
    lines = data.split(b"\n")
    fmt = detect_kernel_format(lines[:50])
    text = lines if fmt == "journal-export" else [ln.decode("utf-8", "replace") for ln in lines]
    events = list(parse_kernel_log(text, fmt=fmt, node=src.node, boot_wall_ns=boot_ns, year=year, tz=tz,
                                   stream=src.path, stats=st))
    if fmt in ("kmsg", "dmesg") and boot_ns is None and events:
        # Monotonic stamps: this machine's boot time fits only if the log can be from this boot.
        boot, unc = _this_boot()
        last = max(e.fields.get("mono_ns") or 0 for e in events)
        if last <= time.clock_gettime_ns(time.CLOCK_BOOTTIME):
            events = [replace(e, occurred_ns=boot + e.fields["mono_ns"], clock="kmsg", uncertainty_ns=unc)
                      if e.fields.get("mono_ns") is not None else e for e in events]
            reason = ("monotonic kernel times were converted with this machine's boot time; pass "
                      "--kernel-boot-time if this log comes from another machine or boot")
        else:
            reason = ("monotonic kernel times reach past this machine's uptime, so the log is from another "
                      "boot: its events are not placed in time; pass --kernel-boot-time or give dmesg -T output")
        res.gaps.append({"file": src.path, "source": "kernel", "reason": reason})
    yield from events
    if st.bad_lines:
        res.gaps.append({"file": src.path, "source": "kernel",
                         "reason": f"{st.bad_lines} of {st.lines} lines not understood as {st.fmt or 'a kernel log'}"})


def _this_boot() -> tuple[int, int]:
    """This machine's boot time on the wall clock (as dmesg -T computes it), and its error."""
    now = time.time_ns()
    return now - time.clock_gettime_ns(time.CLOCK_BOOTTIME), 1_000_000


def _error_json(f, src: Source, rank: int | None, mtime: int | None, res: ReadResult) -> Iterator[Event]:
    """torchelastic's error file: {"message": {"message": ..., "extraInfo": {"py_callstack", "timestamp"}}}."""
    try:
        doc = json.loads(f.read().decode("utf-8", "replace"))
        msg = doc["message"]
        if isinstance(msg, str):
            text, ts = msg, doc.get("timestamp")
        else:
            extra = msg.get("extraInfo", {})
            text = extra.get("py_callstack") or msg.get("message", "")
            ts = extra.get("timestamp")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        res.gaps.append({"file": src.path, "reason": f"not a torchelastic error file: {e}"})
        return
    occurred = int(ts) * 1_000_000_000 if str(ts or "").isdigit() else None
    text = str(text).rstrip("\n")
    r = tb.assemble(text.splitlines())
    yield Event(
        text=text, source="ranklog", kind=KIND_TRACEBACK if r else KIND_RECORD, node=src.node, rank=rank,
        local_rank=src.local_rank, occurred_ns=occurred, observed_ns=mtime, clock="line" if occurred else None,
        uncertainty_ns=1_000_000_000 if occurred else 0, origin=src.path, stream=src.path,
        frames=r.frames if r else (), exc_type=r.exc_type if r else None, fields={"message": r.message} if r else {},
    )
