"""The import rules of the one ``firstfault`` package (ARCHITECTURE.md), checked on the source.

Each part of the package may import only the parts listed for it in ALLOWED; the check
follows imports through other firstfault modules too (a module's whole closure), so an
indirect import breaks it as a direct one does. The analysis is pure: nothing in its
closure imports an I/O module or calls open/print/input (the catalog reads its own
shipped TOML through importlib.resources, and nothing else).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "firstfault"

# part -> the parts it may import (itself always); a part is a top-level module or subpackage
ALLOWED = {
    "wire": set(),
    "wiredecode": {"wire"},
    "common": {"wire"},
    "analysis": {"wire"},
    "reports": {"analysis", "wire"},
    "offline": {"analysis", "reports", "common", "wire"},
    "agent": {"analysis", "common", "wire", "wiredecode"},
    "collector": {"analysis", "reports", "common", "wire", "wiredecode"},
    "demo": set(),  # starts the daemons as processes, imports none of them
    "demo_rank": set(),
    "__init__": set(),
}
ENTRY_POINTS = {"cli", "__main__"}  # know every command; nothing imports them
IO_MODULES = {"socket", "subprocess", "os", "shutil", "sqlite3", "asyncio", "urllib", "http", "io",
              "tempfile", "select", "selectors", "threading", "fcntl", "mmap", "gzip", "zipfile"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The firstfault module that ``import name`` loads (a package's __init__, or a module)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


@cache
def _imports(mod: str) -> tuple[frozenset[str], frozenset[str]]:
    """(firstfault modules, other top-level modules) that ``mod`` imports anywhere in its body."""
    tree = ast.parse(MODULES[mod].read_text(), str(MODULES[mod]))
    ours, others = set(), set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{mod}: relative import (the package uses absolute imports)"
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for n in names:
            if n == "firstfault" or n.startswith("firstfault."):
                if (r := _resolve(n)) and r != mod:
                    ours.add(r)
            else:
                others.add(n.split(".")[0])
    return frozenset(ours), frozenset(others)


def _closure(mod: str) -> set[str]:
    seen, todo = set(), [mod]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(_imports(m)[0])
    return seen


def _part(mod: str) -> str:
    rest = mod.split(".")[1:]
    return rest[0] if rest else "__init__"


def test_every_module_belongs_to_a_known_part():
    unknown = {m for m in MODULES if _part(m) not in ALLOWED and _part(m) not in ENTRY_POINTS}
    assert not unknown, f"add these to ALLOWED with their rules: {unknown}"


def test_parts_import_only_what_they_may_directly_and_indirectly():
    bad = []
    for mod in MODULES:
        part = _part(mod)
        if part in ENTRY_POINTS:
            continue
        for dep in _closure(mod) - {mod}:
            dpart = _part(dep)
            if dpart in ENTRY_POINTS or (dpart != part and dpart not in ALLOWED[part] and dep != "firstfault"):
                bad.append(f"{mod} -> {dep}")
    assert not bad, "imports across the layering rules:\n" + "\n".join(sorted(bad))


def test_nothing_imports_the_entry_points():
    for mod in MODULES:
        if _part(mod) not in ENTRY_POINTS:
            assert not {d for d in _imports(mod)[0] if _part(d) in ENTRY_POINTS}, mod


def test_agent_and_collector_never_meet():
    for mod in MODULES:
        parts = {_part(m) for m in _closure(mod)}
        if _part(mod) not in ENTRY_POINTS:
            assert not {"agent", "collector"} <= parts, f"{mod} reaches both daemons"


def test_analysis_is_pure_through_its_whole_closure():
    for mod in (m for m in MODULES if _part(m) in ("analysis", "reports")):
        for dep in _closure(mod):
            others = _imports(dep)[1]
            assert not others & IO_MODULES, f"{mod} reaches {dep}, which imports {others & IO_MODULES}"
            tree = ast.parse(MODULES[dep].read_text())
            calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
            bad = calls & {"open", "print", "input"}
            assert not bad, f"{dep} calls {bad}"


def test_the_check_sees_a_violation(tmp_path, monkeypatch):
    """The rules bite: a fake analysis module importing an offline one is caught indirectly."""
    (tmp_path / "a.py").write_text("from firstfault.analysis import b\n")
    (tmp_path / "b.py").write_text("from firstfault.offline import logfiles\n")
    fake = {**MODULES, "firstfault.analysis.a": tmp_path / "a.py", "firstfault.analysis.b": tmp_path / "b.py"}
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "MODULES", fake)
    _imports.cache_clear()
    try:
        assert "firstfault.offline.logfiles" in _closure("firstfault.analysis.a")
        assert _part("firstfault.offline.logfiles") not in ALLOWED["analysis"]
    finally:
        _imports.cache_clear()
