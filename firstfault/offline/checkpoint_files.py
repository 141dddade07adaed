"""A DeepSpeed checkpoint folder on disk as the analysis reads it: the inspection of
firstfault/common/checkpoint_files.py (shared with the agent, which ships it from a
live node) made a DiskCheckpoint (firstfault/analysis/diskwire.py)."""

from __future__ import annotations

import os

from firstfault.analysis.checkpoint import DiskCheckpoint
from firstfault.analysis.diskwire import disk_from_wire
from firstfault.common.checkpoint_files import CheckpointPathError, check_archive, inspect

__all__ = ["CheckpointPathError", "check_archive", "inspect_checkpoint_dir"]


def inspect_checkpoint_dir(path: str | os.PathLike, world_size: int | None = None, *,
                           verify_crc: bool = True) -> DiskCheckpoint:
    """Inspect every tag under a DeepSpeed ``save_dir`` (CheckpointPathError if it is none)."""
    return disk_from_wire(inspect(path, world_size, verify_crc=verify_crc))
