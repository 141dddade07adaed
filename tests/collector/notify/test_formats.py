"""What each target receives: signed JSON a receiver can check, Slack mrkdwn in which no
log text can mention, link, format or break out, the notice built from a report redacted."""

from __future__ import annotations

import hashlib
import hmac
import json

from firstfault.collector.notify import formats, notice
from firstfault.common.redact import Redactor

HOSTILE = "boom <!channel> <https://evil.example|click> *bold* ~x~ `code` & \x1b[2J\u202e\nsecond line"


def report(summary=HOSTILE, job_text="ok"):
    return {"schema": "firstfault.report/1", "job": "j1", "partial": False, "blame": "resources",
            "first_failure": {"rank": 2, "node": "gpu-<07>", "pid": 9, "occurred_at": "2026-12-02T09:46:25.412Z",
                              "signature": "kernel.memcg_oom_kill", "category": "host-memory",
                              "phase": "optimizer-step", "summary": summary, "first_action": "Raise the limit.",
                              "confidence": "high", "within_clock_uncertainty": False, "ranks_sharing": [2],
                              "evidence": [{"node": "gpu-07", "rank": 2, "source": "kmsg", "at": "x",
                                            "text": f"{job_text} HF_TOKEN=hf_{'a' * 34}"}]},
            "checkpoint": {"verdict": "safe", "resume_from": "global_step4", "reason": "r", "tags": []},
            "distinct_failures": [{}], "ranks": {"0": {}, "1": {}, "2": {}}}


def build(rep, job="j1", redactor=None, **kw):
    args = dict(job=job, revision=1, previous=None, decided_by="ranks-exited", failed_at="t", settled=True,
                behind=[], report_url="http://head:7141", sent_at="t", redactor=redactor)
    return notice.build(rep, **{**args, **kw})


def test_the_webhook_signature_is_hmac_sha256_over_timestamp_and_body():
    n = build(report())
    body = formats.body(n)
    headers = formats.webhook_headers(n, body, b"key", 1796209021)
    want = hmac.new(b"key", b"1796209021." + body, hashlib.sha256).hexdigest()
    assert headers["X-Firstfault-Signature"] == f"sha256={want}"
    assert headers["X-Firstfault-Timestamp"] == "1796209021"
    assert json.loads(body) == n
    assert b"\x1b" not in body and "\u202e".encode() not in body  # inert when printed
    assert "X-Firstfault-Signature" not in formats.webhook_headers(n, body, None, 1)


def test_a_notice_carries_the_first_failure_checkpoint_and_a_link():
    n = build(report(), job="a job/with?odd#chars")
    assert n["schema"] == "firstfault.notice/1" and n["id"] == "a job/with?odd#chars#1"
    assert n["first_failure"]["rank"] == 2 and n["checkpoint"]["resume_from"] == "global_step4"
    assert n["report_url"] == "http://head:7141/jobs/a%20job%2Fwith%3Fodd%23chars"
    assert n["ranks"] == 3 and n["distinct_failures"] == 1 and n["update"] is False


def test_secrets_are_redacted_from_the_notice():
    n = build(report(), redactor=Redactor())
    text = json.dumps(n)
    assert "hf_aaaa" not in text and "[redacted:" in text


def test_slack_text_cannot_mention_link_format_or_break_lines():
    msg = formats.slack_message(build(report()))
    text = msg["blocks"][0]["text"]["text"]
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text
    assert "<https://evil" not in text and "&lt;https://evil.example|click&gt;" in text
    assert "*bold*" not in text and "\u2217bold\u2217" in text
    assert "`code`" not in text and "~x~" not in text
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b[2J" in text
    assert "boom" in text and "second line" in text
    summary_line = next(ln for ln in text.splitlines() if "boom" in ln)
    assert "second line" in summary_line  # the log's newline did not start a line of its own
    # the node, a short user value, is inline code that nothing in it can close
    assert "`gpu-&lt;07&gt;`" in text
    assert text.count("<") == 1 and "<http://head:7141/jobs/j1|The report>" in text  # our one link


def test_slack_code_spans_cannot_be_closed_from_inside():
    assert formats.slack_code("a`b") == "`a\u02cbb`"
    assert formats.slack_code("x & <y>") == "`x &amp; &lt;y&gt;`"


def test_an_update_names_what_it_was_before():
    first = build(report())
    changed = report()
    changed["first_failure"]["rank"] = 0
    upd = build(changed, revision=2, previous=notice.answer(report()))
    assert upd["update"] is True and upd["previous"]["rank"] == 2 and upd["first_failure"]["rank"] == 0
    assert notice.answer(changed) != notice.answer(report())
    assert "Job update" in formats.slack_message(upd)["blocks"][0]["text"]["text"]
    assert first["previous"] is None
