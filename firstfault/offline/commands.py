"""``firstfault analyze`` and ``firstfault checkpoint``: a dead job's files, read offline (no daemon).

    firstfault analyze PATH... [--format text|md|json|html] [--output FILE] [--node NAME]
                               [--kernel FILE] [--checkpoint-dir DIR] [--tz ZONE]
                               [--kernel-boot-time TIME] [--job ID]
    firstfault checkpoint DIR [--format text|json] [--world-size N]

Exit codes of ``analyze``: 0 a report was written (whatever it found; inputs that
could not be read are listed in it and on stderr), 1 no input could be read at
all or the output file cannot be written, 2 usage error (none of the PATHs exists,
as ``checkpoint`` and ``compare`` say of a folder that is not there). ``checkpoint``: 0 the checkpoint a restart would pick is safe,
1 it is unsafe, 3 its safety is unknown, 2 usage error or not a checkpoint folder.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from firstfault.analysis.catalog import load_catalog
from firstfault.analysis.checkpoint import checkpoint_from_disk
from firstfault.analysis.reads import scan_needles
from firstfault.analysis.report import Inputs, build_report
from firstfault.common import redact
from firstfault.common.output import check_target, write_output
from firstfault.common.redact import Redactor
from firstfault.offline import logfiles
from firstfault.offline.checkpoint_files import CheckpointPathError, inspect_checkpoint_dir
from firstfault.reports import FORMATS, needs_timeline, render
from firstfault.reports.escape import terminal

PROGRESS_MIN_BYTES = 64 << 20


class _Progress:
    """A one-line progress meter on stderr, only when stderr is a terminal and the input is large."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.start = time.monotonic()
        self.last = 0.0

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last < 0.2:
            return
        self.last = now
        mb = self.done / 1e6
        rate = mb / max(now - self.start, 1e-6)
        pct = 100 * self.done / self.total if self.total else 0
        sys.stderr.write(f"\ranalyzing {mb:,.0f} / {self.total / 1e6:,.0f} MB ({pct:3.0f}%) {rate:,.0f} MB/s ")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\r" + " " * 60 + "\r")
        sys.stderr.flush()


def _parse_time(s: str) -> int:
    try:
        return int(float(s) * 1e9)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time: {s!r} (use ISO 8601 or epoch seconds)") from None
    if dt.tzinfo is None:
        dt = dt.astimezone()
    return int(dt.timestamp() * 1e9)


