"""Collector configuration: a TOML file and command-line flags -> a frozen CollectorConfig.

A whole file (every key optional; these are the defaults, except token_file, node_tokens_file
and tls)::

    listen = "127.0.0.1:7140"          # agents connect here (HOST:PORT, [v6]:PORT)
    http = "127.0.0.1:7141"            # the query API
    db = "./firstfault.db"             # the store: a SQLite file (created if absent), or
                                       # postgresql://USER:PASSWORD@HOST:PORT/DB (or postgres://;
                                       # libpq URL syntax; needs firstfault[postgres]): one
                                       # database several collectors can share
    token_file = "/etc/firstfault/token"   # required unless listen is loopback; one token a
                                       # line, any accepted (rotation: firstfault/common/tokens.py)
    node_tokens_file = "/etc/firstfault/node-tokens"  # "NODE TOKEN" a line: a hello is then
                                       # accepted only with the token of the node it names
                                       # (token_file's tokens then serve the HTTP API only)
    http_open_on_loopback = false      # true: with a token_file, the HTTP API on a loopback
                                       # address still answers without the token (then any local
                                       # user reads every job); false: the token applies to
                                       # every listener
    log_level = "info"                 # debug, info, warning, error

    [tls]                              # all absent: plain TCP
    cert = "/etc/firstfault/collector.pem"
    key = "/etc/firstfault/collector.key"
    client_ca = "/etc/firstfault/agents-ca.pem"   # set: agents need a client cert (mTLS)
    bind_node = false                  # true (with client_ca): a hello's node must be its client
                                       # certificate's common name or one of its DNS names

    [retention]                        # 0: no bound
    max_age_days = 30
    max_bytes = 0
    prune_interval_s = 600

    [limits]
    max_connections = 1024
    max_unauthenticated = 256          # connections before their hello; more close the oldest
    max_batch_records = 10000          # told to agents in welcome (<= the wire's 10000)
    max_frame_bytes = 8388608          # likewise (<= the wire's 8 MiB)
    max_inflight_records = 100000      # records read but not yet stored, all connections
    read_timeout_s = 120               # no whole frame for this long: close

    [redact]                           # reports and bundles: secrets replaced (see the agent's)
    enabled = true
    defaults = true
    patterns = []

    [clock]                            # NTP-style offsets of the nodes' clocks
    ping_interval_s = 10
    samples = 8
    drift_ppm = 50
    save_interval_s = 60

    [notify]                           # telling people of failed jobs: firstfault/collector/notify/config.py
    quiet_s = 30                       # (its keys, and [[notify.target]] webhooks, Slack, commands)

Flags: every top-level key KEY is ``--KEY`` and every key KEY of table T is
``--T-KEY``, underscores written as dashes (``--token-file``, ``--tls-client-ca``,
``--limits-read-timeout-s``); ``--config FILE`` names the file; flags win over it.
Unknown keys and flags, wrong types and bad values are all collected and raised as
one ConfigError listing every problem.

Security: a token is required when ``listen`` is not a loopback address (the agents'
hello carries it); without one the configuration is refused. A configured token applies to
every listener, the HTTP API on loopback included, unless ``http_open_on_loopback`` says
otherwise (``api_tokens``). The tokens are read from
token_file at load time (and again on SIGHUP: firstfault/collector/daemon.py) and kept
out of repr().
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from firstfault.collector.notify.config import PARSERS as NOTIFY_PARSERS
from firstfault.collector.notify.config import NotifyConfig
from firstfault.collector.store import display
from firstfault.common import settings
from firstfault.common.redact import PARSERS as REDACT_PARSERS
from firstfault.common.redact import RedactConfig
from firstfault.common.settings import Address, HelpRequested, is_loopback_host  # noqa: F401 (re-exported)
from firstfault.common.tokens import read_node_tokens, read_tokens
from firstfault.wire import MAX_BATCH_RECORDS, MAX_FRAME_BYTES

USAGE = """\
usage: firstfault collector [--config FILE] [--check-config] [--listen HOST:PORT] [--http HOST:PORT]
                            [--db PATH_OR_URL] [--token-file FILE] [--log-level LEVEL]
                            [--tls-cert F --tls-key F [--tls-client-ca F]]
                            [--retention-max-age-days N] [--retention-max-bytes N]
                            [--limits-max-connections N] [--limits-read-timeout-s S] ...

