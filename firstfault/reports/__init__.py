"""Render a report (REPORT.md's dict) as text, Markdown or JSON. Render only: no analysis here."""

from __future__ import annotations

import json

from firstfault.reports.markdown import render_markdown
from firstfault.reports.text import render_text

FORMATS = ("text", "md", "json")


def render(report: dict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    if fmt == "md":
        return render_markdown(report)
    if fmt == "text":
        return render_text(report)
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
