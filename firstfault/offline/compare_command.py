"""``firstfault compare BEFORE AFTER``: did the fix work? A failed run against its retry.

    firstfault compare BEFORE AFTER [--format text|md|json|html] [--output FILE]
                       [--before-checkpoint-dir DIR] [--after-checkpoint-dir DIR]
                       [--before-kernel FILE] [--after-kernel FILE] [--node NAME] [--tz ZONE]
                       [--collector URL | --db PATH_OR_URL] [--token-file F]

Each side is a set of log paths as ``analyze`` takes them (a folder, a file, NODE=PATH;
several joined by commas) or, when it names nothing on disk, a job id at the collector.
The comparison itself is firstfault/analysis/compare.py; the JSON is documented in
docs/COMPARE.md.

Exit codes: 0 fixed, 1 not fixed, 3 inconclusive, 2 usage error (a side that can not be
read or found).

Job ids need the collector's query commands, which this package may not import: cli.py
hands them in as a ``JobSource``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from firstfault.analysis.compare import compare_reports
from firstfault.analysis.report import iso
from firstfault.common.output import check_target, write_output
from firstfault.offline.commands import report_from_logs, time_zone
from firstfault.reports.compare import render_compare
from firstfault.reports.escape import terminal

EXIT = {"fixed": 0, "not-fixed": 1, "inconclusive": 3}
USAGE = 2


class SideError(Exception):
    """A side names nothing that can be read: no such file, no such job, nothing readable."""


@dataclass(frozen=True)
class JobSource:
    """How to reach a collector for a side that is a job id (wired in by cli.py)."""

    add_options: Callable[[argparse.ArgumentParser], None]
    report: Callable[[argparse.Namespace, str], dict]
    errors: tuple[type[Exception], ...]


def _exists(spec: str) -> bool:
    path = spec.split("=", 1)[1] if "=" in spec and not os.path.exists(spec) else spec
    return os.path.exists(path)


def side_paths(spec: str) -> list[str] | None:
    """The log paths a side names, or None when it names a job id.

    A side that exists on disk is one path (commas and all); else a comma-separated list
    of paths that all exist. Anything else that looks like a path is an error, not a job.
    """
    if spec == "-":
        raise SideError("compare reads no standard input: give each side's log files or folder")
    if _exists(spec):
        return [spec]
    parts = [p for p in spec.split(",") if p]
    if parts and all(_exists(p) for p in parts):
        return parts
    if any(os.sep in p or p.startswith(".") or "=" in p for p in parts) or not parts:
        missing = [p for p in parts if not _exists(p)] or [spec]
        raise SideError(f"no such file or folder: {', '.join(missing)}")
    return None


def _report(a: argparse.Namespace, which: str, paths: list[str] | None, jobs: JobSource | None) -> tuple[dict, dict]:
    """(report, source) of one side: its log paths, or its job (``paths`` None)."""
    spec = getattr(a, which)
    if paths is None:
        if getattr(a, f"{which}_checkpoint_dir") or getattr(a, f"{which}_kernel"):
            print(f"firstfault: {which.upper()} is a job at the collector: --{which}-checkpoint-dir and "
                  f"--{which}-kernel apply to sides given as logs and are left unused", file=sys.stderr)
        if jobs is None:
            raise SideError(f"{spec!r} names no file, and this firstfault can not ask a collector for jobs")
        try:
            return jobs.report(a, spec), {"job": spec}
        except jobs.errors as e:
            raise SideError(f"job {spec!r}: {e}") from None
    report, gaps, problem = report_from_logs(
        paths, node=a.node, kernel=getattr(a, f"{which}_kernel"), checkpoint_dir=getattr(a, f"{which}_checkpoint_dir"),
        tz=a.tz)
    for g in gaps:
        print(f"firstfault: {which.upper()}: {terminal(g.get('file'))}: {terminal(g.get('reason'))}",
              file=sys.stderr)
    if problem:
        raise SideError(f"{which.upper()}: {problem}")
    src = {"logs": paths}
    if getattr(a, f"{which}_checkpoint_dir"):
        src["checkpoint_dir"] = getattr(a, f"{which}_checkpoint_dir")
    return report, src


def cmd_compare(a: argparse.Namespace, jobs: JobSource | None = None) -> int:
    check_target(a.output)
    try:
        paths = [side_paths(a.before), side_paths(a.after)]  # both named right before either is read
        before, bsrc = _report(a, "before", paths[0], jobs)
        after, asrc = _report(a, "after", paths[1], jobs)
    except SideError as e:
        print(f"firstfault: {e}", file=sys.stderr)
        return USAGE
    result = compare_reports(before, after, before_source=bsrc, after_source=asrc, generated_at=iso(time.time_ns()))
    write_output(render_compare(result, a.format), a.output)
    return EXIT[result["verdict"]]


def add_parser(sub, jobs: JobSource | None = None) -> None:
    p = sub.add_parser("compare", help="did the fix work? compare a failed run with its retry",
                       description="Compare a failed run (BEFORE) with its retry (AFTER): what changed, whether "
                       "the first failure came back on any rank, whether the retry got past it. Exit codes: "
                       "0 fixed, 1 not fixed, 3 inconclusive, 2 usage error.")
    p.add_argument("before", metavar="BEFORE", help="the failed run: log folder or file(s) (comma-separated, "
                   "NODE=PATH), or a job id at the collector")
    p.add_argument("after", metavar="AFTER", help="the retry, given the same way")
    p.add_argument("--format", choices=("text", "md", "json", "html"), default="text")
    p.add_argument("--output", "-o", metavar="FILE", help="write the comparison here instead of stdout")
    for side in ("before", "after"):
        p.add_argument(f"--{side}-checkpoint-dir", metavar="DIR",
                       help=f"{side.upper()}'s DeepSpeed checkpoint folder, checked on disk")
        p.add_argument(f"--{side}-kernel", action="append", metavar="FILE",
                       help=f"{side.upper()}'s kernel log (as analyze --kernel; repeatable)")
    p.add_argument("--node", metavar="NAME", help="the node the logs of both sides come from")
    p.add_argument("--tz", type=time_zone, help="time zone of timestamps that carry none (default: this machine's)")
    if jobs is not None:
        jobs.add_options(p)
    p.set_defaults(func=lambda a: cmd_compare(a, jobs))
