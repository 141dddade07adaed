"""Real collector processes, one on a SQLite file and one on PostgreSQL: agents (test
clients speaking firstfault/wire.py) stream a real job's logs from two nodes into each;
`firstfault report/jobs/timeline` over the HTTP API and on the store directly name the
same first failure as `firstfault analyze` of the files, and both stores answer alike."""

import json
import re
import tarfile
import urllib.request
from pathlib import Path

import pytest

from firstfault.cli import main
from tests.analysis.shipped import ship_file
from tests.collector.server.ingest_helpers import Agent
from tests.collector.server.ingest_helpers import CollectorProcess as Collector

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "data" / "real" / "deepspeed-exception-rank2-of-4"

JOB = "ds-4242"
NODES = {"node-a": (0, 1), "node-b": (2, 3)}


def _rank_files(ranks):
    for p in sorted((REAL / "logs").glob("*.log")):
        r = int(p.stem.rsplit("rank", 1)[1])
        if r in ranks:
            yield r, p


def _start(db) -> Collector:
    c = Collector(db)
    for node, ranks in NODES.items():
        records = []
        for r, p in _rank_files(ranks):
            records += ship_file(p, node, r, len(records))
        records = [type(rec)(**{**{f: getattr(rec, f) for f in rec.__slots__}, "job": JOB, "stream": "s1"})
                   for rec in records]
        a = Agent(c.ingest, node=node, stream="s1")
        assert a.hello().high_seq is None
        for i in range(0, len(records), 500):
            a.send_batch(records[i:i + 500])
            a.wait_ack(records[min(i + 500, len(records)) - 1].seq)
        a.close()
    return c


@pytest.fixture(scope="module")
def collectors(request, tmp_path_factory):
    """Started on first use: backend -> (collector, its --db)."""
    started: dict = {}

    def get(backend: str):
        if backend not in started:
            db = (str(tmp_path_factory.mktemp("collector") / "ff.db") if backend == "sqlite"
                  else request.getfixturevalue("postgres").create_database())
            started[backend] = (_start(db), db)
        return started[backend]
    yield get
    for c, _ in started.values():
        assert c.stop() == 0


@pytest.fixture(params=["sqlite", "postgres"])
def collector(request, collectors):
    return collectors(request.param)


def _cli(capsys, *args) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().out


def test_report_over_http_equals_offline_analyze(collector, capsys):
    c, _ = collector
    url = f"http://{c.http[0]}:{c.http[1]}"
    code, out = _cli(capsys, "report", JOB, "--collector", url, "--format", "json")
    assert code == 0
    live = json.loads(out)
    args = ["analyze"] + [f"{node}={p}" for node, ranks in NODES.items() for _, p in _rank_files(ranks)]
    code, out = _cli(capsys, *args, "--format", "json", "--tz", "UTC")
    offline = json.loads(out)
    for rep in (live, offline):
        ff = rep["first_failure"]
        assert (ff["rank"], ff["node"], ff["signature"], ff["phase"]) == (2, "node-b", "python.exception", "forward")
    assert live["job"] == JOB
    assert {r: v["node"] for r, v in live["ranks"].items()} == {r: v["node"] for r, v in offline["ranks"].items()}
    assert [d["signature"] for d in live["distinct_failures"]] == [d["signature"] for d in offline["distinct_failures"]]


def test_jobs_timeline_and_bundle(collector, capsys, tmp_path):
    c, db = collector
    url = f"http://{c.http[0]}:{c.http[1]}"
    code, out = _cli(capsys, "jobs", "--collector", url, "--format", "json")
    jobs = json.loads(out)["jobs"]
    assert [j["job"] for j in jobs] == [JOB] and sorted(jobs[0]["nodes"]) == ["node-a", "node-b"]
    code, out = _cli(capsys, "timeline", JOB, "--collector", url, "--rank", "2", "--grep", "ValueError",
                     "--format", "jsonl")
    rows = [json.loads(x) for x in out.splitlines()]
    assert rows and all(r["rank"] == 2 and "ValueError" in r["message"] for r in rows)
    code, out = _cli(capsys, "timeline", JOB, "--collector", url, "--format", "json")
    everything = json.loads(out)["records"]
    total = sum(len(p.read_text(errors="replace").splitlines()) for _, p in _rank_files(range(4)))
    assert 0 < len(everything) <= total  # tracebacks are one record each; nothing else is cut
    assert [r["at"] for r in everything] == sorted(r["at"] for r in everything)
    code, out = _cli(capsys, "report", JOB, "--collector", url, "--format", "html")
    assert code == 0 and "First failure: <span id='ff-who'>rank 2" in out and '"lanes":[' in out
    bundle = tmp_path / "b.tar.gz"
    assert _cli(capsys, "report", JOB, "--collector", url, "--bundle", str(bundle))[0] == 0
    with tarfile.open(bundle) as tar:
        names = {Path(n).name: n for n in tar.getnames()}
        page = tar.extractfile(names["report.html"]).read().decode()
        rep = json.loads(tar.extractfile(names["report.json"]).read())
    assert set(names) == {"report.md", "report.json", "report.html", "timeline.jsonl", "config.txt", "README.txt"}
    assert "timeline" not in rep  # the swimlanes' data goes to the page only
    assert "First failure: <span id='ff-who'>rank 2" in page and "Content-Security-Policy" in page


def test_metrics_over_http(collector):
    c, _ = collector
    with urllib.request.urlopen(f"http://{c.http[0]}:{c.http[1]}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        body = r.read().decode()
    assert re.search(r"^firstfault_collector_records_stored_total [1-9][0-9]*$", body, re.M)
    assert re.search(r'^firstfault_collector_store_seconds_bucket\{le="\+Inf"\} [1-9]', body, re.M)


def test_report_from_the_db_file_and_unknown_job(collector, capsys):
    _, db = collector
    code, out = _cli(capsys, "report", JOB, "--db", str(db), "--format", "json")
    assert code == 0 and json.loads(out)["first_failure"]["rank"] == 2
    assert main(["report", "nope", "--db", str(db)]) == 1
    assert "no job 'nope'" in capsys.readouterr().err


def test_postgres_and_sqlite_collectors_answer_alike(collectors, capsys):
    out = {}
    for backend in ("sqlite", "postgres"):
        c, db = collectors(backend)
        url = f"http://{c.http[0]}:{c.http[1]}"
        rep = json.loads(_cli(capsys, "report", JOB, "--collector", url, "--format", "json")[1])
        rep.pop("generated_at")
        timeline = _cli(capsys, "timeline", JOB, "--collector", url, "--format", "jsonl")[1]
        jobs = json.loads(_cli(capsys, "jobs", "--db", db, "--format", "json")[1])["jobs"]
        out[backend] = rep, timeline, jobs
    assert out["postgres"] == out["sqlite"]
