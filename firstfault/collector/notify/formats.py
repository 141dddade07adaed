"""A notice as each kind of target receives it: the signed JSON of a webhook (and a
command's stdin), and Slack's incoming-webhook message. Pure: bytes and headers out.

Webhook (docs/NOTICE.md): the body is the notice as JSON (UTF-8; every control, bidi and
line-separator character a ``\\uXXXX`` escape, so the body is inert when printed), with
``Content-Type: application/json``, ``X-Firstfault-Schema: firstfault.notice/1``,
``X-Firstfault-Delivery: <notice id>``, ``X-Firstfault-Timestamp: <unix seconds>`` and,
with a secret, ``X-Firstfault-Signature: sha256=<hex>``: HMAC-SHA256 with the secret
over ``<timestamp>.<body>``. A receiver recomputes it over the bytes it got, compares in
constant time and refuses old timestamps (replays).

Slack: ``{"text": <headline>, "blocks": [...]}`` in mrkdwn. Slack parses ``&``, ``<`` and
``>`` as control characters (links, @channel and user mentions), so every user-derived
string has them as ``&amp;`` ``&lt;`` ``&gt;``, control and bidi characters escaped
(reports/escape.py's ``terminal``), line breaks as spaces. Short values (job, node,
signature, tag) are inline code, their backticks replaced by ``ˋ`` (U+02CB) so none can
close the span; free text (summary, what to do) has ``*``, ``~`` and backticks replaced
by lookalikes (``∗``, ``∼``, ``ˋ``) so a log line cannot make bold, strike or code.
"""

from __future__ import annotations

import hashlib
import hmac

from firstfault.collector.notify.notice import SCHEMA, headline
from firstfault.reports.escape import json_text, terminal

SIGNATURE_HEADER = "X-Firstfault-Signature"
TIMESTAMP_HEADER = "X-Firstfault-Timestamp"
_ENTITIES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
_MARKS = str.maketrans({"*": "\u2217", "~": "\u223c", "`": "\u02cb"})


def body(notice: dict) -> bytes:
    """The notice as the JSON a webhook and a command receive."""
    return json_text(notice, indent=None).encode()


def sign(secret: bytes, timestamp: int, payload: bytes) -> str:
    """The signature header's value: ``sha256=`` HMAC-SHA256 of ``<timestamp>.<payload>``."""
    mac = hmac.new(secret, str(timestamp).encode() + b"." + payload, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def webhook_headers(notice: dict, payload: bytes, secret: bytes | None, timestamp: int) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "X-Firstfault-Schema": SCHEMA,
               "X-Firstfault-Delivery": _header_safe(notice["id"]), TIMESTAMP_HEADER: str(timestamp)}
    if secret is not None:
        headers[SIGNATURE_HEADER] = sign(secret, timestamp, payload)
    return headers


def _header_safe(s: str) -> str:
    return "".join(c if " " <= c <= "~" else "?" for c in s)[:200]


def slack_text(s: object) -> str:
    """Free text for mrkdwn: inert (see the module docstring)."""
    flat = " ".join(("" if s is None else str(s)).splitlines())
    return terminal(flat).translate(_ENTITIES).translate(_MARKS)


def slack_code(s: object) -> str:
    """A short value as inline code nothing in it can close."""
    flat = " ".join(("" if s is None else str(s)).splitlines())
    inner = terminal(flat).translate(_ENTITIES).replace("`", "\u02cb")
    return f"`{inner or ' '}`"


def slack_message(notice: dict) -> dict:
    """The Slack incoming-webhook payload of a notice."""
    first = notice.get("first_failure")
    ckpt = notice["checkpoint"]
    title = "Job update" if notice["update"] else "Job failed"
    lines = [f"*{title}:* {slack_code(notice['job'])}"]
    if first is None:
        lines.append("No first failure was found in its records.")
    else:
        rank = "unknown" if first.get("rank") is None else str(first["rank"])
        lines.append(f"*First failure:* rank {slack_code(rank)} on {slack_code(first.get('node') or 'unknown')}"
                     f" | {slack_code(first.get('signature'))} ({slack_text(first.get('category'))}, "
                     f"phase {slack_text(first.get('phase'))}, confidence {slack_text(first.get('confidence'))})")
        if first.get("summary"):
            lines.append(slack_text(first["summary"]))
        if first.get("first_action"):
            lines.append(f"*Do first:* {slack_text(first['first_action'])}")
    resume = slack_code(ckpt["resume_from"]) if ckpt.get("resume_from") else "no safe tag"
    lines.append(f"*Checkpoint:* {slack_text(ckpt.get('verdict'))}; resume from {resume}")
    if notice.get("previous"):
        prev = notice["previous"]
        lines.append(f"_Was:_ rank {slack_code(prev.get('rank'))}, {slack_code(prev.get('signature'))}")
    if not notice["settled"]:
        lines.append("_Not settled: no news yet from " + ", ".join(slack_code(n) for n in notice["nodes_behind"])
                     + "; an update follows if their records change the answer._")
    if notice.get("report_url"):
        url = notice["report_url"].translate(_ENTITIES).replace("|", "%7C")
        lines.append(f"<{url}|The report>")
    text = "\n".join(lines)
    return {"text": slack_text(headline(notice)),
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]}


def slack_body(notice: dict) -> bytes:
    return json_text(slack_message(notice), indent=None).encode()
