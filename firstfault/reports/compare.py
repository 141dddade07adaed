"""Render a comparison (``firstfault.compare/1``, docs/COMPARE.md) as text, Markdown, JSON or HTML.

Render only: every judgement is in firstfault/analysis/compare.py; each medium escapes
the untrusted text from logs its own way (compare_text.py, compare_html.py).
"""

from __future__ import annotations

from firstfault.reports import render
from firstfault.reports.compare_html import render_compare_html
from firstfault.reports.compare_text import render_markdown, render_text

RENDERERS = {"text": render_text, "md": render_markdown, "html": render_compare_html}
FORMATS = ("text", "md", "json", "html")


def render_compare(c: dict, fmt: str) -> str:
    if fmt == "json":
        return render(c, "json")
    if fmt not in RENDERERS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return RENDERERS[fmt](c)
