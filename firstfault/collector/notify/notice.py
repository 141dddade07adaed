"""A notice: what the collector tells people of a failed job, schema ``firstfault.notice/1``.

Built from the job's report (REPORT.md: already redacted by the collector's ``[redact]``)
and what the decision knew; docs/NOTICE.md is its specification (fields are added
freely, never renamed or dropped without a new schema version). Pure: no I/O.

The *answer* of a notice is what an update is about: the first failure's rank, node,
signature, category and phase, and the checkpoint's verdict and tag to resume from. A
later record that changes the answer makes a new revision (``update`` true, ``previous``
the earlier answer); one that changes nothing else is not told.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from typing import Any

from firstfault.collector.notify.config import CONFIDENCE, Filter
from firstfault.common.redact import Redactor

SCHEMA = "firstfault.notice/1"
_FIRST_KEYS = ("rank", "node", "pid", "occurred_at", "observed_at", "signature", "category", "phase",
               "summary", "first_action", "confidence", "within_clock_uncertainty", "ranks_sharing")
ANSWER_KEYS = ("rank", "node", "signature", "category", "phase", "checkpoint", "resume_from")
MAX_EVIDENCE = 3
MAX_TEXT = 2000  # characters of one evidence line in a notice


def answer(report: dict) -> dict:
    """The part of a report whose change is worth an update."""
    first = report.get("first_failure") or {}
    ckpt = report.get("checkpoint") or {}
    return {"rank": first.get("rank"), "node": first.get("node"), "signature": first.get("signature"),
            "category": first.get("category"), "phase": first.get("phase"),
            "checkpoint": ckpt.get("verdict"), "resume_from": ckpt.get("resume_from")}


def build(report: dict, *, job: str, revision: int, previous: dict | None, decided_by: str,
          failed_at: str, settled: bool, behind: list[str], report_url: str | None, sent_at: str,
          redactor: Redactor | None) -> dict:
    """The notice of ``report``; every string redacted once more (the job id too)."""
    first = report.get("first_failure")
    ckpt = report.get("checkpoint") or {}
    notice: dict[str, Any] = {
        "schema": SCHEMA,
        "id": f"{job}#{revision}",
        "job": job,
        "revision": revision,
        "update": revision > 1,
        "previous": previous,
        "sent_at": sent_at,
        "failed_at": failed_at,
        "decided_by": decided_by,
        "settled": settled,
        "nodes_behind": behind,
        "first_failure": None if first is None else {
            **{k: first.get(k) for k in _FIRST_KEYS},
            "evidence": [{k: ev.get(k) for k in ("node", "rank", "source", "at")}
                         | {"text": str(ev.get("text") or "")[:MAX_TEXT]}
                         for ev in (first.get("evidence") or [])[:MAX_EVIDENCE]]},
        "blame": report.get("blame", "unknown"),
        "checkpoint": {"verdict": ckpt.get("verdict", "unknown"), "resume_from": ckpt.get("resume_from"),
                       "reason": ckpt.get("reason")},
        "distinct_failures": len(report.get("distinct_failures") or []),
        "ranks": len(report.get("ranks") or {}),
        "partial": bool(report.get("partial")),
        "report_url": None if report_url is None else f"{report_url.rstrip('/')}/jobs/{_url_part(job)}",
    }
    if redactor is not None:
        notice = redactor.walk(notice, Counter())
    return notice


def _url_part(job: str) -> str:
    from urllib.parse import quote

    return quote(job, safe="")


def matches(f: Filter, notice: dict) -> bool:
    """Does a target with filter ``f`` get this notice?"""
    first = notice.get("first_failure") or {}
    category = first.get("category") or "unknown"
    signature = first.get("signature") or ""
    confidence = first.get("confidence") or "low"
    if f.categories and category not in f.categories:
        return False
    if f.signatures and not any(fnmatch.fnmatchcase(signature, p) for p in f.signatures):
        return False
    if f.job is not None and not re.search(f.job, notice["job"]):
        return False
    rank = CONFIDENCE.index(confidence) if confidence in CONFIDENCE else 0
    return rank >= CONFIDENCE.index(f.min_confidence)


def headline(notice: dict) -> str:
    """One line (raw, not escaped: each target escapes it): what failed first."""
    first = notice.get("first_failure")
    what = "updated" if notice["update"] else "failed"
    if first is None:
        return f"job {notice['job']} {what}: no first failure found"
    where = f"rank {first['rank']}" if first.get("rank") is not None else "a rank"
    node = f" on {first['node']}" if first.get("node") else ""
    return (f"job {notice['job']} {what}: {where}{node}, {first.get('signature')} "
            f"({first.get('category')}, {first.get('phase')})")
