"""flightrec: the PyTorch Flight Recorder dumps the ranks write, one record each.

A rank with ``TORCH_FR_BUFFER_SIZE`` (older: ``TORCH_NCCL_TRACE_BUFFER_SIZE``) > 0
records its last collectives; its dump goes to ``<prefix><rank>``, the prefix from its
environment: ``TORCH_FR_DUMP_TEMP_FILE``, else ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, else
torch's default ``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_`` (``$HOME/.cache``
without XDG_CACHE_HOME), relative to the rank's working directory if relative. NCCL
writes it on a watchdog timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``); any rank may write it
with ``torch._C._distributed_c10d._dump_fr_trace()`` (gloo has no dump of its own).

Each poll (``interval_s``) reads the environment of ranks the procs source found
(``ranks``, wired by the daemon; ``/proc/PID/environ``: the procs source's privileges)
once, and looks in each prefix's folder for ``<prefix><digits>`` files modified since
that rank started, plus the configured ``prefixes``. A file is read once it has not
changed for ``settle_s`` (a dump being written is not read half-way), up to
``max_file_bytes``, and parsed by firstfault/analysis/frdump.py (restricted unpickler:
nothing is imported or called; or JSON).

Emits (source "flightrec"): ``rank.flight_recorder``: message = the dump as compact
JSON (``frdump.to_message``: the newest entries that fit MAX_MESSAGE_BYTES),
occurred_ns = the file's mtime, rank = the file name's digits, job and pid of the rank
that named the prefix; fields ``path``, ``format``, ``bytes``, ``version``,
``entries_total``, ``entries_shipped``. A file that is no readable dump, or too large:
``rank.gap`` with ``reason`` (``unreadable_dump``, ``too_large``) and ``detail``.

Exactly once: what was shipped (path, inode, size, mtime) is kept in
``<state_dir>/flightrec.json``; a dump written again (a later timeout) is new. A
prefix is forgotten ``keep_s`` after the last rank that named it ended.
"""

from __future__ import annotations

import logging
import os
import time

import psutil

from firstfault.agent.sources.base import Draft, PollingSource, StateFile, printable, register
from firstfault.agent.sources.procs import parse_environ
from firstfault.analysis.frdump import FRFormatError, parse_dump, to_message
from firstfault.wire import KIND_RANK_FLIGHT_RECORDER, SOURCE_FLIGHTREC

log = logging.getLogger(__name__)

KIND_RANK_GAP = "rank.gap"
DEFAULT_NAME = "comm_lib_trace_rank_"
MAX_SHIPPED_KEPT = 4096


def dump_prefix(env: dict[str, str], cwd: str | None = None) -> str | None:
    """Where a rank with environment ``env`` writes its Flight Recorder dump (without the
    rank), None when its Flight Recorder is off. Pure."""
    size = env.get("TORCH_FR_BUFFER_SIZE", env.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0")).strip()
    if not size.isdigit() or int(size) <= 0:
        return None
    prefix = env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if not prefix:
        cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or "/tmp", ".cache")
        prefix = os.path.join(cache, "torch", DEFAULT_NAME)
    if not os.path.isabs(prefix):
        if not cwd:
            return None
        prefix = os.path.join(cwd, prefix)
    return os.path.normpath(prefix) + ("/" if prefix.endswith("/") else "")


class _Prefix:
    __slots__ = ("job", "pids", "since_ns", "gone_at")

    def __init__(self, job, since_ns: int) -> None:
        self.job, self.pids, self.since_ns, self.gone_at = job, {}, since_ns, None


