"""`firstfault analyze` on the kubelet's container logs (/var/log/pods, the CRI format): a line the
runtime split into partial records is one line again, in the current and the rotated, gzipped files."""

from __future__ import annotations

import gzip
import json
from datetime import datetime, timezone

from firstfault.cli import main
from tests.common.criwriter import records

UID = "6a1d9e40-2c3b-4f8e-b7a6-51c0de9f3a24"
T0 = int(datetime(2026, 12, 3, 20, 32, 39, tzinfo=timezone.utc).timestamp()) * 1_000_000_000
S = 10**9
TB = [b"Traceback (most recent call last):",
      b'  File "/app/train.py", line 41, in <module>',
      b"    main()",
      b"ValueError: feature vector has 17 columns, expected 16 (bad record in batch at step 5)"]


def test_a_split_exception_line_is_read_whole(tmp_path, capsys):
    d = tmp_path / "pods" / f"training_llama-worker-0_{UID}" / "pytorch"
    d.mkdir(parents=True)
    old = b"".join(records("stdout", f"step {i} loss 2.3".encode(), T0 + i * S) for i in range(3))
    (d / "0.log.20261203-203300.gz").write_bytes(gzip.compress(old))
    new = b"".join(records("stdout", f"step {i} loss 2.3".encode(), T0 + i * S) for i in range(3, 5))
    new += b"".join(records("stderr", line, T0 + 10 * S + k, buf=24) for k, line in enumerate(TB))
    (d / "0.log").write_bytes(new)
    assert new.count(b" stderr P ") >= 3  # the exception line really is split
    code = main(["analyze", str(tmp_path / "pods"), "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0
    first = json.loads(out)["first_failure"]
    assert TB[-1].decode() in first["evidence"][0]["text"]
    assert first["occurred_at"].startswith("2026-12-03T20:32:49")  # the record's own time
