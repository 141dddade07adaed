"""Fixtures of the store tests: a record factory, a fixed clock, a fresh store file."""

import pytest

from agent.wire import Record
from collector.store.sqlite import SqliteStore

T0 = 1_796_206_319_782_000_000  # 2026-12-02 10:11:59.782 UTC
S = 1_000_000_000  # one second in ns
LINE = ("[2026-12-02 10:11:59,782] [INFO] [logging.py:107:log_dist] [Rank {rank}] step={seq}, "
        "skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]")


class Clock:
    """now_ns for a store: a day after T0 unless a test sets ``now``."""

    def __init__(self) -> None:
        self.now = T0 + 86400 * S

    def __call__(self) -> int:
        return self.now


def make_record(seq: int, *, node: str = "gpu-01", stream: str = "s1", t: int | None = None,
                job: str | None = "job-1", rank: int | None = 0, **kw) -> Record:
    """A DeepSpeed-style rank line at T0 + seq seconds unless told otherwise."""
    t = T0 + seq * S if t is None else t
    values = dict(source="ranklog", kind="rank.line", message=LINE.format(rank=rank, seq=seq),
                  occurred_ns=t, observed_ns=t + 8_000_000, job=job, rank=rank,
                  local_rank=rank, pid=None if rank is None else 24000 + rank)
    if job is None and "source" not in kw:
        values.update(source="kmsg", kind="kernel.line", message=f"kernel line {seq}",
                      rank=None, local_rank=None, pid=None, boot_id="b-1", mono_ns=seq)
    values.update(kw)
    return Record(node=node, stream=stream, seq=seq, **values)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def rec():
    return make_record


@pytest.fixture
def store(tmp_path, clock):
    s = SqliteStore(tmp_path / "ff.db", now_ns=clock)
    yield s
    s.close()
