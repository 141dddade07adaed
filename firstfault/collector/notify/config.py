"""The ``[notify]`` table of collector.toml: when a failed job is told, and to whom.

::

    [notify]
    queue_dir = "/var/lib/firstfault/notify"   # pending notices (survive restarts); default:
                                       # the SQLite file's folder + /notify (required with PostgreSQL)
    report_url = "https://head-01:7141"    # the link in a notice: REPORT_URL/jobs/JOB
                                       # (default: the collector's own http address)
    quiet_s = 30                       # a failure, then no record of the job for this long: failed
    settle_s = 2                       # margin past the first failure (plus the clock uncertainty)
                                       # every node of the job must have shipped before it is settled
    max_wait_s = 120                   # failed and not settled after this long: notify anyway
                                       # (settled = false, the nodes still behind named)
    timeout_s = 10                     # one delivery's limit (HTTP request, command run)
    max_attempts = 8                   # deliveries tried before a notice is dropped (logged)
    backoff_initial_s = 1              # retry after 1, 2, 4, ... s (each 50-100 % of it)
    backoff_max_s = 300
    max_queue = 1000                   # pending deliveries kept on disk; more drop the oldest

    [[notify.target]]                  # any number of targets
    name = "ops"                       # in log lines and metrics (the URL never is)
    type = "webhook"                   # webhook | slack | command
    url = "https://hooks.example.com/firstfault"     # webhook, slack
    secret_file = "/etc/firstfault/webhook-secret"   # webhook: HMAC-SHA256 key (docs/NOTICE.md)
    command = ["/usr/local/bin/page-oncall", "--team", "ml"]   # command: JSON on stdin
    categories = ["hardware", "host-memory"]   # filter: any of these (default: every category)
    signatures = ["kernel.*", "gpu.xid*"]      # filter: fnmatch patterns of the signature
    job = "^prod-"                     # filter: a regular expression searched in the job id
    min_confidence = "medium"          # filter: low | medium | high

A target's ``url`` and secret are kept out of repr() and the logs. Every problem of
every target is reported at once, as the other keys' are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from firstfault.common import settings

TYPES = ("webhook", "slack", "command")
CONFIDENCE = ("low", "medium", "high")
CATEGORIES = ("user-code", "config", "gpu-memory", "host-memory", "numerics", "framework",
              "hardware", "network", "storage", "cascade", "unknown")


@dataclass(frozen=True, slots=True)
class Filter:
    """Which notices a target gets; an empty part lets every notice through."""

    categories: tuple[str, ...] = ()
    signatures: tuple[str, ...] = ()  # fnmatch patterns
    job: str | None = None  # a regular expression, searched
    min_confidence: str = "low"


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    type: str
    url: str | None = field(default=None, repr=False)
    secret: bytes | None = field(default=None, repr=False)
    command: tuple[str, ...] = ()
    filter: Filter = Filter()
    timeout_s: float | None = None  # None: [notify] timeout_s


@dataclass(frozen=True, slots=True)
class NotifyConfig:
    queue_dir: Path | None = None
    report_url: str | None = None
    quiet_s: float = 30
    settle_s: float = 2
    max_wait_s: float = 120
    timeout_s: float = 10
    max_attempts: int = 8
    backoff_initial_s: float = 1
    backoff_max_s: float = 300
    max_queue: int = 1000
    target: tuple[Target, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.target)


_TARGET_KEYS = ("name", "type", "url", "secret_file", "command", "categories", "signatures", "job",
                "min_confidence", "timeout_s")


def _target(i: int, t: Any, problems: list[str]) -> Target | None:
    where = f"notify.target[{i}]"
    if type(t) is not dict:
        problems.append(f"{where}: expected a table ([[notify.target]]), got {t!r}")
        return None
    n = len(problems)
    for k in t:
        if k not in _TARGET_KEYS:
            problems.append(f"{where}.{k}: unknown key; known here: {', '.join(_TARGET_KEYS)}")

    def get(key: str, parse: settings.Parser, default: Any = None) -> Any:
        if key not in t:
            return default
        try:
            return parse(t[key], False)
        except ValueError as e:
            problems.append(f"{where}.{key}: {e}")
            return default

    name = get("name", settings.string, f"target{i}")
    kind = get("type", settings.one_of(*TYPES))
    if kind is None and "type" not in t:
        problems.append(f"{where}.type: required, one of {', '.join(TYPES)}")
    url = get("url", settings.string)
    secret_file = get("secret_file", settings.path)
    command = tuple(get("command", settings.strings(), []))
    categories = tuple(get("categories", settings.strings(settings.one_of(*CATEGORIES)), []))
    signatures = tuple(get("signatures", settings.strings(), []))
    job = get("job", settings.string)
    if job is not None:
        try:
            re.compile(job)
        except re.error as e:
            problems.append(f"{where}.job: not a regular expression: {e}")
    confidence = get("min_confidence", settings.one_of(*CONFIDENCE), "low")
    timeout = get("timeout_s", settings.number(0, strict=True))
    if kind in ("webhook", "slack"):
        if url is None:
            problems.append(f"{where}.url: required for type {kind}")
        elif not re.match(r"https?://[^/\s]+", url):
            problems.append(f"{where}.url: expected an http:// or https:// URL")
        if command:
            problems.append(f"{where}.command: only for type command")
    if kind == "command":
        if not command:
            problems.append(f"{where}.command: required for type command (a list: program, arguments)")
        if url is not None:
            problems.append(f"{where}.url: not for type command")
    if secret_file is not None and kind != "webhook":
        problems.append(f"{where}.secret_file: only for type webhook")
    secret = None
    if secret_file is not None:
        try:
            secret = secret_file.read_bytes().strip()
            if not secret:
                problems.append(f"{where}.secret_file: {secret_file} is empty")
        except OSError as e:
            problems.append(f"{where}.secret_file: cannot read {secret_file}: {e.strerror or e}")
    if len(problems) > n:
        return None
    return Target(name=name, type=kind, url=url, secret=secret, command=command, timeout_s=timeout,
                  filter=Filter(categories, signatures, job, confidence))


def parse_targets(v: Any, flag: bool) -> tuple[Target, ...]:
    """The settings parser of ``[[notify.target]]``: every problem of every target at once."""
    if flag:
        raise ValueError("targets are set in the configuration file ([[notify.target]]), not by a flag")
    if type(v) is not list:
        raise ValueError(f"expected an array of tables ([[notify.target]]), got {v!r}")
    problems: list[str] = []
    targets = [_target(i, t, problems) for i, t in enumerate(v)]
    names = [t.name for t in targets if t is not None]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"notify.target: the name {dup!r} is used twice")
    if problems:
        raise ValueError("; ".join(problems))
    return tuple(t for t in targets if t is not None)


PARSERS: dict[str, settings.Parser] = {
    "queue_dir": settings.path,
    "report_url": settings.string,
    "quiet_s": settings.number(0, strict=True),
    "settle_s": settings.number(0),
    "max_wait_s": settings.number(0, strict=True),
    "timeout_s": settings.number(0, strict=True),
    "max_attempts": settings.number(1, integer=True),
    "backoff_initial_s": settings.number(0, strict=True),
    "backoff_max_s": settings.number(0, strict=True),
    "max_queue": settings.number(1, integer=True),
    "target": parse_targets,
}
