"""The failure catalog: load, check and match ``signatures/*.toml``. Pure.

Reads only the TOML files shipped in ``signatures/`` next to this module
(``importlib.resources``), in the order of their names, or the files at a given
path: ``[[signature]]`` entries (signatures/README.md documents their keys; one example line they match: ``[rank0]: RuntimeError: [.../pair.cc:553]
Connection closed by peer [127.0.0.1]:15546`` -> ``gloo.peer_closed``, a cascade)
and ``[xid.<code>]`` tables (name, bucket, category, optional role).

Invariants:
- Signatures are tried in file order (files by name), each only on text holding one of its
  needles (literal, case-sensitive); so ``Catalog.prefilter`` (every needle in
  one regex) is an exact skip test: text it does not hit matches nothing.
- ``load_catalog`` checks every entry and raises one ``CatalogError`` listing
  every problem found.
- ``Match.summary`` never raises: a parenthesis holding a placeholder without a
  value is left out, elsewhere such a placeholder reads ``<name>``; a malformed
  template comes back as written.
- A match whose groups hold ``xid`` takes category and role from the Xid table
  when it knows the code.

Cost (CPython 3.11 here): ``match`` takes a few µs on progress and checkpoint
lines (first in the file, being most of the lines that hold a needle) and some
30 µs on text that reaches the end of the catalog. ``prefilter`` scans log text
at roughly 10-25 MB/s; to scan at 50 MB/s and more, give ``Catalog.needles`` to
an Aho-Corasick automaton (scan.py does) and call ``match`` on its hits only.

Known issues: group values are strings (callers convert); a needle on one line
and the pattern's hit on another line of a multi-line text still match.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
import string
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import ahocorasick_rs

ROLES = ("root", "cascade", "context")
CATEGORIES = ("user-code", "config", "gpu-memory", "host-memory", "numerics", "framework",
              "hardware", "network", "storage", "cascade", "unknown")
PHASES = ("init", "forward", "backward", "param-gather", "optimizer-step", "checkpoint-save",
          "checkpoint-load", "data", "unknown")
XID_BUCKETS = ("application", "hardware", "driver", "informational")
EXTRA_PLACEHOLDERS = ("xid_name",)  # filled from the Xid table, not from a regex group

_ID = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+$")
_REQUIRED = ("id", "role", "category", "phases", "needles", "patterns", "summary", "first_action",
             "reference", "examples")
_OPTIONAL = ("not_examples", "max_confidence", "category_from_words", "names_rank_of", "traits", "greater")
# What the code asks of a signature, instead of its id: each trait a signature may carry (``traits``)
# and what it means. The loader refuses any other; tests/analysis/test_catalog.py checks each is carried.
TRAITS = {
    "progress": "a rank's training went on (a step counter): the latest per rank is kept",
    "save-start": "a checkpoint save began (its tag)",
    "save-file": "a checkpoint save wrote a file (its tag)",
    "save-done": "a checkpoint save finished (its tag)",
    "load-start": "a checkpoint load began",
    "launcher-ok": "the launcher saw every worker exit 0",
    "group-ok": "torchrun's worker group succeeded",
    "failure-table-rank": "torchrun's failure table: the rank of the exit line below",
    "failure-table-host": "torchrun's failure table: the host of the rank line below",
    "stopped-from-outside": "the launcher itself was told to stop (a cancel, a time limit)",
    "child-failed": "a launcher's word that a worker failed, without what failed (torchrun's ChildFailedError, "
                    "mpirun's first non-zero exit, the training-operator's failed replicas): judge.py",
    "launcher-stop": "a launcher stopping its workers (it kills or signals them): not a rank's own words",
    "collective-timeout": "a collective or barrier timed out on this rank: it waited for a peer",
    "nccl-work-status": "ProcessGroupNCCL's last enqueued and completed work of a rank",
    "oom-kill": "an OOM killer (kernel, Slurm, Ray, the kubelet) ended a process",
    "oom-report": "the kernel's report of its OOM killer at work (the allocation that invoked it, the victim it "
                  "chose), printed only as it kills: judge.oom_reported",
    "xid-kernel": "an Xid the driver logged (NVRM), with its pid",
    "xid-nvml": "an Xid NVML reported (the agent), with the GPU",
    "fatal-error": "Python's own fatal error line (faulthandler's 'Fatal Python error: ...')",
    "generic": "a last resort that names no failure of its own: its message is its fingerprint",
    "cut-traceback": "a traceback whose exception line is missing",
    "mention": "words in prose that name a class of failure",
    "death-words": "words that a process was killed with no error of its own: they say nothing of a traceback's "
                   "exception (judge.with_mentioned_category)",
    "unexplained": "a death whose reporter does not know its cause: the text's words may name its class (judge.py)",
    "memory-unresolved": "an out-of-memory whose memory (GPU or host) the line does not say: the text's words about "
                         "memory may (judge.py)",
    "quoted-exception": "an exception quoted inside a line (a sentence, quotes): the failure only when nothing else is (judge.py)",
    "carried-exception": "a line that carries another process's exception (Ray's RayTaskError(<cause>)): the failure only when nothing else is (judge.py)",
    "nccl-result": "names only an ncclResult code; a 'Last error:' line below it names the cause (lasterror.py)",
    "peer-socket": "NCCL's words that its socket to a peer closed or broke (a cascade): the cause an ncclResult wrapper "
                   "above it stands for all the same (lasterror.py)",
    "comm-setup": "an ncclResult that NCCL's communicator set-up returns (bootstrap and transport sockets, topology, "
                  "buffers), raised at the collective that made the communicator: failure_phase.nccl_setup",
    "nccl-trace": "NCCL's error back trace (file:line -> code): an earlier line of the same process says more (lasterror.py)",
    "native-trace": "a native stack trace (c10's frames, glibc backtrace_symbols): the failure printed just above it says more (lasterror.py)",
    "memory-user": "a row of an OOM killer's list of the node's biggest processes, with the task it ran: failure_phase.py",
    "work-bar": "a progress bar of work other than training (data preparation, evaluation), with its elapsed time: timeout_cause.py",
    "training-ended": "a trainer's own line that training ended (max epochs or steps reached): timeout_cause.py",
    "save-begins": "a line that says a checkpoint save began, a framework's or the job's own words: timeout_cause.py",
    "phase-marker": "a line phases.toml's [[marker]] rules name (set-up, a save, progress): the latest of each is kept",
}
NAMES_RANK_OF = ("next-traceback",)
# Traits of the last resorts and of words about a failure: they never take a line from a context signature.
_LAST_RESORTS = frozenset({"generic", "mention", "quoted-exception", "carried-exception"})
_TOP = ("version", "signature", "xid", "category_rule")
CONFIDENCES = ("low", "medium", "high")


class CatalogError(Exception):
    """The catalog cannot be used; ``problems`` lists every reason found."""

    def __init__(self, source: str, problems: list[str]):
        self.source, self.problems = source, list(problems)
        listing = "\n  ".join(self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s) in the failure catalog:\n  {listing}")


class LazyPattern:
    """One of a signature's patterns, compiled on its first use: a run of ``analyze`` tries a few
    dozen of the catalog's ~900 patterns, and compiling all at every start took about half of a
    one-line log's time. The shipped catalog's patterns are compiled and checked by its tests
    (``load_catalog(check=True)``); a catalog given by path is checked as it is read."""

    __slots__ = ("pattern", "_rx")

    def __init__(self, pattern: str, rx: re.Pattern[str] | None = None) -> None:
        self.pattern = pattern
        self._rx = rx

    @property
    def compiled(self) -> re.Pattern[str]:
        if self._rx is None:
            self._rx = re.compile(self.pattern)
        return self._rx

    def search(self, text: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return self.compiled.search(text, pos, endpos)

    @property
    def groupindex(self) -> Mapping[str, int]:
        return self.compiled.groupindex

    # a pattern is its text, as a compiled one is: equal by it, and a copy is itself
    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazyPattern) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def __copy__(self) -> LazyPattern:
        return self

    def __deepcopy__(self, memo: dict) -> LazyPattern:
        return self

    def __repr__(self) -> str:
        return f"LazyPattern({self.pattern!r})"


@dataclass(frozen=True, slots=True)
class Signature:
    id: str
    role: str
    category: str
    phases: tuple[str, ...]
    needles: tuple[str, ...]
    patterns: tuple[LazyPattern, ...]
    summary: str
    first_action: str
    reference: str
    examples: tuple[str, ...]
    not_examples: tuple[str, ...] = ()
    index: int = 0  # position in the file: the order signatures are tried in
    max_confidence: str = "high"  # the most confidence a finding of it can have (generic ones: less)
    category_from_words: bool = False  # the category comes from the matched text (category_rule), not ``category``
    # the rank it names belongs to another line of its stream: the next traceback (a launcher's line
    # above a child's traceback)
    names_rank_of: str | None = None
    traits: frozenset[str] = frozenset()  # what the code asks of it (TRAITS)
    # (a, b): a match counts only where group a's number exceeds group b's (more processes joined than the world)
    greater: tuple[str, str] | None = None

    def holds(self, groups: dict[str, str | None]) -> bool:
        """Whether a pattern's match stands: ``greater``'s condition, where the signature has one."""
        if self.greater is None:
            return True
        a, b = (groups.get(k) or "" for k in self.greater)
        return a.isdigit() and b.isdigit() and int(a) > int(b)


@dataclass(frozen=True, slots=True)
class CategoryRule:
    """``[[category_rule]]``: text (an exception's type and message) that one of ``patterns``
    (case-insensitive) finds is of ``category``. Rules are tried in file order."""

    category: str
    patterns: tuple[re.Pattern[str], ...]


@dataclass(frozen=True, slots=True)
class XidInfo:
    code: int
    name: str
    bucket: str  # application | hardware | driver | informational
    category: str
    role: str  # as given, else "context" for informational codes and "root" otherwise


@dataclass(frozen=True, slots=True)
class Match:
    signature: Signature
    groups: dict[str, str]  # the named groups that matched (None dropped)
    category: str  # effective: the Xid table overrides the signature's
    role: str
    summary: str  # rendered with the groups
    xid: XidInfo | None = None

    @property
    def first_action(self) -> str:
        return render(self.signature.first_action, self.groups)


_UNSAID = "\x00"  # stands for a placeholder without a value while the text is put together


def render(template: str, values: dict[str, str]) -> str:
    """Fill ``{name}`` placeholders. A parenthesis that holds one without a value is left out (the line did
    not say it: "A worker (pid {pid}) died" reads "A worker died"); elsewhere a missing one reads ``<name>``.
    Never raises."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError:
        return template
    out = []
    for literal, name, _spec, _conv in parts:
        out.append(literal.replace(_UNSAID, ""))
        if name is not None:
            out.append(str(values[name]).replace(_UNSAID, "") if values.get(name) is not None else _UNSAID + name + _UNSAID)
    text = "".join(out)
    if _UNSAID not in text:
        return text
    text = _UNSAID_ASIDE.sub("", text)
    return _UNSAID_NAME.sub(lambda m: f"<{m.group(1)}>", text)


_UNSAID_ASIDE = re.compile(r" ?\([^()\x00]*(?:\x00[^\x00]*\x00[^()\x00]*)+\)")
_UNSAID_NAME = re.compile(r"\x00([^\x00]*)\x00")


def needle_regex(needles: Iterable[str]) -> re.Pattern[str]:
    """One regex that hits where any needle occurs, shaped as a trie (one branch per character)."""
    trie: dict = {}
    for n in needles:
        node = trie
        for ch in n:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict) -> str:
        if "" in node:  # a needle ends here: longer ones add nothing to "occurs"
            return ""
        alts = [re.escape(ch) + build(child) for ch, child in sorted(node.items())]
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return re.compile(build(trie) if trie else r"(?!)")  # no needles: never hits


