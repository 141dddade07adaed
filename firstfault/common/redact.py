"""Redaction: secrets in log lines are replaced before they are spooled, stored or reported.

Training jobs print secrets: a launcher's command line (``--hf_token hf_...``, ``--password
...``), an environment dump (``WANDB_API_KEY=...``, ``AWS_SECRET_ACCESS_KEY=...``), a proxy
or database URL (``postgresql://user:password@host``), an ``Authorization: Bearer`` header.
The agent redacts every record it spools (firstfault/agent/spool/intake.py), ``firstfault analyze``
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

Where: ``rows`` (the agent's spool) redacts messages and the strings of ``fields`` (top-level
values and lists of strings: procs' ``cmdline``); ``events`` redacts the analysis' events
before it reads them (offline, /paste, collector reports), so what it derives (a fingerprint
blanks digits, hiding a key's shape) holds no secret; ``report`` and ``walk`` the rest.
A private key printed over several lines is redacted line by line (``messages`` keeps the
block open from one call to the next). Look-alikes kept: tokenizer special tokens, a token id
(``token=50257``), code (``token = self.tokenizer(batch["text"])``), a URL's port.
Every regex is bounded (no quantifier without a limit after a literal): a 64 KiB line of
literals costs well under a second.

Known limits: a secret split over two lines (other than a private key's block), or in a
case mix the literals do not list (``PassWord=``), or of a shape no pattern knows, is not
redacted. Redaction is text replacement: it can redact a non-secret that looks like one
(``--token_file path``).
"""

from __future__ import annotations

import re
from bisect import bisect_right, insort
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
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
_KEYS = (r"(?P<key>password|passwd|passphrase|secret|token|api[_-]?key|access[_-]?key|private[_-]?key"
         r"|secret[_-]?key|credentials?|auth|wandb[_-]?key)")
_KEY_LITERALS = _forms("password", "passwd", "passphrase", "secret", "token", "api_key", "apikey",
                       "access_key", "accesskey", "private_key", "credential", "credentials",
                       "auth", "wandb_key", "wandbkey", "api-key", "access-key", "private-key",
                       "secret_key", "secret-key", "wandb-key") + ("apiKey", "accessKey", "privateKey",
                                                                   "secretKey")
