"""Prometheus text exposition (format 0.0.4), pure: a metric family at a time.

Shared by the agent's /metrics (firstfault/agent/metrics.py) and the collector's
(firstfault/collector/metrics.py), so both write families, labels and numbers alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Sample = tuple[str, Mapping[str, str], int | float]  # (name suffix, labels, value)


def family(name: str, kind: str, help_: str, samples: Iterable[Sample] | int | float) -> list[str]:
    """HELP, TYPE and the samples of family ``name``; a bare number is its one sample.
    A sample's suffix extends the name (a histogram's ``_bucket``, ``_sum``, ``_count``).
    Ints are written as they are (a seq keeps every digit), floats by repr."""
    if isinstance(samples, (int, float)):
        samples = [("", {}, samples)]
    out = [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
    for suffix, labels, value in samples:
        lab = ",".join(f'{k}="{label_value(v)}"' for k, v in labels.items())
        out.append(f"{name}{suffix}{{{lab}}} {value!r}" if lab else f"{name}{suffix} {value!r}")
    return out


def label_value(v: str) -> str:
    """``v`` escaped for a label value: backslash, newline and double quote."""
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
