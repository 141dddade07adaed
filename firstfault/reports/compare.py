"""Render a comparison (``firstfault.compare/1``, docs/COMPARE.md) as text, Markdown, JSON or HTML.

Render only: every judgement is in firstfault/analysis/compare.py; each medium escapes
the untrusted text from logs its own way (compare_text.py, compare_html.py).
"""

from __future__ import annotations

import json

from firstfault.reports.compare_html import render_compare_html
from firstfault.reports.compare_text import render_markdown, render_text

FORMATS = ("text", "md", "json", "html")


def render_compare(c: dict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(c, indent=2, ensure_ascii=False) + "\n"
    if fmt == "md":
        return render_markdown(c)
    if fmt == "text":
        return render_text(c)
    if fmt == "html":
        return render_compare_html(c)
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
