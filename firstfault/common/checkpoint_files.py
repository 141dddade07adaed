"""Inspect a DeepSpeed checkpoint directory on disk: which tags are whole.

Both the agent (its checkpoints source ships the inspection of a job's checkpoint
directory once the job ends) and ``firstfault analyze --checkpoint-dir`` /
``firstfault checkpoint`` / ``firstfault report --checkpoint-dir`` use this module,
so the verdict is the same wherever the folder was read. Its output is plain data,
the *inspection* (``SCHEMA``), as the agent ships it in a record's message (JSON);
firstfault/analysis/diskwire.py turns it into the analysis' DiskCheckpoint::

    {"schema": "firstfault.checkpoint-inspection/1", "path": ..., "latest": "global_step4",
     "latest_problem": null, "world_size": 2, "world_size_from": "inferred", "zero_stage": "1/2",
     "notes": [...], "tags": [{"tag": "global_step4", "step": 4, "complete": true, "problems": [],
     "world_size_seen": 2, "mtime_ns": ..., "files": [{"name": "mp_rank_00_model_states.pt",
     "rank": 0, "kind": "model", "status": "ok", "size_bytes": 9000, "mtime_ns": ..., "detail": ""}]}]}

Reads a ``save_dir`` as ``engine.save_checkpoint(save_dir)`` leaves it::

    save_dir/latest                      "global_step4" (no newline), written by rank 0
    save_dir/global_step4/mp_rank_00_model_states.pt
    save_dir/global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt
    save_dir/global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt
    save_dir/zero_to_fp32.py, zero_to_torch.py   (recovery scripts, ignored)

File names, from deepspeed/runtime/engine.py (0.19.8, the same in 0.19.6 at
deepspeedai/DeepSpeed edaa722):

- ``_get_ckpt_name``: model states, ``mp_rank_{mp:02d}_model_states.pt`` (ZeRO 0-2,
  written by data-parallel rank 0 only), or with partitioned weights (ZeRO 3)
  ``zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt`` on every rank.
- ``_get_zero_ckpt_prefix`` / ``_get_rank_zero_ckpt_name`` (via ``_get_zero_ckpt_name``):
  the optimizer shard of every data-parallel rank,
  ``{"bf16_" if bf16}zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt``;
  ``_get_all_zero_checkpoint_names`` still loads the old ``..._mp_rank_00optim_states.pt``.
- ``_get_optimizer_ckpt_name`` / ``_get_expert_ckpt_name`` (MoE):
  ``expp_rank_{e}_mp_rank_{mp:02d}_optim_states.pt``, ``layer_{l}_expert_{x}_mp_rank_{mp:02d}_model_states.pt``:
  their bytes are checked, their completeness is not (known issue).
- ``save_checkpoint``: rank 0 writes ``latest`` after its own files, without waiting
  for the other ranks (the barrier comes after), so ``latest`` can name a tag whose
  shards are incomplete. Real trees: tests/data/checkpoints/{zero2,zero3}.

Every ``.pt`` is a ``torch.save`` zip archive (stored, not compressed): its end
record is written last, so a truncated file does not open as a zip, and every
member's CRC-32 can be checked without torch (``verify_crc``, streamed in 1 MiB
reads by zipfile). Nothing here raises for a bad checkpoint: each defect is a
problem naming the rank and file. Only an unusable path raises CheckpointPathError.

World size means the data-parallel size (ZeRO shards per model-parallel rank; the
job's world size without tensor/pipeline parallelism). Without one from the logs it
is inferred as the highest shard rank seen + 1, and then a missing highest-numbered
shard cannot be detected (the inspection's ``notes`` say so).
"""

from __future__ import annotations

import os
import re
import stat
import zipfile
from pathlib import Path

SCHEMA = "firstfault.checkpoint-inspection/1"
STEP_TAG = re.compile(r"global_step(\d+)")  # as analysis/checkpoint.py reads a tag's step
LATEST = "latest"
RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")
# ZeRO 3 model states and every ZeRO optimizer shard carry the data-parallel rank.
ZERO_FILE = re.compile(
    r"(?P<bf16>bf16_)?zero_pp_rank_(?P<dp>\d+)_mp_rank_(?P<mp>\d+)_?(?P<kind>model|optim)_states\.pt"
)
MODEL_FILE = re.compile(r"mp_rank_(?P<mp>\d+)_model_states\.pt")
KIND_NAMES = {"model": "model states", "optim": "optimizer shard"}
STATUS_WORDS = {"not-zip": "not a zip archive", "not-torch": "not a torch.save archive"}


