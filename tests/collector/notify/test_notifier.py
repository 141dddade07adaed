"""The notifier's decisions over what the ingest tells it, with the report given: a job is
told once, after every node has shipped past its first failure; a later record that changes
the answer makes one update, one that does not makes none; a restart does not tell a told
job again; a node that says nothing holds the notice up to max_wait_s, then it goes
unsettled, naming that node. The command target is real (a JSON file per notice)."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from firstfault.collector.notify.config import NotifyConfig, Target
from firstfault.collector.notify.notifier import Notifier
from firstfault.collector.notify.queue import NoticeQueue

S = 10**9


def report(rank=2, signature="python.exception"):
    return {"first_failure": {"rank": rank, "node": "a", "signature": signature, "category": "user-code",
                              "phase": "forward", "confidence": "high",
                              "occurred_at": "2026-12-03T10:00:00.000Z"},
            "checkpoint": {"verdict": "unknown", "resume_from": None}, "ranks": {}}


def cols(job, rows, observed_ns):
    """A batch's columns: rows of (kind, rank, fields)."""
    return {"job": [job] * len(rows), "kind": [k for k, _, _ in rows], "rank": [r for _, r, _ in rows],
            "fields": [f for _, _, f in rows], "observed_ns": [observed_ns] * len(rows)}


class World:
    def __init__(self, tmp_path, **cfg):
        self.out = tmp_path / "out"
        self.out.mkdir(exist_ok=True)
        script = ("import sys, json, os; d = json.load(sys.stdin); "
                  f"open(os.path.join({str(self.out)!r}, str(len(os.listdir({str(self.out)!r}))) + '.json'), 'w')"
                  ".write(json.dumps(d))")
        self.cfg = NotifyConfig(target=(Target("cmd", "command", command=(sys.executable, "-c", script)),),
                                **{"quiet_s": 30, "settle_s": 0.5, "max_wait_s": 60, **cfg})
        self.queue_dir = tmp_path / "q"
        self.rep = report()
        self.probed: list[str] = []

    def notifier(self) -> Notifier:
        async def rep(job):
            return self.rep
        return Notifier(self.cfg, report=rep, clock=lambda n: (0, 10_000_000), probe=self.probed.extend,
                        queue=NoticeQueue(self.queue_dir, 100))

    def told(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(self.out.iterdir(), key=lambda p: int(p.stem))]


async def until(cond, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "not reached"
        await asyncio.sleep(0.05)


def test_told_once_when_settled_then_updated_once_when_the_answer_changes(tmp_path):
    w = World(tmp_path)

    async def main():
        n = w.notifier()
        await n.start()
        first = int(time.time() * 1e9)
        w.rep = report()
        w.rep["first_failure"]["occurred_at"] = None  # the failure's time: when its record was stored
        n.stored("a", cols("j", [("rank.traceback", 2, {}), ("proc.exit", 2, {"code": 1})], first))
        n.stored("b", cols("j", [("proc.exit", 0, {"code": -15, "signal": "SIGTERM"})], first))
        # failed (every rank exited), but neither node has shipped past the failure + margin
        await until(lambda: n.watches["j"].failed_ns is not None)
        await asyncio.sleep(0.6)
        assert w.told() == [] and set(w.probed) == {"a", "b"}
        n.pong("a", time.time_ns() + 2 * S)  # a answered a ping: caught up
        await asyncio.sleep(0.6)
        assert w.told() == []  # b still behind
        n.closed("b", clean=True)  # b's agent flushed and left
        await until(lambda: len(w.told()) == 1)
        # a record that changes nothing: no update
        n.stored("a", cols("j", [("rank.line", 2, {})], time.time_ns()))
        await asyncio.sleep(1.2)
        assert len(w.told()) == 1
        # one that changes the first failure: one update
        w.rep = report(rank=0, signature="kernel.memcg_oom_kill")
        n.stored("a", cols("j", [("rank.line", 0, {})], time.time_ns()))
        await until(lambda: len(w.told()) == 2)
        await asyncio.sleep(1.0)
        await n.stop()
        return n

    n = asyncio.run(main())
    first, upd = w.told()
    assert first["revision"] == 1 and first["settled"] and first["decided_by"] == "ranks-exited"
    assert first["first_failure"]["rank"] == 2
    assert upd["revision"] == 2 and upd["update"] and upd["previous"]["rank"] == 2
    assert upd["first_failure"]["rank"] == 0
    assert n.metrics.failed_jobs == {("user-code", "python.exception"): 1}  # counted once per job

    async def after_restart():
        n = w.notifier()
        await n.start()
        n.stored("a", cols("j", [("rank.traceback", 0, {})], time.time_ns()))  # resent
        n.closed("a", clean=True)
        await asyncio.sleep(1.5)
        await n.stop()
    asyncio.run(after_restart())
    assert len(w.told()) == 2  # told before the restart: not again


def test_a_silent_node_holds_the_notice_until_max_wait_then_it_goes_unsettled(tmp_path):
    w = World(tmp_path, max_wait_s=1.5, quiet_s=0.5)
    w.rep["first_failure"]["occurred_at"] = None  # the failure's time: when its record was stored

    async def main():
        n = w.notifier()
        await n.start()
        n.stored("a", cols("k", [("rank.traceback", 1, {})], time.time_ns()))
        n.stored("silent", cols("k", [("rank.line", 0, {})], time.time_ns() - 60 * S))
        n.closed("a", clean=True)
        t0 = time.monotonic()
        await until(lambda: len(w.told()) == 1)
        await n.stop()
        return time.monotonic() - t0

    took = asyncio.run(main())
    (got,) = w.told()
    assert got["settled"] is False and got["nodes_behind"] == ["silent"] and got["decided_by"] == "quiet"
    assert 1.5 <= took < 6


def test_an_end_mark_without_a_failure_tells_nothing(tmp_path):
    w = World(tmp_path)
    w.rep = {"first_failure": None, "checkpoint": {}, "ranks": {"0": {"exit": {"code": 0}}}}

    async def main():
        n = w.notifier()
        await n.start()
        n.stored("a", cols("ok", [("proc.exit", 0, {"code": 0}), ("job.mark", None, {"event": "end"})],
                           time.time_ns()))
        n.closed("a", clean=True)
        await until(lambda: n.watches["ok"].not_failed)
        await asyncio.sleep(0.5)
        await n.stop()
    asyncio.run(main())
    assert w.told() == []


def test_the_launchers_end_in_the_report_decides_before_the_quiet_time(tmp_path):
    w = World(tmp_path, quiet_s=60)
    w.rep["ranks"] = {"0": {"exit": {"code": -15, "signal": "SIGTERM"}}, "1": {"exit": {"code": 1}}}

    async def main():
        n = w.notifier()
        await n.start()
        n.stored("a", cols("t", [("rank.traceback", 1, {}), ("rank.line", 0, {})], time.time_ns()))
        n.closed("a", clean=True)
        await until(lambda: len(w.told()) == 1)
        await n.stop()
    asyncio.run(main())
    (got,) = w.told()
    assert got["decided_by"] == "launcher-end" and got["settled"] is True
