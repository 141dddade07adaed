"""Fixtures of the store tests: a record factory, a fixed clock, and stores of each
backend: ``store`` and ``open_store`` run a test on SQLite and on PostgreSQL (a new
database on the session's server, tests/collector/conftest.py), ``sqlite_store`` only
on SQLite."""

import itertools

import pytest

from firstfault.collector.store.sqlite import SqliteStore
from firstfault.wire import Record

BACKENDS = ("sqlite", "postgres")

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


def rows(store, query: str) -> list[tuple]:
    """What a literal SQL query (valid in both dialects) returns on the store's database."""
    if isinstance(store, SqliteStore):
        return store._db.execute(query).fetchall()
    return store._conn().execute(query).fetchall()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def open_store(request, backend, tmp_path, clock):
    """open_store(name="ff", **kw): a store of the test's backend; a name opened
    again is the same database."""
    opened, urls = [], {}

    def open_(name: str = "ff", **kw):
        kw.setdefault("now_ns", clock)
        if backend == "sqlite":
            s = SqliteStore(tmp_path / f"{name}.db", **kw)
        else:
            from firstfault.collector.store.postgres import PostgresStore

            if name not in urls:
                urls[name] = request.getfixturevalue("postgres").create_database()
            s = PostgresStore(urls[name], **kw)
        opened.append(s)
        return s
    yield open_
    for s in opened:
        s.close()


@pytest.fixture
def empty_store(request, backend, tmp_path):
    """empty_store(): a store of the test's backend holding nothing, each call (for
    property tests: PostgreSQL reuses one database, emptied)."""
    calls = itertools.count()
    url = None

    def open_():
        nonlocal url
        if backend == "sqlite":
            return SqliteStore(tmp_path / f"empty-{next(calls)}.db")
        from firstfault.collector.store.postgres import PostgresStore
        from firstfault.collector.store.postgres_schema import TABLES

        url = url or request.getfixturevalue("postgres").create_database()
        with PostgresStore(url) as s:
            for table in TABLES[1:]:  # all but schema_version
                s._conn().execute(f"DELETE FROM {table}")
        return PostgresStore(url)
    return open_


@pytest.fixture
def store(open_store):
    return open_store()


@pytest.fixture
def sqlite_store(tmp_path, clock):
    s = SqliteStore(tmp_path / "ff.db", now_ns=clock)
    yield s
    s.close()
