"""How often `firstfault analyze` is right on the development corpus of public failure threads.

    python3 -m bench.corpus [--texts DIR] [--index FILE] [--cases] [--misses] [--json OUT]

The corpus (../shared/corpus/index.jsonl) labels 129 public GitHub threads in the report's own
vocabulary: the first failing rank, the category and the phase. Its texts are third-party and
never enter this repository: each case's excerpt is read from ``--texts`` (default
``$FIRSTFAULT_CORPUS_TEXTS``, else scratch/corpus in the nearest folder above the checkout), one ``<id>.log`` per
case, and fed to ``firstfault analyze -`` on standard input, as a user pastes a log.

Scoring, as the corpus's README asks:
- rank: on the cases whose label names a rank;
- category: on the cases whose label is not ``unknown``;
- phase: on the cases whose label is not ``unknown`` (``checkpoint-load`` counts for ``init``);
- "no failure found": every case shows a failure, so each such answer is a miss;
- wrong at high: an answer with confidence high where a scored field is wrong.
Figures per framework family and per labelled category, high- and medium-confidence labels apart.
Cases without a text are listed, not scored.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tests.offline import scoring

ROOT = Path(__file__).resolve().parents[1]


def _beside(rel: str) -> Path:
    """``rel`` in the nearest folder above the checkout that holds it (a worktree may sit deeper)."""
    for up in ROOT.parents:
        if (up / rel).exists():
            return up / rel
    return ROOT.parent / rel


INDEX = Path(os.environ.get("FIRSTFAULT_CORPUS_INDEX") or _beside("shared/corpus/index.jsonl"))
TEXTS = Path(os.environ.get("FIRSTFAULT_CORPUS_TEXTS") or _beside("scratch/corpus"))
CLASSES = ("rank", "category", "phase")

# framework family: the first family whose word appears in the label's framework or launcher
FAMILIES = (
    ("ray RL", ("verl", "openrlhf", "roll", "slime", "ray")),
    ("megatron/nemo", ("megatron", "nemo")),
    ("lightning", ("lightning",)),
    ("llama-factory/colossalai/torchtune/titan", ("llama-factory", "colossalai", "torchtune", "torchtitan")),
    ("hf/accelerate/trl", ("hf-", "accelerate", "trl", "transformers", "axolotl", "finetrainers")),
    ("deepspeed", ("deepspeed",)),
    ("pytorch ddp/fsdp", ("pytorch", "ddp", "fsdp", "torch")),
)


def family(row: dict) -> str:
    words = f"{row['framework']} {row['launcher']}".lower()
    for name, keys in FAMILIES:
        if any(k in words for k in keys):
            return name
    return "other"


@dataclass
class Tally:
    cases: int = 0
    hits: dict = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    asked: dict = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    none_found: int = 0
    high: int = 0
    high_wrong: int = 0

    def add(self, verdict: dict) -> None:
        self.cases += 1
        for k in CLASSES:
            if verdict[k] is not None:
                self.asked[k] += 1
                self.hits[k] += verdict[k]
        self.none_found += verdict["none_found"]
        self.high += verdict["high"]
        self.high_wrong += verdict["high_wrong"]

    def row(self, name: str) -> str:
        cells = [f"{self.hits[k]}/{self.asked[k]} ({100 * self.hits[k] / self.asked[k]:.0f}%)"
                 if self.asked[k] else "-" for k in CLASSES]
        return (f"| {name} | {self.cases} | " + " | ".join(cells)
                + f" | {self.none_found} | {self.high_wrong}/{self.high} |")


def analyze(text: bytes) -> dict:
    """The JSON report of one pasted text, from `firstfault analyze -` run in this process."""
    return scoring.analyze(scoring.Case("paste", ["-"], {}, stdin=text))


def judge(row: dict, rep: dict) -> tuple[dict, dict]:
    """(the answer, the verdict per class: True/False where scored, None where the label says nothing)."""
    ff = rep.get("first_failure")
    got = ({"rank": None, "category": "none", "phase": None, "confidence": None, "signature": None} if ff is None
           else {k: ff.get(k) for k in ("rank", "category", "phase", "confidence", "signature")})
    phase = got["phase"]
    if phase == "checkpoint-load" and row["phase"] == "init":
        phase = "init"
    verdict = {
        "rank": None if row["first_failing_rank"] is None else got["rank"] == row["first_failing_rank"],
        "category": None if row["category"] == "unknown" else got["category"] == row["category"],
        "phase": None if row["phase"] == "unknown" else phase == row["phase"],
        "none_found": ff is None,
    }
    wrong = any(verdict[k] is False for k in CLASSES)
    verdict["high"] = got["confidence"] == "high"
    verdict["high_wrong"] = verdict["high"] and wrong
    return got, verdict


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=Path, default=TEXTS, help="folder of <id>.log excerpts (outside the repository)")
    p.add_argument("--index", type=Path, default=INDEX)
    p.add_argument("--cases", action="store_true", help="print one line per case")
    p.add_argument("--misses", action="store_true", help="print only the cases with a wrong scored field")
    p.add_argument("--json", type=Path, help="write every case's answer and verdict here")
    a = p.parse_args(argv)
    try:
        rows = [json.loads(line) for line in a.index.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        print(f"bench.corpus: cannot read the index {a.index}: {e}", file=sys.stderr)
        return 2
    total, by_family, by_class, by_conf = Tally(), defaultdict(Tally), defaultdict(Tally), defaultdict(Tally)
    missing, out = [], []
    for row in rows:
        path = a.texts / f"{row['id']}.log"
        if not path.is_file():
            missing.append(row["id"])
            continue
        got, verdict = judge(row, analyze(path.read_bytes()))
        for t in (total, by_family[family(row)], by_class[row["category"]], by_conf[row["label_confidence"]]):
            t.add(verdict)
        out.append({"id": row["id"], "got": got, "verdict": verdict,
                    "want": {"rank": row["first_failing_rank"], "category": row["category"], "phase": row["phase"]}})
        bad = any(verdict[k] is False for k in CLASSES) or verdict["none_found"]
        if a.cases or (a.misses and bad):
            marks = " ".join(f"{k}={'ok' if verdict[k] else 'NO' if verdict[k] is False else '-'}" for k in CLASSES)
            print(f"{row['id']} {family(row):<12.12} {marks} got={got['category']}/{got['phase']}/r{got['rank']}"
                  f"/{got['confidence']}/{got['signature']} want={row['category']}/{row['phase']}"
                  f"/r{row['first_failing_rank']}")
    head = "| {} | cases | rank | category | phase | no failure found | wrong at high |\n|---|---|---|---|---|---|---|"
    print(head.format("set"))
    print(total.row("all"))
    for conf in sorted(by_conf):
        print(by_conf[conf].row(f"labels of confidence {conf}"))
    print()
    print(head.format("framework"))
    for name in sorted(by_family, key=lambda n: -by_family[n].cases):
        print(by_family[name].row(name))
    print()
    print(head.format("labelled category"))
    for name in sorted(by_class, key=lambda n: -by_class[n].cases):
        print(by_class[name].row(name))
    if missing:
        print(f"\nno text for {len(missing)} case(s): {' '.join(missing)}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
