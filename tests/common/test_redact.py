"""Redaction (firstfault/common/redact.py) on lines shaped like what training jobs print:
DeepSpeed's launcher command lines (runner.py ``cmd = ...``, launch.py ``spawned with
command: [...]``), argparse Namespaces, environment dumps, .netrc, proxy URLs, HTTP errors;
and the lines that must stay as they are (tokenizer configs, throughput, prose)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from firstfault.agent.sources.base import Draft
from firstfault.common import redact
from firstfault.common.redact import Redactor, user_pattern

HF = "hf_" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1Bc4De7F"  # the shape: hf_ and 34 letters or digits
WANDB = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c"  # a legacy 40-hex W&B key
AWS_ID, AWS_SECRET = "AKIA" + "Z7Q2M4K8P1R5T9W3", "kR8vN2pQ5sT1xW4zB7dF0gH3jL6mC9aE2uY5iO8e"
GH = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
TS = "[2026-12-02 11:31:33,434] [INFO] "

SECRETS = [  # (line, what must be gone, patterns that fire)
    (TS + f"[runner.py:618:main] cmd = /usr/bin/python3 -u -m deepspeed.launcher.launch "
     f"--world_info=eyJsb2NhbGhvc3QiOiBbMCwgMV19 --master_addr=127.0.0.1 --master_port=29562 "
     f"train.py --hf_token {HF} --wandb_key={WANDB} --password hunter2",
     [HF, WANDB, "hunter2"], {"hf-token": 1, "keyword": 1, "flag": 1}),
    (TS + "[launch.py:245:main] process 27034 spawned with command: ['/usr/bin/python3', '-u', "
     "'train.py', '--local_rank=0', '--db_password', 'hunter2', '--token=abc123xyz']",
     ["hunter2", "abc123xyz"], {"keyword": 1, "flag": 1}),
    (f"Namespace(local_rank=0, hf_token='{HF}', deepspeed_config='ds.json', api_key=None)",
     [HF], {"hf-token": 1}),
    (f"AWS_ACCESS_KEY_ID={AWS_ID}", [AWS_ID], {"aws-access-key-id": 1}),
    (f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}", [AWS_SECRET], {"keyword": 1}),
    (f"export WANDB_API_KEY={WANDB}", [WANDB], {"keyword": 1}),
    (f"{{'HF_TOKEN': '{HF}', 'PATH': '/usr/bin', 'GITHUB_TOKEN': '{GH}'}}", [HF, GH],
     {"hf-token": 1, "github-token": 1}),
    ("HTTPS_PROXY=http://alice:s3cr3tpw@proxy.example:3128", ["s3cr3tpw"], {"url-password": 1}),
    (f"machine api.wandb.ai login user password {WANDB}", [WANDB], {"netrc": 1}),
    ("requests.exceptions.HTTPError: 401 Client Error for url; Authorization: Bearer "
     "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", ["eyJhbGciOiJIUzI1NiJ9"], {"bearer": 1}),
    (f"$ wandb login --relogin {WANDB}", [WANDB], {"wandb-login": 1}),
    ('{"db_password": "hunter2", "token": "abc123xyz"}', ["hunter2", "abc123xyz"], {"keyword": 2}),
]
KEPT = [
    TS + "[logging.py:123:log_dist] [Rank 0] step=10, tokens_per_sec=81234, num_tokens=4096",
    "PreTrainedTokenizerFast(name_or_path='gpt2', special_tokens={'bos_token': '<|endoftext|>', "
    "'eos_token': '<|endoftext|>', 'pad_token': '[PAD]'})",
    "Token indices sequence length is longer than the specified maximum sequence length",
    "the password was rejected by the server; author=alice secret_santa=1 token_file=None",
    "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered",
    "wandb: Run data is saved locally in /job/wandb/run-20261202_113133-abc",
]


@pytest.mark.parametrize("line, gone, fired", SECRETS)
def test_the_defaults_redact_real_shaped_lines(line, gone, fired):
    counts = Counter()
    out = Redactor().text(line, counts)
    for secret in gone:
        assert secret not in out, out
    assert counts == fired, (out, counts)
    assert out.count("[redacted:") == sum(fired.values())


def test_keys_and_text_around_stay_readable():
    out = Redactor().text(SECRETS[0][0], Counter())
    assert out.endswith("train.py --hf_token [redacted:hf-token] --wandb_key=[redacted:keyword] "
                        "--password [redacted:flag]")
    assert Redactor().text(f"HF_TOKEN={HF}", Counter()) == "HF_TOKEN=[redacted:hf-token]"


@pytest.mark.parametrize("line", KEPT)
def test_lines_without_secrets_stay_as_they_are(line):
    counts = Counter()
    assert Redactor().text(line, counts) == line and not counts


def test_rows_copy_only_what_they_redact():
    shared = {"path": "/logs/rank0.log"}  # ranklog gives every row of a chunk one fields dict
    rows = [("ranklog", "rank.line", KEPT[0], None, 1, None, None, "j", 0, 0, None, 6, shared),
            ("ranklog", "rank.line", SECRETS[0][0], None, 1, None, None, "j", 0, 0, None, 6, shared)]
    r, counts = Redactor(), Counter()
    one = rows[:1]
    assert r.rows(one, counts) is one and not counts  # nothing to redact: the same list
    out = r.rows(rows, counts)
    assert out[0] is rows[0] and shared == {"path": "/logs/rank0.log"}
    assert out[1][12] == {"path": "/logs/rank0.log", "redacted": "flag:1,hf-token:1,keyword:1"}
    assert HF not in out[1][2] and counts == {"hf-token": 1, "keyword": 1, "flag": 1}
    draft = Draft(source="kmsg", kind="kernel.line", message=f"x password={WANDB}", observed_ns=1)
    (d,) = r.rows([draft])
    assert d.message == "x password=[redacted:keyword]" and d.fields == {"redacted": "keyword:1"}


def test_configured_patterns():
    p = user_pattern(r"corp=CORP-(?P<secret>[0-9A-F]{16})")
    assert p.literals == ("CORP-",)
    r = Redactor.from_settings(True, False, [r"corp=CORP-(?P<secret>[0-9A-F]{16})"])
    assert r.text("key CORP-0123456789ABCDEF used", c := Counter()) == "key CORP-[redacted:corp] used"
    assert c == {"corp": 1} and r.text(f"HF_TOKEN={HF}", Counter()) == f"HF_TOKEN={HF}"  # no defaults
    assert Redactor.from_settings(False, True, []) is None
    for bad, why in [("nameonly", "NAME=REGEX"), ("x=[0-9]{40}", "at least 3 literal"),
                     ("x=ab(", "not a regular expression"), ("bad name=abc", "NAME=REGEX")]:
        with pytest.raises(ValueError, match=why):
            user_pattern(bad)


def test_a_report_says_what_was_redacted():
    rep = {"first_failure": {"summary": f"launch failed: --hf_token {HF}", "evidence": [
        {"text": f"AWS_ACCESS_KEY_ID={AWS_ID}"}]}, "job": "12"}
    out = redact.report(json.loads(json.dumps(rep)), Redactor(), Counter({"keyword": 3}))
    assert HF not in json.dumps(out) and AWS_ID not in json.dumps(out)
    assert out["redaction"] == {"secrets": 5, "by_pattern": {"aws-access-key-id": 1, "hf-token": 1,
                                                             "keyword": 3}, "enabled": True}
    off = redact.report(json.loads(json.dumps(rep)), None)
    assert HF in json.dumps(off) and off["redaction"]["enabled"] is False
    assert redact.parse_mark("hf-token:1,keyword:2") == {"hf-token": 1, "keyword": 2}


def test_messages_searched_in_chunks_as_read_find_what_one_joined_search_finds():
    """Chunks given as read (bytes, joined by newlines) and loose messages around them
    (str, one with a newline of its own): the same hits at the same indexes."""
    lines = [line for line, _, _ in SECRETS] + KEPT
    msgs = [m.encode() for m in lines]
    msgs[0], msgs[9] = lines[0], lines[9]
    msgs[4] = "a traceback\nspread over lines, token=abc123xyz"
    chunks = [(1, 2, b"\n".join(msgs[1:3])), (5, 4, b"\n".join(msgs[5:9])),
              (len(msgs) - 2, 2, b"\n".join(msgs[-2:]))]
    assert all(type(m) is bytes for first, n, _ in chunks for m in msgs[first:first + n])
    a, b = Counter(), Counter()
    whole = Redactor().messages(msgs, a)
    parts = Redactor().messages(msgs, b, chunks=chunks)
    assert parts == whole and a == b
    assert 4 in whole and sorted(whole) == sorted(set(range(len(SECRETS))))


def test_fields_remember_clean_strings_and_still_redact_secrets():
    """redact.events asks Redactor.fields of every Event; the strings found clean are remembered
    (a stream's Events share them), and a secret among them is redacted all the same."""
    r, counts = Redactor(), Counter()
    clean = {"rank_from": "the file it was read from", "after_ns": 5}
    assert r.fields(clean, counts) is None and not counts
    assert "the file it was read from" in r._clean
    assert r.fields(dict(clean), counts) is None  # the remembered string: no search
    secret = {"rank_from": "the file it was read from", "cmd": f"--hub_token {HF}"}
    out = r.fields(secret, counts)
    assert out is not None and HF not in out["cmd"] and out["rank_from"] == "the file it was read from"
    assert counts["hf-token"] == 1 and secret["cmd"].endswith(HF)  # the Event's own dict is left alone
    listed = {"argv": ["train.py", f"--token={HF}"]}  # strings in a list are no remembered string
    assert HF not in r.fields(listed, counts)["argv"][1]


def test_the_clean_strings_remembered_stay_bounded(monkeypatch):
    monkeypatch.setattr(redact, "CLEAN_KEPT", 3)
    r = Redactor()
    for i in range(10):
        assert r.fields({"path": f"/logs/rank{i}.log"}, Counter()) is None
        assert len(r._clean) <= 3
    assert "x" * 600 not in r._clean and r.fields({"long": "x" * 600}, Counter()) is None
    assert "x" * 600 not in r._clean  # past CLEAN_MAX_CHARS: searched each time, not kept


def test_the_bytes_automaton_finds_what_the_default_one_finds():
    """messages() searches with a DFA (faster a byte); its overlapping hits are the
    default automaton's, literal for literal."""
    import random

    import ahocorasick_rs

    r = Redactor()
    lits = [w for p in r.patterns for w in p.literals]
    plain = ahocorasick_rs.BytesAhoCorasick(list(dict.fromkeys(w.encode() for w in lits)))
    rnd = random.Random(24)
    for _ in range(200):
        text = b"".join(rnd.choice([rnd.choice(lits).encode(), b" ", b"=", b"x", b"\n", b"_key",
                                    b"ab", "é".encode()]) for _ in range(rnd.randint(0, 60)))
        assert (r._bytes_ac.find_matches_as_indexes(text, overlapping=True)
                == plain.find_matches_as_indexes(text, overlapping=True))
