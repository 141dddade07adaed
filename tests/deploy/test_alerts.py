"""deploy/alerts/firstfault.rules.yml: valid Prometheus rule groups whose expressions use only
metrics the collector exposes; the README shows one of its rules as it is in the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from firstfault.collector.metrics import Metrics
from firstfault.collector.notify.metrics import NotifyMetrics

yaml = pytest.importorskip("yaml")
ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "alerts" / "firstfault.rules.yml"


def exposed() -> set[str]:
    m = NotifyMetrics()
    m.job_failed("hardware", "gpu.xid_79", 1.0)
    m.delivered("ops")
    m.failed("ops")
    text = Metrics().render_prometheus() + m.render_prometheus()
    return {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")}


def test_the_rules_use_only_metrics_the_collector_exposes():
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert len(rules) >= 3
    have = exposed()
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"} and r["alert"] and r["expr"]
        names = set(re.findall(r"\b(firstfault_\w+)", r["expr"]))
        assert names and names <= have, (r["alert"], names - have)
        assert r["labels"]["severity"] in ("warning", "critical")


def test_the_readme_shows_a_rule_of_the_file():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", readme, re.S).group(1)
    (shown,) = yaml.safe_load(block)
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    kept = rules[shown["alert"]]
    assert shown["expr"] == kept["expr"] and shown["labels"] == kept["labels"]
    assert shown["annotations"]["summary"] == kept["annotations"]["summary"]
