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
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Any

import ahocorasick_rs

from firstfault.common import settings

MARK = "[redacted:{}]"
_CASES = (str.lower, str.upper, str.capitalize)


@dataclass(frozen=True)
class Pattern:
    """``literals``: a text is tried only where it holds one (with ``word_end``, only where the
    literal ends a word: ``token=`` yes, ``tokens_per_sec`` no); ``anchor``: where the regex
    is tried, "literal" (it starts at the literal: one ``match`` there), "key" (at the start
    of the word the literal ends: a ``--key``), None (searched through the whole text)."""

    name: str
    regex: re.Pattern
    literals: tuple[str, ...]
    anchor: str | None = None
    word_end: bool = False


def _forms(*words: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(f(w) for w in words for f in _CASES))


# Key names whose value is a secret; the key must end there (``tokens_per_sec=`` is no key).
_KEYS = (r"(?P<key>password|passwd|passphrase|secret|token|api_?key|access_?key|private_?key"
         r"|credentials?|auth|wandb_?key)")
_KEY_LITERALS = _forms("password", "passwd", "passphrase", "secret", "token", "api_key", "apikey",
                       "access_key", "accesskey", "private_key", "credential", "credentials",
                       "auth", "wandb_key", "wandbkey") + ("apiKey", "accessKey", "privateKey")
_NOT_SECRETS = {"none", "null", "nil", "false", "true", "", "***", "<none>"}
_TOKENIZER_KEYS = re.compile(r"(?i)(pad|eos|bos|unk|sep|cls|mask|additional_special|special)_tokens?$")

DEFAULTS: tuple[Pattern, ...] = (
    Pattern("hf-token", re.compile(r"\bhf_[A-Za-z0-9]{30,}"), ("hf_",), "literal"),
    Pattern("github-token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}"),
            ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), "literal"),
    Pattern("aws-access-key-id", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), ("AKIA", "ASIA"),
            "literal"),
    Pattern("wandb-login", re.compile(r"(?i)\bwandb\s+login\s+(?:--?[\w-]+\s+)*(?P<secret>[\w-]{40,})"),
            _forms("wandb")),
    Pattern("bearer", re.compile(r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{8,}=*)"), _forms("bearer"),
            "literal"),
    Pattern("url-password", re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]+:(?P<secret>[^\s/@]+)@"),
            ("://",)),
    Pattern("netrc", re.compile(r"(?i)\bmachine\s+\S+\s+login\s+\S+\s+password\s+(?P<secret>\S+)"),
            _forms("machine")),
    # KEY=VALUE, KEY: VALUE, "KEY": "VALUE" (env dumps, configs, dicts, Namespace reprs): the
    # key ends in one of _KEYS (the regex starts there: fast; _replace reads the whole key)
    Pattern("keyword", re.compile(
        r"(?i)" + _KEYS + r"[\"']?[ \t]*[:=][ \t]*[\"']?(?P<secret>[^\s\"',;}\])]+)"),
        _KEY_LITERALS, "literal", True),
    # --KEY VALUE and '--KEY', 'VALUE' (command lines, as shells and Python lists print them)
    Pattern("flag", re.compile(
        r"(?i)(?<![\w-])--?[\w.-]*?" + _KEYS + r"(?:[ \t]+|[\"'],[ \t]*[\"'])"
        r"(?P<secret>[^\s\"',;}\])-][^\s\"',;}\])]*)"), _KEY_LITERALS, "key", True),
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


def _key(m: re.Match) -> str:
    """The whole key a keyword match ends (back from the match over word characters)."""
    return m.string[_word_start(m.string, m.start()):m.end("key")]


def _replace(p: Pattern, counts: Counter, m: re.Match) -> str:
    try:
        start, end = m.span("secret")
    except IndexError:
        start, end = m.span()
    value = m.string[start:end]
    if value.lower() in _NOT_SECRETS or value.startswith("[redacted:") or (
            p.name in ("keyword", "flag") and _TOKENIZER_KEYS.search(_key(m))):
        return m.group()
    counts[p.name] += 1
    return m.string[m.start():start] + MARK.format(p.name) + m.string[end:m.end()]


