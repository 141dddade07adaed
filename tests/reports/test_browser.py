"""The HTML report and the collector's pages in a real browser: Debian's chromium, headless,
driven through Playwright (pip ``playwright``; its own browser download is never used).
Every page is loaded with the network refused: anything it tried to fetch fails the test.

The screenshot of examples/oom-kill goes to $FIRSTFAULT_ARTIFACTS (default build/artifacts/),
and with FIRSTFAULT_UPDATE_SCREENSHOT=1 also to docs/report.png, the one the README shows.
"""

import asyncio
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from bench.htmljob import make_job, open_page, redraw, wait_until
from firstfault.cli import main
from tests.reports.hostile import write_hostile_log
from tests.reports.test_html import OOM_ARGS

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("FIRSTFAULT_ARTIFACTS") or ROOT / "build" / "artifacts")
MEMORY_RUN = ROOT / "tests" / "data" / "real" / "torchrun-oom-memory-rank1-of-2"
READY_LIMIT_S = 20  # the 100k-event page, navigation to drawn, on a busy 2-core CI machine (bench/RESULTS.md: ~1-2 s)
REDRAW_LIMIT_MS = 1000


@pytest.fixture(scope="module")
def browser():
    missing = [what for what, ok in (("chromium (apt-get install chromium)", shutil.which("chromium")),
                                     ("playwright (pip install playwright)", _has_playwright())) if not ok]
    if missing:
        if os.environ.get("CI"):
            pytest.fail("CI must run the browser tests; missing: " + ", ".join(missing))
        pytest.skip("no browser here: " + ", ".join(missing))
    from bench.htmljob import chromium

    pw, b = chromium()
    yield b
    b.close()
    pw.stop()


def _has_playwright() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


def _html(tmp_path, *args) -> Path:
    out = tmp_path / "report.html"
    assert main(["analyze", *args, "--format", "html", "--output", str(out), "--tz", "UTC"]) == 0
    return out


def _ready(page):
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)


