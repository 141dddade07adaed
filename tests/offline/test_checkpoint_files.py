"""collector.checkpoint_files on real DeepSpeed 0.19.8 trees (tests/data/checkpoints)
and on damaged copies of them made here in tmp_path."""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import tempfile
import zipfile
from pathlib import Path

import pytest

from firstfault.analysis.checkpoint import checkpoint_from_disk
from firstfault.offline.checkpoint_files import CheckpointPathError, check_archive, inspect_checkpoint_dir

DATA = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
Z2_SHARD1 = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
Z2_FILES = ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt", Z2_SHARD1]
Z3_FILES = [
    "zero_pp_rank_0_mp_rank_00_model_states.pt",
    "zero_pp_rank_0_mp_rank_00_optim_states.pt",
    "zero_pp_rank_1_mp_rank_00_model_states.pt",
    "zero_pp_rank_1_mp_rank_00_optim_states.pt",
]


@pytest.fixture(params=["zero2", "zero3"])
def stage_tree(request):
    return request.param


def copy_tree(tmp_path: Path, name: str = "zero2") -> Path:
    return Path(shutil.copytree(DATA / name, tmp_path / name))


def member_data_offset(path: Path, member_suffix: str) -> int:
    """Where the stored bytes of the zip member ending in member_suffix start."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(member_suffix))
    with open(path, "rb") as fh:
        fh.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", fh.read(4))
    return info.header_offset + 30 + name_len + extra_len


def problems_of(disk, tag):
    return next(t for t in disk.tags if t.tag == tag).problems


@pytest.mark.parametrize("name,files", [("zero2", Z2_FILES), ("zero3", Z3_FILES)])
def test_real_trees_are_complete(name, files):
    disk = inspect_checkpoint_dir(DATA / name)
    assert disk.latest == "global_step4" and disk.latest_problem is None
    assert [t.tag for t in disk.tags] == ["global_step2", "global_step4"]
    assert [t.step for t in disk.tags] == [2, 4]
    assert disk.zero_stage == ("1/2" if name == "zero2" else "3")
    for tag in disk.tags:
        assert tag.complete and tag.problems == []
        assert tag.world_size_seen == 2
        assert sorted(f.name for f in tag.files) == files
        assert all(f.status == "ok" and f.size_bytes > 0 and f.mtime_ns for f in tag.files)
    assert checkpoint_from_disk(disk)["verdict"] == "safe"


def test_world_size_inferred_says_what_it_cannot_see(stage_tree):
    disk = inspect_checkpoint_dir(DATA / stage_tree)
    assert (disk.world_size, disk.world_size_from) == (2, "inferred")
    assert any("missing highest-numbered shard cannot be detected" in n for n in disk.notes)
    given = inspect_checkpoint_dir(DATA / stage_tree, world_size=2)
    assert (given.world_size, given.world_size_from, given.notes) == (2, "given", [])


def test_given_world_size_larger_than_shards_names_missing_ranks(stage_tree):
    disk = inspect_checkpoint_dir(DATA / stage_tree, world_size=3)
    problems = problems_of(disk, "global_step4")
    assert "rank 2 optimizer shard missing (zero_pp_rank_2_mp_rank_00_optim_states.pt)" in problems
    if stage_tree == "zero3":
        assert "rank 2 model states missing (zero_pp_rank_2_mp_rank_00_model_states.pt)" in problems


@pytest.mark.parametrize("verify_crc", [True, False])
def test_truncated_shard(tmp_path, verify_crc):
    root = copy_tree(tmp_path)
    shard = root / "global_step4" / Z2_SHARD1
    shard.write_bytes(shard.read_bytes()[:2000])
    disk = inspect_checkpoint_dir(root, verify_crc=verify_crc)
    assert problems_of(disk, "global_step4") == [f"rank 1 optimizer shard truncated ({Z2_SHARD1})"]
    assert problems_of(disk, "global_step2") == []
    report = checkpoint_from_disk(disk)
    assert (report["verdict"], report["resume_from"]) == ("unsafe", "global_step2")
    assert "rank 1 optimizer shard truncated" in report["reason"]


def test_deleted_shard(tmp_path):
    root = copy_tree(tmp_path)
    (root / "global_step4" / Z2_SHARD1).unlink()
    tag = inspect_checkpoint_dir(root).tags[-1]
    assert not tag.complete
    assert tag.problems == [f"rank 1 optimizer shard missing ({Z2_SHARD1})"]
    assert tag.world_size_seen == 1


def test_deleted_highest_shard_everywhere_needs_the_world_size(tmp_path):
    root = copy_tree(tmp_path)
    for tag in ("global_step2", "global_step4"):
        (root / tag / Z2_SHARD1).unlink()
    assert all(t.complete for t in inspect_checkpoint_dir(root).tags)  # the documented blind spot
    disk = inspect_checkpoint_dir(root, world_size=2)
    assert all(t.problems == [f"rank 1 optimizer shard missing ({Z2_SHARD1})"] for t in disk.tags)


def test_deleted_zero3_model_states(tmp_path):
    root = copy_tree(tmp_path, "zero3")
    (root / "global_step2" / "zero_pp_rank_0_mp_rank_00_model_states.pt").unlink()
    assert problems_of(inspect_checkpoint_dir(root), "global_step2") == [
        "rank 0 model states missing (zero_pp_rank_0_mp_rank_00_model_states.pt)"
    ]


def test_corrupt_bytes_fail_the_crc(tmp_path):
    root = copy_tree(tmp_path)
    model = root / "global_step4" / "mp_rank_00_model_states.pt"
    raw = bytearray(model.read_bytes())
    raw[member_data_offset(model, "/data.pkl") + 10] ^= 0xFF
    model.write_bytes(bytes(raw))
    [problem] = problems_of(inspect_checkpoint_dir(root), "global_step4")
    assert problem == (
        "rank 0 model states corrupt: CRC mismatch in mp_rank_00_model_states/data.pkl (mp_rank_00_model_states.pt)"
    )
    assert problems_of(inspect_checkpoint_dir(root, verify_crc=False), "global_step4") == []


def test_empty_and_not_zip_files(tmp_path):
    root = copy_tree(tmp_path, "zero3")
    (root / "global_step4" / Z3_FILES[3]).write_bytes(b"")
    (root / "global_step4" / Z3_FILES[2]).write_bytes(b"\x80\x02legacy pickle")
    assert problems_of(inspect_checkpoint_dir(root), "global_step4") == [
        f"rank 1 model states not a zip archive ({Z3_FILES[2]})",
        f"rank 1 optimizer shard empty ({Z3_FILES[3]})",
    ]


def test_latest_names_a_missing_tag(tmp_path):
    root = copy_tree(tmp_path)
    (root / "latest").write_text("global_step6")
    disk = inspect_checkpoint_dir(root)
    assert disk.latest == "global_step6"
    assert disk.latest_problem == f"`latest` names global_step6, which is not in {root}"
    report = checkpoint_from_disk(disk)
    assert (report["verdict"], report["default_tag"]) == ("unsafe", "global_step6")
    assert report["resume_from"] == "global_step4"


@pytest.mark.parametrize("content", ["", "\n"])
def test_empty_latest(tmp_path, content):
    root = copy_tree(tmp_path)
    (root / "latest").write_text(content)
    disk = inspect_checkpoint_dir(root)
    assert (disk.latest, disk.latest_problem) == (None, "`latest` is empty")
    assert [t.tag for t in disk.tags] == ["global_step2", "global_step4"]


def test_missing_latest_still_finds_tags(tmp_path):
    root = copy_tree(tmp_path)
    (root / "latest").unlink()
    disk = inspect_checkpoint_dir(root)
    assert (disk.latest, disk.latest_problem) == (None, "no `latest` file")
    assert checkpoint_from_disk(disk)["default_tag"] == "global_step4"


@contextlib.contextmanager
def unprivileged():
    """Drop to nobody for the block when root (root reads files of mode 000)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_unreadable_shard_and_tag_folder():
    # tmp_path's parents are 0700 root: use a folder nobody can traverse to.
    top = Path(tempfile.mkdtemp(prefix="firstfault-ckpt-"))
    try:
        top.chmod(0o755)
        root = Path(shutil.copytree(DATA / "zero2", top / "zero2"))
        (root / "global_step4" / Z2_SHARD1).chmod(0)
        (root / "global_step2").chmod(0)
        with unprivileged():
            disk = inspect_checkpoint_dir(root)
        assert problems_of(disk, "global_step4") == [
            f"rank 1 optimizer shard unreadable: permission denied ({Z2_SHARD1})"
        ]
        # An unlistable tag folder: its files are not seen, so all of them are missing too.
        assert problems_of(disk, "global_step2")[0] == "tag folder unreadable (Permission denied)"
    finally:
        shutil.rmtree(top)


