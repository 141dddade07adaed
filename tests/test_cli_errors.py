"""No traceback ever reaches a user: every subcommand, given bad paths, ports taken or closed
and bad values, says what is wrong on stderr and exits non-zero (``python -m firstfault``, as
a user runs it: the daemons and ``demo`` parse their own arguments)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from firstfault.collector.store.sqlite import SqliteStore
from firstfault.wire import Record

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "oom-kill"
T0 = 1_796_206_319_782_000_000


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    """Paths and ports the cases name: a store with job 77, a file that is no database, a
    missing folder, a file where a folder belongs, a port taken and one nobody serves."""
    d = tmp_path_factory.mktemp("cli")
    with SqliteStore(d / "c.db") as store:
        store.insert([Record(node="n1", stream="n1-s", seq=1, source="ranklog", kind="rank.line",
                             message="ValueError: expected 16 features, got 17", occurred_ns=T0,
                             observed_ns=T0, job="77", rank=1)])
    (d / "text.db").write_text("not a database\n")
    (d / "afile").write_text("x\n")
    (d / "bad.toml").write_text("collectors = [\n")
    (d / "logs").mkdir()
    (d / "logs" / "rank0.log").write_text("[rank0]: RuntimeError: boom\n")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    yield {"d": str(d), "db": str(d / "c.db"), "missing": str(d / "missing"), "afile": str(d / "afile"),
           "taken": str(taken.getsockname()[1]), "closed": str(closed)}
    taken.close()


# (name, argv with {d} {db} {missing} {afile} {taken} {closed}, what stderr must say)
CASES = [
    ("analyze missing path", "analyze {missing}/logs", "no such file or folder: {missing}/logs"),
    ("analyze output in a missing folder", f"analyze {EXAMPLE} -o {{missing}}/x.html --format html",
     "cannot write {missing}/x.html: no folder {missing}"),
    ("analyze output is a folder", f"analyze {EXAMPLE} -o {{d}}", "is a folder"),
    ("analyze bad zone", "analyze {d}/logs --tz Mars/Olympus", "unknown time zone"),
    ("analyze bad boot time", "analyze {d}/logs --kernel-boot-time yesterday", "not a time"),
    ("analyze bad redact pattern", "analyze {d}/logs --redact noequals", "NAME=REGEX"),
    ("analyze bad format", "analyze {d}/logs --format pdf", "invalid choice"),
    ("checkpoint missing", "checkpoint {missing}", "No such file"),
    ("checkpoint bad world size", "checkpoint {d} --world-size many", "invalid int"),
    ("compare missing", "compare {missing}/a {missing}/b", "no such file or folder"),
    ("compare output in a missing folder", f"compare {EXAMPLE} {EXAMPLE} -o {{missing}}/c.md",
     "no folder {missing}"),
    ("jobs missing db", "jobs --db {missing}/c.db", "no database at"),
    ("jobs db not a database", "jobs --db {d}/text.db", "not a usable SQLite database"),
    ("jobs collector closed, HOST:PORT", "jobs --collector 127.0.0.1:{closed}", "no collector answers at http://127.0.0.1:"),
    ("jobs collector closed, URL", "jobs --collector http://127.0.0.1:{closed}/", "no collector answers at http://127.0.0.1:"),
    ("jobs collector bad", "jobs --collector ftp://x:1", "expected HOST:PORT or a URL"),
    ("jobs token file missing", "jobs --token-file {missing}/token", "cannot read"),
    ("report output in a missing folder", "report 77 --db {db} -o {missing}/r.html --format html",
     "cannot write {missing}/r.html: no folder"),
    ("report bundle in a missing folder", "report 77 --db {db} --bundle {missing}/b.tar.gz",
     "cannot write {missing}/b.tar.gz: no folder"),
    ("report unknown job", "report 78 --db {db}", "no job '78'"),
    ("timeline bad since", "timeline 77 --db {db} --since yesterday", "since"),
    ("timeline bad rank", "timeline 77 --db {db} --rank one", "rank"),
    ("timeline bad limit", "timeline 77 --db {db} --limit x", "invalid int"),
    ("collector listen port taken", "collector --listen 127.0.0.1:{taken} --http 127.0.0.1:0 --db {d}/col1.db",
     "cannot listen on 127.0.0.1:{taken}"),
    ("collector http port taken", "collector --listen 127.0.0.1:0 --http 127.0.0.1:{taken} --db {d}/col2.db",
     "cannot serve the HTTP API"),
    ("collector port out of range", "collector --listen 127.0.0.1:70000 --db {d}/col3.db", "port 0..65535"),
    ("collector db in a missing folder", "collector --listen 127.0.0.1:0 --http 127.0.0.1:0 --db {missing}/c.db",
     "cannot open the store"),
    ("collector db not a database", "collector --listen 127.0.0.1:0 --http 127.0.0.1:0 --db {d}/text.db",
     "not a usable SQLite database"),
    ("collector config missing", "collector --config {missing}/collector.toml", "collector.toml"),
    ("collector config not TOML", "collector --config {d}/bad.toml", "bad.toml"),
    ("agent metrics port taken", "agent --collector 127.0.0.1:{closed} --state-dir {d}/agent1 --metrics "
     "127.0.0.1:{taken} --kmsg-enabled false --procs-enabled false --cgroup-enabled false",
     "cannot serve /metrics on 127.0.0.1:{taken}: Address already in use"),
    ("agent state dir is a file", "agent --collector 127.0.0.1:{closed} --state-dir {afile} --metrics ''",
     "{afile}"),
    ("agent collector bad", "agent --collector http://127.0.0.1:7140/api --check-config", "http://HOST:PORT"),
    ("agent ranklog names no job", "agent --collector 127.0.0.1:7140 --ranklog '{d}/jobs/*/rank*.log' --check-config",
     "can never name a job"),
    ("agent ranklog relative", "agent --collector 127.0.0.1:7140 --ranklog 'logs/rank{{rank}}.log' --check-config",
     "not an absolute path"),
    ("agent bad number", "agent --collector 127.0.0.1:7140 --spool-max-bytes lots --check-config", "an integer"),
    ("agent config missing", "agent --config {missing}/agent.toml --check-config", "agent.toml"),
    ("agent unknown flag", "agent --colector 127.0.0.1:7140", "--colector"),
    ("mark without job", "mark start --state-dir {d}/agent2", "--job"),
    ("mark bad event", "mark begin --job 7 --state-dir {d}/agent2", "invalid choice"),
    ("mark state dir is a file", "mark start --job 7 --state-dir {afile}", "{afile}"),
    ("demo keep under a file", "demo --keep {afile}/work", "cannot make the work folder"),
    ("demo bad ranks", "demo --ranks 1", "--ranks"),
    ("demo bad serve", "demo --serve maybe", "invalid choice"),
    ("no command", "", "required"),
    ("unknown command", "analyse x", "invalid choice"),
]


@pytest.mark.parametrize("name, argv, says", CASES, ids=[c[0] for c in CASES])
def test_a_bad_argument_is_said_in_a_line_with_a_non_zero_exit_and_no_traceback(where, name, argv, says):
    import shlex

    args = shlex.split(argv.format(**where))
    r = subprocess.run([sys.executable, "-m", "firstfault", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode not in (0, None), f"{name}: exit 0\n{r.stderr}"
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    assert says.format(**where) in r.stderr, r.stderr
    last = r.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith(("firstfault", "  - ", "ERROR firstfault")), r.stderr  # the reason, not a stack frame


def test_a_path_that_is_not_there_is_a_usage_error_for_analyze_checkpoint_and_compare(where):
    """One rule for the three commands that read a dead job's files: a PATH that does not exist
    exits 2 (usage), whereas files that exist but cannot be read are analyze's exit 1."""
    codes = {}
    for cmd in ("analyze", "checkpoint", "compare"):
        args = [f"{where['missing']}/x"] * (2 if cmd == "compare" else 1)
        codes[cmd] = subprocess.run([sys.executable, "-m", "firstfault", cmd, *args], cwd=ROOT,
                                    capture_output=True, text=True, timeout=60).returncode
    assert codes == {"analyze": 2, "checkpoint": 2, "compare": 2}
    (Path(where["d"]) / "empty.log").write_text("")
    r = subprocess.run([sys.executable, "-m", "firstfault", "analyze", f"{where['d']}/empty.log"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no input could be read" in r.stderr


def test_a_long_evidence_line_is_cut_at_a_word_with_an_ellipsis():
    from firstfault.reports.text import alike_text, clip, ranks_text

    line = "RuntimeError: " + " ".join(f"word{i}" for i in range(60))
    cut = clip(line, 80)
    assert len(cut) <= 80 and cut.endswith("…") and line.startswith(cut[:-1]) and line[len(cut) - 1] == " "
    assert clip("short line", 80) == "short line"
    assert clip("x" * 100, 10) == "x" * 9 + "…"  # no space to cut at: cut where it must, still marked
    assert (ranks_text([2]), ranks_text([1, 2, 5]), ranks_text([])) == ("rank 2", "ranks 1, 2, 5", "none")
    assert (alike_text([2]), alike_text([1, 2])) == ("rank 2 only", "ranks 1, 2")


def test_a_closed_pipe_is_no_error():
    """``firstfault analyze … | head``: the reader gone before the report is written is no failure
    to report (BrokenPipeError is an OSError: it must not reach the one-line OSError net) and exits 0."""
    p = subprocess.Popen([sys.executable, "-m", "firstfault", "analyze", str(EXAMPLE), "--format", "html"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # the reader leaves at once: every write of the report meets a closed pipe
    err = p.stderr.read()
    assert p.wait(60) == 0, err
    assert "Traceback" not in err and "Broken pipe" not in err and "BrokenPipeError" not in err, err
