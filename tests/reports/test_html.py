"""The HTML report without a browser: everything inline, the policy's hashes right, log text
escaped, the timeline bounded. (tests/reports/test_browser.py opens it in Chromium.)"""

import base64
import hashlib
import json
import re
from pathlib import Path

from firstfault.analysis.events import Event
from firstfault.analysis.lanes import LaneWatcher
from firstfault.cli import main
from firstfault.reports.html import visible
from tests.reports.hostile import HOSTILE, write_hostile_log

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "oom-kill"
OOM_ARGS = [str(EXAMPLE), "--kernel", str(EXAMPLE / "kmsg.txt"), "--kernel-boot-time", "1796326759.5386636",
            "--checkpoint-dir", str(EXAMPLE / "checkpoints")]


def html_of(tmp_path, *args) -> str:
    out = tmp_path / "r.html"
    assert main(["analyze", *args, "--format", "html", "--output", str(out), "--tz", "UTC"]) == 0
    return out.read_text(encoding="utf-8")


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_the_page_loads_nothing_and_runs_only_its_own_script(tmp_path):
    page = html_of(tmp_path, *OOM_ARGS)
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, re.S)
    assert [a for a, _ in scripts] == [" type='application/json' id='ff-data'", ""]
    (style,) = re.findall(r"<style>(.*?)</style>", page, re.S)
    policy = re.search(r'http-equiv=\'Content-Security-Policy\' content="([^"]+)"', page)[1].replace("&#x27;", "'")
    assert f"script-src {_sha(scripts[1][1])};" in policy and f"style-src {_sha(style)};" in policy
    assert "default-src 'none'" in policy and "connect-src 'none'" in policy
    assert not re.search(r"""(?:src|href)\s*=\s*['"]?(?:https?:|//)""", page)
    assert "@import" not in style and "url(" not in style and "<link" not in page


def test_the_oom_kill_is_on_its_nodes_lane_linked_to_rank_1(tmp_path):
    page = html_of(tmp_path, *OOM_ARGS)
    data = json.loads(re.search(r"<script type='application/json' id='ff-data'>(.*?)</script>", page, re.S)[1])
    tl = data["timeline"]
    ev = tl["events"]
    i = ev["kind"].index("first")
    lane = tl["lanes"][ev["lane"][i]]
    assert lane["rank"] is None and ev["link"][i] == 1 and ev["sig"][i] == "kernel.memcg_oom_kill"
    assert {(ln["rank"]) for ln in tl["lanes"]} == {None, 0, 1}
    assert [s["tag"] for s in tl["spans"]] == ["global_step2", "global_step4"]
    assert {s["verdict"] for s in tl["spans"]} == {"safe"}
    assert "First failure: <span id='ff-who'>rank 1 on localhost</span>" in page
    assert "Memory by phase" in page and "memory cgroup" in page


def test_hostile_log_text_is_text(tmp_path):
    write_hostile_log(tmp_path)
    page = html_of(tmp_path, str(tmp_path / "console.log"))
    assert "<script>window" not in page and "<img" not in page and "</details><img" not in page
    assert "\x1b" not in page and "\u202e" not in page
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;&lt;/details&gt;&lt;img src=x onerror=" in page
    # colours the scanner drops (what a terminal shows is the text); what is left is shown, not obeyed
    assert "RED \\x1b(0lqk\\x07 \\u202eevil" in page
    blob = re.search(r"<script type='application/json' id='ff-data'>(.*?)</script>", page, re.S)[1]
    assert "<" not in blob and ">" not in blob
    shown = json.loads(blob)["first_failure"]["evidence"][0]["text"]
    assert shown.endswith(visible(HOSTILE.replace("\x1b[31m", "").replace("\x1b[0m", "")))


def test_the_timeline_keeps_every_lane_bounded():
    w = LaneWatcher()
    for i in range(100_000):
        w(Event(text=f"plain line {i}", source="ranklog", node="n", rank=i % 4, seq=i, occurred_ns=i * 1_000_000))
        if i % 10 == 0:
            w(Event(text=f"x/global_step={i}, y", source="ranklog", node="n", rank=i % 4, seq=i, occurred_ns=i))
    assert set(w.plain) == {("n", r) for r in range(4)}
    for s in w.plain.values():
        kept = s.items()
        assert s.count == 25_000 and w.plain_cap // 2 <= len(kept) < w.plain_cap
        gaps = {b.seq - a.seq for a, b in zip(kept, kept[1:])}
        assert len(gaps) == 1  # evenly spread over the run
    assert all(len(s.items()) < w.progress_cap for s in w.progress.values())
