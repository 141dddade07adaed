"""``firstfault jobs | report | timeline``: ask a running collector (its HTTP API) or
read its store directly (the SQLite file, or the PostgreSQL database by its URL).

    firstfault jobs [--collector URL | --db PATH_OR_URL] [--format text|json]
    firstfault report JOB [--format text|md|json|html] [--output FILE] [--bundle FILE.tar.gz]
                          [--checkpoint-dir DIR]
    firstfault timeline JOB [--rank R] [--node N] [--since T] [--until T] [--grep TEXT]
                            [--limit N] [--node-context] [--format text|json|jsonl]

Exit codes: 0 done, 1 the job or the collector could not be found, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from firstfault.analysis.catalog import load_catalog
from firstfault.collector import query
from firstfault.common.output import check_target, write_output
from firstfault.common.redact import Redactor
from firstfault.common.settings import endpoint, read_token
from firstfault.reports import FORMATS, needs_timeline, render
from firstfault.reports.escape import json_text, terminal, terminal_lines

DEFAULT_URL = "http://127.0.0.1:7141"
HTTP_PORT = 7141  # the collector's default --http port


def api_url(v: str) -> str:
    """``--collector``: a URL (``http://HOST[:PORT]``, port 7141 where none is written) or, as the
    agent writes it, ``HOST:PORT`` -> the API's base URL. argparse turns the error into a usage line."""
    try:
        scheme, addr = endpoint(v, HTTP_PORT)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return f"{'https' if scheme == 'https' else 'http'}://{addr}"


DEFAULT_TOKEN_FILE = "/etc/firstfault/token"  # what deploy/install.sh writes (mode 0600)


class _Http:
    """The collector's HTTP API, read with urllib (token from --token-file)."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.token = token

    def _open(self, path: str, params: dict | None = None):
        q = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
        req = urllib.request.Request(f"{self.url}{path}{'?' + q if q else ''}")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            return urllib.request.urlopen(req, timeout=300)
        except urllib.error.HTTPError as e:
            try:
                msg = json.load(e).get("error", e.reason)
            except ValueError:
                msg = e.reason
            raise query.QueryError(f"{self.url}: {msg}") from None
        except urllib.error.URLError as e:
            raise query.QueryError(f"no collector answers at {self.url} ({e.reason}); give --db PATH to read "
                                   "its database directly") from None

    def jobs(self) -> list[dict]:
        with self._open("/api/jobs") as r:
            return json.load(r)["jobs"]

    def report(self, job: str, timeline: bool = False, inspection: dict | None = None) -> dict:
        if inspection is not None:
            raise query.QueryError("--checkpoint-dir reads the collector's store directly: give --db PATH_OR_URL "
                                   "(the collector's API is read-only)")
        with self._open(f"/api/jobs/{urllib.parse.quote(job, safe='')}/report",
                        {"timeline": "1"} if timeline else None) as r:
            return json.load(r)

    def bundle(self, job: str) -> bytes:
        with self._open(f"/api/jobs/{urllib.parse.quote(job, safe='')}/bundle") as r:
            return r.read()

    def timeline(self, job: str, params: dict) -> Iterator[dict]:
        with self._open(f"/api/jobs/{urllib.parse.quote(job, safe='')}/timeline", {**params, "format": "jsonl"}) as r:
            for line in r:
                yield json.loads(line)


class _Db:
    """The store, read directly: a SQLite file or a postgres:// URL."""

    def __init__(self, db: str) -> None:
        from firstfault.collector.store import URL_SCHEMES, open_store
        from firstfault.collector.store.base import StoreError

        if not db.startswith(URL_SCHEMES) and not os.path.exists(db):
            raise query.QueryError(f"no database at {db}")
        try:
            self.store = open_store(db)
        except StoreError as e:
            raise query.QueryError(str(e)) from None
        self.catalog = load_catalog()

    def jobs(self) -> list[dict]:
        return query.jobs(self.store)

    def report(self, job: str, timeline: bool = False, inspection: dict | None = None) -> dict:
        from firstfault.analysis.diskwire import disk_from_wire

        disk = None if inspection is None else disk_from_wire(inspection)
        return query.report(self.store, job, self.catalog, redactor=Redactor(), timeline=timeline, disk=disk)

    def bundle(self, job: str) -> bytes:
        return query.bundle(self.store, job, self.catalog, Redactor())

    def timeline(self, job: str, params: dict) -> Iterator[dict]:
        from firstfault.collector.api import parse_selection

        if self.store.job(job) is None:
            raise query.QueryError(f"no job {job!r} in the store")
        try:
            sel = parse_selection(job, params)
        except ValueError as e:  # the words the HTTP API answers with
            raise query.QueryError(str(e)) from None
        return query.timeline(self.store, sel, Redactor(), context=params.get("context") == "1", catalog=self.catalog)


def _source(a: argparse.Namespace):
    token = None
    if a.token_file:
        problems: list[str] = []
        token = read_token(Path(a.token_file), problems)
        if token is None:
            raise query.QueryError("; ".join(problems))
    elif not a.db and os.access(DEFAULT_TOKEN_FILE, os.R_OK):  # the install's: root on the head node
        token = read_token(Path(DEFAULT_TOKEN_FILE), [])
    return _Db(a.db) if a.db else _Http(a.collector or DEFAULT_URL, token)


def job_report(a: argparse.Namespace, job: str) -> dict:
    """The report of ``job`` from where ``add_source_options`` said (``firstfault compare`` uses it)."""
    return _source(a).report(job)


def add_source_options(p: argparse.ArgumentParser) -> None:
    """--collector URL | --db PATH_OR_URL, and --token-file: where the jobs' records are."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--collector", metavar="URL", type=api_url,
                       help=f"the collector's HTTP API: http://HOST:PORT or HOST:PORT (default {DEFAULT_URL})")
    where.add_argument("--db", metavar="PATH_OR_URL",
                       help="read the collector's store directly: its SQLite file or postgresql:// URL")
    p.add_argument("--token-file", metavar="F", help=f"the collector's token (default {DEFAULT_TOKEN_FILE} "
                   "where this user can read it)")


def cmd_jobs(a: argparse.Namespace) -> int:
    rows = _source(a).jobs()
    if a.format == "json":
        write_output(json.dumps({"jobs": rows}, indent=2) + "\n", None)
        return 0
    lines = [f"{'JOB':<24} {'STATUS':<8} {'NODES':>5} {'RANKS':>5} {'RECORDS':>9}  FIRST -> LAST"]
    for j in rows:
        lines.append(f"{terminal(j['job']):<24} {j['status']:<8} {len(j['nodes']):>5} {len(j['ranks']):>5} "
                     f"{j['records']:>9}  {j['first_at']} -> {j['last_at']}")
    write_output("\n".join(lines) + "\n", None)
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    check_target(a.bundle or a.output)  # before asking the collector, which may take a while
    src = _source(a)
    if a.bundle:
        data = src.bundle(a.job)
        write_output(data, a.bundle)
        print(f"firstfault: wrote {a.bundle} ({len(data)} bytes)", file=sys.stderr)
        return 0
    inspection = None
    if a.checkpoint_dir:  # inspected here, on the head node, as `firstfault checkpoint` does
        from firstfault.common.checkpoint_files import CheckpointPathError, inspect

        try:
            inspection = inspect(a.checkpoint_dir)
        except CheckpointPathError as e:
            raise query.QueryError(str(e)) from None
    write_output(render(src.report(a.job, timeline=needs_timeline(a.format), inspection=inspection), a.format),
                 a.output)
    return 0


def cmd_timeline(a: argparse.Namespace) -> int:
    params = {"rank": a.rank, "node": a.node, "since": a.since, "until": a.until, "grep": a.grep,
              "limit": None if a.limit is None else str(a.limit), "context": "1" if a.node_context else None}
    rows = _source(a).timeline(a.job, {k: v for k, v in params.items() if v is not None})
    w = sys.stdout.write
    if a.format == "json":
        w('{"records": [')
        for i, r in enumerate(rows):
            w(("," if i else "") + json_text(r, indent=None))
        w("]}\n")
    elif a.format == "jsonl":
        for r in rows:
            w(json_text(r, indent=None) + "\n")
    else:  # log text is untrusted: inert on a terminal (firstfault/reports/escape.py)
        for r in rows:
            who = (f"rank {r['rank']}" if r.get("rank") is not None else
                   "node" if r.get("node_context") else terminal(r["source"]))
            for i, line in enumerate(terminal_lines(r["message"]) or [""]):
                w(f"{r['at']} {terminal(r['node']):<12} {who:<8} {line}\n" if i == 0 else f"{'':>47}{line}\n")
    return 0


def add_parsers(sub) -> None:
    common = argparse.ArgumentParser(add_help=False)
    add_source_options(common)

    p = sub.add_parser("jobs", parents=[common], help="list the jobs the collector knows")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("report", parents=[common], help="the report of a job, over all its nodes")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--format", choices=FORMATS, default="text",
                   help="html: one self-contained page (swimlanes, memory by phase) that opens with no network")
    p.add_argument("--output", "-o", metavar="FILE")
    p.add_argument("--bundle", metavar="FILE.tar.gz", help="write the bug-report bundle instead")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="DeepSpeed checkpoint folder to check on disk here, with --db (default: what the job's "
                        "agents inspected)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("timeline", parents=[common], help="the merged, clock-corrected timeline of a job")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--rank", metavar="R", help="rank(s), comma separated")
    p.add_argument("--node", metavar="N", help="node(s), comma separated")
    p.add_argument("--since", metavar="T", help="ISO 8601 time with zone, or epoch seconds")
    p.add_argument("--until", metavar="T")
    p.add_argument("--grep", metavar="TEXT", help="only records whose message contains TEXT (literally)")
    p.add_argument("--limit", type=int, metavar="N", help="at most N records (default: all)")
    p.add_argument("--node-context", action="store_true",
                   help="also the kernel and cgroup records of the job's nodes in its lifetime that name none of "
                        "its processes (default: the job's own records)")
    p.add_argument("--format", choices=("text", "json", "jsonl"), default="text")
    p.set_defaults(func=cmd_timeline)
