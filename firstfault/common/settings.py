"""What both daemons' configurations share: TOML file + flags, value checks, tokens.

firstfault/agent/config.py and firstfault/collector/config.py each declare their keys; the rules are
common and live here once: every key of the TOML file is also a flag (top-level
KEY is ``--KEY``, key KEY of table T is ``--T-KEY``, underscores written as
dashes), flags win, unknown keys and flags are errors, and every problem is
collected and raised together as one ConfigError. A value parser takes (raw
value, came from a flag) — a flag's value is always a string — and returns the
value or raises ValueError saying what it expected.
"""

from __future__ import annotations

import ipaddress
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from firstfault.common.tokens import read_tokens


class ConfigError(Exception):
    """The configuration is unusable; ``problems`` lists every reason, one a line."""

    def __init__(self, problems: list[str], what: str = "") -> None:
        self.problems = list(problems)
        n = len(self.problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''} in the {what + ' ' if what else ''}"
                         "configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


class HelpRequested(Exception):
    """``--help`` was given: print the usage (the exception's text) and exit 0."""


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        return is_loopback_host(self.host)


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` can only be reached from this machine (names other than localhost: no)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- value parsers: (raw value, came from a flag) -> value; ValueError says why ------

Parser = Callable[[Any, bool], Any]


def address(v: Any, flag: bool) -> Address:
    if type(v) is not str:
        raise ValueError(f"expected a string HOST:PORT, got {v!r}")
    host, sep, port = v.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT (port 0..65535), got {v!r}")
    return Address(host, int(port))


URL_SCHEMES = ("http", "https", "tcp")


def endpoint(v: str, default_port: int) -> tuple[str | None, Address]:
    """Where a collector is, in either form people write it: ``HOST:PORT``, ``[v6]:PORT``
    or a URL ``http://HOST[:PORT][/]`` (also https, tcp) -> (the URL's scheme or None, the
    address; ``default_port`` where a URL has none). ValueError says why not."""
    if type(v) is not str or not v.strip():
        raise ValueError(f"expected HOST:PORT or a URL http://HOST:PORT, got {v!r}")
    scheme, sep, rest = v.strip().partition("://")
    if not sep:
        scheme, rest = None, v.strip()
    elif scheme.lower() not in URL_SCHEMES:
        raise ValueError(f"expected HOST:PORT or a URL http://HOST:PORT (schemes {', '.join(URL_SCHEMES)}), "
                         f"got {v!r}")
    rest = rest[:-1] if sep and rest.endswith("/") else rest
    if "/" in rest or "?" in rest or "@" in rest:
        raise ValueError(f"expected HOST:PORT or http://HOST:PORT with no path, query or user, got {v!r}")
    if sep and (":" not in rest or rest.endswith("]")):  # a URL without a port
        rest = f"{rest}:{default_port}"
    try:
        return scheme and scheme.lower(), address(rest, False)
    except ValueError:
        raise ValueError(f"expected HOST:PORT or a URL http://HOST:PORT, got {v!r}") from None


def number(lo: float, *, strict: bool = False, integer: bool = False,
           hi: float | None = None) -> Parser:
    def parse(v: Any, flag: bool) -> Any:
        if flag:
            try:
                v = int(v) if integer else float(v)
            except ValueError:
                raise ValueError(f"expected {'an integer' if integer else 'a number'}, "
                                 f"got {v!r}") from None
        ok_types = (int,) if integer else (int, float)
        if type(v) not in ok_types:
            raise ValueError(f"expected {'an integer' if integer else 'a number'}, got {v!r}")
        if (v <= lo if strict else v < lo) or (hi is not None and v > hi):
            rng = f"> {lo}" if strict else f">= {lo}"
            raise ValueError(f"expected a value {rng}" + (f" and <= {hi}" if hi else "")
                             + f", got {v!r}")
        return v
    return parse


def string(v: Any, flag: bool) -> str:
    if type(v) is not str or not v:
        raise ValueError(f"expected a non-empty string, got {v!r}")
    return v


def text(v: Any, flag: bool) -> str:
    """Any string, the empty one too."""
    if type(v) is not str:
        raise ValueError(f"expected a string, got {v!r}")
    return v


def path(v: Any, flag: bool) -> Path:
    return Path(string(v, flag))


def boolean(v: Any, flag: bool) -> bool:
    if flag and v in ("true", "false", "yes", "no", "1", "0", "on", "off"):
        return v in ("true", "yes", "1", "on")
    if type(v) is not bool:
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def one_of(*choices: str) -> Parser:
    def parse(v: Any, flag: bool) -> str:
        if v not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
        return v
    return parse


level = one_of("debug", "info", "warning", "error")


def strings(item: Parser = string) -> Parser:
    """A list of values; from a repeatable flag each occurrence adds one."""
    def parse(v: Any, flag: bool) -> list:
        if flag:
            v = v if isinstance(v, list) else [v]
        if type(v) is not list:
            raise ValueError(f"expected a list, got {v!r}")
        return [item(x, flag) for x in v]
    return parse


# --- files -----------------------------------------------------------------------

def read_toml(path: str | Path | None, problems: list[str]) -> dict[str, Any]:
    """The TOML document at ``path`` ({} for None); a problem, and {}, if unusable."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        problems.append(f"config file {path}: cannot read it: {e.strerror or e}")
    except tomllib.TOMLDecodeError as e:
        problems.append(f"config file {path}: not valid TOML: {e}")
    return {}


def read_token(path: Path | None, problems: list[str]) -> str | None:
    """The token an agent sends: the first of the token file (firstfault/common/tokens.py)."""
    tokens = read_tokens(path, problems)
    return tokens[0] if tokens else None


def read_values(parsers: dict[str | None, dict[str, Parser]], doc: dict[str, Any],
                flags: dict[tuple[str | None, str], Any], where: str, problems: list[str],
                flag_names: dict[str, str] | None = None) -> dict[str | None, dict[str, Any]]:
    """{table: {key: value}} from a TOML document (top-level keys and ``[table]`` keys, as
    ``parsers`` declares them) with ``flags`` ((table, key) -> value) on top.
    ``flag_names`` renames a key's flag where it is not ``flag_name(table, key)``."""
    values: dict[str | None, dict[str, Any]] = {t: {} for t in parsers}
    tables = [t for t in parsers if t is not None]
    for key, v in doc.items():
        if key in tables:
            if type(v) is not dict:
                problems.append(f"{where}[{key}] must be a table, got {v!r}")
                continue
            for k, x in v.items():
                _take(parsers, values, key, k, x, False, f"{where}{key}.{k}", problems)
        else:
            _take(parsers, values, None, key, v, False, f"{where}{key}", problems)
    for (table, key), v in flags.items():
        name = (flag_names or {}).get(key) or flag_name(table, key)
        _take(parsers, values, table, key, v, True, name, problems)
    return values


def _take(parsers: dict[str | None, dict[str, Parser]], values: dict, table: str | None, key: str,
          v: Any, flag: bool, name: str, problems: list[str]) -> None:
    parser = parsers[table].get(key)
    if parser is None:
        known = ", ".join(parsers[table]) + ("" if table else "".join(
            f", [{t}]" for t in parsers if t is not None))
        problems.append(f"{name}: unknown key; known here: {known}")
        return
    try:
        values[table][key] = parser(v, flag)
    except ValueError as e:
        problems.append(f"{name}: {e}")


def flag_name(table: str | None, key: str) -> str:
    return "--" + ((table + "-") if table else "").replace("_", "-") + key.replace("_", "-")


# --- the command line ------------------------------------------------------------

def parse_argv(argv: list[str], known: set[str], *, usage: str, switches: frozenset[str] = frozenset(),
               repeatable: frozenset[str] = frozenset()
               ) -> tuple[str | None, dict[str, Any], list[str]]:
    """(--config value, {flag: value}, problems) for ``argv``; HelpRequested on --help.

    A flag takes a value (``--x V`` or ``--x=V``); a repeatable one collects a
    list; a switch takes none and is True."""
    problems: list[str] = []
    flags: dict[str, Any] = {}
    config_path: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg in ("-h", "--help"):
            raise HelpRequested(usage)
        name, eq, value = arg.partition("=")
        if not name.startswith("-"):
            problems.append(f"{arg!r}: unexpected argument (every setting is a --flag)")
            continue
        if name in switches:
            if eq:
                problems.append(f"{name}: takes no value")
            flags[name] = True
            continue
        if name != "--config" and name not in known:
            problems.append(f"{name}: unknown flag (see --help)")
            if not eq and i < len(argv) and not argv[i].startswith("-"):
                i += 1  # its value
            continue
        if not eq:
            if i >= len(argv) or argv[i].startswith("--"):
                problems.append(f"{name}: needs a value")
                continue
            value = argv[i]
            i += 1
        if name == "--config":
            config_path = value
        elif name in repeatable:
            flags.setdefault(name, []).append(value)
        else:
            flags[name] = value
    return config_path, flags, problems
