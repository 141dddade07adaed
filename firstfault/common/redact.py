"""Redaction: secrets in log lines are replaced before they are spooled, stored or reported.

Training jobs print secrets: a launcher's command line (``--hf_token hf_...``, ``--password
...``), an environment dump (``WANDB_API_KEY=...``, ``AWS_SECRET_ACCESS_KEY=...``), a proxy
or database URL (``postgresql://user:password@host``), an ``Authorization: Bearer`` header.
The agent redacts every record it spools (firstfault/agent/sink.py), ``firstfault analyze``
and the collector's reports and bundles redact what they print (``report``), each with the
patterns of its configuration: ``[redact]`` ``enabled`` (default true), ``defaults``
(default true: DEFAULTS below) and ``patterns``, extra ``NAME=REGEX`` strings.

A match is replaced by ``[redacted:NAME]``: only the regex's group ``secret`` where it
has one (the key and separator stay readable: ``HF_TOKEN=[redacted:keyword]``), else the
whole match. A record that had something redacted carries ``fields.redacted`` =
``"NAME:COUNT,..."``; a report says what was redacted in ``redaction``:
``{"secrets": N, "by_pattern": {NAME: COUNT}}``.

Cost: a pattern is tried only on a text holding one of its literals (a ``Pattern``'s
``literals``, case as written; the defaults list the lower, upper and capitalised forms),
found by one Aho-Corasick pass over a whole batch of lines; most lines hold none
(bench/agent.py measures the cost per line, bench/RESULTS.md). A configured pattern must
start with a literal of at least 3 characters (its literal); it is refused otherwise.

Known limits: a secret split over two lines, or in a case mix the literals do not list
(``PassWord=``), or of a shape no pattern knows, is not redacted. Redaction is text
replacement: it can redact a non-secret that looks like one (``--token_file path``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import ahocorasick_rs

from firstfault.common import settings

MARK = "[redacted:{}]"
_CASES = (str.lower, str.upper, str.capitalize)


@dataclass(frozen=True)
class Pattern:
    name: str
    regex: re.Pattern
    literals: tuple[str, ...]


def _forms(*words: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(f(w) for w in words for f in _CASES))


# Key names whose value is a secret; the key must end there (``tokens_per_sec=`` is no key).
_KEYS = (r"(?:password|passwd|passphrase|secret|token|api_?key|access_?key|private_?key|credentials?|auth"
         r"|wandb_?key)")
_NOT_SECRETS = {"none", "null", "nil", "false", "true", "", "***", "<none>"}
_TOKENIZER_KEYS = re.compile(r"(?i)(pad|eos|bos|unk|sep|cls|mask|additional_special|special)_tokens?$")

DEFAULTS: tuple[Pattern, ...] = (
    Pattern("hf-token", re.compile(r"\bhf_[A-Za-z0-9]{30,}"), ("hf_",)),
    Pattern("github-token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}"),
            ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    Pattern("aws-access-key-id", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), ("AKIA", "ASIA")),
    Pattern("wandb-login", re.compile(r"(?i)\bwandb\s+login\s+(?:--?[\w-]+\s+)*(?P<secret>[\w-]{40,})"),
            _forms("wandb")),
    Pattern("bearer", re.compile(r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{8,}=*)"), _forms("bearer")),
    Pattern("url-password", re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]+:(?P<secret>[^\s/@]+)@"),
            ("://",)),
    Pattern("netrc", re.compile(r"(?i)\bmachine\s+\S+\s+login\s+\S+\s+password\s+(?P<secret>\S+)"),
            _forms("machine")),
    # KEY=VALUE, KEY: VALUE, "KEY": "VALUE" (env dumps, configs, dicts, Namespace reprs),
    # --KEY VALUE and '--KEY', 'VALUE' (command lines, as shells and Python lists print them)
    Pattern("keyword", re.compile(
        r"(?i)(?<![A-Za-z0-9])(?P<key>(?P<dash>--?)?[A-Za-z0-9_.-]*" + _KEYS + r")"
        r"(?:[\"']?[ \t]*[:=][ \t]*[\"']?|(?(dash)(?:[ \t]+|[\"'],[ \t]*[\"'])|(?!)))"
        r"(?P<secret>[^\s\"',;}\])]+)"),
        _forms("password", "passwd", "passphrase", "secret", "token", "api_key", "apikey",
               "access_key", "accesskey", "private_key", "credential", "auth", "wandb")
        + ("apiKey", "accessKey", "privateKey")),
)


@dataclass(frozen=True, slots=True)
class RedactConfig:
    """The ``[redact]`` table of the agent's and the collector's configuration."""

    enabled: bool = True
    defaults: bool = True  # DEFAULTS, and patterns after them
    patterns: tuple[str, ...] = ()  # NAME=REGEX

    def redactor(self) -> Redactor | None:
        return Redactor.from_settings(self.enabled, self.defaults, self.patterns)


def check_patterns(v: Any, flag: bool) -> tuple[str, ...]:
    """The settings parser of ``[redact] patterns``: each one compiles (ValueError)."""
    specs = tuple(settings.strings()(v, flag))
    for spec in specs:
        user_pattern(spec)
    return specs


def user_pattern(spec: str) -> Pattern:
    """A configured ``NAME=REGEX``; ValueError says what is wrong."""
    name, eq, regex = spec.partition("=")
    if not eq or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise ValueError(f"redact pattern {spec!r}: expected NAME=REGEX (NAME: letters, digits, _ . -)")
    try:
        rx = re.compile(regex)
    except re.error as e:
        raise ValueError(f"redact pattern {name}: not a regular expression: {e}") from None
    literal = re.match(r"(?:[A-Za-z0-9_\-/:@ ]|\\[.\-/:@ ])+", regex)
    text = literal.group().replace("\\", "") if literal else ""
    if len(text) < 3:
        raise ValueError(f"redact pattern {name}: must start with at least 3 literal characters "
                         f"(they are what lines are searched for first), got {regex!r}")
    return Pattern(name, rx, (text,))


def _replace(p: Pattern, counts: Counter, m: re.Match) -> str:
    try:
        start, end = m.span("secret")
    except IndexError:
        start, end = m.span()
    value = m.string[start:end]
    if value.lower() in _NOT_SECRETS or value.startswith("[redacted:") or (
            p.name == "keyword" and _TOKENIZER_KEYS.search(m.group("key"))):
        return m.group()
    counts[p.name] += 1
    return m.string[m.start():start] + MARK.format(p.name) + m.string[end:m.end()]


class Redactor:
    """Applies patterns; see the module docstring."""

    def __init__(self, patterns: Sequence[Pattern] = DEFAULTS) -> None:
        self.patterns = tuple(patterns)
        literals = [(lit, i) for i, p in enumerate(self.patterns) for lit in p.literals]
        self._owner = [i for _, i in literals]
        self._ac = ahocorasick_rs.AhoCorasick([lit for lit, _ in literals]) if literals else None

    @classmethod
    def from_settings(cls, enabled: bool, defaults: bool, patterns: Iterable[str]) -> Redactor | None:
        """None when off; ValueError for a bad pattern."""
        if not enabled:
            return None
        return cls((DEFAULTS if defaults else ()) + tuple(map(user_pattern, patterns)))

    def _candidates(self, text: str) -> set[int]:
        return {self._owner[i] for i, _, _ in self._ac.find_matches_as_indexes(text)} if self._ac else set()

    def text(self, s: str, counts: Counter, which: set[int] | None = None) -> str:
        """``s`` with its secrets replaced; what was replaced is added to ``counts``."""
        for i in sorted(self._candidates(s) if which is None else which):
            p = self.patterns[i]
            s = p.regex.sub(lambda m, p=p: _replace(p, counts, m), s)
        return s

    def rows(self, rows: list, counts: Counter | None = None) -> list:
        """Spool rows (wire-column tuples or Drafts) with their messages redacted: the same
        list when nothing is; a redacted row gets ``fields.redacted``."""
        if self._ac is None or not rows:
            return rows
        tuples = type(rows[0]) is tuple
        msgs = [r[2] for r in rows] if tuples else [r.message for r in rows]
        joined = "\n".join(msgs)
        hits = self._ac.find_matches_as_indexes(joined)
        if not hits:
            return rows
        starts, at = [], 0
        for m in msgs:
            starts.append(at)
            at += len(m) + 1
        which: dict[int, set[int]] = {}
        j = 0
        for lit, start, _ in hits:  # in order of start
            while j + 1 < len(starts) and starts[j + 1] <= start:
                j += 1
            which.setdefault(j, set()).add(self._owner[lit])
        out = rows
        for j, pats in which.items():
            mine: Counter = Counter()
            text = self.text(msgs[j], mine, pats)
            if not mine:
                continue
            if counts is not None:
                counts.update(mine)
            if out is rows:
                out = list(rows)
            r = out[j]
            mark = ",".join(f"{k}:{v}" for k, v in sorted(mine.items()))
            if tuples:
                out[j] = (*r[:2], text, *r[3:-1], {**r[-1], "redacted": mark})
            else:
                out[j] = replace(r, message=text, fields={**r.fields, "redacted": mark})
        return out

    def walk(self, value: Any, counts: Counter) -> Any:
        """Every string in a JSON-like value redacted (dict keys kept)."""
        if isinstance(value, str):
            return self.text(value, counts)
        if isinstance(value, dict):
            return {k: self.walk(v, counts) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.walk(v, counts) for v in value]
        return value


def parse_mark(mark: Any) -> Counter:
    """The counts in a record's ``fields.redacted`` (``"hf-token:1,keyword:2"``)."""
    out: Counter = Counter()
    if isinstance(mark, str):
        for part in mark.split(","):
            name, _, n = part.rpartition(":")
            if name and n.isdigit():
                out[name] += int(n)
    return out


def report(rep: dict, redactor: Redactor | None, earlier: Counter | None = None) -> dict:
    """The report with its strings redacted and ``redaction`` saying what was: what this
    redactor replaced in it plus ``earlier`` (what the agents had redacted from its records)."""
    counts = Counter(earlier or ())
    if redactor is not None:
        rep = redactor.walk({k: v for k, v in rep.items() if k != "redaction"}, counts)
    rep["redaction"] = {"secrets": sum(counts.values()), "by_pattern": dict(sorted(counts.items())),
                        "enabled": redactor is not None}
    return rep


PARSERS = {"enabled": settings.boolean, "defaults": settings.boolean, "patterns": check_patterns}
