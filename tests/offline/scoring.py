"""Score `firstfault analyze` against the truth of every test set: how often it names the first
failing rank, the category and the phase, and how often a "high" confidence answer is right.

Sets (each input with its truth; ``None`` in a truth: the input does not show it, not scored):

- ``real``: tests/data/real/*/scenario.json (`expected`), each folder analysed as a user would
  (its per-node folders as NODE=DIR, its checkpoint folder checked);
- ``formats``: tests/data/formats/expected.json (the captures that hold a failure);
- ``fragments``: tests/data/fragments/manifest.json, each input pasted on standard input.

An answer is right when every field its truth names matches: the rank (when the truth names
one), the category and the phase (when the truth names them). Used by
tests/offline/test_fragments.py and bench/accuracy.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from firstfault.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
FIELDS = ("rank", "category", "phase")


@dataclass
class Case:
    name: str
    args: list[str]  # analyze's arguments
    truth: dict  # rank, category, phase (None: not scored)
    stdin: bytes | None = None


@dataclass
class Score:
    cases: int = 0
    hits: dict = field(default_factory=lambda: {k: 0 for k in FIELDS})
    asked: dict = field(default_factory=lambda: {k: 0 for k in FIELDS})
    high: int = 0
    high_right: int = 0
    wrong: list = field(default_factory=list)  # (case, field, got, want)
    high_wrong: list = field(default_factory=list)

    def pct(self, key: str) -> float | None:
        return 100.0 * self.hits[key] / self.asked[key] if self.asked[key] else None

    def high_precision(self) -> float | None:
        return 100.0 * self.high_right / self.high if self.high else None


def real_cases() -> list[Case]:
    out = []
    for scen in sorted((DATA / "real").glob("*/scenario.json")):
        doc = json.loads(scen.read_text())
        folder = scen.parent
        exp = doc["expected"]
        paths = [str(folder) if p == "." else p.split("=", 1)[0] + "=" + str(folder / p.split("=", 1)[1])
                 for p in doc.get("analyze_paths", ["."])]
        args = paths + (["--checkpoint-dir", str(folder / "checkpoints")] if (folder / "checkpoints").is_dir() else [])
        if exp.get("failed") is False:
            truth = {"rank": None, "category": "none", "phase": None}
        else:
            truth = {"rank": exp.get("rank"), "category": exp["category"], "phase": exp.get("phase")}
        out.append(Case(folder.name, args, truth))
    return out


def format_cases() -> list[Case]:
    return [Case("+".join(c["files"]), [str(DATA / "formats" / f) for f in c["files"]],
                 {k: c[k] for k in FIELDS}) for c in json.loads((DATA / "formats" / "expected.json").read_text())]


def fragment_cases() -> list[Case]:
    out = []
    for e in json.loads((DATA / "fragments" / "manifest.json").read_text()):
        out.append(Case(e["file"], ["-"], {"rank": e.get("rank"), "category": e["category"], "phase": e["phase"]},
                        stdin=(DATA / "fragments" / e["file"]).read_bytes()))
    return out


SETS = {"real": real_cases, "formats": format_cases, "fragments": fragment_cases}


def analyze(case: Case) -> dict:
    """The JSON report of one case, from `firstfault analyze` run in this process."""
    out = io.StringIO()
    old = sys.stdin
    if case.stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(case.stdin))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            rc = main(["analyze", *case.args, "--format", "json", "--tz", "UTC"])
    finally:
        sys.stdin = old
    if rc != 0:
        raise RuntimeError(f"{case.name}: analyze exited {rc}")
    return json.loads(out.getvalue())


def first_failure_of(text: str) -> dict | None:
    """The report's first failure of ``text`` pasted on standard input (``analyze -``), as users paste logs."""
    return analyze(Case("paste", ["-"], {}, stdin=text.encode()))["first_failure"]


def answer(rep: dict) -> dict:
    ff = rep["first_failure"]
    if ff is None:
        return {"rank": None, "category": "none", "phase": None, "confidence": None}
    return {"rank": ff["rank"], "category": ff["category"], "phase": ff["phase"], "confidence": ff["confidence"]}


def score(cases: list[Case]) -> Score:
    s = Score()
    for case in cases:
        got = answer(analyze(case))
        s.cases += 1
        right = True
        for key in FIELDS:
            want = case.truth[key]
            if want is None:
                continue
            s.asked[key] += 1
            if got[key] == want:
                s.hits[key] += 1
            else:
                right = False
                s.wrong.append((case.name, key, got[key], want))
        if got["confidence"] == "high":
            s.high += 1
            s.high_right += right
            if not right:
                s.high_wrong.append((case.name, got, case.truth))
    return s
