"""Benchmark: the HTML report of a 256-rank, 100k-event job, built, written and drawn in Chromium.

Generates 32 nodes x 8 ranks of DeepSpeed rank logs (line shapes as DeepSpeed 0.19.8 and
torch 2.13 print them, see tests/data/real: the engine's ``step=N, skipped=`` and the
timer's ``global_step=`` lines on every rank, as ``log_dist(..., ranks=[-1])`` would,
``see_memory_usage`` at every 2nd step, a CUDA OOM traceback on one rank and NCCL
watchdog timeouts on the rest), ~118k lines that the scanner makes Events of (only the last progress line before another hit is one). Then:

- builds the report with its timeline (in this process) and renders the page: seconds, bytes;
- opens it in headless Chromium (Debian's, through Playwright) with the network blocked:
  navigation to the first drawn swimlanes, then the redraw after "Show all", after
  scrolling half way down the lanes, and after a zoom in (the page's own ``data-render-ms``);
- the same with the lanes' thinning off (every Event of the job in the page) to show the
  drawing copes with 100k marks, not only with what the default keeps.

    python3 bench/htmljob.py [--out bench/out] [--runs 3]

``make_job(folder)`` is shared with tests/reports/test_browser.py.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

NODES, PER_NODE, STEPS, MEMORY_EVERY = 32, 8, 190, 2
FAIL_RANK, FAIL_STEP = 137, 185
T0 = 1_796_205_000.0


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f",{int((t % 1) * 1000):03d}"


def _rank_lines(rank: int, rnd: random.Random):
    t = T0 + rnd.random()
    yield f"[{_stamp(t)}] [INFO] [comm.py:821:init_distributed] Initializing TorchBackend in DeepSpeed with backend nccl\n"
    t += 20
    for step in range(1, STEPS + 1):
        t += 0.9 + rnd.random() * 0.05
        if step % MEMORY_EVERY == 0:
            ma = 21.3 + rnd.random() * 0.2
            yield "Engine before step\n"
            yield f"MA {ma:.2f} GB         Max_MA {ma + 4.6:.2f} GB         CA {ma + 6:.2f} GB         Max_CA {ma + 7:.0f} GB \n"
            yield f"CPU Virtual Memory:  used = {310 + rnd.random() * 5:.2f} GB, percent = 15.1%\n"
        if rank == FAIL_RANK and step == FAIL_STEP:
            yield f"[rank{rank}]: Traceback (most recent call last):\n"
            yield f'[rank{rank}]:   File "/work/train.py", line 88, in <module>\n'
            yield f"[rank{rank}]:     loss = engine(batch)\n"
            yield f'[rank{rank}]:   File "/usr/lib/python3/dist-packages/deepspeed/runtime/engine.py", line 2105, in forward\n'
            yield f"[rank{rank}]:     loss = self.module(*inputs, **kwargs)\n"
            yield (f"[rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a "
                   "total capacity of 79.10 GiB of which 1.05 GiB is free. Of the allocated memory 75.20 GiB is allocated "
                   "by PyTorch, and 1.12 GiB is reserved by PyTorch but unallocated.\n")
            return
        if step == FAIL_STEP:
            t += 600
            yield (f"[rank{rank}]:[E1202 10:{(rank % 50):02d}:00.000000000 ProcessGroupNCCL.cpp:632] [Rank {rank}] "
                   f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={step * 7}, OpType=ALLGATHER, "
                   "NumelIn=1048576, NumelOut=268435456, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.\n")
            return
        yield (f"[{_stamp(t)}] [INFO] [logging.py:107:log_dist] [Rank {rank}] step={step}, skipped=0, "
               f"lr=[0.0001], mom=[(0.9, 0.999)]\n")
        yield (f"[{_stamp(t)}] [INFO] [timer.py:264:stop] epoch=0/micro_step={step}/global_step={step}, "
               f"RunningAvgSamplesPerSec={180 + rnd.random():.6f}, CurrSamplesPerSec={181 + rnd.random():.6f}, "
               "MemAllocated=21.33GB, MaxMemAllocated=27.9GB\n")


def make_job(folder: Path) -> list[str]:
    """Write the job (or reuse it); return the ``analyze`` arguments: NODE=PATH per node folder."""
    args = [f"gpu-{n:02d}={folder / f'gpu-{n:02d}'}" for n in range(NODES)]
    if (folder / ".done").exists():
        return args
    shutil.rmtree(folder, ignore_errors=True)
    for n in range(NODES):
        d = folder / f"gpu-{n:02d}"
        d.mkdir(parents=True)
        for r in range(n * PER_NODE, (n + 1) * PER_NODE):
            with open(d / f"2026-12-02_10:00:00_rank{r}.log", "w") as f:
                f.writelines(_rank_lines(r, random.Random(r)))
    (folder / ".done").write_text("")
    return args


def build(args: list[str], *, thin: bool = True) -> tuple[dict, float]:
    """The report with its timeline, as ``analyze --format html`` builds it; and the seconds it took."""
    from firstfault.analysis import report as report_mod
    from firstfault.analysis.catalog import load_catalog
    from firstfault.analysis.lanes import LaneWatcher
    from firstfault.analysis.reads import scan_needles
    from firstfault.analysis.report import Inputs, build_report
    from firstfault.offline import logfiles

    saved = report_mod.LaneWatcher
    if not thin:
        report_mod.LaneWatcher = functools.partial(LaneWatcher, plain_cap=1 << 30, progress_cap=1 << 30)
    try:
        t = time.perf_counter()
        cat = load_catalog()
        res = logfiles.ReadResult()
        events = logfiles.read_events(logfiles.discover(args), scan_needles(cat), res, tz=None)
        inputs = Inputs(gaps=res.gaps, timeline=True, generated_ns=time.time_ns())
        rep = build_report(_tracking(events, inputs, res), cat, inputs)
        return rep, time.perf_counter() - t
    finally:
        report_mod.LaneWatcher = saved


def _tracking(events, inputs, res):
    yield from events
    inputs.rank_nodes.update(res.rank_nodes)


def chromium():
    """Debian's chromium through Playwright (no browser download), headless, as root without its sandbox."""
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise RuntimeError("no chromium on PATH: apt-get install chromium")
    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
    return pw, browser