class CheckpointPathError(Exception):
    """The path is not a directory, or holds no DeepSpeed checkpoint."""


def check_archive(path: Path, verify_crc: bool = True) -> tuple[str, str]:
    """(status, detail) of one torch.save file; never raises."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
            if not head:
                return "empty", "0 bytes"
            if head != b"PK\x03\x04":
                return "not-zip", "does not start with a zip header"
            fh.seek(0)
            with zipfile.ZipFile(fh) as archive:
                names = archive.namelist()
                if not any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
                    return "not-torch", "zip without data.pkl"
                if verify_crc:
                    bad = archive.testzip()
                    if bad is not None:
                        return "corrupt", f"CRC mismatch in {bad}"
                else:
                    size = os.fstat(fh.fileno()).st_size
                    if any(i.header_offset + i.compress_size > size for i in archive.infolist()):
                        return "truncated", "members end past the end of the file"
    except zipfile.BadZipFile as exc:
        # It starts like a zip but its end record is unreadable: cut short.
        return "truncated", str(exc)
    except OSError as exc:  # permission denied, I/O error
        return "unreadable", (exc.strerror or str(exc)).lower()
    except (EOFError, ValueError, RuntimeError) as exc:  # damaged member headers
        return "corrupt", f"{type(exc).__name__}: {exc}"
    return "ok", ""


def _read_latest(root: Path) -> tuple[str | None, str | None]:
    path = root / LATEST
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except FileNotFoundError:
        return None, "no `latest` file"
    except OSError as exc:
        return None, f"`latest` unreadable ({exc.strerror})"
    if not text:
        return None, "`latest` is empty"
    if not (root / text).is_dir():
        return text, f"`latest` names {text}, which is not in {root}"
    return text, None


def _list_pt(folder: Path) -> list[str] | OSError:
    """The .pt file names in a folder, or why it cannot be listed."""
    try:
        return sorted(n for n in os.listdir(folder) if n.endswith(".pt"))
    except OSError as exc:
        return exc


def _classify(name: str) -> tuple[str, int | None, int | None, bool]:
    """(kind, dp rank, mp rank, bf16) from a file name."""
    if m := ZERO_FILE.fullmatch(name):
        return m["kind"], int(m["dp"]), int(m["mp"]), bool(m["bf16"])
    if m := MODEL_FILE.fullmatch(name):
        return "model", None, int(m["mp"]), False
    return "other", None, None, False


def _expected(stage: str, world: int, mp_ranks: set[int], bf16: bool) -> dict[tuple, str]:
    """(kind, dp rank, mp rank) -> the file name DeepSpeed writes for it."""
    want: dict[tuple, str] = {}
    prefix = "bf16_" if bf16 else ""
    for mp in sorted(mp_ranks or {0}):
        if stage in ("0", "1/2"):
            want[("model", 0, mp)] = f"mp_rank_{mp:02d}_model_states.pt"
        for dp in range(world if stage != "0" else 0):
            if stage == "3":
                want[("model", dp, mp)] = f"zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt"
            want[("optim", dp, mp)] = f"{prefix}zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt"
    return want


def _inspect_tag(
    tag_dir: Path, listed: list[str] | OSError, stage: str, world: int, mp_ranks: set[int], bf16: bool,
    verify_crc: bool,
) -> dict:
    step = int(m[1]) if (m := STEP_TAG.fullmatch(tag_dir.name)) else None
    files: list[dict] = []
    problems: list[str] = []
    seen: dict[tuple, dict] = {}
    if isinstance(listed, OSError):
        problems.append(f"tag folder unreadable ({listed.strerror})")
        listed = []
    for name in listed:
        kind, dp, mp, _ = _classify(name)
        rank = 0 if kind == "model" and dp is None else dp  # mp_rank_XX_model_states: dp rank 0 writes it
        try:
            st = (tag_dir / name).stat()
            size, mtime = st.st_size, st.st_mtime_ns
        except OSError:
            size = mtime = None
        status, detail = check_archive(tag_dir / name, verify_crc)
        f = _file(name, rank, kind, status, size, mtime, detail)
        files.append(f)
        if kind != "other":
            seen[(kind, rank, mp)] = f
        if status != "ok":
            said = f": {detail}" if status in ("corrupt", "unreadable") else ""
            problems.append(f"{_label(f)} {STATUS_WORDS.get(status, status)}{said} ({name})")
    for key, name in _expected(stage, world, mp_ranks, bf16).items():
        if key not in seen:
            missing = _file(name, key[1], key[0], "missing")
            files.append(missing)
            problems.append(f"{_label(missing)} missing ({name})")
    ranks = [f["rank"] for f in files if f["rank"] is not None and f["status"] != "missing"]
    try:
        tag_mtime = tag_dir.stat().st_mtime_ns
    except OSError:
        tag_mtime = None
    return {"tag": tag_dir.name, "step": step, "files": files, "complete": not problems, "problems": problems,
            "world_size_seen": max(ranks, default=-1) + 1, "mtime_ns": tag_mtime}


def _file(name: str, rank: int | None, kind: str, status: str, size: int | None = None, mtime: int | None = None,
          detail: str = "") -> dict:
    return {"name": name, "rank": rank, "kind": kind, "status": status, "size_bytes": size, "mtime_ns": mtime,
            "detail": detail}


def _label(f: dict) -> str:
    what = KIND_NAMES.get(f["kind"], "file")
    return f"rank {f['rank']} {what}" if f["rank"] is not None else what


def inspect(path: str | os.PathLike, world_size: int | None = None, *, verify_crc: bool = True) -> dict:
    """The inspection of every tag under a DeepSpeed ``save_dir``; see the module docstring."""
    root = Path(path)
    try:
        mode = root.stat().st_mode
    except OSError as exc:
        raise CheckpointPathError(f"{root}: {exc.strerror}; pass the directory given to save_checkpoint") from exc
    if not stat.S_ISDIR(mode):
        raise CheckpointPathError(f"{root} is not a directory; pass the directory given to save_checkpoint")
    latest, latest_problem = _read_latest(root)
    try:
        entries = os.listdir(root)
    except OSError as exc:
        raise CheckpointPathError(f"{root}: cannot list it ({exc.strerror})") from exc
    listing = {root / n: _list_pt(root / n) for n in sorted(entries) if (root / n).is_dir()}
    # A tag: what `latest` names, a global_stepN folder, or any folder holding .pt files.
    listing = {
        d: names for d, names in listing.items()
        if d.name == latest or STEP_TAG.fullmatch(d.name) or (isinstance(names, list) and names)
    }
    if not listing and not {LATEST, *RECOVERY_SCRIPTS} & set(entries):
        raise CheckpointPathError(
            f"{root} is not a DeepSpeed checkpoint: no `latest` file and no tag folder with .pt files"
        )
    every = [_classify(n) for names in listing.values() if isinstance(names, list) for n in names]
    if any(k == "model" and dp is not None for k, dp, _, _ in every):
        stage = "3"
    elif any(k == "optim" and dp is not None for k, dp, _, _ in every):
        stage = "1/2"
    elif any(k == "model" for k, _, _, _ in every):
        stage = "0"  # or ZeRO 1/2 with every optimizer shard missing: not distinguishable
    else:
        stage = "unknown"
    mp_ranks = {mp for _, _, mp, _ in every if mp is not None}
    bf16 = any(b for *_, b in every)
    notes: list[str] = []
    dp_seen = [dp for _, dp, _, _ in every if dp is not None]
    if world_size is not None:
        world, world_from = world_size, "given"
    elif dp_seen:
        world, world_from = max(dp_seen) + 1, "inferred"
        notes.append(
            f"world size {world} inferred from the shards present: a missing highest-numbered shard cannot be detected"
        )
    else:
        world, world_from = 0, None
    tags = [_inspect_tag(d, names, stage, world, mp_ranks, bf16, verify_crc) for d, names in listing.items()]
    if all(t["step"] is not None for t in tags):
        tags.sort(key=lambda t: t["step"])
    else:
        tags.sort(key=lambda t: (t["mtime_ns"] or 0, t["tag"]))
    if not verify_crc:
        notes.append("CRCs not checked: corrupt bytes inside a file go unnoticed")
    return {"schema": SCHEMA, "path": str(root), "latest": latest, "latest_problem": latest_problem, "tags": tags,
            "world_size": world or None, "world_size_from": world_from, "zero_stage": stage, "notes": notes}