class Redactor:
    """Applies patterns; see the module docstring."""

    def __init__(self, patterns: Sequence[Pattern] = DEFAULTS) -> None:
        self.patterns = tuple(patterns)
        owners: dict[str, list[int]] = {}
        for i, p in enumerate(self.patterns):
            for lit in p.literals:
                owners.setdefault(lit, []).append(i)
        self._owners = list(owners.values())  # by literal index: the patterns it starts
        self._word_end = [i for i, p in enumerate(self.patterns) if p.word_end]
        self._ac = ahocorasick_rs.AhoCorasick(list(owners)) if owners else None
        self._bytes_ac = ahocorasick_rs.BytesAhoCorasick([w.encode() for w in owners]) if owners else None

    @classmethod
    def from_settings(cls, enabled: bool, defaults: bool, patterns: Iterable[str]) -> Redactor | None:
        """None when off; ValueError for a bad pattern."""
        if not enabled:
            return None
        return cls((DEFAULTS if defaults else ()) + tuple(map(user_pattern, patterns)))

    def text(self, s: str, counts: Counter) -> str:
        """``s`` with its secrets replaced; what was replaced is added to ``counts``."""
        if self._ac is None:
            return s
        return self._redact(s, self._hits(s, self._ac.find_matches_as_indexes(s, overlapping=True),
                                          0), counts)

    def _hits(self, s: str, found: list, base: int) -> list[tuple[int, int]]:
        """(pattern, position in the text that starts at ``base`` of ``s``) of literal matches."""
        out = []
        for lit, a, b in found:
            owners = self._owners[lit]
            if self._word_end and b < len(s) and (s[b].isalnum() or s[b] == "_"):
                owners = [i for i in owners if i not in self._word_end]
            out += [(i, a - base) for i in owners]
        return out

    def _redact(self, s: str, hits: list[tuple[int, int]], counts: Counter) -> str:
        """``s`` redacted where ``hits`` (pattern, literal position) say to try."""
        found: list[tuple[int, int, int, re.Match]] = []  # (pattern, start, end, match)
        for i in sorted({i for i, _ in hits}):
            p = self.patterns[i]
            if p.anchor is None:
                found += [(i, m.start(), m.end(), m) for m in p.regex.finditer(s)]
                continue
            for at in sorted({at for j, at in hits if j == i}):
                m = p.regex.match(s, at if p.anchor == "literal" else _word_start(s, at))
                if m:
                    found.append((i, m.start(), m.end(), m))
        out, taken, mine = [], [], Counter()
        for i, a, b, m in found:  # earlier patterns first; a later one overlapping them is out
            if any(a < tb and ta < b for ta, tb in taken):
                continue
            text = _replace(self.patterns[i], mine, m)
            if text != m.group():
                taken.append((a, b))
                out.append((a, b, text))
        if not out:
            return s
        counts.update(mine)
        parts, at = [], 0
        for a, b, text in sorted(out):
            parts += [s[at:a], text]
            at = b
        return "".join(parts) + s[at:]

    def messages(self, msgs: Sequence[str | bytes], counts: Counter | None = None,
                 chunks: Sequence[tuple[int, int, bytes]] = ()) -> dict[int, tuple[str, str]]:
        """The messages (str, or bytes of UTF-8 text) that hold a secret: index ->
        (the message redacted, the ``fields.redacted`` mark). One search over all of
        them joined; only a message with a literal's hit is looked at again.
        ``chunks``: (first, count, bytes) where the caller holds msgs[first:first+count]
        (bytes) already joined by newlines, as read: searched as they are (the
        prefilter on the chunk: no message is encoded or joined again)."""
        if self._bytes_ac is None or not msgs:
            return {}
        per: dict[int, list] = {}
        for first, n, data in _segments(msgs, chunks):
            found = self._bytes_ac.find_matches_as_indexes(data, overlapping=True)
            if not found:
                continue
            starts = list(accumulate((len(m) + 1 for m in _encoded(msgs, first, first + n - 1)), initial=0))
            for lit, a, b in found:
                k = bisect_right(starts, a) - 1
                per.setdefault(first + k, []).append((lit, a - starts[k], b - starts[k]))
        out = {}
        for j, hits in per.items():
            m = msgs[j]
            text = m if type(m) is str else m.decode()
            tries = self._hits(text, hits, 0) if _encode(m).isascii() else None  # bytes = str offsets
            if tries == []:
                continue  # e.g. a key's literal inside a longer word
            mine: Counter = Counter()
            text = self.text(text, mine) if tries is None else self._redact(text, tries, mine)
            if mine:
                if counts is not None:
                    counts.update(mine)
                out[j] = (text, ",".join(f"{k}:{v}" for k, v in sorted(mine.items())))
        return out

    def rows(self, rows: list, counts: Counter | None = None) -> list:
        """Spool rows (wire-column tuples or Drafts) with their messages redacted: the same
        list when nothing is; a redacted row gets ``fields.redacted``."""
        if not rows:
            return rows
        tuples = type(rows[0]) is tuple
        hits = self.messages([r[2] for r in rows] if tuples else [r.message for r in rows], counts)
        if not hits:
            return rows
        out = list(rows)
        for j, (text, mark) in hits.items():
            r = out[j]
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


def _encode(m: str | bytes) -> bytes:
    return m if type(m) is bytes else m.encode("utf-8", "surrogatepass")


def _encoded(msgs: Sequence[str | bytes], lo: int, hi: int) -> list[bytes]:
    return [_encode(m) for m in msgs[lo:hi]]


def _segments(msgs: Sequence[str | bytes], chunks: Sequence[tuple[int, int, bytes]]):
    """(first message, count, bytes of those messages joined by newlines): the given
    chunks as they are, the messages between them joined here."""
    at = 0
    for first, count, data in chunks:
        if first > at:
            yield at, first - at, b"\n".join(_encoded(msgs, at, first))
        yield first, count, data
        at = first + count
    if at < len(msgs):
        yield at, len(msgs) - at, b"\n".join(_encoded(msgs, at, len(msgs)))


def _word_start(s: str, at: int) -> int:
    """Where the word (letters, digits, ``_ . -``) that holds position ``at`` starts."""
    while at > 0 and (s[at - 1].isalnum() or s[at - 1] in "_.-"):
        at -= 1
    return at


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
