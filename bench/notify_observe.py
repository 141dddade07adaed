"""The notifier's cost on the collector's event loop: ``Notifier.stored`` over one batch of records
(what the ingest calls after each batch is durable), per record.

    python3 bench/notify_observe.py [--records 10000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone, not an install

from firstfault.collector.notify.config import NotifyConfig  # noqa: E402
from firstfault.collector.notify.notifier import Notifier  # noqa: E402


async def _no_report(job: str) -> dict:
    return {}


def batches(n: int) -> dict[str, dict[str, list]]:
    """Batches as the store hands them to the notifier (columns), in three shapes."""
    return {
        "one job": {"job": ["j1"] * n, "kind": ["rank.line"] * n, "rank": [i % 8 for i in range(n)],
                    "fields": [{}] * n, "observed_ns": list(range(n))},
        "no job (kernel)": {"job": [None] * n, "kind": ["kernel.line"] * n, "rank": [None] * n,
                            "fields": [{}] * n, "observed_ns": list(range(n))},
        "two jobs + an exit": {"job": [f"j{i % 2}" for i in range(n)], "kind": ["rank.line"] * (n - 1) + ["proc.exit"],
                               "rank": [i % 8 for i in range(n)], "fields": [{}] * (n - 1) + [{"code": 1}],
                               "observed_ns": list(range(n))},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=10_000, help="records per batch")
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args(argv)
    notifier = Notifier(NotifyConfig(), report=_no_report, clock=lambda node: (5, 10))
    for name, batch in batches(a.records).items():
        best = min(timeit.repeat(lambda: notifier.stored("a", batch), number=20, repeat=a.repeat)) / 20
        print(f"{name}: {best * 1e3:.3f} ms per {a.records}-record batch, {best / a.records * 1e9:.0f} ns/record")
    return 0


if __name__ == "__main__":
    sys.exit(main())
