"""The runner removes the shared-memory buffers DeepSpeed's ranks leave behind, but not those a live
process maps or holds open: the live-node test runs two jobs at once, and DeepSpeed's shm_initialize
waits without end for each other rank's buffer to exist, so removing a running job's buffer hung that
job (also while its rank was still filling the buffer with write(), before mapping it)."""

from __future__ import annotations

import mmap

from tests.realjobs import run


def test_a_buffer_a_live_process_maps_is_kept_and_a_closed_one_is_not(tmp_path):
    held, left = tmp_path / "deepspeed_allreduce_buffer_0_127.0.0.1_29500_0", tmp_path / "stale_1"
    for p in (held, left):
        p.write_bytes(b"\0" * 4096)
    with open(held, "r+b") as f, mmap.mmap(f.fileno(), 4096) as m:  # mapped, as a rank maps its buffer
        m[0] = 1
        assert run._in_use({held, left}) == {held}
    assert run._in_use({held, left}) == set()  # unmapped once its process let go


def test_a_buffer_a_live_process_is_still_writing_is_kept(tmp_path):
    filling, left = tmp_path / "deepspeed_allreduce_buffer_0_127.0.0.1_29500_1", tmp_path / "stale_1"
    left.write_bytes(b"\0" * 4096)
    with open(filling, "wb") as f:  # created and being written, not mapped yet: shm_initialize's shared_create
        f.write(b"\0" * 4096)
        assert run._in_use({filling, left}) == {filling}
    assert run._in_use({filling, left}) == set()
