"""Records as columns: runs of shared values, changed in one pass."""

from __future__ import annotations

import random

import pytest

from firstfault.agent.spool.columns import ColumnsBuilder, Runs


def _model_update(values: list, changes: dict) -> list:
    return [changes[i](v) if i in changes else v for i, v in enumerate(values)]


@pytest.mark.parametrize("seed", range(20))
def test_update_changes_exactly_the_records_named_as_set_one_by_one_does(seed):
    rnd = random.Random(seed)
    runs = Runs()
    for _ in range(rnd.randrange(1, 12)):
        runs.add(object(), rnd.randrange(1, 6))
    n = len(runs.values())
    picked = rnd.sample(range(n), rnd.randrange(0, n + 1))
    changes = {i: (lambda v, i=i: (i, v)) for i in picked}
    expect = _model_update(runs.values(), changes)
    one_by_one = Runs([r[:] for r in runs])
    for i in picked:
        one_by_one.set(i, changes[i](one_by_one.at(i)))
    runs.update(changes)
    assert runs.values() == expect == one_by_one.values()
    assert all(k > 0 for _, k in runs)
    assert len(runs) <= len(one_by_one)


def test_update_past_the_end_raises():
    runs = Runs()
    runs.add("a", 3)
    with pytest.raises(IndexError):
        runs.update({3: str.upper})
    assert runs.values() == ["a"] * 3


def test_add_fields_merges_into_the_last_row_of_each_file_only():
    b = ColumnsBuilder()
    f0, f1 = {"path": "/r0"}, {"path": "/r1"}
    b.lines([b"a", b"b"], 1, "j", 0, 0, f0)
    b.lines([b"c"], 1, "j", 1, 1, f1)
    b.lines([b"d", b"e"], 2, "j", 0, 0, f0)
    b.add_fields({2: {"end_offset": 2}, 4: {"end_offset": 4}})
    fields = b.build().cols[12].values()
    assert fields == [f0, f0, {**f1, "end_offset": 2}, f0, {**f0, "end_offset": 4}]
    assert f0 == {"path": "/r0"} and f1 == {"path": "/r1"}
