"""checkpoints: a job's checkpoint directories learned from its ranks' command lines and
DeepSpeed config, inspected on disk once a rank ends, with the offline inspection's verdict
(real DeepSpeed 0.19.8 trees: tests/data/checkpoints)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from firstfault.agent.sources.checkpoints import CheckpointsSource, dirs_from_cmdline, dirs_from_save_lines, fit_message
from firstfault.agent.sources.procs import Identity
from firstfault.analysis.checkpoint import checkpoint_from_disk
from firstfault.analysis.diskwire import SCHEMA, disk_from_wire
from firstfault.common.checkpoint_files import SCHEMA as COMMON_SCHEMA
from firstfault.common.checkpoint_files import inspect
from firstfault.offline.checkpoint_files import inspect_checkpoint_dir

DATA = Path(__file__).resolve().parents[2] / "data" / "checkpoints"


def test_dirs_from_the_command_line_and_the_deepspeed_config():
    configs = {"/work/ds.json": {"train_batch_size": 8, "checkpoint": {"save_dir": "ckpt/ds"}}}
    argv = ["python", "train.py", "--save-dir", "checkpoints", "--output_dir=/abs/out", "--deepspeed_config",
            "ds.json", "--save", "--lr", "1"]
    assert dirs_from_cmdline(argv, "/work", configs.get) == {"/work/checkpoints", "/abs/out", "/work/ckpt/ds"}
    assert dirs_from_cmdline(["python", "train.py", "--save_dir", "rel"], None) == set()  # no cwd: unknown


def test_the_oldest_tags_go_first_when_the_inspection_is_too_large():
    insp = inspect(DATA / "zero2")
    text, kept = fit_message(insp, limit=len(json.dumps(insp, separators=(",", ":"))) - 1)
    assert kept == 1 and [t["tag"] for t in json.loads(text)["tags"]] == ["global_step4"]  # `latest` kept
    assert SCHEMA == COMMON_SCHEMA


def test_a_rank_that_ends_gets_its_jobs_checkpoint_inspected_as_offline(tmp_path):
    work = tmp_path / "job"
    work.mkdir()
    shutil.copytree(DATA / "zero2", work / "checkpoints")
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--save-dir", "checkpoints"],
                            cwd=work)
    ranks = {rank.pid: Identity("j1", 0, 0, {})}
    src = CheckpointsSource(settle_s=0, ranks=lambda: dict(ranks))
    try:
        cmdline = Path(f"/proc/{rank.pid}/cmdline")
        deadline = time.monotonic() + 10
        while b"--save-dir" not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)  # exec'd (the procs source finds a rank only then: its environment says so)
        assert src.poll() == []  # learned, still running
    finally:
        rank.kill()
        rank.wait()
    del ranks[rank.pid]
    [d] = src.poll()
    assert (d.kind, d.job, d.fields["path"], d.fields["trigger"]) == (
        "checkpoint.inspection", "j1", str(work / "checkpoints"), "job-end")
    shipped = checkpoint_from_disk(disk_from_wire(json.loads(d.message)))
    offline = checkpoint_from_disk(inspect_checkpoint_dir(work / "checkpoints"))
    assert shipped == offline and shipped["verdict"] == "safe" and shipped["resume_from"] == "global_step4"
    assert src.poll() == []  # once


def test_configured_dirs_and_a_folder_that_is_no_checkpoint(tmp_path):
    empty = tmp_path / "nothing-yet"
    empty.mkdir()
    ranks = {os.getpid(): Identity("j2", 0, 0, {})}
    src = CheckpointsSource(dirs=[str(empty), str(DATA / "zero3")], settle_s=0, ranks=lambda: dict(ranks))
    src.poll()
    ranks.clear()
    assert [d.fields["path"] for d in src.poll()] == [str(DATA / "zero3")]


def test_the_path_in_a_save_line_a_rank_logged(tmp_path):
    """DeepSpeed's save line (FORMATS.md) names the tag's file; its save dir is two folders up,
    relative to the ranks' working directory when relative."""
    line = b"[INFO] [logging.py:123:log_dist] [Rank 0] Saving model checkpoint: out/ck/global_step4/mp_rank_00_model_states.pt"
    assert dirs_from_save_lines(b"rank 0 step 4 loss 1.0\n" + line) == {"out/ck"}
    assert dirs_from_save_lines(b"rank 0 step 4 loss 1.0") == set()
    work = tmp_path / "job"
    shutil.copytree(DATA / "zero2", work / "out" / "ck")
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=work)
    ranks = {rank.pid: Identity("j3", 0, 0, {})}
    src = CheckpointsSource(settle_s=0, ranks=lambda: dict(ranks))
    try:
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{rank.pid}/cwd") != str(work) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert src.poll() == []  # its command line names no dir
        src.watch(("j3", 0, 0, {}), line, 0)  # ranklog's hook, from its own thread
        assert src.poll() == []
    finally:
        rank.kill()
        rank.wait()
    ranks.clear()
    assert [d.fields["path"] for d in src.poll()] == [str(work / "out" / "ck")]
