"""Hostile log text through every format the renderer offers (reports.FORMATS): inert in each.

Real analysis on files written here: a rank's traceback whose exception message is the
hostile text (its lines as the rank printed them; the reader keeps what follows a line's
last carriage return, as a terminal shows it, so that one goes in the other fields only),
the node name (``NODE=PATH``, no ``=`` in it), the job id and the log's folder name carry
it too. Every format must show it and let none of it act:

- text: no control character but the newlines it puts itself (no escape sequence, no
  carriage return, no bidi override), no line forged by the log;
- md: rendered to HTML by a CommonMark + GFM-tables parser (markdown-it-py), only the
  tags the renderer writes itself, no attribute, no link, no image, no heading of the
  log's; no raw control character in the Markdown either (it is read in terminals);
- json: parses back to exactly the hostile text, no raw control, bidi or separator
  character in the document;
- html (issue 9's page, when the renderer offers it): no tag or attribute of the log's.

A format without a check here fails: a new format joins this test.
"""

from __future__ import annotations

import html.parser
import json
import re

import pytest

from firstfault.offline.commands import report_from_logs
from firstfault.reports import FORMATS, render

HOSTILE = [
    "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m",  # retitle, clear the screen, colour
    "half\rFIRST FAILURE: rank 9 on gpu-99",  # overwrite a line on a terminal
    "<img src=x onerror=alert(1)> <script>alert(2)</script> <!-- c -->",
    "[click](javascript:alert(3)) ![i](http://attacker.example/i.png) <http://attacker.example>",
    "**bold** _em_ `code` ```fence ~~gone~~ | cell | \\| &amp; &#60;b&#62;",
    "\u202eexe.txt \u2066isolate\u2069 \u200fmark \u2028sep \ufeffbom \x9b2J",
    "# Heading",
    "</details><details open><summary>x</summary>",
]
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
MARKERS = ("owned", "FIRST FAILURE: rank 9", "onerror=alert(1)", "javascript:alert(3)",
           "~~gone~~", "isolate", "Heading", "open")


def message(h: str) -> str:
    return "carriage return elsewhere" if "\r" in h else h


def node(h: str) -> str:
    return "gpu-1" + h.replace("=", "-")


def make_report(tmp_path, i: int, h: str) -> dict:
    folder = tmp_path / f"logs<b>{i}"
    folder.mkdir()
    lines = message(h).split("\n")
    (folder / "rank0.log").write_text(
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/job/train.py", line 7, in <module>\n'
        + f"[rank0]: ValueError: bad input {lines[0]}\n"
        + "".join(f"[rank0]: {ln}\n" for ln in lines[1:]), encoding="utf-8", errors="surrogateescape")
    rep, _, problem = report_from_logs([f"{node(h)}={folder}"], job=f"job-{h}")
    assert problem is None and rep["first_failure"] is not None
    return rep


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    return [(h, make_report(tmp, i, h)) for i, h in enumerate(HOSTILE)]


def _check_text(out: str, h: str) -> None:
    assert not RAW.search(out.replace("\t", "")), repr(RAW.search(out))
    assert sum(ln.startswith("FIRST FAILURE") for ln in out.splitlines()) == 1
    assert any(m in out for m in MARKERS)  # shown, inert


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))

    def handle_data(self, data):
        self.text.append(data)


def _html_tags(page: str) -> _Tags:
    p = _Tags()
    p.feed(page)
    return p


MD_TAGS = {"h2", "h3", "p", "strong", "em", "table", "thead", "tbody", "tr", "th", "td",
           "code", "pre", "details", "summary", "ul", "li", "blockquote"}


def _check_md(out: str, h: str) -> None:
    from markdown_it import MarkdownIt
    assert not RAW.search(out.replace("\t", "")), repr(RAW.search(out))
    page = MarkdownIt("commonmark").enable("table").render(out)
    tags = _html_tags(page)
    assert {t for t, _ in tags.tags} <= MD_TAGS, {t for t, _ in tags.tags} - MD_TAGS
    assert all(not attrs or (t == "td" and attrs == [("style", "text-align:left")])
               for t, attrs in tags.tags), [x for x in tags.tags if x[1]]
    assert [t for t, _ in tags.tags].count("details") == 1  # the renderer's own, once
    assert sum(t in ("h2", "h3") for t, _ in tags.tags) == 4  # title, ranks, checkpoint, context
    assert any(m in "".join(tags.text) for m in MARKERS)  # shown as text


def _check_json(out: str, h: str) -> None:
    assert not RAW.search(out), repr(RAW.search(out))
    doc = json.loads(out)
    assert doc["job"] == f"job-{h}" and message(h).split("\n")[0] in doc["first_failure"]["summary"]
    assert doc["first_failure"]["node"] == node(h)


def _check_html(out: str, h: str) -> None:
    tags = _html_tags(out)
    for tag, attrs in tags.tags:
        assert tag not in ("img", "iframe", "object", "embed"), tag
        for name, value in attrs:
            assert not name.startswith("on"), (tag, name)
            assert "javascript:" not in (value or "").lower(), (tag, name, value)
    scripts = [a for t, a in tags.tags if t == "script"]
    assert all("alert(" not in str(a) for a in scripts)
    assert "<img src=x" not in out and "<script>alert(2)" not in out
    assert any(m in "".join(tags.text) for m in MARKERS)


CHECKS = {"text": _check_text, "md": _check_md, "json": _check_json, "html": _check_html}


@pytest.mark.parametrize("fmt", FORMATS)
def test_hostile_text_is_inert_in_every_format(reports, fmt):
    assert fmt in CHECKS, f"format {fmt!r} has no inertness check here: add one"
    for h, rep in reports:
        CHECKS[fmt](render(rep, fmt), h)


def test_the_hostile_text_reached_the_report(reports):
    """The test is real: each hostile string is in the report the formats render."""
    for h, rep in reports:
        assert message(h).split("\n")[0] in rep["first_failure"]["summary"], rep["first_failure"]
        assert rep["first_failure"]["node"] == node(h) and rep["job"] == f"job-{h}"
