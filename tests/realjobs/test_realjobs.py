"""Real DeepSpeed jobs on the CPU, broken on purpose, then analysed by `firstfault analyze`.

Each scenario of run.py runs once per session, fresh, into a temporary folder (one at a
time: the machine has two cores). Two tests look at each run:

- ``test_run_*`` checks the run itself did what the scenario says (the harness works,
  whatever the analyzer does);
- ``test_report_*`` runs ``python -m firstfault analyze <folder> --format json`` (with
  ``--node``, ``--checkpoint-dir`` and, for the OOM runs, ``--kernel kmsg.txt``) and
  compares the report (/work/shared/REPORT.md) with the scenario's ground truth.

Run them with ``pytest -m realjob tests/realjobs`` (the OOM ones need root and cgroup
v1's memory controller, and are marked ``root`` as well).
"""

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.realjobs import run

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


HAVE_STACK = all(importlib.util.find_spec(m) is not None for m in ("torch", "deepspeed"))

pytestmark = [
    pytest.mark.realjob,
    pytest.mark.skipif(not HAVE_STACK, reason="needs torch and deepspeed (pip install -e '.[realjobs]')"),
]


def _can_oom(sc=None):
    if os.geteuid() != 0:
        return "needs root to make a memory cgroup or read the kernel log"
    if (sc is None or sc.fail == "oom") and not os.access(run.CGROUP_V1_MEMORY, os.W_OK):
        return f"needs cgroup v1's memory controller at {run.CGROUP_V1_MEMORY}"
    return None


PLAIN = [n for n, s in run.SCENARIOS.items() if not s.needs_root]
OOM = [n for n, s in run.SCENARIOS.items() if s.needs_root]


def _skip_unless_oom_possible(name=None):
    why = _can_oom(run.SCENARIOS[name] if name else None)
    if why:
        pytest.skip(why)


# --- the run itself -----------------------------------------------------------------


def rank_text(folder, rank, launcher, nproc=None, nodes=1):
    """Everything one rank wrote to its own log files."""
    if launcher == "torchrun" and nodes > 1:
        node, local = divmod(rank, nproc)
        files = sorted(folder.glob(f"node{node}/logs/*/attempt_0/{local}/*.log"))
    elif launcher == "torchrun":
        files = sorted(folder.glob(f"logs/*/attempt_0/{rank}/*.log"))
    else:
        files = sorted(folder.glob(f"logs/*_rank{rank}.log"))
    return "".join(f.read_text(errors="replace") for f in files)


def check_run(folder, doc):
    sc = run.SCENARIOS[doc["name"]]
    result = doc["result"]
    assert not result.get("timed_out"), "the job outlived the runner's timeout"
    launcher_log = "".join(p.read_text(errors="replace") for p in sorted(folder.glob("**/launcher.log")))
    world = sc.nproc * sc.nodes
    if not sc.keep_rank_logs:
        assert sorted(p.name for p in folder.iterdir()) == ["launcher.log", "scenario.json"]
        for r in range(sc.nproc):
            assert f"[default{r}]:" in launcher_log
        ranks = {r: launcher_log for r in range(sc.nproc)}
    else:
        ranks = {r: rank_text(folder, r, sc.launcher, sc.nproc, sc.nodes) for r in range(world)}
        assert all(ranks.values()), "a rank left no log"
    if sc.kernel:
        kmsg = (folder / "kmsg.txt").read_text(errors="replace")
        assert f"firstfault-realjob: {sc.name} starts" in kmsg and f"firstfault-realjob: {sc.name} ended" in kmsg
        assert "Killed process" not in kmsg, "another job's OOM kill fell into the window: run it again"
    if sc.fail == "none":
        # A rare teardown abort can fail the launcher after training: judge the training.
        for r, text in ranks.items():
            assert f"rank {r} done after {sc.steps} steps" in text
        assert (folder / "checkpoints" / "latest").read_text() == f"global_step{sc.steps}"
        return
    assert result["launcher_exit_code"] != 0
    failing = ranks.get(sc.fail_rank, "")
    if sc.fail == "exception":
        assert f"[rank{sc.fail_rank}]: ValueError: feature vector has 17 columns" in failing
    elif sc.fail == "oom":
        assert "oom_kill 1" in result["cgroup"]["memory.oom_control"]
        kmsg = (folder / "kmsg.txt").read_text(errors="replace")
        assert "Memory cgroup out of memory: Killed process" in kmsg
        assert "Killed process" in (folder / "dmesg.txt").read_text(errors="replace")
        assert "Killed process" in (folder / "dmesg-T.txt").read_text(errors="replace")
        assert "Traceback" not in failing
    elif sc.fail == "kill-in-save":
        ckpt = folder / "checkpoints"
        assert (ckpt / "latest").read_text() == f"global_step{sc.fail_step}"
        shard = f"zero_pp_rank_{sc.fail_rank}_mp_rank_00_optim_states.pt"
        with pytest.raises(zipfile.BadZipFile):
            zipfile.ZipFile(ckpt / f"global_step{sc.fail_step}" / shard)
        with zipfile.ZipFile(ckpt / f"global_step{sc.fail_step - sc.save_every}" / shard) as z:
            assert z.testzip() is None
    elif sc.fail == "hang" and sc.sigterm_after:
        assert result.get("sigterm_sent_at") and "death signal, shutting down workers" in launcher_log
        assert "Current thread 0x" in failing and "in __next__" in failing  # its dump: in the data loader
        survivors = [t for r, t in ranks.items() if r != sc.fail_rank]
        assert all("Current thread 0x" in t and "in all_reduce" in t for t in survivors)
        assert "Traceback" not in failing
    elif sc.fail == "hang":
        ms = int(sc.timeout_s * 1000)
        survivors = {r: t for r, t in ranks.items() if r != sc.fail_rank}
        # Every survivor reached the collective the hung rank never joined; the first whose timer
        # fires ends the job (torchrun stops the rest), so on a loaded machine a late survivor may
        # be stopped, or see its peer's socket close, before its own timer fires.
        for r, text in survivors.items():
            assert f"rank {r} step {sc.fail_step - 1} loss " in text
        assert any(f"Timed out waiting {ms}ms for " in t for t in survivors.values())
        assert "Traceback" not in failing
        if "--abort-on-collective-error" in sc.train_extra:
            assert "exitcode  : -6" in launcher_log or "exitcode: -6" in launcher_log
    elif sc.fail == "bad-config":
        for text in ranks.values():
            assert "Extra inputs are not permitted [type=extra_forbidden" in text
            assert "reduce_bucket_sizee" in text
    elif sc.fail == "nan":
        assert f"FloatingPointError: loss is nan at step {sc.fail_step}" in failing


