"""Records as the agent ships them from a rank log or a kernel log: for the tests that compare a
report over records with the report over the files."""

from pathlib import Path

from firstfault.analysis import traceback as tb
from firstfault.analysis.kernel import parse_kernel_log
from firstfault.wire import Record


def ship_file(path: Path, node: str, rank: int | None, seq0: int) -> list[Record]:
    """One record per line, one per traceback (what the agent's ranklog source sends: its
    tracebacks by the grammar of firstfault/analysis/traceback.py, one prefix at a time)."""
    out: list[Record] = []
    lines = path.read_text(errors="replace").splitlines()
    mtime = path.stat().st_mtime_ns
    i = 0
    while i < len(lines):
        text = lines[i]
        prefix, body = tb.split_prefix(text)
        at = tb.opening(tb.visible(body))
        if at is not None:
            g, j = tb.Grammar(tb.visible(body)[at:]), i + 1
            while j < len(lines):
                p, b = tb.split_prefix(lines[j])
                if p != prefix or g.feed(tb.visible(b)) == tb.END:
                    break
                j += 1
            while j - 1 > i and not tb.split_prefix(lines[j - 1])[1].strip():  # held blank lines
                j -= 1
            text, kind, i = "\n".join(lines[i:j]), "rank.traceback", j
        else:
            kind, i = "rank.line", i + 1
        out.append(Record(node=node, stream="s-" + path.name, seq=seq0 + len(out), source="ranklog", kind=kind,
                          message=text, observed_ns=mtime, rank=rank, fields={"path": str(path)}))
    return out


def ship_kernel(path: Path, node: str, boot_ns: int) -> list[Record]:
    return [Record(node=node, stream="kmsg", seq=ev.seq, source="kmsg", kind="kernel.line", message=ev.text,
                   occurred_ns=ev.occurred_ns, observed_ns=ev.occurred_ns, mono_ns=ev.fields.get("mono_ns"))
            for ev in parse_kernel_log(path.read_text().splitlines(), fmt="kmsg", boot_wall_ns=boot_ns)]
