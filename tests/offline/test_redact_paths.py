"""Secrets in a dead job's logs never reach the report, whichever part of it they would
land in: the first failure's text, its fingerprint (digits blanked there, which hid a key's
shape from the redactor), the evidence; and the diagnosis stays readable."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from firstfault.common import redact
from firstfault.common.redact import Redactor
from firstfault.offline.commands import report_from_logs

AKIA = "AKIA" + "Z7Q2M4K8P1R5T9W3"
GH = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
BEARER = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"


def _log(tmp_path, last_line: str):
    log = tmp_path / "rank1.log"
    log.write_text(
        "[2026-12-02 10:11:59,782] [INFO] [logging.py:123:log_dist] [Rank 1] step=3 loss=2.1\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/job/train.py", line 88, in <module>\n'
        '[rank1]:     token = self.tokenizer(batch["text"])\n'
        f"[rank1]: {last_line}\n")
    return log


def _report(tmp_path, last_line):
    log = _log(tmp_path, last_line)
    redacted = Counter()
    rep, _, problem = report_from_logs([str(log)], redactor=Redactor(), redacted=redacted)
    assert problem is None
    return redact.report(rep, Redactor(), redacted)


@pytest.mark.parametrize("secret, line", [
    (AKIA, f"RuntimeError: upload to s3 failed for key {AKIA}"),
    (GH, f"RuntimeError: git clone refused with {GH}"),
    (BEARER, f"RuntimeError: 401 from the hub (Authorization: Bearer {BEARER})"),
], ids=["aws-key", "github-token", "bearer"])
def test_no_secret_in_the_fingerprint_or_anywhere(tmp_path, secret, line):
    rep = _report(tmp_path, line)
    text = json.dumps(rep)
    assert secret not in text
    # with digits blanked: the shape the fingerprint would have held
    assert re.sub(r"\d+", "#", secret) not in text
    ff = rep["first_failure"]
    assert "[redacted:" in ff["fingerprint"], ff["fingerprint"]
    assert rep["redaction"]["secrets"] >= 1


def test_the_diagnosis_stays_readable(tmp_path):
    rep = _report(tmp_path, "ValueError: token=50257 is out of vocabulary range")
    text = json.dumps(rep)
    assert "token=50257 is out of vocabulary range" in text
    # nothing redacted anywhere, the traceback's source line (read by the analysis) included
    assert "[redacted:" not in text and rep["redaction"]["secrets"] == 0