_NOT_SECRETS = {"none", "null", "nil", "false", "true", "", "***", "<none>"}
_TOKENIZER_KEYS = re.compile(r"(?i)(pad|eos|bos|unk|sep|cls|mask|additional_special|special)_tokens?$")
# A value that is code, not a secret: a name called or indexed (``token = self.tokenizer(batch["text"])``
# in a traceback's source line)
_TOKEN_ID = re.compile(r"[0-9#]{1,20}")
_CODE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*[(\[]")
# A value: quoted (up to its closing quote, spaces and all), else up to a space or a delimiter
_VALUE = (r"(?P<q>[\"'])?(?P<secret>(?(q)(?:(?!(?P=q))[^\r\n]){1,256}|[^\s\"',;}\])]{1,256}))")
_PEM_BODY = r"(?P<secret>(?:[A-Za-z0-9+/=\s:,.]|\\[nr]|-(?!----(?:END|BEGIN))){0,20000})"

DEFAULTS: tuple[Pattern, ...] = (
    # a private key block (PEM, OpenSSH), its body over lines of one message or as
    # ``\n`` escapes inside JSON; a block spread over log lines: Redactor.messages
    Pattern("private-key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----" + _PEM_BODY),
            ("-----BEGIN ",), "literal"),
    Pattern("hf-token", re.compile(r"\bhf_[A-Za-z0-9]{30,}"), ("hf_",), "literal"),
    Pattern("github-token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})"),
            ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"), "literal"),
    Pattern("aws-access-key-id", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), ("AKIA", "ASIA"),
            "literal"),
    # OpenAI (sk-..., sk-proj-..., sk-svcacct-...) and Anthropic (sk-ant-...) API keys
    Pattern("sk-key", re.compile(r"\bsk-[A-Za-z0-9_-]{20,300}"), ("sk-",), "literal"),
    Pattern("slack-token", re.compile(r"\bxox[abeoprs]-[A-Za-z0-9-]{10,300}"),
            tuple(f"xox{c}-" for c in "abeoprs"), "literal"),
    Pattern("wandb-login", re.compile(r"(?i)\bwandb\s+login\s+(?:--?[\w-]+\s+)*(?P<secret>[\w-]{40,})"),
            _forms("wandb")),
    Pattern("bearer", re.compile(r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{8,}=*)"), _forms("bearer"),
            "literal"),
    # an HTTP header's credentials: Authorization: Basic|Digest|Token ..., Cookie: name=value; ...
    Pattern("authorization", re.compile(
        r"(?i)(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?(?:(?:basic|bearer|token|digest|negotiate)"
        r"[ \t]+)?(?P<secret>[^\s\"']{4,1024})"), _forms("authorization"), "literal"),
    Pattern("cookie", re.compile(r"(?i)cookie[\"']?[ \t]*[:=][ \t]*[\"']?(?P<secret>[^\r\n\"']{1,1024})"),
            _forms("cookie"), "literal"),
    # scheme://user:password@host (user may be empty: redis://:pw@host); the password runs to
    # the last @ before the host, so one holding / or @ goes whole; a port is no password
    Pattern("url-password", re.compile(
        r"[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s/:@]{0,256}:(?P<secret>(?!\d{1,5}(?:[/\s]|$))\S{1,256})"
        r"@(?=[^\s@/]*(?:[/?#\s\"',;)\]}]|$))"), ("://",), "key"),
    Pattern("netrc", re.compile(r"(?i)\bmachine\s+\S+\s+login\s+\S+\s+password\s+(?P<secret>\S+)"),
            _forms("machine")),
    # KEY=VALUE, KEY: VALUE, "KEY": "VALUE" (env dumps, configs, dicts, Namespace reprs): the
    # key ends in one of _KEYS (the regex starts there: fast; _replace reads the whole key)
    Pattern("keyword", re.compile(
        r"(?i)" + _KEYS + r"[\"']?[ \t]*[:=][ \t]*" + _VALUE),
        _KEY_LITERALS, "literal", True),
    # --KEY VALUE and '--KEY', 'VALUE' (command lines, as shells and Python lists print them)
    Pattern("flag", re.compile(
        r"(?i)(?<![\w-])--?[\w.-]*?" + _KEYS + r"(?:[ \t]+|[\"'],[ \t]*)(?=[^\s\"',;}\])-]|[\"'][^-])" + _VALUE),
        _KEY_LITERALS, "key", True),
)
# a private key's block spread over lines (records): its body lines, its header lines
_TEXTY = (str, list, tuple)  # fields values whose strings rows() redacts
CLEAN_KEPT = 4096  # fields strings known to hold no secret, remembered so the next Event skips them
CLEAN_MAX_CHARS = 512  # longer strings are not remembered
_KEY_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")
_KEY_LINE = re.compile(r"[A-Za-z0-9+/=]{1,100}|[A-Za-z-]{3,20}: [^\s]{1,200}|")


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


def _not_a_secret(m: re.Match, value: str) -> bool:
    """A key's value that is no secret: a tokenizer's special token, a token id
    (``token=50257``; ``token=#`` in a fingerprint), code (``token = self.tokenizer(batch["text"])``, unquoted)."""
    key = _key(m)
    if _TOKENIZER_KEYS.search(key):
        return True
    if _TOKEN_ID.fullmatch(value) and key.lower().endswith("token"):  # '#': a fingerprint's digits
        return True
    return m.group("q") is None and _CODE.match(value) is not None