class Catalog:
    """Signatures in file order, the Xid table and the needle prefilter."""

    def __init__(self, signatures: tuple[Signature, ...], xids: dict[int, XidInfo],
                 category_rules: tuple[CategoryRule, ...] = ()):
        self.signatures = signatures
        self.category_rules = category_rules
        self._by_id = {s.id: s for s in signatures}
        self._xids = xids
        # One automaton over every needle: a text's needles name the few signatures worth
        # trying, in one pass over the text instead of one substring search per needle.
        words = sorted({n for s in signatures for n in s.needles})
        self._words = {w: i for i, w in enumerate(words)}
        self._needle_sigs: list[tuple[int, ...]] = [
            tuple(k for k, s in enumerate(signatures) if w in s.needles) for w in words
        ]
        self._ac = ahocorasick_rs.AhoCorasick(words) if words else None

    def __len__(self) -> int:
        return len(self.signatures)

    @functools.cached_property
    def prefilter(self) -> re.Pattern[str]:
        """Every needle in one regex (needle_regex), built on first use: ``match`` needs only the
        automaton, and compiling this takes a tenth of a second at every start."""
        return needle_regex([n for s in self.signatures for n in s.needles])

    def get(self, sig_id: str) -> Signature | None:
        return self._by_id.get(sig_id)

    def ids_with(self, trait: str) -> frozenset[str]:
        """The ids of the signatures that carry ``trait`` (catalog.TRAITS)."""
        if trait not in TRAITS:
            raise KeyError(f"no trait {trait!r} in the catalog's vocabulary")
        return frozenset(s.id for s in self.signatures if trait in s.traits)

    def xid(self, code: int) -> XidInfo | None:
        return self._xids.get(code)

    def match(self, text: str) -> Match | None:
        """The first signature, in file order, with a needle in ``text`` and a matching pattern; a
        context signature (a progress bar, a set-up line) only when no other signature matches but
        last resorts (``_LAST_RESORTS``): a failure printed on the same line as a bar (no newline
        between them) is the line's failure."""
        if self._ac is None:
            return None
        hits = self._ac.find_matches_as_indexes(text, overlapping=True)
        if not hits:
            return None
        context = None
        for k in sorted({k for w, _, _ in hits for k in self._needle_sigs[w]}):
            sig = self.signatures[k]
            if context is not None and (sig.role == "context" or not _LAST_RESORTS.isdisjoint(sig.traits)):
                continue
            for pat in sig.patterns:
                m = pat.search(text)
                if m is not None and sig.holds(m.groupdict()):
                    if sig.role != "context":
                        return self._match(sig, m)
                    context = self._match(sig, m)
                    break
        return context

    def category_of(self, text: str, default: str) -> str:
        """The category the first category_rule finding ``text`` names, else ``default``."""
        for rule in self.category_rules:
            if any(p.search(text) for p in rule.patterns):
                return rule.category
        return default

    def _match(self, sig: Signature, m: re.Match[str]) -> Match:
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        category, role, info, values = sig.category, sig.role, None, groups
        if sig.category_from_words:
            said = " ".join(v for k, v in groups.items() if k in ("exc_type", "message")) or m.group(0)
            category = self.category_of(said, sig.category)
        code = groups.get("xid", "")
        if code.isdigit() and (info := self._xids.get(int(code))) is not None:
            category, role, values = info.category, info.role, {**groups, "xid_name": info.name}
        return Match(sig, groups, category, role, render(sig.summary, values), info)


