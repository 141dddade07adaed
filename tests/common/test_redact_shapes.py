"""One test a shape of secret the redactor must catch (the README's table lists the same),
each in a line shaped as a training job prints it, and the look-alikes it must leave alone.
The values are made up in the shape of each kind of key; none is real."""

from __future__ import annotations

from collections import Counter

import pytest

from firstfault.agent.sources.base import Draft
from firstfault.common.redact import Redactor

HF = "hf_" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1Bc4De7F"
SK_PROJ = "sk-proj-" + "Q2w3E4r5T6y7U8i9O0pA1s2D3f4G5h6J7k8L9z0X1c2V3b4N5m6"
SK_ANT = "sk-ant-api03-" + "Zx9Cv8Bn7Mq6Wa5Es4Rd3Tf2Yg1Uh0Ij9Ok8Pl7-AbCdEfGh"
SK_OLD = "sk-" + "aB1cD2eF3gH4iJ5kL6mN7oP8qR9sT0uV1wX2yZ3aB4cD5eF"
SLACK = "xoxb-" + "1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx"
BASIC = "dXNlcjpodW50ZXIyLXMzY3JldA=="
AKIA = "AKIA" + "Z7Q2M4K8P1R5T9W3"
GH = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
BEARER = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"
BODY = ["b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
        "QyNTUxOQAAACDm0Yx3v4KpR8N2tQwzJ5sLkP9aBcDeFgHiJkLmNoPqRsAAAAJgAAAAAAAAAA",
        "AAAAC3NzaC1lZDI1NTE5AAAAIObRjHe/gqlHw3a1DDMnmwuQ/1oFwN4WAeImQuY2g+pGwA=="]

# (id, line, the secret text that must be gone, the pattern that fires)
SHAPES = [
    ("openai-project-key", f"openai.AuthenticationError: Incorrect API key provided: {SK_PROJ}.", SK_PROJ, "sk-key"),
    ("anthropic-key", f"client = Anthropic(api_key='{SK_ANT}')", SK_ANT, "sk-key"),
    ("bare-anthropic-key", f"using key {SK_ANT} for the judge model", SK_ANT, "sk-key"),
    ("legacy-openai-key", f"OPENAI key in use: {SK_OLD}", SK_OLD, "sk-key"),
    ("slack-bot-token", f"posting the run summary with {SLACK} to #training", SLACK, "slack-token"),
    ("authorization-basic", f"> Authorization: Basic {BASIC}", BASIC, "authorization"),
    ("cookie", "> Cookie: sessionid=6f1c2a9e0b8d4e7f; csrftoken=AbCdEf123", "sessionid=6f1c2a9e0b8d4e7f", "cookie"),
    ("set-cookie", "< Set-Cookie: sessionid=6f1c2a9e0b8d4e7f; HttpOnly", "6f1c2a9e0b8d4e7f", "cookie"),
    ("redis-url-no-user", "REDIS_URL=redis://:Hunter2Redis@cache-01:6379/0", "Hunter2Redis", "url-password"),
    ("url-password-with-slash", "db=postgresql://train:pa/ss/w0rd@db-01:5432/runs", "pa/ss/w0rd", "url-password"),
    ("url-password-with-at", "db=postgresql://train:p@ss@w0rd@db-01:5432/runs", "p@ss@w0rd", "url-password"),
    ("quoted-password-with-spaces", 'config: {"password": "correct horse battery staple"}',
     "correct horse battery staple", "keyword"),
    ("single-quoted-password-with-spaces", "password='correct horse battery staple' user=bob",
     "correct horse battery staple", "keyword"),
    ("flag-quoted-password", 'train.py --password "correct horse battery" --lr 1e-4', "correct horse battery", "flag"),
    ("api-key-flag-with-hyphen", "python eval.py --api-key Zq8Wx7Ec6Rv5Tb4Yn3 --model gpt", "Zq8Wx7Ec6Rv5Tb4Yn3", "flag"),
    ("api-key-equals-with-hyphen", "python eval.py --api-key=Zq8Wx7Ec6Rv5Tb4Yn3", "Zq8Wx7Ec6Rv5Tb4Yn3", "keyword"),
    ("hf-token-flag", f"cmd = python -u train.py --hf_token {HF} --bf16", HF, "hf-token"),
    ("password-equals-flag", "cmd = python -u train.py --password=Hunter2Pass --bf16", "Hunter2Pass", "keyword"),
    ("secret-key-env", "SECRET_KEY=Zq8Wx7Ec6Rv5Tb4Yn3", "Zq8Wx7Ec6Rv5Tb4Yn3", "keyword"),
    ("openssh-key-in-one-message", "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(BODY)
     + "\n-----END OPENSSH PRIVATE KEY-----", BODY[1], "private-key"),
    ("pem-key-in-json", '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\n'
     + "\\n".join(BODY) + '\\n-----END PRIVATE KEY-----\\n", "client_email": "x@y.iam"}', BODY[2], "private-key"),
]


