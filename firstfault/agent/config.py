"""Agent configuration: a TOML file and command-line flags -> a frozen AgentConfig.

A whole file (every key optional; these are the defaults, except where said)::

    node = "gpu-07"                    # default: this host's name
    state_dir = "/var/lib/firstfault-agent"   # the spool and the sources' saved positions
    job = "nightly-7b"                 # label for records with no job of their own (default: none)
    collectors = ["head-01:7140"]      # HOST:PORT (or tcp://HOST:PORT), tried in order, failing over
    token_file = "/etc/firstfault/token"   # required when a collector is not on loopback
    metrics = "127.0.0.1:7142"         # Prometheus /metrics; "" turns it off
    log_level = "info"                 # debug, info, warning, error

    [tls]                              # all absent: plain TCP
    ca = "/etc/firstfault/ca.pem"      # set: TLS, the collector's certificate checked against it
    cert = "/etc/firstfault/agent.pem" # client certificate for mTLS, with key
    key = "/etc/firstfault/agent.key"
    server_name = "head-01"            # name to check the certificate against (default: the host)

    [redact]                           # secrets in records replaced before spooling
    enabled = true                     # (firstfault/common/redact.py): [redacted:NAME]
    defaults = true                    # the built-in patterns (HF, W&B, AWS, GitHub, ...)
    patterns = ["corp=CORP-[0-9A-F]{32}"]   # more, NAME=REGEX (default none)

    [spool]
    max_bytes = 1073741824             # on overflow the oldest unacked records become a gap record
    fsync = "interval"                 # always | interval | never
    fsync_interval_ms = 20

    [sources.cgroup]                   # one table per source (firstfault/agent/sources/NAME.py)
    enabled = true                     # default: on where available; ranklog when it has globs
    interval_s = 10                    # or dirs; journal off
    # every other key is a keyword argument of the source's class (checked against it)

Flags: top-level KEY is ``--KEY``, key KEY of table T is ``--T-KEY``, a source's
option is ``--NAME-KEY`` (``--cgroup-interval-s 5``, ``--nvml-enabled false``);
``--collector`` and ``--ranklog GLOB`` repeat (collectors, sources.ranklog.globs).
Flags win over the file. Unknown keys, flags and sources, wrong types and bad values
are all collected and raised as one ConfigError; ``--check-config`` prints the
result (``describe``) and exits.
"""

from __future__ import annotations

import inspect
import os
import socket
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from firstfault.agent.sources import base as sources
from firstfault.agent.sources.ranklog import glob_names_a_job
from firstfault.common import settings
from firstfault.common.redact import PARSERS as REDACT_PARSERS
from firstfault.common.redact import RedactConfig
from firstfault.common.settings import Address, HelpRequested  # noqa: F401 (re-exported)
from firstfault.common.settings import ConfigError as _BaseConfigError
from firstfault.wire import MAX_NAME_BYTES

USAGE = """\
usage: firstfault agent [--config FILE] [--check-config] [--collector HOST:PORT ...]
                        [--node NAME] [--state-dir DIR] [--ranklog GLOB ...] [--job LABEL]
                        [--token-file F] [--metrics HOST:PORT] [--log-level LEVEL]
                        [--tls-ca F] [--tls-cert F --tls-key F] [--tls-server-name N]
                        [--spool-max-bytes N] [--spool-fsync always|interval|never]
                        [--SOURCE-enabled true|false] [--SOURCE-OPTION VALUE ...]

Every key of the TOML file is a flag: top-level KEY is --KEY, key KEY of table T is
--T-KEY, option KEY of source S is --S-KEY (dashes for underscores); flags win."""

DEFAULT_STATE_DIR = "/var/lib/firstfault-agent"
INGEST_PORT = 7140  # the collector's default --listen port: a collector written without one
DEFAULT_ON = frozenset({"kmsg", "cgroup", "procs", "nvml", "marks", "stacks", "flightrec", "checkpoints"})  # where available
# set by the daemon, not config
WIRED = frozenset({"paths", "state_dir", "agent_state_dir", "pids", "ranks", "watch", "job_label", "tag",
                   "pod_owner"})