def test_tags_sort_by_step_then_mtime(tmp_path):
    root = copy_tree(tmp_path)
    shutil.copytree(root / "global_step2", root / "global_step10")
    assert [t.tag for t in inspect_checkpoint_dir(root).tags] == ["global_step2", "global_step4", "global_step10"]
    for i, name in enumerate(["b", "a"]):  # non-step tags: by folder mtime
        shutil.copytree(root / "global_step2", root / name)
        os.utime(root / name, ns=(4 * 10**18 + i, 4 * 10**18 + i))  # after the copies
    assert [t.tag for t in inspect_checkpoint_dir(root).tags][-2:] == ["b", "a"]


def test_bad_paths(tmp_path):
    with pytest.raises(CheckpointPathError, match="No such file"):
        inspect_checkpoint_dir(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointPathError, match="not a directory"):
        inspect_checkpoint_dir(tmp_path / "file")
    (tmp_path / "logs").mkdir()
    with pytest.raises(CheckpointPathError, match="not a DeepSpeed checkpoint"):
        inspect_checkpoint_dir(tmp_path)


def test_empty_tag_folder_of_a_save_that_just_began(tmp_path):
    root = copy_tree(tmp_path, "zero3")
    (root / "global_step6").mkdir()
    tag = inspect_checkpoint_dir(root).tags[-1]
    assert tag.tag == "global_step6" and len(tag.problems) == 4
    assert all(p.endswith("missing (" + f.name + ")") for p, f in zip(tag.problems, tag.files))


def test_check_archive_on_every_real_file():
    for path in sorted(DATA.rglob("*.pt")):
        assert check_archive(path) == ("ok", ""), path