@functools.lru_cache(maxsize=1)
def shipped() -> Catalog:
    """The shipped catalog, loaded once per process (for code that needs its data, not a choice of catalog)."""
    return load_catalog()


def load_catalog(path: str | Path | None = None, *, check: bool = False) -> Catalog:
    """Load and check the catalog: the shipped one when ``path`` is None, else the TOML
    file at ``path`` or every ``*.toml`` in the folder at ``path`` (in the order of their names).
    The shipped catalog's regexes are compiled on first use unless ``check`` (its tests check them
    all); a catalog given by path is always checked whole."""
    if path is None:
        folder = importlib.resources.files("firstfault.analysis").joinpath("signatures")
        files = sorted((f for f in folder.iterdir() if f.name.endswith(".toml")), key=lambda f: f.name)
        return parse_catalog_files([(f"firstfault/analysis/signatures/{f.name}", f.read_text(encoding="utf-8"))
                                    for f in files], check=check)
    p = Path(path)
    if p.is_dir():
        return parse_catalog_files([(str(f), f.read_text(encoding="utf-8")) for f in sorted(p.glob("*.toml"))])
    return parse_catalog(p.read_text(encoding="utf-8"), str(p))


def parse_catalog(raw: str, source: str = "<string>") -> Catalog:
    """Check a catalog's TOML text; every problem is reported at once."""
    return parse_catalog_files([(source, raw)])


