"""deploy/: the example configurations load and document every option; the systemd units pass
`systemd-analyze verify` with no warning at all and `systemd-analyze security` under the
exposure levels the README promises."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from firstfault.agent import config as agent_config
from firstfault.agent.sources import base as sources
from firstfault.collector import config as collector_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = ("firstfault-agent.service", "firstfault-collector.service")
# The exposure levels README.md promises (systemd-analyze security, 0 safest .. 10).
THRESHOLD = {"firstfault-agent.service": 30, "firstfault-collector.service": 15}  # tenths: 3.0, 1.5

needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                           reason="systemd-analyze missing (apt install systemd)")


def _keys(text: str) -> set[str]:
    """Every key the file sets or shows in a comment (``# key = ...``), as table.key."""
    keys, table = set(), ""
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        if m := re.fullmatch(r"\[([\w.]+)\]", line):
            table = m.group(1) + "."
        elif m := re.match(r"(\w+) = ", line):
            keys.add(table + m.group(1))
    return keys


def _fields(cls, prefix: str = "") -> set[str]:
    out = set()
    for f in dataclasses.fields(cls):
        if f.name in ("token", "tokens", "node_tokens", "sources"):  # read from the token files; tables of their own
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default) and type(default).__name__.endswith("Config"):  # a table
            out |= _fields(type(default), f"{f.name}.")
        else:
            out.add(prefix + f.name)
    return out


@pytest.fixture
def token(tmp_path) -> str:
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    return str(path)


def test_the_agent_example_loads_and_documents_every_option(token):
    cfg, check = agent_config.parse_args(["--config", str(DEPLOY / "agent.toml"), "--token-file", token])
    assert not check and cfg.token == "s3cret"
    assert [str(a) for a in cfg.collectors] == ["head-01:7140"]
    assert str(cfg.state_dir) == agent_config.DEFAULT_STATE_DIR
    keys = _keys((DEPLOY / "agent.toml").read_text())
    want = _fields(agent_config.AgentConfig)
    for name in sources.names():
        want |= {f"sources.{name}.enabled"} | {
            f"sources.{name}.{k}" for k in agent_config.source_options(sources.get(name))}
    assert want - keys == set(), "options missing from deploy/agent.toml"
    assert keys - want == set(), "deploy/agent.toml shows options that do not exist"


def test_the_collector_example_loads_and_documents_every_option(token):
    cfg, _ = collector_config.parse_args(["--config", str(DEPLOY / "collector.toml"), "--token-file", token])
    assert str(cfg.listen) == "0.0.0.0:7140" and cfg.db == "/var/lib/firstfault/firstfault.db"
    keys = _keys((DEPLOY / "collector.toml").read_text())
    want = _fields(collector_config.CollectorConfig)
    assert want - keys == set(), "options missing from deploy/collector.toml"
    assert keys - want == set(), "deploy/collector.toml shows options that do not exist"


def test_units_and_install_agree_on_paths():
    agent = (DEPLOY / "systemd" / UNITS[0]).read_text()
    collector = (DEPLOY / "systemd" / UNITS[1]).read_text()
    assert f"StateDirectory={Path(agent_config.DEFAULT_STATE_DIR).name}\n" in agent
    assert "StateDirectory=firstfault\n" in collector and "/var/lib/firstfault/" in (DEPLOY / "collector.toml").read_text()
    tmpfiles = (DEPLOY / "tmpfiles.d" / "firstfault.conf").read_text()
    assert f"d {agent_config.DEFAULT_STATE_DIR}/marks 1733 firstfault-agent firstfault-agent -" in tmpfiles
    for unit in (agent, collector):
        assert "Type=notify" in unit and "WatchdogSec=" in unit and "Restart=on-failure" in unit


def verify_root(tmp_path: Path) -> Path:
    """A root for `systemd-analyze --root`: this machine's system units plus ours, and an
    executable at /opt/firstfault/bin/firstfault (verify checks that ExecStart= exists)."""
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    for unit in UNITS:
        shutil.copy(DEPLOY / "systemd" / unit, root / "etc/systemd/system" / unit)
    for name in ("opt/firstfault/bin/firstfault", "bin/kill"):  # what ExecStart/ExecReload run
        exe = root / name
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    return root


def analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=120)


@needs_systemd_analyze
def test_units_verify_without_a_single_warning(tmp_path):
    root = verify_root(tmp_path)
    r = analyze("verify", f"--root={root}", *UNITS)
    # verify exits 0 on warnings (an unknown key, a bad value): any output is a failure
    assert (r.returncode, r.stdout + r.stderr) == (0, "")
    # ... and the check is real: a warning does show up
    bad = root / "etc/systemd/system" / UNITS[0]
    bad.write_text(bad.read_text().replace("RestartSec=2", "RestartSec=2\nRestartSecs=2"))
    assert "Unknown key 'RestartSecs'" in analyze("verify", f"--root={root}", UNITS[0]).stderr


@needs_systemd_analyze
@pytest.mark.parametrize("unit", UNITS)
def test_units_exposure_is_at_most_what_the_readme_promises(tmp_path, unit):
    root = verify_root(tmp_path)
    r = analyze("security", "--offline=yes", f"--root={root}", f"--threshold={THRESHOLD[unit]}", unit)
    level = re.search(rf"Overall exposure level for {re.escape(unit)}: ([\d.]+)", r.stdout)
    assert level, r.stdout[-2000:] + r.stderr
    assert r.returncode == 0, f"{unit}: exposure {level.group(1)} > {THRESHOLD[unit]}"
    assert f"--threshold={THRESHOLD[unit]}" in (ROOT / "README.md").read_text()
