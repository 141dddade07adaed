"""Gap accounting against the truth: a spool that overflows while its collector comes and
goes (and the agent restarts) must count each lost record once over the gap records the
collector gets, name every one, and never name one the collector has."""

from __future__ import annotations

import random

import pytest

from tests.agent.spool.test_spool import gaps, open_spool, row

KW = dict(max_bytes=32 << 10, segment_bytes=8192)


def _deliver(sp, got: dict, after: int | None) -> int | None:
    """A collector session: read what is after ``after``, store it, ack it."""
    while recs := sp.read_after(after, max_records=97):
        for r in recs:
            got.setdefault(r.seq, r)
        after = recs[-1].seq
        sp.ack(after)
    return after


@pytest.mark.parametrize("seed", range(6))
def test_each_lost_record_is_named_once_across_outages_and_restarts(tmp_path, seed):
    rnd = random.Random(seed)
    got: dict = {}  # seq -> record, what the collector stored
    written = 0  # data records appended
    data_seqs: set[int] = set()  # their seqs
    sp = open_spool(tmp_path, **KW)
    try:
        for _ in range(60):
            for _ in range(rnd.randrange(0, 400)):  # the collector away: the spool overflows
                data_seqs.add(sp.append([row(written)]))
                written += 1
            if rnd.random() < 0.3:  # the agent restarts
                sp.close()
                sp = open_spool(tmp_path, **KW)
            if rnd.random() < 0.6:  # the collector back for a while
                _deliver(sp, got, sp.stats().acked_seq)
        _deliver(sp, got, sp.stats().acked_seq)
    finally:
        sp.close()
    stored = {s for s, r in got.items() if r.kind != "agent.gap"}
    assert stored <= data_seqs
    named: set[int] = set()
    for g in gaps(got.values()):
        named |= {s for s in range(g["first_seq"], g["last_seq"] + 1) if s in data_seqs}
    assert not named & stored, "a gap names records the collector has"
    lost = data_seqs - stored
    assert named == lost, "a lost record is named by no gap"
    # each lost record counted once over the gaps the collector got (ranges may overlap)
    assert sum(g["dropped_records"] for g in gaps(got.values())) == len(lost) == written - len(stored)