@pytest.mark.parametrize("name", PLAIN)
def test_run(jobs, name):
    folder, doc = jobs(name)
    check_run(folder, doc)


@pytest.mark.root
@pytest.mark.parametrize("name", OOM)
def test_run_oom(jobs, name):
    _skip_unless_oom_possible(name)
    folder, doc = jobs(name)
    check_run(folder, doc)


# --- the report ---------------------------------------------------------------------


def analyze(folder, doc, logs_only=False):
    """`firstfault analyze` as a user runs it offline: the folder (per-node folders as NODE=DIR),
    the node's name, the checkpoint folder to check on disk (unless ``logs_only``), and the kernel
    log with its node's boot time."""
    paths = [p if p == "." else p.split("=", 1)[0] + "=" + str(folder / p.split("=", 1)[1])
             for p in doc.get("analyze_paths", ["."])]
    paths = [str(folder) if p == "." else p for p in paths]
    cmd = [sys.executable, "-m", "firstfault", "analyze", *paths, "--format", "json", "--node", doc["node"]]
    if (folder / "checkpoints").is_dir() and not logs_only:
        cmd += ["--checkpoint-dir", str(folder / "checkpoints")]
    if (folder / "kmsg.txt").is_file():
        clock = doc["result"]["kmsg"]["clock"]
        cmd += ["--kernel", str(folder / "kmsg.txt"), "--kernel-boot-time", repr(clock["wall_s"] - clock["boottime_s"])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"`{' '.join(cmd)}` exited {proc.returncode} without a JSON report:\n"
                    f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}")


def survivors_left_stacks(folder, doc):
    """Whether a rank other than the failing one left a traceback: printed (torch's
    ``[rankN]: Traceback``) or in its torchrun error file (``<rank>/error.json``, which
    @record writes before it prints).

    A rank killed without a stack shows its phase only through the stacks of the ranks
    that waited for it. When the launcher SIGTERMs those ranks before their collective
    fails (a loaded machine, seen in CI), none is left and no tool can know the phase.
    """
    files = [folder / "launcher.log"] + [p for p in (folder / "logs").rglob("*") if p.is_file()]
    others = [r for r in range(doc["world_size"]) if r != doc["expected"]["rank"]]
    marks = [f"[rank{r}]: Traceback (most recent call last):".encode() for r in others]
    printed = any(m in p.read_bytes() for p in files for m in marks)
    error_files = [p for p in files if p.name == "error.json" and p.parent.name in map(str, others)]
    return printed or any(b"Traceback (most recent call last)" in p.read_bytes() for p in error_files)


# the mark DeepSpeed's see_memory_usage prints on rank 0 as it opens a phase ("memory_breakdown": true)
OPENS = {"forward": b"Engine before forward", "backward": b"Engine before backward",
         "optimizer-step": b"Engine before step"}