def open_page(browser, url: str, *, viewport=(1400, 1000)):
    """A page that may load ``url`` and nothing else; console errors, page errors and refused
    requests are collected in page.problems."""
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    page.problems = []
    page.on("console", lambda m: m.type == "error" and page.problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: page.problems.append(f"pageerror: {e}"))
    allowed = "/".join(url.split("/")[:3]) + "/" if url.startswith("http") else "file://"

    def route(r):
        if r.request.url.startswith(allowed):
            r.continue_()
        else:
            page.problems.append(f"request refused: {r.request.url}")
            r.abort()
    page.route("**/*", route)
    return page


def wait_until(check, timeout_s: float = 30) -> None:
    """Poll ``check()`` from here: the page's policy forbids the eval that wait_for_function needs."""
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            raise TimeoutError("the page did not get there in time")
        time.sleep(0.01)


def redraw(page, act) -> float:
    """Do ``act`` and wait for the swimlanes' next drawing; the milliseconds it took (the page's own count)."""
    n = int(page.get_attribute("#tl-scroll", "data-renders"))
    act()
    wait_until(lambda: int(page.get_attribute("#tl-scroll", "data-renders")) > n)
    return float(page.get_attribute("#tl-scroll", "data-render-ms"))


def draw(browser, path: Path) -> dict:
    """Load the page and measure: navigation to drawn, and three redraws."""
    page = open_page(browser, path.as_uri())
    t = time.perf_counter()
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=120_000)
    ready = time.perf_counter() - t
    out = {"ready_s": ready, "first_render_ms": float(page.get_attribute("#tl-scroll", "data-render-ms"))}
    for name, act in (("show_all_ms", lambda: page.click("#tl-fit")),
                      ("scroll_ms", lambda: page.eval_on_selector("#tl-scroll", "b => { b.scrollTop = b.scrollHeight / 2 }")),
                      ("zoom_in_ms", lambda: page.click("#tl-in"))):
        out[name] = redraw(page, act)
    out["problems"] = page.problems
    page.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from firstfault.reports.html import render_html

    args = make_job(Path(a.out) / "htmljob")
    pw, browser = chromium()
    try:
        for thin in (True, False):
            rep, built = build(args, thin=thin)
            t = time.perf_counter()
            page = render_html(rep)
            rendered = time.perf_counter() - t
            path = Path(a.out) / f"htmljob-{'thinned' if thin else 'all'}.html"
            path.write_text(page, encoding="utf-8")
            tl = rep["timeline"]
            runs = [draw(browser, path) for _ in range(a.runs)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "problems"}
            ff = rep["first_failure"]
            print(f"{'thinned' if thin else 'every event'}: lanes={len(tl['lanes'])} events read={tl['seen']} "
                  f"in page={tl['kept']} build={built:.2f} s render_html={rendered:.2f} s size={len(page) / 1e6:.1f} MB "
                  f"| chromium ready={med['ready_s']:.2f} s first draw={med['first_render_ms']:.0f} ms "
                  f"show all={med['show_all_ms']:.0f} ms scroll={med['scroll_ms']:.0f} ms zoom={med['zoom_in_ms']:.0f} ms "
                  f"(median of {a.runs}) | first failure rank {ff['rank']} {ff['signature']} "
                  f"| problems {sum(len(r['problems']) for r in runs)}", flush=True)
    finally:
        browser.close()
        pw.stop()


if __name__ == "__main__":
    main()
