"""A job id is whatever a process on a node had in its environment: as a bundle's folder or a
download's name it must stay one harmless part of a file name. A bundle of a hostile id is
extracted for real, with Python's tarfile (no filter: what older Pythons do) and GNU tar."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from dataclasses import replace

import pytest

from firstfault.analysis.catalog import load_catalog
from firstfault.collector import query
from firstfault.collector.store import open_store
from tests.collector.server.ingest_helpers import make_records

FILES = {"report.md", "report.json", "report.html", "timeline.jsonl", "config.txt", "README.txt"}


@pytest.fixture
def hostile(tmp_path):
    """(store, job id) whose id climbs out of any folder it is extracted into."""
    target = tmp_path / "outside"
    job = f"x/../../../../../../../../..{target}/evil"
    store = open_store(str(tmp_path / "c.db"))
    store.insert([replace(r, job=job) for r in make_records("gpu-01", "s1", 0, 5)])
    yield store, job, target
    store.close()


def test_python_tarfile_writes_only_inside_the_target(hostile, tmp_path):
    store, job, target = hostile
    data = query.bundle(store, job, load_catalog())
    out = tmp_path / "out" / "deep"
    out.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        tar.extractall(out)  # no filter: members are trusted as they are
    assert not target.exists()
    (folder,) = {n.split("/")[0] for n in names}
    assert ".." not in folder and "/" not in folder and folder.startswith("firstfault-x_")
    assert {p.name for p in (out / folder).iterdir()} == FILES
    written = {p for p in tmp_path.rglob("*") if p.is_file() and not p.name.startswith("c.db")}
    assert written == {out / folder / name for name in FILES}


@pytest.mark.skipif(shutil.which("tar") is None, reason="no GNU tar here")
def test_gnu_tar_extracts_every_member(hostile, tmp_path):
    store, job, target = hostile
    bundle = tmp_path / "b.tar.gz"
    bundle.write_bytes(query.bundle(store, job, load_catalog()))
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run(["tar", "-xzf", str(bundle), "-C", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr  # GNU tar skips a member with '..' in it, and fails
    assert not target.exists()
    (folder,) = list(out.iterdir())
    assert {p.name for p in folder.iterdir()} == FILES


@pytest.mark.parametrize("job,want", [
    ("12345", "12345"), ("run_7.a-b", "run_7.a-b"), ("..", None), ("a/b", None), ("", None),
    ("é\u202etxt.exe", None), ("a\nb", None), ("x" * 300, None), ("\udc80", None)])
def test_file_part_is_one_harmless_name(job, want):
    got = query.file_part(job)
    if want is not None:
        assert got == want
    else:
        assert got != job and len(got) <= 89 and not got.startswith(".") and ".." not in got
        assert all(c.isascii() and (c.isalnum() or c in "_.-") for c in got), got
    assert query.file_part(job + "/") != got  # two ids, two names