Every key of the TOML file is a flag: top-level KEY is --KEY, key KEY of table T is
--T-KEY (dashes for underscores); flags win over the file."""


class ConfigError(settings.ConfigError):
    """The collector's configuration is unusable; ``problems`` lists every reason."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems, "collector")


@dataclass(frozen=True, slots=True)
class TLSConfig:
    cert: Path | None = None
    key: Path | None = None
    client_ca: Path | None = None  # set: mutual TLS, agents present a cert it signed
    bind_node: bool = False  # a hello's node must be named by its client certificate

    @property
    def enabled(self) -> bool:
        return self.cert is not None


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    max_age_days: float = 30  # 0: no bound
    max_bytes: int = 0  # 0: no bound
    prune_interval_s: float = 600


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_connections: int = 1024
    max_unauthenticated: int = 256  # connections that have not sent a hello yet, at once
    max_batch_records: int = MAX_BATCH_RECORDS
    max_frame_bytes: int = MAX_FRAME_BYTES
    max_inflight_records: int = 100_000
    read_timeout_s: float = 120


@dataclass(frozen=True, slots=True)
class ClockConfig:
    ping_interval_s: float = 10
    samples: int = 8
    drift_ppm: float = 50
    save_interval_s: float = 60


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    listen: Address = Address("127.0.0.1", 7140)
    http: Address = Address("127.0.0.1", 7141)
    db: str = "./firstfault.db"
    token_file: Path | None = None
    node_tokens_file: Path | None = None
    http_open_on_loopback: bool = False
    log_level: str = "info"
    tls: TLSConfig = TLSConfig()
    retention: RetentionConfig = RetentionConfig()
    limits: LimitsConfig = LimitsConfig()
    clock: ClockConfig = ClockConfig()
    redact: RedactConfig = RedactConfig()
    notify: NotifyConfig = NotifyConfig()
    token: str | None = field(default=None, repr=False)  # the first line of token_file
    tokens: tuple[str, ...] | None = field(default=None, repr=False)  # every line: accepted
    node_tokens: dict[str, tuple[str, ...]] | None = field(default=None, repr=False)  # node_tokens_file

    @property
    def db_is_url(self) -> bool:
        return "://" in self.db

    @property
    def api_tokens(self) -> tuple[str, ...] | None:
        """The tokens the HTTP API asks for: the configured ones, on loopback too, unless the
        operator opened loopback explicitly (None: no token asked)."""
        if self.http_open_on_loopback and self.http.is_loopback:
            return None
        return self.tokens


# --- value parsers (firstfault/common/settings.py) --------------------------------------------

def _db(v: Any, flag: bool) -> str:
    v = settings.string(v, flag)
    scheme = v.split("://", 1)[0] if "://" in v else None
    if scheme is not None and scheme not in ("postgres", "postgresql"):
        raise ValueError(f"expected a SQLite file path or a postgres:// URL, got {v!r}")
    return v


_address, _number, _path = settings.address, settings.number, settings.path
_level = settings.level


_PARSERS: dict[str | None, dict[str, settings.Parser]] = {
    None: {"listen": _address, "http": _address, "db": _db, "token_file": _path,
           "node_tokens_file": _path, "http_open_on_loopback": settings.boolean, "log_level": _level},
    "tls": {"cert": _path, "key": _path, "client_ca": _path, "bind_node": settings.boolean},
    "retention": {"max_age_days": _number(0), "max_bytes": _number(0, integer=True),
                  "prune_interval_s": _number(0, strict=True)},
    "limits": {"max_connections": _number(1, integer=True),
               "max_unauthenticated": _number(1, integer=True),
               "max_batch_records": _number(1, integer=True, hi=MAX_BATCH_RECORDS),
               "max_frame_bytes": _number(1024, integer=True, hi=MAX_FRAME_BYTES),
               "max_inflight_records": _number(1, integer=True),
               "read_timeout_s": _number(0, strict=True)},
    "clock": {"ping_interval_s": _number(0, strict=True),
              "samples": _number(1, integer=True, hi=10_000),
              "drift_ppm": _number(0), "save_interval_s": _number(0, strict=True)},
    "redact": REDACT_PARSERS,
    "notify": NOTIFY_PARSERS,
}
_TABLE_TYPES = {"tls": TLSConfig, "retention": RetentionConfig, "limits": LimitsConfig,
                "clock": ClockConfig, "redact": RedactConfig,
                "notify": NotifyConfig}