def time_zone(s: str):
    try:
        return ZoneInfo(s)
    except (ZoneInfoNotFoundError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown time zone {s!r} (e.g. UTC, Europe/Berlin)") from None


def report_from_logs(paths: list[str], *, node: str | None = None, kernel: list[str] | None = None,
                     checkpoint_dir: str | None = None, tz=None, kernel_boot_ns: int | None = None,
                     job: str | None = None, meter: bool = False, timeline: bool = False,
                     redactor: Redactor | None = None, redacted: Counter | None = None
                     ) -> tuple[dict | None, list[dict], str | None]:
    """Read the logs under ``paths`` and build their report: (report, gaps, problem).

    ``problem`` says why there is no report (no log found, none readable); the gaps
    list every input that could not be read. ``meter``: a progress meter on a terminal's stderr; ``timeline``: add the timeline object
    the HTML report draws. ``redactor``: the events are redacted before the analysis reads
    them (``redacted`` counts what was), so nothing it derives (fingerprints) holds a secret.
    """
    catalog = load_catalog()
    sources = logfiles.discover(paths, node=node, kernel=kernel)
    res = logfiles.ReadResult()
    total = sum(os.path.getsize(s.path) for s in sources if s.path != "-" and os.path.isfile(s.path))
    progress = _Progress(total) if meter and sys.stderr.isatty() and total >= PROGRESS_MIN_BYTES else None
    events = logfiles.read_events(sources, scan_needles(catalog), res, tz=tz,
                                  kernel_boot_ns=kernel_boot_ns, progress=progress)
    disk = None
    if checkpoint_dir:
        try:
            disk = inspect_checkpoint_dir(checkpoint_dir)
        except CheckpointPathError as e:
            res.gaps.append({"file": checkpoint_dir, "reason": str(e)})
    # inputs.gaps is res.gaps: reading appends to it while build_report consumes the events
    inputs = Inputs(job=job, gaps=res.gaps, disk=disk, generated_ns=time.time_ns(), timeline=timeline)
    events = redact.events(events, redactor, Counter() if redacted is None else redacted)
    report = build_report(_tracking(events, inputs, res), catalog, inputs)
    if progress:
        progress.close()
    if not sources:
        return None, res.gaps, "no log files found under the given paths"
    unreadable = {g.get("file") for g in res.gaps if "source" not in g}
    if all(s.path in unreadable for s in sources):
        return None, res.gaps, "no input could be read"
    return report, res.gaps, None


def cmd_analyze(a: argparse.Namespace) -> int:
    try:
        redactor = Redactor.from_settings(not a.no_redact, True, a.redact)
    except ValueError as e:
        print(f"firstfault analyze: {e}", file=sys.stderr)
        return 2
    check_target(a.output)  # a folder that is not there: said now, not after the analysis
    named = [p.split("=", 1)[1] if "=" in p and not os.path.exists(p) else p for p in a.paths]
    if "-" not in named and not any(os.path.exists(p) for p in named):  # a typo, as checkpoint and compare say
        print(f"firstfault: no such file or folder: {terminal(', '.join(a.paths))}", file=sys.stderr)
        return 2
    report, gaps, problem = report_from_logs(a.paths, node=a.node, kernel=a.kernel, checkpoint_dir=a.checkpoint_dir,
                                             tz=a.tz, kernel_boot_ns=a.kernel_boot_time, job=a.job, meter=True,
                                             timeline=needs_timeline(a.format), redactor=redactor,
                                             redacted=(redacted := Counter()))
    for g in gaps:
        print(f"firstfault: {terminal(g.get('file'))}: {terminal(g.get('reason'))}", file=sys.stderr)
    if problem:
        print(f"firstfault: {problem}", file=sys.stderr)
        return 1
    write_output(render(redact.report(report, redactor, redacted), a.format), a.output)
    return 0


def _tracking(events, inputs: Inputs, res: logfiles.ReadResult):
    """Pass events through, then hand what reading learnt (ranks, launcher) to the inputs."""
    yield from events
    inputs.rank_nodes.update(res.rank_nodes)
    inputs.launcher = res.launcher


def cmd_checkpoint(a: argparse.Namespace) -> int:
    try:
        disk = inspect_checkpoint_dir(a.dir, world_size=a.world_size)
    except CheckpointPathError as e:
        print(f"firstfault: {e}", file=sys.stderr)
        return 2
    ck = checkpoint_from_disk(disk)
    if a.format == "json":
        write_output(render(ck, "json"), None)
    else:
        lines = [f"{a.dir}: {ck['verdict']}" + (f"; resume from {ck['resume_from']}" if ck.get("resume_from") else ""),
                 f"  {ck['reason']}"]
        for t in ck.get("tags", []):
            lines.append(f"  {t['tag']}: {t['verdict']}" + "".join(f"\n    - {p}" for p in t.get("problems", [])))
        write_output("\n".join(lines) + "\n", None)
    return {"safe": 0, "unsafe": 1}.get(ck["verdict"], 3)


def add_parsers(sub) -> None:
    an = sub.add_parser("analyze", help="analyse log files offline and print the report")
    an.add_argument("paths", nargs="+", metavar="PATH",
                    help="log file, folder (torchrun --log-dir, DeepSpeed rank logs), NODE=PATH, or - for stdin")
    an.add_argument("--format", choices=FORMATS, default="text",
                    help="html: one self-contained page (swimlanes, memory by phase) that opens with no network")
    an.add_argument("--output", "-o", metavar="FILE", help="write the report here instead of stdout")
    an.add_argument("--node", metavar="NAME", help="the node these logs come from")
    an.add_argument("--kernel", action="append", metavar="FILE",
                    help="kernel log: /dev/kmsg dump, dmesg, dmesg -T, journalctl -k (any -o); repeatable, NODE=FILE")
    an.add_argument("--checkpoint-dir", metavar="DIR", help="DeepSpeed checkpoint folder to check on disk")
    an.add_argument("--tz", type=time_zone, help="time zone of timestamps that carry none (default: this machine's)")
    an.add_argument("--kernel-boot-time", type=_parse_time, metavar="TIME",
                    help="boot time of the node whose dmesg/kmsg is given (default: this machine's)")
    an.add_argument("--job", help="job id to print in the report")
    an.add_argument("--redact", action="append", default=[], metavar="NAME=REGEX",
                    help="another secret pattern to replace (repeatable; the built-in ones stay)")
    an.add_argument("--no-redact", action="store_true",
                    help="print secrets found in the logs as they are (default: [redacted:NAME])")
    an.set_defaults(func=cmd_analyze)
    ck = sub.add_parser("checkpoint", help="check a DeepSpeed checkpoint folder on disk")
    ck.add_argument("dir", metavar="DIR")
    ck.add_argument("--format", choices=("text", "json"), default="text")
    ck.add_argument("--world-size", type=int, metavar="N", help="data-parallel world size (default: inferred)")
    ck.set_defaults(func=cmd_checkpoint)