def parse_catalog_files(texts: list[tuple[str, str]], *, check: bool = True) -> Catalog:
    """Check the catalog made of several TOML texts ((source, text), in the order signatures are
    tried); every problem of every file is reported at once, each with its file. Without ``check``
    the signatures' regexes are left to compile on first use (their problems, and placeholders
    no group fills, are not looked for)."""
    problems: list[str] = []
    sigs: list[Signature] = []
    xids: dict[int, XidInfo] = {}
    rules: list[CategoryRule] = []
    seen: set = set()
    for source, raw in texts:
        try:
            doc = tomllib.loads(raw)
        except tomllib.TOMLDecodeError as e:
            problems.append(f"{source}: not valid TOML: {e}")
            continue
        problems += [f"{source}: unknown top-level key {k!r}" for k in doc if k not in _TOP]
        entries = doc.get("signature", [])
        if not isinstance(entries, list):
            problems.append(f"{source}: signature must be [[signature]] tables")
            entries = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                problems.append(f"{source}: signature #{i}: not a table")
                continue
            sid = entry.get("id")
            where = f"{source}: signature #{i} {sid!r}"
            if isinstance(sid, str) and sid in seen:
                problems.append(f"{where}: duplicate id")
            seen.add(sid if isinstance(sid, str) else None)
            before = len(problems)
            sig = _signature(len(sigs), where, entry, problems, check)
            if len(problems) == before:
                sigs.append(sig)
        rules += _category_rules(source, doc.get("category_rule", []), problems)
        for code, info in _xids(doc.get("xid", {}), problems).items():
            if code in xids:
                problems.append(f"{source}: xid {code} is defined twice")
            xids[code] = info
    if not sigs and not problems:
        problems.append("no [[signature]] entries")
    if problems:
        raise CatalogError(texts[0][0] if len(texts) == 1 else "the catalog", problems)
    return Catalog(tuple(sigs), xids, tuple(rules))


