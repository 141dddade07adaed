"""How often `firstfault analyze` is right, per test set, and how often a "high" answer is.

    python3 bench/accuracy.py [--show-misses]

For each set of tests/offline/scoring.py (real captures, format captures, pasted fragments):
the first failing rank, the category and the phase, each scored where the truth names it,
and the precision of the answers given with confidence "high" (right = every field the
truth names matches). Figures go to bench/RESULTS.md; tests/offline/test_fragments.py holds
the thresholds. Seconds, not minutes: every input is small.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tree's tests and firstfault, run as a file or -m

from tests.offline.scoring import SETS, score  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--show-misses", action="store_true")
    a = p.parse_args(argv)
    print("| set | inputs | rank | category | phase | high-confidence answers right |")
    print("|---|---|---|---|---|---|")
    misses = []
    for name, cases in SETS.items():
        s = score(cases())
        cells = [f"{s.hits[k]}/{s.asked[k]} ({s.pct(k):.0f}%)" if s.asked[k] else "-" for k in ("rank", "category", "phase")]
        high = f"{s.high_right}/{s.high} ({s.high_precision():.0f}%)" if s.high else "-"
        print(f"| {name} | {s.cases} | " + " | ".join(cells) + f" | {high} |")
        misses += [(name, *w) for w in s.wrong]
    if a.show_misses:
        for m in misses:
            print("miss", *m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
