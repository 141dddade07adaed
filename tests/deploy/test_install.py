"""deploy/install.sh into a staging root (--prefix): the venv runs, units, users, directories,
examples, token and Slurm scripts land where the units expect them, the units are enabled, the
installed units verify without a warning, and a second run changes nothing an operator set."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.deploy.test_units import UNITS, analyze, needs_systemd_analyze

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, needs_systemd_analyze,
              pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers missing")]


def install(prefix: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(ROOT / "deploy" / "install.sh"), *args, "--prefix", str(prefix)],
                          capture_output=True, text=True, timeout=900)


def test_install_into_a_prefix_twice(tmp_path):
    p = tmp_path / "root"
    r = install(p, "all")
    assert r.returncode == 0, r.stdout + r.stderr
    ff = p / "opt/firstfault/bin/firstfault"
    out = subprocess.run([str(ff), "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "mark" in out and "collector" in out
    for unit in UNITS:
        assert (p / "etc/systemd/system" / unit).read_text() == (ROOT / "deploy/systemd" / unit).read_text()
        assert os.readlink(p / "etc/systemd/system/multi-user.target.wants" / unit) == f"/etc/systemd/system/{unit}"
    passwd = (p / "etc/passwd").read_text()
    assert "firstfault:x:" in passwd and "firstfault-agent:x:" in passwd
    marks = p / "var/lib/firstfault-agent/marks"
    assert stat.S_IMODE(marks.stat().st_mode) == 0o1733
    token = p / "etc/firstfault/token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text().strip()) >= 40
    for f in ("prolog.sh", "epilog.sh", "mark.sh"):
        assert os.access(p / "opt/firstfault/slurm" / f, os.X_OK)
    # the installed firstfault runs against the installed example configuration
    r = subprocess.run([str(ff), "agent", "--config", str(p / "etc/firstfault/agent.toml"),
                        "--token-file", str(token), "--state-dir", str(tmp_path / "state"), "--check-config"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "configuration ok" in r.stdout, r.stdout + r.stderr

    # the operator edits; a second run (an upgrade) keeps it all
    conf = p / "etc/firstfault/agent.toml"
    conf.write_text(conf.read_text().replace('"head-01:7140"', '"head-02:7140"'))
    before = (conf.read_text(), token.read_text())
    r = install(p, "agent")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (conf.read_text(), token.read_text()) == before
    assert "made a new token" not in r.stdout

    # the units as installed verify without a single warning against the real executable
    shutil.copytree("/usr/lib/systemd/system", p / "usr/lib/systemd/system", symlinks=True, dirs_exist_ok=True)
    kill = p / "bin/kill"  # ExecReload's (the target's own: util-linux or procps)
    kill.parent.mkdir(exist_ok=True)
    kill.write_text("#!/bin/sh\n")
    kill.chmod(0o755)
    v = analyze("verify", f"--root={p}", *UNITS)
    assert (v.returncode, v.stdout + v.stderr) == (0, "")


def test_install_refuses_bad_usage(tmp_path):
    r = install(tmp_path / "root", "everything")
    assert r.returncode == 2 and "install.sh agent|collector|all" in r.stdout