def _category_rules(source: str, entries: object, problems: list[str]) -> list[CategoryRule]:
    if not isinstance(entries, list):
        problems.append(f"{source}: category_rule must be [[category_rule]] tables")
        return []
    out = []
    for i, entry in enumerate(entries):
        where = f"{source}: category_rule #{i}"
        if not isinstance(entry, dict):
            problems.append(f"{where}: not a table")
            continue
        before = len(problems)
        problems += [f"{where}: unknown key {k!r}" for k in entry if k not in ("category", "patterns", "reason")]
        category = entry.get("category")
        if category not in CATEGORIES or category in ("cascade", "unknown"):
            problems.append(f"{where}: category {category!r} is not a failure category")
        compiled = []
        for j, p in enumerate(_field(where, entry, "patterns", "list", problems)):
            problems += _doubled_escape(where, j, p)
            try:
                compiled.append(re.compile(p, re.IGNORECASE))
            except re.error as e:
                problems.append(f"{where}: pattern {j} does not compile: {e}")
        _field(where, entry, "reason", "str", problems)
        if len(problems) == before:
            out.append(CategoryRule(category, tuple(compiled)))
    return out


_DOUBLED = re.compile(r"\\\\[bBdDsSwW]")


def _doubled_escape(where: str, j: int, pattern: str) -> list[str]:
    """A pattern holding two backslashes before b, d, s or w: a basic TOML string's escape written
    in a literal ('...') string, which matches a backslash, never a word boundary or a class."""
    m = _DOUBLED.search(pattern)
    return [f"{where}: pattern {j} holds {m.group(0)!r}: in a '...' TOML string one backslash is the regex's"] if m else []


def _field(where: str, entry: dict, key: str, kind: str, problems: list[str]):
    """Return ``entry[key]`` checked as a non-empty string ("str") or a list of them ("list")."""
    v = entry.get(key, [] if kind == "list" else "")
    if kind == "str" and not (isinstance(v, str) and v.strip()):
        problems.append(f"{where}: {key} must be a non-empty string")
        return ""
    if kind == "list" and not (isinstance(v, list) and all(isinstance(x, str) and x for x in v)):
        problems.append(f"{where}: {key} must be a list of non-empty strings")
        return ()
    return tuple(v) if kind == "list" else v