@register
class FlightrecSource(PollingSource):
    """Ships Flight Recorder dumps; see the module docstring. Options = ``[sources.flightrec]``."""

    name = SOURCE_FLIGHTREC
    interval_s = 2.0

    def __init__(self, *, prefixes: list[str] | tuple[str, ...] = (), max_file_bytes: int = 64 << 20,
                 settle_s: float = 1.0, keep_s: float = 3600.0, ranks=None, **kw) -> None:
        super().__init__(**kw)
        if isinstance(prefixes, str) or not all(isinstance(p, str) and os.path.isabs(p) for p in prefixes):
            raise ValueError(f"flightrec: prefixes must be a list of absolute paths, got {prefixes!r}")
        for name, v in (("settle_s", settle_s), ("keep_s", keep_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"flightrec: {name} must be a number >= 0, got {v!r}")
        if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int) or max_file_bytes < 1024:
            raise ValueError(f"flightrec: max_file_bytes must be an int >= 1024, got {max_file_bytes!r}")
        self.max_file_bytes, self.settle_s, self.keep_s = max_file_bytes, float(settle_s), float(keep_s)
        self.ranks = ranks or (lambda: {})
        self._prefixes: dict[str, _Prefix] = {p: _Prefix(None, 0) for p in prefixes}
        self._fixed = set(prefixes)
        self._seen_pids: set[int] = set()
        self._sizes: dict[str, tuple] = {}  # path -> (ino, size, mtime_ns) at the last poll
        self._state = StateFile(self.state_dir, "flightrec")
        loaded = (self._state.load() or {}).get("shipped", {})
        self._shipped: dict[str, list] = {k: v for k, v in loaded.items() if isinstance(v, list)}

    # --- learning prefixes from the ranks ------------------------------------------------

    def _learn(self, now_ns: int) -> None:
        alive = self.ranks()
        for pid, ident in alive.items():
            if pid in self._seen_pids:
                continue
            self._seen_pids.add(pid)
            try:
                with open(self.paths.pid(pid, "environ"), "rb") as f:
                    env = parse_environ(f.read())
                cwd = os.readlink(self.paths.pid(pid, "cwd"))
                started = int(psutil.Process(pid).create_time() * 1e9)
            except (OSError, psutil.Error):
                continue
            prefix = dump_prefix(env, cwd)
            if prefix is None:
                continue
            since = started - 1_000_000_000  # dumps from before this rank started are another job's
            p = self._prefixes.get(prefix)
            if p is None:
                p = self._prefixes[prefix] = _Prefix(ident.job, since)
                log.info("flightrec: watching prefix=%s job=%s", prefix, ident.job)
            elif prefix not in self._fixed:
                p.since_ns = min(p.since_ns, since)
            p.pids[pid] = ident
            p.gone_at = None
        self._seen_pids &= set(alive)
        mono = time.monotonic()
        for name, p in list(self._prefixes.items()):
            if name in self._fixed:
                continue
            if not set(p.pids) & set(alive):
                p.gone_at = p.gone_at or mono
                if mono - p.gone_at > self.keep_s:
                    del self._prefixes[name]

    # --- finding and reading dumps -----------------------------------------------------

    def _candidates(self, prefix: str):
        folder, base = os.path.split(prefix)
        try:
            with os.scandir(folder or "/") as it:
                for e in it:
                    rest = e.name[len(base):]
                    if e.name.startswith(base) and rest.isdigit() and e.is_file(follow_symlinks=False):
                        yield e.path, int(rest), e.stat(follow_symlinks=False)
        except OSError:
            return

    def poll(self) -> list[Draft]:
        now_ns = time.time_ns()
        self._learn(now_ns)
        out: list[Draft] = []
        sizes: dict[str, tuple] = {}
        for prefix, p in self._prefixes.items():
            for path, rank, st in self._candidates(prefix):
                key = (st.st_ino, st.st_size, st.st_mtime_ns)
                sizes[path] = key
                if st.st_mtime_ns < p.since_ns or self._shipped.get(path) == list(key):
                    continue
                if self._sizes.get(path) != key or (now_ns - st.st_mtime_ns) / 1e9 < self.settle_s:
                    continue  # still being written, or new this poll: read it once it has settled
                out.append(self._read(path, rank, p, st))
                self._shipped[path] = list(key)
        self._sizes = sizes
        if out:
            if len(self._shipped) > MAX_SHIPPED_KEPT:
                self._shipped = {k: v for k, v in self._shipped.items() if k in sizes}
            self._state.save({"shipped": self._shipped})
        return out

    def _read(self, path: str, rank: int, p: _Prefix, st) -> Draft:
        pid = next((pid for pid, i in p.pids.items() if i.rank == rank), None)
        ident = p.pids.get(pid) if pid is not None else None
        who = {"job": p.job, "rank": rank, "local_rank": ident.local_rank if ident else None, "pid": pid}
        fields = {"path": printable(path), "bytes": st.st_size}
        if st.st_size > self.max_file_bytes:
            return self._gap(who, "too_large", f"{path}: {st.st_size} bytes, more than {self.max_file_bytes}", fields)
        try:
            with open(path, "rb") as f:
                data = f.read(self.max_file_bytes + 1)
            dump = parse_dump(data)
        except (OSError, FRFormatError) as e:
            return self._gap(who, "unreadable_dump", f"{path}: {e}", fields)
        msg = to_message(dump)
        shipped = msg.count('"record_id":')
        fields.update(format=dump.fmt, version=printable(dump.version, 64), entries_total=dump.entries_total,
                      entries_shipped=shipped)
        log.info("flightrec: dump shipped path=%s rank=%s entries=%d/%d", path, rank, shipped, dump.entries_total)
        return self.draft(KIND_RANK_FLIGHT_RECORDER, msg, occurred_ns=st.st_mtime_ns, severity=5,
                          fields=fields, **who)

    def _gap(self, who: dict, reason: str, detail: str, fields: dict) -> Draft:
        return self.draft(KIND_RANK_GAP, f"Flight Recorder dump not shipped: {reason}: {detail}", severity=4,
                          fields={**fields, "reason": reason, "detail": printable(detail)}, **who)