def _replace(p: Pattern, counts: Counter, m: re.Match) -> str:
    try:
        start, end = m.span("secret")
    except IndexError:
        start, end = m.span()
    value = m.string[start:end]
    if value.lower() in _NOT_SECRETS or value.startswith("[redacted:") or (
            p.name in ("keyword", "flag") and _not_a_secret(m, value)):
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
        literals = list(owners)
        self._begin = literals.index("-----BEGIN ") if "-----BEGIN " in owners else None
        self._key_open = False  # a private key's block is open across lines (messages())
        self._ac = ahocorasick_rs.AhoCorasick(literals) if owners else None
        # a DFA: ~20 % less time a byte than the default automaton on ranklog's chunks (a
        # search a wake over every line read); the defaults' ~100 literals make a small one
        self._bytes_ac = ahocorasick_rs.BytesAhoCorasick(
            [w.encode() for w in owners], implementation=ahocorasick_rs.Implementation.DFA) if owners else None
        self._clean: set[str] = set()  # fields strings that held no secret (fields())

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
        out, taken, mine = [], [], Counter()  # taken: replaced spans, sorted, disjoint
        for i, a, b, m in found:  # earlier patterns first; a later one overlapping them is out
            k = bisect_right(taken, (a, b))
            if k and taken[k - 1][1] > a or k < len(taken) and taken[k][0] < b:
                continue
            text = _replace(self.patterns[i], mine, m)
            if text != m.group():
                insort(taken, (a, b))
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
        them joined; only a message with a literal's hit is looked at again. The
        messages are lines in order: a private key's block over several is redacted.
        ``chunks``: (first, count, bytes) where the caller holds msgs[first:first+count]
        (bytes) already joined by newlines, as read: searched as they are (the
        prefilter on the chunk: no message is encoded or joined again)."""
        return self._messages(msgs, counts, True, chunks)

    def _messages(self, msgs: Sequence[str | bytes], counts: Counter | None, lines: bool,
                  chunks: Sequence[tuple[int, int, bytes]] = ()) -> dict[int, tuple[str, str]]:
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
        for j, hits in sorted(per.items()):
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
        if lines and self._begin is not None and (self._key_open or any(
                lit == self._begin for hits in per.values() for lit, _, _ in hits)):
            self._key_lines(msgs, out, counts)
        return out

    def _key_lines(self, msgs: Sequence[str | bytes], out: dict, counts: Counter | None) -> None:
        """A private key printed over several lines (records, in order): the lines after a
        ``-----BEGIN ... PRIVATE KEY-----`` that ends its message, up to ``-----END``, are
        redacted whole while they look like the key's body (base64, ``Name: value`` headers).
        The state carries over to the next call (the next batch of the same source)."""
        for j, m in enumerate(msgs):
            text = m if type(m) is str else m.decode("utf-8", "replace")
            if self._key_open:
                line = text.strip()
                if "-----END" in line:
                    self._key_open = False
                    continue
                if _KEY_LINE.fullmatch(line):
                    if line:
                        out[j] = (MARK.format("private-key"), "private-key:1")
                        if counts is not None:
                            counts["private-key"] += 1
                    continue
                self._key_open = False
            begin = None
            for begin in _KEY_BEGIN.finditer(text):
                pass
            if begin is not None and "-----END" not in text[begin.end():]:
                self._key_open = True

    def rows(self, rows: list, counts: Counter | None = None) -> list:
        """Spool rows (wire-column tuples or Drafts) with their messages and the strings of
        their ``fields`` (top-level values, and strings in a top-level list: procs'
        ``cmdline``) redacted: the same list when nothing is; a redacted row gets
        ``fields.redacted``."""
        if not rows:
            return rows
        tuples = type(rows[0]) is tuple
        hits = self.messages([r[2] for r in rows] if tuples else [r.message for r in rows], counts)
        fields = [r[-1] if tuples else r.fields for r in rows]
        in_fields = self._fields(fields, counts)
        if not hits and not in_fields:
            return rows
        out = list(rows)
        for j in sorted(set(hits) | set(in_fields)):
            r = out[j]
            text, mark = hits.get(j, (r[2] if tuples else r.message, ""))
            new, more = in_fields.get(j, (fields[j], Counter()))
            both = parse_mark(mark) + more
            new = {**new, "redacted": ",".join(f"{k}:{v}" for k, v in sorted(both.items()))}
            if tuples:
                out[j] = (*r[:2], text, *r[3:-1], new)
            else:
                out[j] = replace(r, message=text, fields=new)
        return out

    def fields(self, f: dict, counts: Counter) -> dict | None:
        """``f`` with the secrets in its strings replaced, or None when it held none. Strings found
        clean are remembered (up to CLEAN_KEPT): the Events of a stream share most of theirs (where
        their rank was read, a path)."""
        texts = [v for k, v in f.items() if type(v) in _TEXTY and k != "redacted"]
        if all(type(v) is str and v in self._clean for v in texts):
            return None
        got = self._fields_of([f], counts)
        if got:
            return got[0][0]
        if len(self._clean) >= CLEAN_KEPT:
            self._clean.clear()
        self._clean.update(v for v in texts if type(v) is str and len(v) <= CLEAN_MAX_CHARS)
        return None

    def _fields(self, fields: Sequence[dict], counts: Counter | None) -> dict[int, tuple[dict, Counter]]:
        """Row index -> (its fields redacted, what was) for the rows whose fields held a secret:
        one search over every string value of every distinct fields dict (rows of one file
        often share theirs)."""
        rows_of: dict[int, list[int]] = {}
        for j, f in enumerate(fields):
            if f:
                rows_of.setdefault(id(f), []).append(j)
        if len(rows_of) < len(fields):
            firsts = [js[0] for js in rows_of.values()]
            got = self._fields_of([fields[j] for j in firsts], None)
            out = {}
            for n, (new, seen) in got.items():
                for j in rows_of[id(fields[firsts[n]])]:
                    out[j] = (new, seen)
                    if counts is not None:
                        counts.update(seen)
            return out
        return self._fields_of(fields, counts)

    def _fields_of(self, fields: Sequence[dict], counts: Counter | None) -> dict[int, tuple[dict, Counter]]:
        # (row, key, index in a list or None) of every string; most fields hold none (numbers)
        found = [(j, k, v) for j, f in enumerate(fields) if f for k, v in f.items()
                 if type(v) in _TEXTY and k != "redacted"]
        if not found:
            return {}
        where = [(j, k, None) for j, k, v in found if type(v) is str]
        where += [(j, k, i) for j, k, v in found if type(v) is not str
                  for i, item in enumerate(v) if type(item) is str]
        texts = [fields[j][k] if i is None else fields[j][k][i] for j, k, i in where]
        uniq = list(dict.fromkeys(texts))  # a batch's rows mostly share their values (a path)
        found_in = self._messages(uniq, None, False)
        if not found_in:
            return {}
        redacted = {uniq[n]: hit for n, hit in found_in.items()}
        out: dict[int, tuple[dict, Counter]] = {}
        for n in (n for n, t in enumerate(texts) if t in redacted):
            text, mark = redacted[texts[n]]
            j, k, i = where[n]
            new, seen = out.get(j) or (dict(fields[j]), Counter())
            if i is None:
                new[k] = text
            else:
                items = list(new[k])
                items[i] = text
                new[k] = items
            seen.update(parse_mark(mark))
            out[j] = (new, seen)
        if counts is not None:
            for _, seen in out.values():
                counts.update(seen)
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


def events(evs: Iterable[Any], redactor: Redactor | None, counts: Counter) -> Iterator[Any]:
    """Events (firstfault/analysis/events.py: ``text``, ``fields``) with their text and the
    strings of their fields redacted, as the analysis is about to read them: what it derives
    from them (a fingerprint blanks digits, hiding a key's shape) then holds no secret.
    ``counts`` adds what was redacted."""
    if redactor is None:
        yield from evs
        return
    for ev in evs:
        text = redactor.text(ev.text, counts)
        got = redactor.fields(ev.fields, counts) if ev.fields else None
        if got is not None:
            yield replace(ev, text=text, fields=got)
        else:
            yield ev if text == ev.text else replace(ev, text=text)


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
