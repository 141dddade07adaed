"""Render a report (REPORT.md's dict) as text, Markdown or JSON. Render only: no analysis here.
Log text is untrusted: every format makes it inert for its medium (firstfault/reports/escape.py)."""

from __future__ import annotations

from firstfault.reports.escape import json_text
from firstfault.reports.markdown import render_markdown
from firstfault.reports.text import render_text

FORMATS = ("text", "md", "json")


def render(report: dict, fmt: str) -> str:
    if fmt == "json":
        return json_text(report) + "\n"
    if fmt == "md":
        return render_markdown(report)
    if fmt == "text":
        return render_text(report)
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
