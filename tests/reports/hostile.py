"""A log whose failure line is hostile: HTML, a closing </details>, Markdown, terminal escapes and
a bidirectional override, inside a real traceback shape (Python's own format)."""

from pathlib import Path

HOSTILE = ("<script>window.__pwned=1</script></details><img src=x onerror=\"window.__pwned=2\">"
           " **bold** [click](http://evil.invalid/x) \x1b[31mRED\x1b[0m \x1b(0lqk\x07 \u202eevil")


def write_hostile_log(folder: Path) -> Path:
    """A two-rank console log (torchrun's [rankN]: prefixes, DeepSpeed's logger stamps) in which
    rank 1 raises a ValueError whose message is HOSTILE."""
    lines = [
        "[2026-12-02 10:00:00,000] [INFO] [logging.py:107:log_dist] [Rank 0] DeepSpeed info: version=0.19.8, "
        "git-hash=unknown, git-branch=unknown",
        "[2026-12-02 10:00:01,000] [INFO] [timer.py:264:stop] epoch=0/micro_step=1/global_step=1, "
        "RunningAvgSamplesPerSec=10.0, CurrSamplesPerSec=10.0, MemAllocated=0.5GB, MaxMemAllocated=0.6GB",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/work/train.py", line 10, in <module>',
        "[rank1]:     main()",
        '[rank1]:   File "/work/train.py", line 7, in main',
        "[rank1]:     raise ValueError(msg)",
        f"[rank1]: ValueError: {HOSTILE}",
        "[2026-12-02 10:00:02,000] [INFO] [logging.py:107:log_dist] [Rank 0] after the failure",
    ]
    path = folder / "console.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
