"""Where launchers put per-rank log files, and what a path there says. Pure (stdlib re only).

The one place that knows these layouts: the agent's ranklog source follows them
live, the collector's offline reader (firstfault/offline/logfiles.py) walks them; the
layering test lets the collector import this module and agent.wire, nothing else
from the agent. Both layouts are taken from the launchers' own source:

- torchrun ``--log-dir DIR`` (torch.distributed.elastic, PyTorch 2.x): the run's
  folder is ``tempfile.mkdtemp(prefix=f"{rdzv_run_id}_", dir=DIR)``, then
  ``attempt_<restart_count>/<local_rank>/{stdout.log,stderr.log,error.json}``
  (error.json: what ``@record`` writes when the worker raises), e.g.
  ``logs/e4ccfcb9-c3ba-46bf-8895-b4409b29c29b_xl429e9m/attempt_0/1/stderr.log``.
  ``attempt_<n>/filtered_std{out,err}.log`` (``--local-ranks-filter``) repeat
  the ranks' lines and are not rank logs.
- DeepSpeed ``deepspeed --enable_each_rank_log DIR`` (deepspeed/launcher/launch.py):
  ``DIR/<time.strftime("%Y%m%d%H%M%S")>_rank<global rank>.log``, e.g.
  ``logs/20261202113547_rank2.log``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

TORCHRUN, DEEPSPEED = "torchrun", "deepspeed"
TORCHRUN_FILES = ("stdout.log", "stderr.log", "error.json")
_TORCHRUN = re.compile(r"(?:(?P<run_dir>[^/\\]+)[/\\])?attempt_(?P<attempt>\d+)[/\\](?P<local>\d+)"
                       r"[/\\](?P<name>stdout\.log|stderr\.log|error\.json)$")
_DEEPSPEED = re.compile(r"_rank(?P<rank>\d+)\.log$")
_MKDTEMP_SUFFIX = 9  # "_" + the 8 random characters of tempfile.mkdtemp


class LogPath(NamedTuple):
    """What a rank log's path says: which layout, and the identity in it."""

    layout: str  # TORCHRUN | DEEPSPEED
    name: str  # the file name (torchrun: stdout.log, stderr.log or error.json)
    rank: int | None = None  # global rank (DeepSpeed)
    local_rank: int | None = None  # torchrun's per-node worker folder
    attempt: int | None = None  # torchrun restart count
    run_id: str | None = None  # torchrun's rdzv run id (TORCHELASTIC_RUN_ID), if the folder shows it


def parse_log_path(path: str) -> LogPath | None:
    """The layout and identity of ``path``, None if it is in neither layout."""
    m = _TORCHRUN.search(path)
    if m:
        run_dir = m.group("run_dir") or ""
        run_id = run_dir[:-_MKDTEMP_SUFFIX] if (len(run_dir) > _MKDTEMP_SUFFIX
                                                 and run_dir[-_MKDTEMP_SUFFIX] == "_") else None
        return LogPath(TORCHRUN, m.group("name"), local_rank=int(m.group("local")),
                       attempt=int(m.group("attempt")), run_id=run_id)
    m = _DEEPSPEED.search(path)
    if m:
        return LogPath(DEEPSPEED, path.replace("\\", "/").rsplit("/", 1)[-1], rank=int(m.group("rank")))
    return None


def layout_globs(log_dir: str) -> list[str]:
    """Glob patterns (``*`` parts only) of every rank log either launcher writes under ``log_dir``."""
    base = log_dir.rstrip("/") or "/"
    base = "" if base == "/" else base
    return [f"{base}/*/attempt_*/*/{name}" for name in TORCHRUN_FILES] + [f"{base}/*_rank*.log"]
