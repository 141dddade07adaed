"""Every report format names the failing frame: the innermost frame in the user's code
(a real run: rank 1 raises in train.py's check_features under torchrun)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from firstfault.cli import main

REAL = Path(__file__).resolve().parents[1] / "data" / "real" / "torchrun-exception-rank1-of-2"
WHERE = "train.py line 105, in check_features"


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("ff")
    for fmt in ("json", "text", "md", "html"):
        assert main(["analyze", str(REAL), "--format", fmt, "--output", str(out / f"r.{fmt}")]) == 0
    return {fmt: (out / f"r.{fmt}").read_text() for fmt in ("json", "text", "md", "html")}


def test_json_has_the_failing_frame_object(reports):
    fr = json.loads(reports["json"])["first_failure"]["failing_frame"]
    assert fr["file"].endswith("tests/realjobs/train.py") and (fr["line"], fr["function"]) == (105, "check_features")
    assert fr["in_user_code"] is True and fr["raising"]["line"] == 105


@pytest.mark.parametrize("fmt", ["text", "md", "html"])
def test_text_markdown_and_html_show_it(reports, fmt):
    where = WHERE.replace("_", "\\_") if fmt == "md" else WHERE  # Markdown escapes the underscore
    assert "failing at" in reports[fmt] and where in reports[fmt]


OOM = Path(__file__).resolve().parents[1] / "data" / "real" / "torchrun-oom-rank1-of-2"


@pytest.mark.parametrize("fmt", ["json", "text", "md", "html"])
def test_a_rank_the_kernel_killed_says_why_no_frame_is_shown(tmp_path, fmt):
    """A real memcg OOM kill (no traceback): the report says why there is no failing line instead
    of leaving it out."""
    out = tmp_path / f"r.{fmt}"
    assert main(["analyze", str(OOM), "--kernel", str(OOM / "kmsg.txt"), "--format", fmt, "--output", str(out)]) == 0
    text = out.read_text()
    if fmt == "json":
        ff = json.loads(text)["first_failure"]
        assert ff["failing_frame"] is None and ff["failing_frame_note"].startswith("SIGKILL ends a process")
    else:
        assert "no Python frame: SIGKILL ends a process" in text
