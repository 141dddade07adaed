"""The stores (SQLite and PostgreSQL) against a model: random batches (with resends)
and random selections."""


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firstfault.collector.store.base import Selection
from firstfault.collector.store.shared import JOB_MARGIN_NS
from firstfault.wire import Record
from tests.collector.frames import insert_frames

T0 = 1_796_206_319_782_000_000
NODES = ("gpu-01", "gpu-02", "gpu-03")
JOBS = (None, "a", "b")
# times a few minutes apart around the jobs' 10-minute margin, with ties
TIMES = [T0 + k * 60 * 10**9 + d for k in range(-14, 15, 2) for d in (0, 0, 1)]


@st.composite
def records(draw):
    node = draw(st.sampled_from(NODES))
    stream = draw(st.sampled_from(("s1", "s2")))
    seq = draw(st.integers(0, 40))
    job = draw(st.sampled_from(JOBS))
    t = draw(st.sampled_from(TIMES))
    known = draw(st.booleans())
    return Record(node=node, stream=stream, seq=seq, source="ranklog", kind="rank.line",
                  message=draw(st.sampled_from(("step ok", "loss scale", "Killed process"))),
                  occurred_ns=t if known else None, observed_ns=t if not known else t + 5,
                  job=job, rank=draw(st.sampled_from((None, 0, 1, 2))))


selections = st.builds(
    Selection,
    job=st.sampled_from((None, "a", "b", "zz")),
    nodes=st.none() | st.sets(st.sampled_from(NODES + ("gpu-09",))).map(tuple),
    ranks=st.none() | st.sets(st.integers(0, 3)).map(tuple),
    since_ns=st.none() | st.sampled_from(TIMES),
    until_ns=st.none() | st.sampled_from(TIMES),
    grep=st.sampled_from((None, "ok", "loss", "Killed", "(A+)+$")),
    limit=st.none() | st.integers(0, 30),
)


def t_of(r: Record) -> int:
    return r.occurred_ns if r.occurred_ns is not None else r.observed_ns


def model(stored: dict, sel: Selection) -> list[Record]:
    rs = list(stored.values())
    if sel.job is not None:
        own = [r for r in rs if r.job == sel.job]
        if not own:
            return []
        lo = min(map(t_of, own)) - JOB_MARGIN_NS
        hi = max(map(t_of, own)) + JOB_MARGIN_NS
        nodes = {r.node for r in own}
        rs = own + [r for r in rs if r.job is None and r.node in nodes and lo <= t_of(r) <= hi]
    rs = [r for r in rs
          if (sel.nodes is None or r.node in sel.nodes)
          and (sel.ranks is None or r.rank in sel.ranks)
          and (sel.since_ns is None or t_of(r) >= sel.since_ns)
          and (sel.until_ns is None or t_of(r) <= sel.until_ns)
          and (sel.grep is None or sel.grep in r.message)]
    rs.sort(key=lambda r: (t_of(r), r.node, r.stream, r.seq))
    return rs if sel.limit is None else rs[:sel.limit]


@pytest.mark.parametrize("via", ["records", "frames"])
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(records(), max_size=25), max_size=6),
       sels=st.lists(selections, min_size=1, max_size=8))
def test_store_matches_the_model(empty_store, via, batches, sels):
    stored: dict = {}
    with empty_store() as store:
        for batch in batches:
            new = 0
            for r in batch:
                if (r.node, r.stream, r.seq) not in stored:
                    stored[(r.node, r.stream, r.seq)] = r
                    new += 1
            if via == "records":
                assert store.insert(batch) == new
                continue
            assert insert_frames(store, batch) == new
        for (node, stream) in {(n, s) for n, s, _ in stored}:
            assert store.high_seq(node, stream) == max(
                q for n, s, q in stored if (n, s) == (node, stream))
        for sel in sels:
            assert list(store.records(sel)) == model(stored, sel), sel
        jobs = {j.job: j for j in store.jobs()}
        assert set(jobs) == {r.job for r in stored.values()} - {None}
        for name, j in jobs.items():
            own = [r for r in stored.values() if r.job == name]
            assert (j.records, j.first_ns, j.last_ns) == (
                len(own), min(map(t_of, own)), max(map(t_of, own)))
            assert j.nodes == tuple(sorted({r.node for r in own}))
            assert j.ranks == tuple(sorted({r.rank for r in own} - {None}))