def test_the_oom_kill_report_renders_offline_with_the_kill_linked_to_rank_1(browser, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the paths the page shows are the README's
    path = _html(tmp_path, *(str(Path(a).relative_to(ROOT)) if a.startswith(str(ROOT)) else a for a in OOM_ARGS))
    page = open_page(browser, path.as_uri(), viewport=(1280, 900))
    page.goto(path.as_uri())
    _ready(page)
    assert page.inner_text("#ff-who") == "rank 1 on localhost"
    labels = page.eval_on_selector_all("#tl-scroll svg text.lane-label", "ts => ts.map(t => t.firstChild.nodeValue)")
    assert {"localhost", "rank 0", "rank 1"} <= set(labels)
    # the kernel's kill sits on the node's lane, its link drawn down to rank 1's lane
    assert page.locator("#tl-scroll [data-kind='first']").count() == 1
    assert page.locator("#tl-scroll line.link[data-link='1']").count() >= 1
    # memory by phase: rank 1 (the failed one) chosen, its chart drawn, the kernel's figures in the table
    assert page.input_value("#mem-rank") == "1"
    assert page.locator("#mem-chart svg circle").count() >= 2
    assert "memory cgroup" in page.inner_text("#memory table")
    # the kill is at the chart's right edge: its label stays inside the chart
    label = page.evaluate("""() => { const svg = document.querySelector('#mem-chart svg');
        const t = [...svg.querySelectorAll('text')].find(t => t.textContent === 'first failure');
        const a = t.getBoundingClientRect(), b = svg.getBoundingClientRect();
        return [a.left >= b.left, a.right <= b.right]; }""")
    assert label == [True, True]
    # the kernel's marks and the agent's cgroup OOM marks are told apart in the legend
    swatches = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#tl-legend .item')].map(
        i => [i.textContent, [...i.querySelectorAll('svg *')].map(n => n.getAttribute('fill') || n.getAttribute('stroke')).join()]))""")
    assert swatches["kernel / Xid"] != swatches["cgroup OOM (agent)"]
    # clicking the mark of the first failure shows its raw line and where it was read
    page.locator("#tl-scroll [data-kind='first']").click()
    details = page.inner_text("#tl-details")
    assert "Memory cgroup out of memory: Killed process 10396" in details and "origin: " in details
    assert "kmsg.txt:82" in details and "hit rank 1" in details
    page.click("tr.k-first button.show")  # the key event: the kill alone
    assert page.locator("#tl-details .ev").count() == 1
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.mouse.move(0, 0)
    page.evaluate("window.scrollTo(0, 0)")
    bottom = page.evaluate("document.getElementById('tl-details').getBoundingClientRect().bottom + window.scrollY")
    shot = page.screenshot(full_page=True, clip={"x": 0, "y": 0, "width": 1280, "height": bottom + 8})
    (ARTIFACTS / "report-oom-kill.png").write_bytes(shot)
    if os.environ.get("FIRSTFAULT_UPDATE_SCREENSHOT") == "1":
        (ROOT / "docs").mkdir(exist_ok=True)
        (ROOT / "docs" / "report.png").write_bytes(shot)
    assert page.problems == []


def test_memory_phases_are_drawn_for_a_memory_breakdown_run(browser, tmp_path):
    path = _html(tmp_path, str(MEMORY_RUN), "--checkpoint-dir", str(MEMORY_RUN / "checkpoints"))
    page = open_page(browser, path.as_uri())
    page.goto(path.as_uri())
    _ready(page)
    page.select_option("#mem-rank", "0")
    titles = page.eval_on_selector_all("#mem-chart svg rect title", "ts => ts.map(t => t.textContent)")
    assert any(t.startswith("optimizer-step: Engine before step") for t in titles)
    assert any(t.startswith("forward: ") for t in titles) and any(t.startswith("init: ") for t in titles)
    assert page.locator("#mem-chart svg polyline").count() >= 3  # allocated, reserved, node memory
    assert page.problems == []


def test_hostile_log_text_does_not_run_and_shows_as_text(browser, tmp_path):
    write_hostile_log(tmp_path)
    path = _html(tmp_path, str(tmp_path / "console.log"))
    page = open_page(browser, path.as_uri())
    page.goto(path.as_uri())
    _ready(page)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img").count() == 0 and page.locator("script").count() == 2
    evidence = page.inner_text("#first pre.raw")
    assert "<script>window.__pwned=1</script></details><img src=x" in evidence
    assert "\\x1b(0lqk\\x07 \\u202eevil" in evidence
    page.locator("button.show").first.click()
    assert "<script>window.__pwned=1</script>" in page.inner_text("#tl-details")
    assert page.evaluate("window.__pwned") is None
    assert page.problems == []


_CONTRAST = """() => {
  function rgb(s) { const m = s.match(/[\\d.]+/g); return m ? m.map(Number) : null; }
  function lum(c) { const v = c.slice(0, 3).map(x => { x /= 255; return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); });
                    return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; }
  function bg(el) { for (; el; el = el.parentElement) { const c = rgb(getComputedStyle(el).backgroundColor);
                    if (c && (c.length < 4 || c[3] > 0.5)) return c; } return [255, 255, 255]; }
  const bad = [];
  for (const el of document.querySelectorAll('main *, header *')) {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own || el.closest('svg') || el.offsetParent === null) continue;
    const fg = rgb(getComputedStyle(el).color), b = bg(el);
    const a = lum(fg), c = lum(b), ratio = (Math.max(a, c) + 0.05) / (Math.min(a, c) + 0.05);
    if (ratio < 4.5) bad.push(el.tagName + ' ' + ratio.toFixed(2) + ' ' + el.textContent.slice(0, 40));
  }
  return bad;
}"""


def test_labels_contrast_and_keyboard(browser, tmp_path):
    path = _html(tmp_path, *OOM_ARGS)
    page = open_page(browser, path.as_uri())
    page.goto(path.as_uri())
    _ready(page)
    unlabelled = page.eval_on_selector_all(
        "input, select, textarea",
        "els => els.filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')).map(e => e.id)")
    assert unlabelled == []
    nameless = page.eval_on_selector_all("button", "bs => bs.filter(b => !(b.textContent.trim() || "
                                         "b.getAttribute('aria-label'))).length")
    assert nameless == 0
    assert page.evaluate(_CONTRAST) == []
    # the keyboard reaches the page's controls in order, each with a visible focus ring
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip"
    seen = []
    for _ in range(12):
        page.keyboard.press("Tab")
        seen.append(page.evaluate("document.activeElement.id || document.activeElement.tagName"))
        style = page.evaluate("(() => { const s = getComputedStyle(document.activeElement); "
                              "return [s.outlineStyle, parseFloat(s.outlineWidth)] })()")
        assert style[0] != "none" and style[1] >= 2
    assert seen[0] == "SUMMARY"  # the evidence, which opens and closes with the keyboard
    assert seen[1:9] == ["tl-first", "tl-fit", "tl-in", "tl-out", "tl-left", "tl-right", "tl-filter", "tl-scroll"]
    # keys on the focused swimlanes zoom; Enter on a key event's button shows it
    page.focus("#tl-scroll")
    before = page.inner_text("#tl-range")
    page.keyboard.press("+")
    wait_until(lambda: page.inner_text("#tl-range") != before)
    page.focus("#key button.show")
    page.keyboard.press("Enter")
    assert "Memory cgroup out of memory" in page.inner_text("#tl-details")
    assert page.problems == []


def test_the_100k_event_job_stays_responsive(browser, tmp_path_factory):
    from bench.htmljob import build
    from firstfault.reports.html import render_html

    args = make_job(tmp_path_factory.mktemp("htmljob"))
    rep, _ = build(args)
    assert rep["timeline"]["seen"] > 100_000 and len(rep["timeline"]["lanes"]) == 256
    path = tmp_path_factory.mktemp("page") / "big.html"
    path.write_text(render_html(rep), encoding="utf-8")
    page = open_page(browser, path.as_uri())
    t = time.perf_counter()
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=READY_LIMIT_S * 1000)
    ready = time.perf_counter() - t
    assert ready < READY_LIMIT_S
    assert page.inner_text("#ff-who").startswith("rank 137")
    for button in ("#tl-fit", "#tl-in", "#tl-right"):
        assert redraw(page, lambda: page.click(button)) < REDRAW_LIMIT_MS
    print(f"100k-event page: {path.stat().st_size / 1e6:.1f} MB, ready in {ready:.2f} s")
    assert page.problems == []


def _serve_in_thread(api):
    """The api on a loopback port, in a thread of its own; (base url, stop)."""
    from aiohttp import web

    loop = asyncio.new_event_loop()
    box = {}

    async def start():
        runner = web.AppRunner(api.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"], box["port"] = runner, runner.addresses[0][1]

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        box["up"].set()
        loop.run_forever()

    box["up"] = threading.Event()
    th = threading.Thread(target=run, daemon=True)
    th.start()
    assert box["up"].wait(10)

    def stop():
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        th.join(10)
    return f"http://127.0.0.1:{box['port']}", stop


def test_the_collectors_pages_in_the_browser(browser, tmp_path):
    from firstfault.analysis.catalog import load_catalog
    from firstfault.collector.api import Api
    from firstfault.collector.store import open_store
    from tests.analysis.shipped import ship_file
    from tests.collector.test_web import JOB, PASTED, REAL

    store = open_store(str(tmp_path / "ff.db"))
    records = []
    for p in sorted((REAL / "logs").glob("*.log")):
        records += ship_file(p, "node-a", int(p.stem.rsplit("rank", 1)[1]), len(records))
    store.insert([type(r)(**{**{f: getattr(r, f) for f in r.__slots__}, "job": JOB}) for r in records])
    base, stop = _serve_in_thread(Api(store, load_catalog()))
    try:
        page = open_page(browser, base + "/")
        page.goto(base + "/")
        page.click(f"a[href='/jobs/{JOB}']")
        _ready(page)
        assert page.inner_text("#ff-who") == "rank 2 on node-a"
        for url in ("/", "/paste"):  # the collector's own pages: labelled, readable
            page.goto(base + url)
            assert page.evaluate(_CONTRAST) == []
            assert page.eval_on_selector_all("input, textarea", "els => els.filter(e => !e.labels.length).length") == 0
        page.goto(base + "/paste")
        page.fill("#text", PASTED.read_text())
        page.click("button[type=submit]")
        _ready(page)
        assert page.inner_text("#ff-who").startswith("rank 2")
        assert page.problems == []
    finally:
        stop()



def test_a_running_jobs_page_updates_itself(browser, tmp_path):
    from firstfault.analysis.catalog import load_catalog
    from firstfault.collector.api import Api
    from firstfault.collector.store import open_store
    from firstfault.wire import Record

    store = open_store(str(tmp_path / "ff.db"))
    now = time.time_ns()

    def line(seq, rank, text, t_ns):
        return Record(node="gpu-1", stream="s1", seq=seq, source="ranklog", kind="rank.line", message=text,
                      occurred_ns=t_ns, observed_ns=t_ns, job="live-1", rank=rank, fields={"path": f"r{rank}.log"})
    store.insert([line(i, r, f"rank {r} step {i} loss 1.0", now - 5_000_000_000 + i) for i, r in enumerate((0, 1))])
    base, stop = _serve_in_thread(Api(store, load_catalog()))
    try:
        page = open_page(browser, base + "/jobs/live-1")
        page.goto(base + "/jobs/live-1")
        _ready(page)
        assert page.get_attribute("body", "data-status") == "running"
        assert page.inner_text("#first h2") == "No failure found"
        tb = ("Traceback (most recent call last):\n  File \"/work/train.py\", line 9, in <module>\n    main()\n"
              "ValueError: bad batch at step 3")
        store.insert([Record(node="gpu-1", stream="s1", seq=9, source="ranklog", kind="rank.traceback", message=tb,
                             occurred_ns=time.time_ns(), observed_ns=time.time_ns(), job="live-1", rank=1,
                             fields={"path": "r1.log"})])
        wait_until(lambda: page.locator("#ff-who").count() == 1, timeout_s=20)  # the page's own poll, every 5 s
        assert page.inner_text("#ff-who").startswith("rank 1")
        assert page.locator("#tl-scroll [data-kind='first']").count() == 1
        assert page.problems == []
    finally:
        stop()


REAL = sorted(p for p in (ROOT / "tests" / "data" / "real").iterdir() if (p / "scenario.json").exists())


def _under(folder, arg: str) -> str:
    """A scenario's analyze path (PATH or NODE=PATH, relative to its folder) as a command line takes it."""
    node, eq, path = arg.rpartition("=")
    return f"{node}{eq}{folder / path}"


def test_every_real_capture_renders_without_errors(browser, tmp_path):
    """The clean run (no failure), the hang (inferred), the pasted console, bad config, NaN, ..."""
    for folder in REAL:
        extra = ["--checkpoint-dir", str(folder / "checkpoints")] if (folder / "checkpoints").is_dir() else []
        out = tmp_path / f"{folder.name}.html"
        doc = json.loads((folder / "scenario.json").read_text())
        paths = [_under(folder, a) for a in doc.get("analyze_paths") or []] or [str(folder)]
        assert main(["analyze", *paths, *extra, "--format", "html", "--output", str(out), "--tz", "UTC"]) == 0
        page = open_page(browser, out.as_uri())
        page.goto(out.as_uri())
        _ready(page)
        who = page.inner_text("#first h2")
        truth = doc["expected"]
        if truth.get("failed") is False:
            assert who == "No failure found", folder.name
        elif truth.get("rank") is not None:
            assert f"rank {truth['rank']}" in who, folder.name
        assert page.problems == [], folder.name
        page.close()