def _signature(i: int, where: str, entry: dict, problems: list[str], check: bool = True) -> Signature:
    problems += [f"{where}: unknown key {k!r}" for k in entry if k not in _REQUIRED + _OPTIONAL]
    problems += [f"{where}: missing key {k!r}" for k in _REQUIRED if k not in entry]
    sid, role, category = entry.get("id"), entry.get("role"), entry.get("category")
    if not (isinstance(sid, str) and _ID.match(sid)):
        problems.append(f"{where}: id must be dotted lower-case words, <source>.<failure>, like 'source.failure_name'")
    if role not in ROLES:
        problems.append(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
    if category not in CATEGORIES:
        problems.append(f"{where}: category {category!r} is not one of {', '.join(CATEGORIES)}")
    elif role in ROLES and (role == "cascade") != (category == "cascade"):
        problems.append(f"{where}: a cascade has category 'cascade', and only a cascade does")
    phases = _field(where, entry, "phases", "list", problems)
    problems += [f"{where}: phase {p!r} is not one of {', '.join(PHASES)}" for p in phases if p not in PHASES]
    lists = {k: _field(where, entry, k, "list", problems) for k in ("needles", "patterns", "examples", "not_examples")}
    problems += [f"{where}: {k} must not be empty" for k in ("needles", "patterns", "examples")
                 if k in entry and not lists[k]]
    patterns = [LazyPattern(p) for p in lists["patterns"]]
    groups = set(EXTRA_PLACEHOLDERS)
    for j, p in enumerate(patterns if check else ()):
        problems += _doubled_escape(where, j, p.pattern)
        try:
            groups |= set(p.groupindex)
        except re.error as e:
            problems.append(f"{where}: pattern {j} does not compile: {e}")
    texts = {k: _field(where, entry, k, "str", problems) for k in ("summary", "first_action", "reference")}
    for key in ("summary", "first_action"):
        if "\n" in texts[key]:
            problems.append(f"{where}: {key} must be one line")
        try:
            names = [n for _, n, _, _ in string.Formatter().parse(texts[key]) if n is not None]
        except ValueError as e:
            problems.append(f"{where}: {key} is not a valid template: {e}")
            continue
        if check:
            problems += [f"{where}: {key} placeholder {{{n}}} is no group of any pattern" for n in names
                         if n not in groups]
    max_conf = entry.get("max_confidence", "high")
    if max_conf not in CONFIDENCES:
        problems.append(f"{where}: max_confidence {max_conf!r} is not one of {', '.join(CONFIDENCES)}")
    from_words = entry.get("category_from_words", False)
    if not isinstance(from_words, bool):
        problems.append(f"{where}: category_from_words must be true or false")
    traits = _field(where, entry, "traits", "list", problems) if "traits" in entry else ()
    problems += [f"{where}: trait {t!r} is not one of {', '.join(TRAITS)}" for t in traits if t not in TRAITS]
    names_rank_of = entry.get("names_rank_of")
    if names_rank_of is not None and names_rank_of not in NAMES_RANK_OF:
        problems.append(f"{where}: names_rank_of {names_rank_of!r} is not one of {', '.join(NAMES_RANK_OF)}")
    greater = entry.get("greater")
    if greater is not None and not (isinstance(greater, list) and len(greater) == 2
                                    and all(isinstance(g, str) for g in greater)):
        problems.append(f"{where}: greater must be two group names [a, b] (a's number exceeds b's)")
        greater = None
    elif greater is not None and check:
        problems += [f"{where}: greater names {g!r}, no group of any pattern" for g in greater if g not in groups]
    return Signature(str(sid), str(role), str(category), phases, lists["needles"], tuple(patterns),
                     texts["summary"], texts["first_action"], texts["reference"], lists["examples"],
                     lists["not_examples"], i, str(max_conf), from_words is True,
                     names_rank_of if names_rank_of in NAMES_RANK_OF else None, frozenset(traits),
                     tuple(greater) if greater is not None else None)


def _xids(table: object, problems: list[str]) -> dict[int, XidInfo]:
    if not isinstance(table, dict):
        problems.append("xid must be a table of [xid.<code>] tables")
        return {}
    out = {}
    for key, entry in table.items():
        where = f"xid {key!r}"
        if not key.isdigit() or not isinstance(entry, dict):
            problems.append(f"{where}: must be [xid.<code>] with a decimal number code")
            continue
        before = len(problems)
        problems += [f"{where}: unknown key {k!r}" for k in entry if k not in ("name", "bucket", "category", "role")]
        name = _field(where, entry, "name", "str", problems)
        bucket, category, role = entry.get("bucket"), entry.get("category"), entry.get("role")
        if bucket not in XID_BUCKETS:
            problems.append(f"{where}: bucket {bucket!r} is not one of {', '.join(XID_BUCKETS)}")
        if category not in CATEGORIES or category == "cascade":
            problems.append(f"{where}: category {category!r} is not a failure category")
        if role is not None and role not in ROLES:
            problems.append(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
        if len(problems) == before:
            role = role or ("context" if bucket == "informational" else "root")
            out[int(key)] = XidInfo(int(key), name, bucket, category, role)
    return out