@pytest.mark.parametrize("line, secret, pattern", [s[1:] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_a_shape_is_redacted(line, secret, pattern):
    counts = Counter()
    out = Redactor().text(line, counts)
    assert secret not in out and f"[redacted:{pattern}]" in out, out
    assert counts[pattern] >= 1


def test_the_pem_key_in_json_keeps_the_rest_of_the_json():
    line = SHAPES[-1][1]
    out = Redactor().text(line, Counter())
    assert out.startswith('{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----[redacted:')
    assert out.endswith('-----END PRIVATE KEY-----\\n", "client_email": "x@y.iam"}')


def test_a_key_block_over_log_lines_is_redacted_line_by_line():
    lines = ["[rank0]: loading deploy key", "-----BEGIN OPENSSH PRIVATE KEY-----", *BODY,
             "-----END OPENSSH PRIVATE KEY-----", "[rank0]: step 1 loss=2.3"]
    r = Redactor()
    counts = Counter()
    # in two batches: the block stays open from one to the next
    hits = r.messages(lines[:3], counts)
    hits2 = r.messages(lines[3:], counts)
    got = [hits.get(i, (ln, ""))[0] for i, ln in enumerate(lines[:3])] + \
          [hits2.get(i, (ln, ""))[0] for i, ln in enumerate(lines[3:])]
    assert not any(b in "\n".join(got) for b in BODY)
    assert got[0] == lines[0] and got[1] == lines[1] and got[-2:] == lines[-2:]
    assert counts["private-key"] == len(BODY)


@pytest.mark.parametrize("line", [
    "ValueError: token=50257 is out of vocabulary range",
    '    token = self.tokenizer(batch["text"])',
    "    password = getpass.getpass()",
    "    secret = os.environ[\"RUN_SECRET\"]",
    "[rank0]: eos_token_id=50256 pad_token=None token=50256",
    "https://mirror.example:8443/simple/@scope/pkg",
    "Basic block size 4096",
    "the task-12345 finished: ask-me-anything mode",
], ids=["integer-token", "traceback-source-line", "getpass-call", "environ-lookup", "token-ids",
        "url-port-not-a-password", "basic-in-prose", "sk-inside-a-word"])
def test_a_look_alike_stays(line):
    assert Redactor().text(line, Counter()) == line


def test_procs_cmdline_in_fields_is_redacted():
    cmd = f"python -u train.py --hf_token {HF} --password=Hunter2Pass --api-key Zq8Wx7Ec6Rv5Tb4Yn3"
    d = Draft(source="procs", kind="proc.start", message=cmd, observed_ns=1,
              fields={"ppid": 1, "comm": "python", "cmdline": cmd, "paths": ["/job", f"/job/{HF}"]})
    counts = Counter()
    (out,) = Redactor().rows([d], counts)
    for secret in (HF, "Hunter2Pass", "Zq8Wx7Ec6Rv5Tb4Yn3"):
        assert secret not in out.message and secret not in out.fields["cmdline"]
    assert out.fields["paths"] == ["/job", "/job/[redacted:hf-token]"]
    assert out.fields["ppid"] == 1 and out.fields["comm"] == "python"
    assert out.fields["redacted"] == "flag:2,hf-token:3,keyword:2"
    assert counts == {"flag": 2, "hf-token": 3, "keyword": 2}


def test_fingerprint_shapes_are_caught_before_digits_are_blanked():
    """Fingerprints blank digits (``#``), which hides a key's shape from the patterns: the
    report must be built from redacted text (tests/offline and tests/collector check the
    whole path); here: the shapes that hold digits are redacted in the message itself."""
    for secret in (AKIA, GH, f"Bearer {BEARER}"):
        out = Redactor().text(f"RuntimeError: login failed with {secret} at 10:11", Counter())
        assert secret not in out and "[redacted:" in out


def test_rows_sharing_one_fields_dict_are_each_redacted():
    fields = {"path": f"/scratch/{HF}/rank0.log", "offset_bytes": 0}
    rows = [("ranklog", "rank.line", f"line {i}", None, 1, None, None, "1", 0, 0, None, 6, fields)
            for i in range(5)]
    counts = Counter()
    out = Redactor().rows(rows, counts)
    assert all(r[-1]["path"] == "/scratch/[redacted:hf-token]/rank0.log" for r in out)
    assert all(r[-1]["redacted"] == "hf-token:1" for r in out) and counts == {"hf-token": 5}
    assert fields["path"].startswith(f"/scratch/{HF}")  # the caller's dict is not changed