class ConfigError(_BaseConfigError):
    """The agent's configuration is unusable; ``problems`` lists every reason."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems, "agent")


@dataclass(frozen=True, slots=True)
class TLSConfig:
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    @property
    def enabled(self) -> bool:
        return self.ca is not None or self.cert is not None


@dataclass(frozen=True, slots=True)
class SpoolConfig:
    max_bytes: int = 1 << 30
    fsync: str = "interval"
    fsync_interval_ms: int = 20  # readers see records only after their fsync (bench/agent.py)


@dataclass(frozen=True, slots=True)
class SourceConfig:
    name: str
    enabled: bool | None = None  # None: the default (DEFAULT_ON where available)
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def wanted(self) -> bool:
        if self.enabled is not None:
            return self.enabled
        if self.name == "ranklog":
            return bool(self.options.get("globs") or self.options.get("dirs") or self.options.get("pod_dirs"))
        return self.name in DEFAULT_ON

    @property
    def explicit(self) -> bool:
        """Turned on by the operator, not by default: failing to start is an error."""
        return bool(self.enabled) or (self.enabled is None and self.name == "ranklog"
                                      and self.wanted)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str = field(default_factory=socket.gethostname)
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    job: str | None = None
    collectors: tuple[Address, ...] = ()
    token_file: Path | None = None
    metrics: Address | None = Address("127.0.0.1", 7142)
    log_level: str = "info"
    tls: TLSConfig = TLSConfig()
    spool: SpoolConfig = SpoolConfig()
    redact: RedactConfig = RedactConfig()
    sources: Mapping[str, SourceConfig] = field(default_factory=lambda: MappingProxyType({}))
    token: str | None = field(default=None, repr=False)  # read from token_file


def _name(v: Any, flag: bool) -> str:
    v = settings.string(v, flag)
    if len(v.encode()) > MAX_NAME_BYTES:
        raise ValueError(f"expected at most {MAX_NAME_BYTES} bytes, got {len(v.encode())}")
    return v


def _collector(v: Any, flag: bool) -> Address:
    """``HOST:PORT`` (port 7140 where none is written) or a URL: the query commands'
    ``--collector http://HOST:PORT`` form is taken too (only its host and port: TLS is ``[tls]``)."""
    return settings.endpoint(v, INGEST_PORT)[1]


def _metrics(v: Any, flag: bool) -> Address | None:
    return None if v == "" else settings.address(v, flag)


_PARSERS: dict[str | None, dict[str, settings.Parser]] = {
    None: {"node": _name, "state_dir": settings.path, "job": _name,
           "collectors": settings.strings(_collector), "token_file": settings.path,
           "metrics": _metrics, "log_level": settings.level},
    "tls": {"ca": settings.path, "cert": settings.path, "key": settings.path,
            "server_name": settings.string},
    "spool": {"max_bytes": settings.number(1 << 20, integer=True),
              "fsync": settings.one_of("always", "interval", "never"),
              "fsync_interval_ms": settings.number(1, integer=True)},
    "redact": REDACT_PARSERS,
}
_TABLE_TYPES = {"tls": TLSConfig, "spool": SpoolConfig, "redact": RedactConfig}
_FLAGS: dict[str, tuple[str | None, str]] = {
    settings.flag_name(t, k): (t, k) for t, keys in _PARSERS.items() for k in keys}
_FLAGS["--collector"] = (None, "collectors")
del _FLAGS["--collectors"]
_REPEATABLE = frozenset({"--collector", "--ranklog", "--redact-patterns"})


# --- source options: checked against the source class's keyword arguments ----------