_FLAGS: dict[str, tuple[str | None, str]] = {
    settings.flag_name(t, k): (t, k) for t, keys in _PARSERS.items() for k in keys}


# --- loading -------------------------------------------------------------------

def load_config(path: str | Path | None = None,
                flags: dict[tuple[str | None, str], str] | None = None) -> CollectorConfig:
    """The configuration from the TOML file at ``path`` (optional) with ``flags``
    ((table, key) -> string value) on top; ConfigError lists every problem."""
    problems: list[str] = []
    doc = settings.read_toml(path, problems)
    where = f"{path}: " if path is not None else ""
    values = settings.read_values(_PARSERS, doc, flags or {}, where, problems)
    cfg = CollectorConfig(**{k: v for k, v in values[None].items()}, **{
        t: _TABLE_TYPES[t](**values[t]) for t in _TABLE_TYPES})
    cfg = _check(cfg, problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def _check(cfg: CollectorConfig, problems: list[str]) -> CollectorConfig:
    """Cross-key checks and the token file; returns cfg with the token read."""
    tls = cfg.tls
    if (tls.cert is None) != (tls.key is None):
        problems.append("tls: cert and key go together; set both or neither")
    if tls.client_ca is not None and tls.cert is None:
        problems.append("tls.client_ca needs tls.cert and tls.key (mTLS runs over TLS)")
    for name in ("cert", "key", "client_ca"):
        p = getattr(tls, name)
        if p is not None and not os.access(p, os.R_OK):
            problems.append(f"tls.{name}: cannot read {p}")
    lim = cfg.limits
    if lim.max_inflight_records < lim.max_batch_records:
        problems.append(f"limits.max_inflight_records ({lim.max_inflight_records}) must be at "
                        f"least limits.max_batch_records ({lim.max_batch_records})")
    if lim.read_timeout_s <= cfg.clock.ping_interval_s:
        problems.append(f"limits.read_timeout_s ({lim.read_timeout_s}) must exceed "
                        f"clock.ping_interval_s ({cfg.clock.ping_interval_s}): idle agents "
                        "send nothing but pongs")
    if cfg.notify.enabled and cfg.notify.queue_dir is None and "://" in cfg.db:
        problems.append("notify.queue_dir: required with a PostgreSQL db (the notices pending are kept "
                        "on this machine's disk)")
    if tls.bind_node and tls.client_ca is None:
        problems.append("tls.bind_node needs tls.client_ca (the node's name comes from its client certificate)")
    tokens = read_tokens(cfg.token_file, problems)
    node_tokens = read_node_tokens(cfg.node_tokens_file, problems)
    if cfg.token_file is None and cfg.node_tokens_file is None and not cfg.listen.is_loopback:
        problems.append(f"listen {cfg.listen} is not a loopback address: a token is required "
                        "(set token_file or --token-file FILE; agents send the same token); "
                        "refusing to accept unauthenticated agents from the network")
    return replace(cfg, token=tokens[0] if tokens else None, tokens=tokens, node_tokens=node_tokens)


def parse_args(argv: list[str]) -> tuple[CollectorConfig, bool]:
    """(configuration, --check-config given) for ``firstfault collector ARGS`` (argv
    without the command).

    ConfigError lists every problem (unknown flags included); HelpRequested on --help."""
    config_path, given, problems = settings.parse_argv(
        argv, set(_FLAGS), usage=USAGE, switches=frozenset({"--check-config"}))
    check = bool(given.pop("--check-config", False))
    flags = {_FLAGS[name]: value for name, value in given.items()}
    try:
        cfg = load_config(config_path, flags)
    except ConfigError as e:
        problems.extend(e.problems)
    if problems:
        raise ConfigError(problems)
    return cfg, check


def describe(cfg: CollectorConfig) -> str:
    """One key=value line of the effective configuration, for the start-up log (no token)."""
    parts = []
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if f.name in ("token", "tokens", "node_tokens"):
            continue
        if f.name == "db":  # a URL's password stays out of logs
            v = display(v)
        if f.name == "notify":
            parts += [f"notify.targets={','.join(f'{t.name}:{t.type}' for t in v.target) or 'none'}"]
        elif is_dataclass(v) and not isinstance(v, Address):
            parts += [f"{f.name}.{g.name}={getattr(v, g.name)}" for g in fields(v)]
        else:
            parts.append(f"{f.name}={v}")
    return " ".join(parts)
