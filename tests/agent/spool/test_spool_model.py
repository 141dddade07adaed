"""The spool against a simple model, by hypothesis' stateful testing (as Vector tests its
disk buffer): random appends, fsyncs, shipper reads, acks, clean restarts, crashes (the
process killed and the active segment cut at a random byte of what was not yet durable, as
a power loss or a torn write leaves it) and a flipped byte in a durable entry.

The model is a list of the records the spool holds, in seq order, and the part of it that
is durable (what a reader may have seen). Checked:
- a reader sees only durable records, in seq order, exactly the model's after its position;
- what was acked never comes back, and an ack deletes nothing unacked;
- a crash loses only records that were not durable, a prefix of them survives, no gap names
  them (they were never visible: format.py, Recovery 3), and no seq a reader may have seen
  is given out again;
- a corrupt entry loses exactly its records and is named by one "corrupt" gap of its size.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import msgpack
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from firstfault.agent.spool import Spool
from firstfault.agent.spool.format import HEADER

T0 = 1796206319790113000
KW = dict(node="gpu-07", max_bytes=8 << 20, segment_bytes=4096, fsync="interval",
          fsync_interval_ms=60_000)  # the flusher never wakes by itself: the test fsyncs


def _row(n: int, pad: int) -> tuple:
    return ("ranklog", "rank.line", f"m{n} " + "x" * pad, None, T0 + n, None, None, "12345",
            0, 0, 24211, 6, {})


def _entries(seg: Path) -> list[tuple[int, int, int, int]]:
    """(offset, end, seq, count) of each entry of a segment, by its len fields."""
    buf, out, pos = seg.read_bytes(), [], 0
    while pos + HEADER.size <= len(buf):
        n, _, seq = HEADER.unpack_from(buf, pos)
        end = pos + HEADER.size + n
        out.append((pos, end, seq, msgpack.unpackb(buf[pos + HEADER.size:end])[0]))
        pos = end
    return out


class SpoolModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="spool-model-"))
        self.sp = self._open()
        self.n = 0  # records made
        self.held: list[tuple[int, str]] = []  # (seq, message): what the spool holds, > acked
        self.durable_seq = 0  # the model's durable horizon: every held record <= it survives
        self.read_pos = 0  # the shipper's (collector's) position
        self.acked = 0
        self.seen_max = 0  # the highest seq a reader could have seen

    def _open(self) -> Spool:
        """Open the spool and fsync what recovery wrote (its gaps), so that readers see it
        now and the flusher stays asleep: "interval" shows readers only what is fsynced."""
        sp = Spool(self.dir, **KW)
        sp.durability.flush_once()
        return sp

    def teardown(self) -> None:
        try:
            self.sp.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- what the spool says ------------------------------------------------------------

    def _data_after(self, after: int, max_records: int = 10**9) -> list[tuple[int, str]]:
        out = []
        while len(out) < max_records and (recs := self.sp.read_after(
                after, max_records=min(97, max_records - len(out)))):
            out += [(r.seq, r.message.split(" ")[0]) for r in recs if r.kind == "rank.line"]
            after = recs[-1].seq
        return out

    def _gaps_after(self, after: int) -> list[dict]:
        out = []
        while recs := self.sp.read_after(after, max_records=97):
            out += [r.fields for r in recs if r.kind == "agent.gap"]
            after = recs[-1].seq
        return out

    # --- rules --------------------------------------------------------------------------

    @rule(count=st.integers(1, 40), pad=st.sampled_from([0, 30, 400]))
    def append(self, count: int, pad: int) -> None:
        rows = [_row(self.n + i, pad) for i in range(count)]
        last = self.sp.append(rows)
        assert last > self.seen_max  # never a seq a reader may have seen
        self.held += [(last - count + 1 + i, f"m{self.n + i}") for i in range(count)]
        self.n += count
        self.durable_seq = max(self.durable_seq, self.sp.visible_seq)

    @rule()
    def fsync(self) -> None:
        self.sp.durability.flush_once()
        self.durable_seq = self.sp.visible_seq
        assert not self.held or self.durable_seq >= self.held[-1][0]

    @rule(k=st.integers(1, 150))
    def read(self, k: int) -> None:
        got = self._data_after(self.read_pos, k)
        want = [r for r in self.held if r[0] > self.read_pos]
        assert got == want[:len(got)]
        assert all(seq <= self.sp.visible_seq for seq, _ in got)
        assert got or not [r for r in want if r[0] <= self.sp.visible_seq]
        if got:
            self.read_pos = got[-1][0]

    @rule(back=st.integers(0, 50))
    def ack(self, back: int) -> None:
        seq = max(self.acked, self.read_pos - back)
        self.sp.ack(seq)
        self.acked = seq
        self.held = [r for r in self.held if r[0] > seq]
        assert self._data_after(seq) == [r for r in self.held if r[0] <= self.sp.visible_seq]

    @rule()
    def restart(self) -> None:
        self.sp.close()
        self.sp = self._open()
        self.durable_seq = self.sp.visible_seq  # close fsynced everything
        assert self._data_after(self.acked) == self.held

    @rule(where=st.floats(0, 1))
    def crash(self, where: float) -> None:
        sp = self.sp
        sp.durability.stop()
        act = sp.state.segs[-1]
        cut = sp.state.vis_size + int((act.size - sp.state.vis_size) * where)
        os.truncate(act.path, cut)  # what was not durable, cut at a random byte
        os.close(sp.state.fd)  # killed: no flush, no meta
        os.close(sp._lock_fd)
        self.sp = self._open()
        got = self._data_after(self.acked)
        durable = [r for r in self.held if r[0] <= self.durable_seq]
        assert got[:len(durable)] == durable  # every durable record survives, in order
        assert got == self.held[:len(got)]  # and then a prefix of the rest
        assert not [g for g in self._gaps_after(self.acked) if g["last_seq"] > self.seen_max]
        self.held = got
        self.durable_seq = max(self.durable_seq, self.sp.visible_seq)

    @precondition(lambda self: len([r for r in self.held if r[0] > self.read_pos]) > 1)
    @rule(pick=st.integers(0, 10**6), at=st.floats(0, 1))
    def corrupt(self, pick: int, at: float) -> None:
        self.sp.close()  # all durable now
        segs = sorted(self.dir.glob("*.seg"))
        held = {r[0] for r in self.held}
        targets = []  # entries of unread records with a valid entry (or segment) after them
        for i, seg in enumerate(segs):
            ents = _entries(seg)
            for j, (a, b, seq, count) in enumerate(ents):
                if seq > self.read_pos and seq in held and (j + 1 < len(ents) or i + 1 < len(segs)):
                    targets.append((seg, a, b, seq, count))
        if targets:
            seg, a, b, seq, count = targets[pick % len(targets)]
            data = bytearray(seg.read_bytes())
            data[a + HEADER.size + int((b - a - HEADER.size - 1) * at)] ^= 0x40
            seg.write_bytes(bytes(data))
        self.sp = self._open()
        if not targets:
            return
        (g,) = [g for g in self._gaps_after(self.read_pos) if g["reason"] == "corrupt"
                and g["first_seq"] <= seq <= g["last_seq"]]
        lost = [r for r in self.held if g["first_seq"] <= r[0] <= g["last_seq"]]
        assert [r[0] for r in lost] == list(range(seq, seq + count))  # that entry, no other
        assert g["dropped_records"] == g["last_seq"] - g["first_seq"] + 1 >= count
        self.held = [r for r in self.held if r not in lost]
        assert self._data_after(self.acked) == self.held
        self.durable_seq = self.sp.visible_seq

    @invariant()
    def seen(self) -> None:
        self.seen_max = max(self.seen_max, self.sp.visible_seq)  # a reader may read it now

    @invariant()
    def acked_never_comes_back(self) -> None:
        recs = self.sp.read_after(self.acked, max_records=5)
        assert all(r.seq > self.acked for r in recs)
        assert (self.sp.stats().acked_seq or 0) <= self.acked


SpoolModel.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestSpoolModel = SpoolModel.TestCase