def source_options(cls: type, *, wired: bool = False) -> dict[str, inspect.Parameter]:
    """The keyword arguments of a source class that configuration may set (with
    ``wired``: also those the daemon sets, WIRED)."""
    params: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        more = False
        for p in inspect.signature(init).parameters.values():
            if p.kind is p.VAR_KEYWORD:
                more = True
            elif (p.name != "self" and p.kind is not p.VAR_POSITIONAL
                  and (wired or p.name not in WIRED)):
                params.setdefault(p.name, p)
        if not more:
            break
    return params


def _option_parser(p: inspect.Parameter) -> settings.Parser:
    """A parser for an option from its default's type, else its annotation (a string
    under ``from __future__ import annotations``): bool, int, float, a list of strings,
    else a string."""
    d, note = p.default, str(p.annotation)
    kinds = [(bool, settings.boolean), (int, settings.number(-(2**63), integer=True)),
             (float, settings.number(float("-inf")))]
    for t, parser in kinds:
        if type(d) is t:
            return parser
    if isinstance(d, (list, tuple)) or note.split("[")[0] in ("list", "tuple", "Iterable", "Sequence"):
        return settings.strings()
    for t, parser in kinds:
        if t.__name__ in note.replace("|", " ").split():
            return parser
    return settings.text  # the source checks its own strings


def _source_table(name: str, table: Any, where: str, problems: list[str],
                  flags: dict[str, Any]) -> SourceConfig | None:
    try:
        cls = sources.get(name)
    except sources.SourceError as e:
        problems.append(f"{where}sources.{name}: {e}")
        return None
    if type(table) is not dict:
        problems.append(f"{where}[sources.{name}] must be a table, got {table!r}")
        return None
    params = source_options(cls)
    enabled, options = None, {}
    merged = [(k, v, False, f"{where}sources.{name}.{k}") for k, v in table.items()]
    merged += [(k, v, True, f"--{name}-{k}".replace("_", "-")) for k, v in flags.items()]
    for key, v, flag, label in merged:
        if key == "enabled":
            parser = settings.boolean
        elif key in params:
            parser = _option_parser(params[key])
        else:
            problems.append(f"{label}: unknown option of source {name}; known: "
                            f"enabled, {', '.join(sorted(params)) or '(none)'}")
            continue
        try:
            value = parser(v, flag)
        except ValueError as e:
            problems.append(f"{label}: {e}")
            continue
        if key == "enabled":
            enabled = value
        else:
            options[key] = value
    return SourceConfig(name, enabled, MappingProxyType(options))


# --- loading -------------------------------------------------------------------