def survivor_marks_phase(folder, doc):
    """Whether rank 0, a survivor, printing DeepSpeed's memory_breakdown marks, stopped inside the
    expected phase: its last mark opens it (``Engine before step`` and never ``Engine after step``).
    The ranks train in lockstep, so it waited there for the rank that died; that witnesses the phase
    when no survivor's stack was left."""
    if doc["expected"]["rank"] == 0 or doc["expected"]["phase"] not in OPENS:
        return False
    logs = [p for p in (folder / "logs").rglob("stdout.log") if p.parent.name == "0"]
    marks = [line for p in logs for line in p.read_bytes().splitlines() if line.startswith((b"Engine before", b"Engine after"))]
    return bool(marks) and marks[-1].strip() == OPENS[doc["expected"]["phase"]]


def report_mismatches(report, doc, folder):
    """Where the report disagrees with the scenario's ground truth, as 'field: got X, want Y'."""
    exp = dict(doc["expected"])
    if exp.get("phase_witness") == "survivor-stacks" and not (survivors_left_stacks(folder, doc)
                                                               or survivor_marks_phase(folder, doc)):
        exp["phase"] = "unknown"
    got, want = {}, {}

    def cmp(field, value, expected):
        if value != expected:
            got[field], want[field] = value, expected

    cmp("schema", report.get("schema"), "firstfault.report/1")
    ff = report.get("first_failure")
    if exp.get("failed") is False:
        cmp("first_failure", ff, None)
    elif ff is None:
        cmp("first_failure", None, "a failure")
    else:
        if exp["rank"] is not None:
            cmp("first_failure.rank", ff.get("rank"), exp["rank"])
        cmp("first_failure.node", ff.get("node"), exp.get("node", doc["node"]))
        cmp("first_failure.category", ff.get("category"), exp["category"])
        if exp["phase"] is not None:
            cmp("first_failure.phase", ff.get("phase"), exp["phase"])
        cmp("blame", report.get("blame"), exp["blame"])
        if "ranks_sharing" in exp:
            cmp("first_failure.ranks_sharing", sorted(ff.get("ranks_sharing") or []), exp["ranks_sharing"])
        if "signal" in exp:
            rank = report.get("ranks", {}).get(str(exp["rank"])) or {}
            cmp(f"ranks.{exp['rank']}.exit.signal", (rank.get("exit") or {}).get("signal"), exp["signal"])
    ckpt = report.get("checkpoint") or {}
    cmp("checkpoint.verdict", ckpt.get("verdict"), exp["checkpoint_verdict"])
    cmp("checkpoint.resume_from", ckpt.get("resume_from"), exp["checkpoint_resume_from"])
    if "incomplete_tag" in exp:
        tags = {t.get("tag"): t for t in ckpt.get("tags") or []}
        cmp(f"checkpoint.tags[{exp['incomplete_tag']}].complete",
            (tags.get(exp["incomplete_tag"]) or {}).get("complete"), False)
    return [f"{k}: got {got[k]!r}, want {want[k]!r}" for k in got]


def check_report(report, doc, folder):
    wrong = report_mismatches(report, doc, folder)
    assert not wrong, f"{doc['name']}: the report disagrees with the ground truth:\n  " + "\n  ".join(wrong)


def check_logs_only(report, doc, with_disk):
    """What the logs alone (no checkpoint folder given) say of the checkpoint: in a fresh run what the
    scenario expects, or less when a race left less in the logs (a survivor SIGTERMed before it printed
    its error) — never more: no resume point the disk refutes, no verdict but the expected or unknown."""
    want = doc["expected"].get("logs_only")
    if not want:
        return
    ck = report["checkpoint"]
    safe_on_disk = {t["tag"] for t in with_disk["checkpoint"]["tags"] if t["verdict"] == "safe"}
    assert ck["verdict"] in (want["checkpoint_verdict"], "unknown"), ck["reason"]
    assert ck["resume_from"] is None or ck["resume_from"] in safe_on_disk, ck["reason"]


@pytest.mark.parametrize("name", PLAIN)
def test_report(jobs, name):
    folder, doc = jobs(name)
    full = analyze(folder, doc)
    check_report(full, doc, folder)
    check_logs_only(analyze(folder, doc, logs_only=True), doc, full)


@pytest.mark.root
@pytest.mark.parametrize("name", OOM)
def test_report_oom(jobs, name):
    _skip_unless_oom_possible(name)
    folder, doc = jobs(name)
    full = analyze(folder, doc)
    check_report(full, doc, folder)
    check_logs_only(analyze(folder, doc, logs_only=True), doc, full)
