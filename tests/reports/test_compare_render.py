"""Rendering a comparison escapes the untrusted text it carries from logs, in every medium."""

from __future__ import annotations

import json
import re

import pytest

from firstfault.analysis.compare import compare_reports
from firstfault.reports.compare import render_compare
from tests.analysis.test_compare import BEFORE, PASSED

HOSTILE = "x | `y` <script>alert(1)</script> \x1b[2J\n# heading"


def hostile_comparison() -> dict:
    before = json.loads(json.dumps(BEFORE))
    before["first_failure"]["summary"] = HOSTILE
    after = json.loads(json.dumps(PASSED))
    after["context"]["launch_command"] = f"python train.py --note '{HOSTILE}'"
    return compare_reports(before, after, before_source={"logs": ["<b>run1</b>"]}, after_source={"job": "j|1"})


def test_html_escapes_everything_and_loads_nothing():
    out = render_compare(hostile_comparison(), "html")
    assert "<script>" not in out and "&lt;script&gt;" in out and "&lt;b&gt;run1&lt;/b&gt;" in out
    assert "src=" not in out and "href=" not in out


def test_markdown_keeps_hostile_text_inside_its_cells():
    out = render_compare(hostile_comparison(), "md")
    rows = [line for line in out.splitlines() if line.startswith("| BEFORE") or line.startswith("| AFTER")]
    assert len(rows) == 2 and all(len(re.findall(r"(?<!\\)\|", line)) == 4 for line in rows)  # 3 cells each
    assert "j\\|1" in rows[1] and "&lt;b&gt;run1" in rows[0]
    assert "<script>" not in out and "\n# heading" not in out


def test_text_drops_terminal_control_characters():
    out = render_compare(hostile_comparison(), "text")
    assert "\x1b" not in out and "?[2J" in out


def test_json_is_the_object_itself():
    c = hostile_comparison()
    assert json.loads(render_compare(c, "json")) == c
    with pytest.raises(ValueError):
        render_compare(c, "yaml")