def load_config(path: str | Path | None = None,
                flags: dict[tuple[str | None, str], Any] | None = None,
                source_flags: dict[str, dict[str, Any]] | None = None) -> AgentConfig:
    """The configuration from the TOML file at ``path`` with ``flags`` ((table, key)
    -> value) and ``source_flags`` (source -> option -> value) on top."""
    problems: list[str] = []
    doc = settings.read_toml(path, problems)
    where = f"{path}: " if path is not None else ""
    tables = doc.pop("sources", {})
    if type(tables) is not dict:
        problems.append(f"{where}[sources] must be a table of source tables")
        tables = {}
    values = settings.read_values(_PARSERS, doc, flags or {}, where, problems,
                                  {"collectors": "--collector"})
    if "collectors" in values[None]:
        values[None]["collectors"] = tuple(values[None]["collectors"])
    srcs: dict[str, SourceConfig] = {}
    source_flags = source_flags or {}
    for name in sorted(set(sources.names()) | set(tables) | set(source_flags)):
        sc = _source_table(name, tables.get(name, {}), where, problems, source_flags.get(name, {}))
        if sc is not None:
            srcs[name] = sc
    cfg = AgentConfig(**values[None], **{t: _TABLE_TYPES[t](**values[t]) for t in _TABLE_TYPES},
                      sources=MappingProxyType(srcs))
    cfg = _check(cfg, problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def _check(cfg: AgentConfig, problems: list[str]) -> AgentConfig:
    """Cross-key checks and the token file; returns cfg with the token read."""
    tls = cfg.tls
    if (tls.cert is None) != (tls.key is None):
        problems.append("tls: cert and key go together; set both or neither")
    for name in ("ca", "cert", "key"):
        p = getattr(tls, name)
        if p is not None and not os.access(p, os.R_OK):
            problems.append(f"tls.{name}: cannot read {p}")
    if not cfg.collectors:
        problems.append("collectors: none given; name at least one (--collector HOST:PORT)")
    ranklog = cfg.sources.get("ranklog")
    if cfg.job is None and ranklog is not None and ranklog.wanted:
        globs = ranklog.options.get("globs")
        for g in globs if isinstance(globs, list) else ():  # not a list: the source says so
            if isinstance(g, str) and os.path.isabs(g) and not glob_names_a_job(g):  # else the source says why
                problems.append(f"sources.ranklog: glob {g!r} can never name a job, so its lines would belong "
                                "to none and `firstfault jobs` would not list them: put {job} where the job's "
                                "name is (/logs/{job}/rank{rank}.log) or give the agent --job LABEL")
    token = settings.read_token(cfg.token_file, problems)
    remote = [str(a) for a in cfg.collectors if not a.is_loopback]
    if cfg.token_file is None and remote:
        problems.append(f"collector {remote[0]} is not a loopback address: a token is required "
                        "(token_file or --token-file FILE, the collector's token)")
    return replace(cfg, token=token)


def parse_args(argv: list[str]) -> tuple[AgentConfig, bool]:
    """(configuration, --check-config given) for ``firstfault agent ARGS``.

    ConfigError lists every problem (unknown flags included); HelpRequested on --help."""
    source_names = set(sources.names())
    known = set(_FLAGS) | _REPEATABLE
    known |= {a for a in argv if _source_flag(a.partition("=")[0], source_names)}
    config_path, given, problems = settings.parse_argv(
        argv, known, usage=USAGE, switches=frozenset({"--check-config"}), repeatable=_REPEATABLE)
    check = bool(given.pop("--check-config", False))
    flags: dict[tuple[str | None, str], Any] = {}
    source_flags: dict[str, dict[str, Any]] = {}
    for name, value in given.items():
        if name == "--ranklog":
            source_flags.setdefault("ranklog", {})["globs"] = value
        elif name in _FLAGS:
            flags[_FLAGS[name]] = value
        else:
            src, key = _source_flag(name, source_names)
            source_flags.setdefault(src, {})[key] = value
    try:
        cfg = load_config(config_path, flags, source_flags)
    except ConfigError as e:
        problems.extend(e.problems)
    if problems:
        raise ConfigError(problems)
    return cfg, check


def _source_flag(flag: str, names: set[str]) -> tuple[str, str] | None:
    """("cgroup", "interval_s") for ``--cgroup-interval-s`` when cgroup is a source."""
    if not flag.startswith("--"):
        return None
    for name in names:
        prefix = f"--{name}-"
        if flag.startswith(prefix) and len(flag) > len(prefix):
            return name, flag[len(prefix):].replace("-", "_")
    return None


def describe(cfg: AgentConfig) -> str:
    """The effective configuration, one ``key = value`` a line (no token)."""
    lines = []
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if f.name == "token":
            continue
        if f.name == "sources":
            for sc in v.values():
                state = "on" if sc.wanted else "off"
                opts = " ".join(f"{k}={x!r}" for k, x in sorted(sc.options.items()))
                lines.append(f"sources.{sc.name} = {state}" + (f" ({opts})" if opts else ""))
        elif f.name in _TABLE_TYPES:
            lines += [f"{f.name}.{g.name} = {getattr(v, g.name)}" for g in fields(v)]
        elif f.name == "collectors":
            lines.append(f"collectors = {', '.join(map(str, v))}")
        else:
            lines.append(f"{f.name} = {v}")
    return "\n".join(lines)
