"""checkpoints: what a job left in its checkpoint directories, inspected when it ends.

Learns each job's checkpoint directories from:

- ``dirs`` (``[sources.checkpoints] dirs = ["/ckpt/run1"]`` in agent.toml): absolute
  paths, inspected for every job on the node;
- each rank's command line (``/proc/PID/cmdline``, read once per rank, found by the
  procs source: ``ranks``, wired by the daemon), pure ``dirs_from_cmdline``:
  ``--save DIR``, ``--save_dir``/``--save-dir``, ``--output_dir``/``--output-dir``,
  ``--checkpoint_dir``/``--checkpoint-dir`` (and ``--opt=DIR``); a DeepSpeed config file
  the command line names (``--deepspeed_config``, ``--deepspeed``, ``--ds_config``,
  ``--ds-config``; JSON up to 1 MiB) gives any ``save_dir`` key in it. A relative path
  is the rank's working directory's (``/proc/PID/cwd``);
- the path in a DeepSpeed save line a rank logs (``[Rank 0] Saving model checkpoint:
  DIR/global_step4/mp_rank_00_model_states.pt``: DIR), told by the ranklog source
  (``watch``, wired by the daemon; a relative DIR is the job's ranks' working directory's).

When a rank of a job ends (it leaves the procs source's ranks), the job's directories
are inspected ``settle_s`` later (the others may still be writing, or be stopped by the
launcher), and once more when the job's last rank ended. The inspection is
firstfault/common/checkpoint_files.py's, the one ``firstfault checkpoint`` makes offline,
so the collector's verdict is the offline one. A folder that is no checkpoint (yet) is
skipped.

Emits ``checkpoint.inspection``: job = the ranks' job, message = the inspection as
compact JSON (its newest tags that fit MAX_MESSAGE_BYTES, ``latest``'s tag kept first),
fields ``path``, ``tags`` (shipped), ``tags_total``, ``trigger`` (``rank-exit`` |
``job-end``). A job without an id (no SLURM_JOB_ID, run id or job label) is not inspected:
its records would belong to no job.

Known issues: a script that takes its directory from elsewhere and logs no save line at
INFO needs ``dirs``. With ``verify_crc`` (the default, as offline) every byte of
every tag is read once per inspection.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from firstfault.agent.sources.base import Draft, PollingSource, printable, register
from firstfault.common.checkpoint_files import CheckpointPathError, inspect
from firstfault.wire import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

SOURCE_CHECKPOINTS = "checkpoints"
KIND_CHECKPOINT_INSPECTION = "checkpoint.inspection"
DIR_OPTIONS = ("--save", "--save_dir", "--save-dir", "--output_dir", "--output-dir", "--checkpoint_dir",
               "--checkpoint-dir")
CONFIG_OPTIONS = ("--deepspeed_config", "--deepspeed", "--ds_config", "--ds-config")
MAX_CONFIG_BYTES = 1 << 20
SAVE_LINE = b"Saving model checkpoint: "
_SAVE_PATH = re.compile(rb"Saving model checkpoint: (\S+)")


def dirs_from_save_lines(raw: bytes) -> set[str]:
    """The save directories DeepSpeed's save lines in ``raw`` name (the folder above the tag's). Pure."""
    if SAVE_LINE not in raw:  # one find per chunk of lines
        return set()
    out = set()
    for m in _SAVE_PATH.finditer(raw):
        tag_dir = os.path.dirname(m.group(1).decode("utf-8", "surrogateescape"))
        if tag_dir and os.path.dirname(tag_dir):
            out.add(os.path.dirname(tag_dir))
    return out


def _save_dirs(obj, depth: int = 0) -> Iterable[str]:
    """Every string ``save_dir`` in a JSON document (depth-bounded)."""
    if depth > 8:
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "save_dir" and isinstance(v, str) and v:
                yield v
            else:
                yield from _save_dirs(v, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            yield from _save_dirs(v, depth + 1)


def dirs_from_cmdline(argv: list[str], cwd: str | None,
                      read_config: Callable[[str], object | None] = lambda _p: None) -> set[str]:
    """The checkpoint directories a rank's command line names, absolute. Pure but for
    ``read_config`` (path -> the parsed JSON of a DeepSpeed config, or None)."""
    found: list[str] = []
    configs: list[str] = []
    for i, a in enumerate(argv):
        opt, eq, val = a.partition("=")
        if opt in DIR_OPTIONS or opt in CONFIG_OPTIONS:
            v = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if v and not v.startswith("-"):
                (found if opt in DIR_OPTIONS else configs).append(v)
    for c in configs:
        path = c if os.path.isabs(c) or cwd is None else os.path.join(cwd, c)
        found += list(_save_dirs(read_config(path)))
    out = set()
    for d in found:
        if os.path.isabs(d):
            out.add(os.path.normpath(d))
        elif cwd is not None:
            out.add(os.path.normpath(os.path.join(cwd, d)))
    return out


def fit_message(insp: dict, limit: int = MAX_MESSAGE_BYTES) -> tuple[str, int]:
    """The inspection as compact JSON within ``limit`` bytes: the oldest tags dropped first
    (never the one ``latest`` names); (text, tags kept)."""
    tags = list(insp["tags"])
    while True:
        text = json.dumps({**insp, "tags": tags}, separators=(",", ":"))
        if len(text.encode()) <= limit or not tags:
            return text, len(tags)
        drop = next((i for i, t in enumerate(tags) if t["tag"] != insp.get("latest")), None)
        if drop is None:
            return text[:0], 0
        tags.pop(drop)


@dataclass
class _Job:
    dirs: set[str] = field(default_factory=set)
    cwds: set[str] = field(default_factory=set)  # the ranks' working directories (relative save lines)
    pids: set[int] = field(default_factory=set)
    due: float | None = None
    trigger: str = "rank-exit"


@register
class CheckpointsSource(PollingSource):
    """Inspects a job's checkpoint directories when it ends; see the module docstring."""

    name = SOURCE_CHECKPOINTS
    interval_s = 2.0

    def __init__(self, *, dirs: list[str] | tuple[str, ...] = (), settle_s: float = 5.0, verify_crc: bool = True,
                 ranks=None, **kw) -> None:
        super().__init__(**kw)
        if isinstance(dirs, str) or not all(isinstance(d, str) and os.path.isabs(d) for d in dirs):
            raise ValueError(f"checkpoints: dirs must be a list of absolute paths, got {dirs!r}")
        if isinstance(settle_s, bool) or not isinstance(settle_s, (int, float)) or settle_s < 0:
            raise ValueError(f"checkpoints: settle_s must be a number >= 0, got {settle_s!r}")
        if not isinstance(verify_crc, bool):
            raise ValueError(f"checkpoints: verify_crc must be true or false, got {verify_crc!r}")
        self.dirs, self.settle_s, self.verify_crc = {os.path.normpath(d) for d in dirs}, float(settle_s), verify_crc
        self.ranks = ranks or (lambda: {})
        self._pids: dict[int, str] = {}  # rank pid -> its job
        self._jobs: dict[str, _Job] = {}
        self._told: dict[str, set[str]] = {}  # job -> dirs its save lines named (watch, another thread)
        self._lock = threading.Lock()

    def watch(self, ident: tuple, raw: bytes, observed_ns: int) -> None:
        """Lines of the job's ranks were read (the ranklog source's hook, once a wake per job): note
        the save dirs named."""
        found = dirs_from_save_lines(raw)
        if found and ident[0] is not None:
            with self._lock:
                self._told.setdefault(ident[0], set()).update(found)

    def _read_config(self, path: str) -> object | None:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_CONFIG_BYTES + 1)
            return None if len(data) > MAX_CONFIG_BYTES else json.loads(data)
        except (OSError, ValueError):
            return None

    def _learn(self, pid: int) -> tuple[set[str], str | None]:
        """(the checkpoint dirs a rank's command line names, its working directory)."""
        try:
            cwd = os.readlink(self.paths.pid(pid, "cwd"))
        except OSError:
            cwd = None
        try:
            with open(self.paths.pid(pid, "cmdline"), "rb") as f:
                argv = [a.decode("utf-8", "surrogateescape") for a in f.read().split(b"\0") if a]
        except OSError:
            return set(), cwd
        return dirs_from_cmdline(argv, cwd, self._read_config), cwd

    def poll(self) -> list[Draft]:
        now = time.monotonic()
        snap = self.ranks()
        for pid, ident in snap.items():
            if pid in self._pids or ident.job is None:
                continue
            job = self._jobs.setdefault(ident.job, _Job())
            dirs, cwd = self._learn(pid)
            job.dirs |= self.dirs | dirs
            if cwd is not None:
                job.cwds.add(cwd)
            job.pids.add(pid)
            self._pids[pid] = ident.job
        with self._lock:
            told, self._told = self._told, {}
        for name, dirs in told.items():
            job = self._jobs.get(name)
            if job is not None:
                job.dirs |= {os.path.normpath(d) for d in dirs if os.path.isabs(d)}
                job.dirs |= {os.path.normpath(os.path.join(c, d)) for d in dirs if not os.path.isabs(d) for c in job.cwds}
        for pid in [p for p in self._pids if p not in snap]:
            job = self._jobs[self._pids.pop(pid)]
            job.pids.discard(pid)
            job.due, job.trigger = now + self.settle_s, ("job-end" if not job.pids else "rank-exit")
        out: list[Draft] = []
        for name, job in list(self._jobs.items()):
            if job.due is not None and now >= job.due:
                out += self._inspect(name, job)
                job.due = None
                if not job.pids:
                    del self._jobs[name]
        return out

    def _inspect(self, name: str, job: _Job) -> list[Draft]:
        out = []
        for d in sorted(job.dirs):
            try:
                insp = inspect(d, verify_crc=self.verify_crc)
            except CheckpointPathError as e:
                log.debug("not a checkpoint dir=%s job=%s why=%s", d, name, e)
                continue
            text, kept = fit_message(insp)
            out.append(self.draft(KIND_CHECKPOINT_INSPECTION, message=text, job=name,
                                  fields={"path": printable(d), "tags": kept, "tags_total": len(insp["tags"]),
                                          "trigger": job.trigger}))
            log.info("checkpoint inspected job=%s path=%s tags=%d latest=%s", name, d, len(insp["tags"]),
                     insp.get("latest"))
        return out
