"""Every command in every README is run by a test, as written.

RUN_BY names, for each command of a README's ```sh blocks (tests/readme.py), the test that
runs it; that test reads the command from the README itself. A command added to a README
without a test here fails test_every_readme_command_is_run_by_a_test. The offline examples
run here; the others need a fresh machine or systemd and run in tests/deploy (slow, in CI).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

from tests.readme import ROOT, all_commands, command

README, OOM_README = ROOT / "README.md", ROOT / "examples" / "oom-kill" / "README.md"
DEPLOY = "tests.deploy.test_readme_commands"

RUN_BY = {
    ("README.md", "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/firstfault demo"):
        f"{DEPLOY}::test_the_main_job_command_on_stock_debian",  # and test_the_main_job_command_here
    ("README.md", "bash .ci/run"):  # what CI runs on a clean machine: the whole suite; in the container, the quick one
        f"{DEPLOY}::test_the_test_command_on_stock_debian",
    ("README.md", "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"):
        f"{DEPLOY}::test_the_quick_test_command_in_a_fresh_venv",
    ("README.md", "firstfault analyze examples/oom-kill --kernel examples/oom-kill/kmsg.txt --kernel-boot-time "
                  "1796326759.5386636 --checkpoint-dir examples/oom-kill/checkpoints"):
        "tests.test_readme::test_the_offline_examples_run_as_written",
    ("examples/oom-kill/README.md", "firstfault analyze examples/oom-kill --kernel examples/oom-kill/kmsg.txt "
                                    "--kernel-boot-time 1796326759.5386636"):
        "tests.test_readme::test_the_offline_examples_run_as_written",
    ("examples/oom-kill/README.md", "firstfault analyze examples/oom-kill --kernel examples/oom-kill/kmsg.txt "
                                    "--kernel-boot-time 1796326759.5386636 --checkpoint-dir examples/oom-kill/checkpoints"):
        "tests.test_readme::test_the_offline_examples_run_as_written",
    ("README.md", "firstfault compare tests/data/compare/retry-0-zero3-probe-fails "
                  "tests/data/compare/retry-1-zero2-fixed --before-checkpoint-dir "
                  "tests/data/compare/retry-0-zero3-probe-fails/checkpoints --after-checkpoint-dir "
                  "tests/data/compare/retry-1-zero2-fixed/checkpoints"):
        "tests.test_readme::test_the_compare_example_runs_as_written",
    ("README.md", "head -c 32 /dev/urandom | base64 > deploy/kubernetes/token"):
        "tests.deploy.test_kubernetes::test_the_readmes_token_command_makes_a_token_the_daemons_take",
    # need a container engine and a cluster (none here); tests/deploy/test_kubernetes.py validates
    # what they build and apply
    ("README.md", "docker build -f deploy/kubernetes/Dockerfile -t firstfault:0.2.0 ."): None,
    ("README.md", "kubectl apply -k deploy/kubernetes"): None,
    **{("README.md", c): f"{DEPLOY}::test_the_operators_commands_on_stock_debian" for c in (
        "deploy/install.sh collector --start",
        "deploy/install.sh agent",
        "firstfault agent --config /etc/firstfault/agent.toml --check-config",
        "systemctl restart firstfault-agent",
        "firstfault jobs",
        "firstfault report 4242",
        "firstfault timeline 4242 --node gpu-07 --since 2026-12-02T10:00:00Z --grep Xid --node-context",
        "firstfault report 4242 --bundle 4242.tar.gz",
    )},
}


def test_every_readme_command_is_run_by_a_test():
    found = all_commands()
    assert found == set(RUN_BY), (f"not covered: {sorted(found - set(RUN_BY))}; "
                                  f"no longer in a README: {sorted(set(RUN_BY) - found)}")
    for target in filter(None, RUN_BY.values()):
        module, _, name = target.partition("::")
        assert callable(getattr(importlib.import_module(module), name, None)), target


def _run(cmd: str) -> subprocess.CompletedProcess:
    """``cmd`` as a shell runs it in the repository root, with this Python's scripts first on PATH."""
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _offline_examples() -> list[str]:
    return [command(README, "firstfault analyze examples/oom-kill"),
            *(c for path, c in sorted(all_commands()) if path == "examples/oom-kill/README.md")]


@pytest.mark.parametrize("cmd", _offline_examples())
def test_the_offline_examples_run_as_written(cmd):
    """The OOM-kill example names rank 1, killed by the kernel in its optimizer step, whichever README
    gives the command; global_step4 is safe to resume from."""
    r = _run(cmd + " --format json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    first = rep["first_failure"]
    assert first["signature"] == "kernel.memcg_oom_kill"
    assert (first["rank"], first["category"], rep["blame"]) == (1, "host-memory", "resources")
    text = _run(cmd)
    assert text.returncode == 0 and "rank 1" in text.stdout
    assert first["phase"] == "optimizer-step"
    assert (rep["checkpoint"]["verdict"], rep["checkpoint"]["resume_from"]) == ("safe", "global_step4")


def test_the_compare_example_runs_as_written():
    """The README's compare example says FIXED (exit 0) and shows the output the README quotes."""
    r = _run(command(README, "firstfault compare tests/data/compare/"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("FIXED: BEFORE's first failure is gone on every rank and AFTER got past it.")
    quoted = README.read_text().split("```text\nFIXED:", 1)[1].split("…", 1)[0]
    assert ("FIXED:" + quoted).strip() in r.stdout
