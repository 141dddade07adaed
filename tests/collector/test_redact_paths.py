"""The collector's every way out (report, timeline, bundle) redacts what agents stored as it
came (an agent with redaction off): messages, fields (procs' command line) and fingerprints;
and leaves a traceback's source line and a token id as they are."""

from __future__ import annotations

import io
import json
import re
import tarfile
import time

import pytest

from firstfault.analysis.catalog import load_catalog
from firstfault.collector import query
from firstfault.collector.store import open_store
from firstfault.collector.store.base import Selection
from firstfault.common.redact import Redactor
from firstfault.wire import Record

HF = "hf_" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1Bc4De7F"
AKIA = "AKIA" + "Z7Q2M4K8P1R5T9W3"
SK = "sk-proj-" + "Q2w3E4r5T6y7U8i9O0pA1s2D3f4G5h6J7k8L9z0X1c2V3b4N5m6"
SECRETS = (HF, AKIA, SK, "Hunter2Pass", re.sub(r"\d+", "#", AKIA))
JOB = "77"
SOURCE_LINE = '    token = self.tokenizer(batch["text"])'


@pytest.fixture
def store(tmp_path):
    now = time.time_ns()
    cmd = f"python -u train.py --hf_token {HF} --password=Hunter2Pass"

    def rec(seq, **kw):
        return Record(node="gpu-01", stream="s1", seq=seq, observed_ns=now + seq, occurred_ns=now + seq,
                      job=JOB, rank=0, pid=4242, **kw)
    s = open_store(str(tmp_path / "c.db"))
    s.insert([
        rec(0, source="procs", kind="proc.start", message=cmd,
            fields={"cmdline": cmd, "comm": "python", "ppid": 1}),
        rec(1, source="ranklog", kind="rank.line", message=f"using OpenAI key {SK} for eval"),
        rec(2, source="ranklog", kind="rank.traceback", message=(
            "Traceback (most recent call last):\n"
            '  File "/job/train.py", line 88, in <module>\n'
            f"{SOURCE_LINE}\n"
            f"RuntimeError: upload to s3 failed for key {AKIA}")),
        rec(3, source="ranklog", kind="rank.line", message="ValueError: token=50257 is out of vocabulary range"),
    ])
    yield s
    s.close()


def _clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, secret


def test_the_report_redacts_fingerprints_too(store):
    rep = query.report(store, JOB, load_catalog(), redactor=Redactor())
    text = json.dumps(rep)
    _clean(text)
    assert "[redacted:aws-access-key-id]" in rep["first_failure"]["fingerprint"]
    assert rep["redaction"]["secrets"] >= 1


def test_the_timeline_redacts_fields(store):
    rows = list(query.timeline(store, Selection(job=JOB), Redactor()))
    _clean(json.dumps(rows))
    assert "[redacted:hf-token]" in rows[0]["fields"]["cmdline"]
    assert SOURCE_LINE in rows[2]["message"]
    assert rows[3]["message"] == "ValueError: token=50257 is out of vocabulary range"


def test_every_member_of_the_bundle_is_clean(store):
    data = query.bundle(store, JOB, load_catalog(), Redactor())
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name.split("/")[-1]: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    assert len(members) == 6
    for name, text in members.items():
        _clean(text)
    assert SOURCE_LINE.strip() in members["timeline.jsonl"].replace('\\"', '"')
