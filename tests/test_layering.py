"""Layering: the agent never imports the collector; the collector imports from the agent only what
both daemons share (the wire format, the configuration rules, sd_notify,
the launchers' log layouts); the analysis does no
I/O of its own (no open, sockets or subprocesses)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_agent_never_imports_collector():
    for path in (ROOT / "agent").rglob("*.py"):
        bad = {n for n in _imports(path) if n == "collector" or n.startswith("collector.")}
        assert not bad, f"{path} imports {bad}"


# The contract both daemons share; agent.layouts: the launchers' rank-log layouts, which
# the agent follows live and the collector's offline reader walks (one place for them).
SHARED = {"agent.wire", "agent.settings", "agent.sdnotify", "agent.layouts", "agent.prometheus"}


def test_collector_imports_only_the_shared_modules_from_agent():
    for path in (ROOT / "collector").rglob("*.py"):
        bad = {n for n in _imports(path) if (n == "agent" or n.startswith("agent.")) and n not in SHARED}
        assert not bad, f"{path} imports {bad}"


def test_analysis_is_pure():
    io_modules = {"socket", "subprocess", "os", "shutil", "sqlite3", "asyncio", "urllib", "http"}
    for path in (ROOT / "collector" / "analysis").glob("*.py"):
        if path.name == "catalog.py":  # loads its shipped TOML; nothing else
            continue
        tree = ast.parse(path.read_text(), str(path))
        assert not (_imports(path) & io_modules), path
        calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert not calls & {"open", "print", "input"}, f"{path} calls {calls & {'open', 'print', 'input'}}"
