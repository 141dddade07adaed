"""Render a report (REPORT.md's dict) as text, Markdown, JSON or HTML. Render only: no analysis here.
Log text is untrusted: every format makes it inert for its medium (firstfault/reports/escape.py).

HTML draws the report's ``timeline`` object, which the analysis builds only when asked
(``Inputs.timeline``): ask for it when the format is ``html`` (``needs_timeline``)."""

from __future__ import annotations

from firstfault.reports.escape import json_text
from firstfault.reports.html import render_html
from firstfault.reports.markdown import render_markdown
from firstfault.reports.text import render_text

FORMATS = ("text", "md", "json", "html")


def needs_timeline(fmt: str) -> bool:
    return fmt == "html"


def render(report: dict, fmt: str) -> str:
    if fmt == "json":
        return json_text(report) + "\n"
    if fmt == "md":
        return render_markdown(report)
    if fmt == "text":
        return render_text(report)
    if fmt == "html":
        return render_html(report)
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
