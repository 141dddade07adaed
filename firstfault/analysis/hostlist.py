"""Slurm hostlist expressions (``SLURM_JOB_NODELIST``) expanded to node names. Pure.

Job marks (firstfault/agent/sources/marks.py) carry the node list as the scheduler gave it,
compressed: ``gpu-[01-04,07],head-01`` is gpu-01 .. gpu-04, gpu-07 and head-01,
as ``scontrol show hostnames`` prints them. Top-level commas separate hosts;
each ``[...]`` holds comma-separated numbers and ``lo-hi`` ranges, zero-padded to
the width of ``lo`` (``[08-10]`` is 08, 09, 10); several bracket groups in one
host multiply (``r[1-2]n[1-2]`` is r1n1, r1n2, r2n1, r2n2). Names keep the order
given; a repeated name is listed once.

Bad input (unbalanced brackets, a reversed range, more than MAX_HOSTS names)
raises HostlistError with the reason.
"""

from __future__ import annotations

import re
from itertools import product

MAX_HOSTS = 100_000
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


class HostlistError(ValueError):
    """A node list that is not a hostlist expression."""


def _split_top(expr: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(expr):
        if c == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' at {i} in {expr!r:.200}")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"']' without '[' at {i} in {expr!r:.200}")
        elif c == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"'[' not closed in {expr!r:.200}")
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip()]


def _numbers(spec: str, host: str) -> list[str]:
    out: list[str] = []
    for item in spec.split(","):
        m = _RANGE.fullmatch(item.strip())
        if not m:
            raise HostlistError(f"bad range {item!r:.40} in {host!r:.200}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise HostlistError(f"reversed range {item!r:.40} in {host!r:.200}")
        if int(hi) - int(lo) >= MAX_HOSTS:
            raise HostlistError(f"more than {MAX_HOSTS} hosts in {host!r:.200}")
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return out


def expand_hostlist(expr: str) -> list[str]:
    """The node names of a hostlist expression, in order, each once."""
    names: dict[str, None] = {}
    for host in _split_top(expr):
        pieces = re.split(r"\[([^\]]*)\]", host)  # text, spec, text, spec, ..., text
        choices = [[p] if i % 2 == 0 else _numbers(p, host) for i, p in enumerate(pieces)]
        count = 1
        for c in choices:
            count *= len(c)
        if count + len(names) > MAX_HOSTS:
            raise HostlistError(f"more than {MAX_HOSTS} hosts in {expr!r:.200}")
        names.update(dict.fromkeys("".join(p) for p in product(*choices)))
    return list(names)
