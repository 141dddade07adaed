"""Deliveries to real receivers on loopback: a signed webhook checked by the receiver, a
receiver that fails twice then succeeds, one that hangs (timeout), a command with the
JSON on stdin, a restart with a delivery pending, the queue's bound."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

from firstfault.collector.notify.config import Filter, NotifyConfig, Target
from firstfault.collector.notify.deliver import Deliverer
from firstfault.collector.notify.metrics import NotifyMetrics
from firstfault.collector.notify.queue import NoticeQueue
from tests.collector.notify.receiver import Receiver

SECRET = b"s3cret-for-the-test"


def notice(job="4242", category="host-memory", signature="kernel.memcg_oom_kill", confidence="high"):
    return {"schema": "firstfault.notice/1", "id": f"{job}#1", "job": job, "revision": 1, "update": False,
            "first_failure": {"rank": 1, "node": "gpu-07", "category": category, "signature": signature,
                              "confidence": confidence}}


def cfg(*targets, **kw) -> NotifyConfig:
    base = dict(timeout_s=2, max_attempts=5, backoff_initial_s=0.2, backoff_max_s=0.5)
    return NotifyConfig(target=tuple(targets), **{**base, **kw})


async def run_until(d: Deliverer, cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


def deliver(tmp_path, config: NotifyConfig, notices, cond, timeout: float = 20.0) -> Deliverer:
    async def main():
        d = Deliverer(config, NoticeQueue(tmp_path / "q", config.max_queue), NotifyMetrics())
        await d.start()
        for n in notices:
            await d.submit(n)
        try:
            await run_until(d, cond, timeout)
        finally:
            await d.stop()
        return d
    return asyncio.run(main())


def test_a_signed_webhook_is_checked_by_its_receiver(tmp_path, caplog):
    good, bad = Receiver(secret=SECRET), Receiver(secret=SECRET)
    try:
        caplog.set_level(logging.INFO, "firstfault.collector.notify.deliver")
        d = deliver(tmp_path, cfg(Target("good", "webhook", url=good.url, secret=SECRET),
                                  Target("wrong-key", "webhook", url=bad.url, secret=b"another key"),
                                  max_attempts=1),
                    [notice()], lambda: good.delivered() and bad.requests)
        (got,) = good.delivered()
        assert got == notice()
        headers = good.requests[0]["headers"]
        assert headers["X-Firstfault-Schema"] == "firstfault.notice/1"
        assert headers["X-Firstfault-Delivery"] == "4242#1"
        assert bad.requests[0]["status"] == 401 and not bad.delivered()
        assert d.metrics.deliveries == {"good": 1} and d.metrics.failures == {"wrong-key": 1}
        lines = [r.getMessage() for r in caplog.records]
        assert any(ln.startswith("notice delivered target=good type=webhook job='4242' revision=1 attempt=1 "
                                 "status=200") for ln in lines)
        assert any(ln.startswith("notice dropped target=wrong-key") and "HTTP 401" in ln for ln in lines)
        assert not any(good.url in ln or "s3cret" in ln for ln in lines)  # no URL, no secret in the log
        assert not list((tmp_path / "q" / "pending").iterdir())
    finally:
        good.close()
        bad.close()


def test_a_receiver_that_fails_twice_gets_the_notice_on_the_third_attempt(tmp_path, caplog):
    r = Receiver(fail_first=2)
    try:
        caplog.set_level(logging.INFO, "firstfault.collector.notify.deliver")
        t0 = time.monotonic()
        deliver(tmp_path, cfg(Target("flaky", "webhook", url=r.url)), [notice()], lambda: r.delivered())
        assert [q["status"] for q in r.requests] == [500, 500, 200]
        assert len(r.delivered()) == 1
        fails = [x.getMessage() for x in caplog.records if "delivery failed" in x.getMessage()]
        assert len(fails) == 2 and "attempt=1" in fails[0] and "attempt=2" in fails[1]
        assert all("HTTP 500" in f and "retry_in_s=" in f for f in fails)
        # back-off: 0.1..0.2 s, then 0.2..0.4 s
        assert time.monotonic() - t0 >= 0.3
    finally:
        r.close()


def test_a_hanging_receiver_times_out_and_does_not_hold_up_another_target(tmp_path, caplog):
    hang, fine = Receiver(hang_s=30), Receiver()
    try:
        caplog.set_level(logging.INFO, "firstfault.collector.notify.deliver")
        t0 = time.monotonic()
        d = deliver(tmp_path, cfg(Target("hangs", "webhook", url=hang.url, timeout_s=0.5),
                                  Target("fine", "webhook", url=fine.url), max_attempts=1),
                    [notice()], lambda: fine.delivered() and any(
                        "notice dropped target=hangs" in x.getMessage() for x in caplog.records))
        assert time.monotonic() - t0 < 10
        assert d.metrics.failures == {"hangs": 1} and d.metrics.deliveries == {"fine": 1}
        (line,) = [x.getMessage() for x in caplog.records if "target=hangs" in x.getMessage()]
        assert "timeout after 0.5 s" in line
    finally:
        hang.close()
        fine.close()


def test_a_command_gets_the_json_on_stdin_and_a_failing_one_is_retried(tmp_path, caplog):
    out = tmp_path / "got.json"
    script = f"import sys; open({str(out)!r}, 'wb').write(sys.stdin.buffer.read())"
    failing = "import sys; sys.stdin.read(); sys.stderr.write('pager said no\\n'); sys.exit(3)"
    caplog.set_level(logging.INFO, "firstfault.collector.notify.deliver")
    deliver(tmp_path, cfg(Target("cmd", "command", command=(sys.executable, "-c", script)),
                          Target("bad", "command", command=(sys.executable, "-c", failing)), max_attempts=2),
            [notice()], lambda: out.exists() and sum("target=bad" in x.getMessage() for x in caplog.records) == 2)
    assert json.loads(out.read_bytes()) == notice()
    lines = [x.getMessage() for x in caplog.records if "target=bad" in x.getMessage()]
    assert "exit status 3: pager said no" in lines[0] and lines[1].startswith("notice dropped")


def test_a_slack_target_gets_an_incoming_webhook_message(tmp_path):
    r = Receiver()
    try:
        n = notice()
        n.update({"checkpoint": {"verdict": "safe", "resume_from": "global_step4"}, "settled": True,
                  "nodes_behind": [], "report_url": "http://head:7141/jobs/4242"})
        n["first_failure"].update(phase="forward", summary="<!here> ate *all* memory")
        deliver(tmp_path, cfg(Target("chat", "slack", url=r.url)), [n], lambda: r.delivered())
        (msg,) = r.delivered()
        assert r.requests[0]["headers"]["Content-Type"] == "application/json"
        assert msg["text"].startswith("job 4242 failed: rank 1 on gpu-07, kernel.memcg_oom_kill")
        text = msg["blocks"][0]["text"]["text"]
        assert msg["blocks"][0]["text"]["type"] == "mrkdwn"
        assert "&lt;!here&gt; ate \u2217all\u2217 memory" in text and "<!here>" not in text
        assert "resume from `global_step4`" in text and "X-Firstfault-Signature" not in r.requests[0]["headers"]
    finally:
        r.close()


def test_filters_choose_the_targets(tmp_path):
    hw, mem, prod = Receiver(), Receiver(), Receiver()
    try:
        targets = (Target("hw", "webhook", url=hw.url, filter=Filter(categories=("hardware",))),
                   Target("mem", "webhook", url=mem.url,
                          filter=Filter(signatures=("kernel.*",), min_confidence="medium")),
                   Target("prod", "webhook", url=prod.url, filter=Filter(job=r"^prod-")))
        notices = [notice("prod-1"), notice("dev-2", confidence="low"),
                   notice("dev-3", category="hardware", signature="gpu.xid_79")]
        deliver(tmp_path, cfg(*targets), notices,
                lambda: len(hw.delivered()) == 1 and len(mem.delivered()) == 1 and len(prod.delivered()) == 1)
        time.sleep(0.3)
        assert [n["job"] for n in hw.delivered()] == ["dev-3"]
        assert [n["job"] for n in mem.delivered()] == ["prod-1"]
        assert [n["job"] for n in prod.delivered()] == ["prod-1"]
    finally:
        for r in (hw, mem, prod):
            r.close()


def test_a_delivery_pending_at_a_restart_is_sent_after_it(tmp_path):
    r = Receiver()
    port, url = r.port, r.url
    r.close()  # nobody listens: the first run cannot deliver
    target = Target("ops", "webhook", url=url)

    async def first_run():
        dl = Deliverer(cfg(target, backoff_initial_s=30, backoff_max_s=30),
                       NoticeQueue(tmp_path / "q", 100), NotifyMetrics())
        await dl.start()
        await dl.submit(notice())
        await run_until(dl, lambda: dl.metrics.failures.get("ops") == 1)
        await dl.stop()
    asyncio.run(first_run())
    (pending,) = (tmp_path / "q" / "pending").iterdir()
    doc = json.loads(pending.read_text())
    assert doc["attempts"] == 1 and doc["next_at"] > time.time() + 10  # retried in 15..30 s
    doc["next_at"] = time.time()  # due now: the test does not wait out the back-off
    pending.write_text(json.dumps(doc))
    again = Receiver(port=port)  # the receiver is back; a new Deliverer (a restarted collector) sends it
    try:
        async def second_run():
            dl = Deliverer(cfg(target), NoticeQueue(tmp_path / "q", 100), NotifyMetrics())
            await dl.start()
            await run_until(dl, lambda: again.delivered())
            await dl.stop()
        asyncio.run(second_run())
        assert again.delivered() == [notice()]
        assert not list((tmp_path / "q" / "pending").iterdir())
    finally:
        again.close()


def test_the_queue_is_bounded_and_drops_the_oldest(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    q = NoticeQueue(tmp_path / "q", 3)
    dropped = [q.put("ops", notice(f"job-{i}"), time.time())[1] for i in range(5)]
    assert dropped == [[], [], [], ["00000000000000000001"], ["00000000000000000002"]]
    assert [d.notice["job"] for d in NoticeQueue(tmp_path / "q", 3).load()] == ["job-2", "job-3", "job-4"]
    assert sum("reason=queue-full" in x.getMessage() for x in caplog.records) == 2


def test_an_unreadable_queue_file_is_moved_aside(tmp_path, caplog):
    q = NoticeQueue(tmp_path / "q", 10)
    q.put("ops", notice(), time.time())
    (tmp_path / "q" / "pending" / "00000000000000000009.json").write_text("{half a file")
    assert [d.notice["job"] for d in q.load()] == ["4242"]
    assert (tmp_path / "q" / "bad" / "00000000000000000009.json").exists()
    assert any("notice file unreadable" in x.getMessage() for x in caplog.records)


def test_a_hanging_command_is_killed_with_its_children_at_its_timeout(tmp_path, caplog):
    pids = tmp_path / "pids"
    script = (f"import os, subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(60)']); open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}'); time.sleep(60)")
    caplog.set_level(logging.INFO, "firstfault.collector.notify.deliver")
    deliver(tmp_path, cfg(Target("slow", "command", command=(sys.executable, "-c", script), timeout_s=1),
                          max_attempts=1),
            [notice()], lambda: any("notice dropped target=slow" in x.getMessage() for x in caplog.records))
    assert "timeout after 1 s" in caplog.text
    for pid in map(int, pids.read_text().split()):
        deadline = time.monotonic() + 5
        while _alive(pid):
            assert time.monotonic() < deadline, f"pid {pid} still runs"
            time.sleep(0.05)


def _alive(pid: int) -> bool:

    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
