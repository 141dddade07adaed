"""The README's commands, run as written, where a new user or an operator runs them.

- The main job, on a stock Debian 12 (a debootstrap tree booted with systemd-nspawn, with only
  Debian's python3 and python3-venv, no pip, no git: the tree is copied in as a clone has it),
  as root in the tree: the demo's report names the failed rank (2).
- The test command (``bash .ci/run``) on the same stock Debian 12, as root, as CI runs it: it
  installs the system packages and makes its own virtual environment with everything the suite
  needs; the suite inside is limited to the quick selection (FIRSTFAULT_CI_TESTS), which passes.
- The main job and the quick-test command on this machine (CI's kind), each in a copy of the
  tree with the fresh virtual environment the command makes: the report names rank 2; the
  fast suite passes with only the [test] extra.
- The operators' commands in the same kind of container, named gpu-07 with head-01 resolving
  to itself: install.sh for the collector and the agent, the agent's --check-config, the
  restart, then after a job (4242) that logs a traceback on rank 2 and a kernel Xid line on
  the node: jobs, report, timeline, bundle.

Each command comes from README.md (tests/readme.py), never from a copy. Slow (minutes: pip
installs from the package index); the containers need root, systemd-container, debootstrap.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shlex
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from tests.deploy.nspawn import Container, missing_tools
from tests.readme import ROOT, command

README = ROOT / "README.md"
REAL = ROOT / "tests" / "data" / "real" / "deepspeed-exception-rank2-of-4"
TREE = "/root/firstfault"
# Where the package index is reached through a TLS proxy, the host's CA bundle says whom to trust
# (pip's own bundle does not know the proxy); the container gets it as PIP_CERT. Elsewhere nothing.
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# Where this kind of machine keeps wheels for pip on disk (torch's CPU build among them); elsewhere
# the command finds torch as a user's machine would.
LOCAL_WHEELS = Path("/opt/wheels")

pytestmark = [pytest.mark.slow]
in_a_container = pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))


def _clone_tar(dest: Path) -> Path:
    """The tracked files of this checkout (what `git clone` gives a user), as a tar file."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    out = dest / "tree.tar"
    with tarfile.open(out, "w") as tar:
        for name in filter(None, files.decode().split("\0")):
            if (ROOT / name).is_file():
                tar.add(ROOT / name, arcname=name)
    return out


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("readme")
    _clone_tar(tmp)
    binds_ro = {str(tmp): "/mnt/clone", **({str(HOST_CA): "/mnt/host-ca.crt"} if HOST_CA.exists() else {})}
    c = Container(f"ff-readme-{uuid.uuid4().hex[:8]}", tmp / "console.log", binds=("/dev/kmsg",),
                  binds_ro=binds_ro)
    try:
        c.run("hostname gpu-07")  # the tree's /etc/hostname is the host's
        c.run(f"mkdir -p {TREE} && tar -xf /mnt/clone/tree.tar -C {TREE}")
        yield c
    finally:
        c.stop()


def _in_tree(box: Container, cmd: str, timeout: float, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess:
    env = {**({"PIP_CERT": "/mnt/host-ca.crt"} if HOST_CA.exists() else {}), **(env or {})}
    return box.run(f"cd {TREE} && {cmd}", check=False, timeout=timeout, env=env)


@pytest.fixture
def fresh_box(tmp_path):
    """Another stock Debian 12 for the test command, which installs system packages: the tree
    copied in, and where this machine keeps wheels on disk for pip (the CPU torch), those. No
    /dev/kmsg (nspawn gives none): the tests that need it skip, as in a user's container."""
    _clone_tar(tmp_path)
    binds_ro = {str(tmp_path): "/mnt/clone", **({str(HOST_CA): "/mnt/host-ca.crt"} if HOST_CA.exists() else {}),
                **({str(LOCAL_WHEELS): "/mnt/wheels"} if LOCAL_WHEELS.is_dir() else {})}
    c = Container(f"ff-ci-{uuid.uuid4().hex[:8]}", tmp_path / "console.log", binds_ro=binds_ro)
    try:
        c.run(f"mkdir -p {TREE} && tar -xf /mnt/clone/tree.tar -C {TREE}")
        yield c
    finally:
        c.stop()


@pytest.mark.root
@in_a_container
def test_the_test_command_on_stock_debian(fresh_box):
    cmd = command(README, "bash .ci/run")
    assert fresh_box.run("python3 -m pip --version", check=False).returncode != 0  # no pip, as Debian ships it
    # and no venv module either, as a minimal install has it: the command installs what it needs
    fresh_box.run("DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq python3-venv python3.11-venv")
    assert fresh_box.run("python3 -m venv /tmp/v", check=False).returncode != 0
    env = {"CI": "true", "FIRSTFAULT_CI_TESTS": "-q -rs",
           **({"PIP_FIND_LINKS": "/mnt/wheels"} if LOCAL_WHEELS.is_dir() else {})}
    r = _in_tree(fresh_box, cmd, timeout=3000, env=env)
    out = r.stdout.splitlines()
    assert r.returncode == 0, f"{cmd!r} exited {r.returncode}\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert re.search(r"^\d+ passed", out[-1]) and "failed" not in out[-1] and "error" not in out[-1], out[-40:]
    # the suite ran in the environment the command made, with the CPU build of torch
    torch = fresh_box.run(f"{TREE}/.venv/bin/python -c 'import torch, firstfault; print(torch.__version__, "
                          "torch.cuda.is_available(), firstfault.__file__)'").stdout.split()
    assert torch[1:] == ["False", f"{TREE}/firstfault/__init__.py"] and (
        "+cpu" in torch[0] or not LOCAL_WHEELS.is_dir()), torch


@pytest.mark.root
@in_a_container
def test_the_main_job_command_on_stock_debian(box):
    cmd = command(README, "python3 -m venv .venv && .venv/bin/pip install . ")
    # what a new user meets first: Debian's python3 has no pip and refuses system installs
    assert box.run("python3 -m pip --version", check=False).returncode != 0
    r = _in_tree(box, cmd, timeout=900)
    assert r.returncode == 0, f"{cmd!r} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert re.search(r"^FIRST FAILURE of job demo-\w+: rank 2 on gpu-07$", r.stdout, re.M), r.stdout[-3000:]
    assert "firstfault demo: " in r.stderr


def _copy_of_the_tree(tmp_path: Path) -> Path:
    with tarfile.open(_clone_tar(tmp_path)) as tar:
        tar.extractall(tmp_path / "tree", filter="data")
    return tmp_path / "tree"


def _as_this_python(cmd: str) -> str:
    """The same interpreter that runs this suite stands for the user's python3."""
    return cmd.replace("python3 -m venv", f"{shlex.quote(sys.executable)} -m venv", 1)


def test_the_main_job_command_here(tmp_path):
    """On this kind of machine (CI's), from a copy of the tree: the report names rank 2."""
    cmd = _as_this_python(command(README, "python3 -m venv .venv && .venv/bin/pip install . "))
    r = subprocess.run(["bash", "-c", cmd], cwd=_copy_of_the_tree(tmp_path), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"^FIRST FAILURE of job demo-\w+: rank 2 on ", r.stdout, re.M), r.stdout[-3000:]


def test_the_quick_test_command_in_a_fresh_venv(tmp_path):
    """The fast suite from a copy of the tree, in a virtual environment the command makes itself."""
    cmd = _as_this_python(command(README, "python3 -m venv .venv && .venv/bin/pip install -e '.[test]'"))
    r = subprocess.run(["bash", "-c", cmd + " -q -x -p no:cacheprovider"], cwd=_copy_of_the_tree(tmp_path),
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert re.search(r"\d+ passed", r.stdout) and " failed" not in r.stdout.splitlines()[-1]


def _rank2_traceback() -> str:
    """Rank 2's traceback as the real job printed it (its DeepSpeed rank log)."""
    log = next((REAL / "logs").glob("*_rank2.log")).read_text()
    start = log.index("Traceback (most recent call last):")
    return log[log.rfind("\n", 0, start) + 1:].rstrip("\n") + "\n"


@pytest.mark.root
@in_a_container
def test_the_operators_commands_on_stock_debian(box, tmp_path):
    box.run("grep -q head-01 /etc/hosts || echo '127.0.0.1 head-01' >> /etc/hosts")
    for prefix in ("deploy/install.sh collector", "deploy/install.sh agent"):
        cmd = command(README, prefix)
        r = _in_tree(box, cmd, timeout=600)
        assert r.returncode == 0, f"{cmd!r}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
    # Configure, as the README says: the rank logs' globs (collectors = head-01:7140 is the default)
    box.run("sed -i 's|^globs = \\[\\].*|globs = [\"/scratch/{job}/rank{rank}.log\"]|' /etc/firstfault/agent.toml")
    for prefix in ("firstfault agent --config", "systemctl restart firstfault-agent"):
        cmd = command(README, prefix)
        r = _in_tree(box, cmd, timeout=120)
        assert r.returncode == 0, f"{cmd!r}: {r.stdout}{r.stderr}"
    box.wait_for("the agent connected", lambda: "shipping to" in box.show(
        "firstfault-agent.service", "StatusText")["StatusText"])

    # job 4242 on gpu-07: a start mark, rank 2's real traceback, an Xid line in the kernel log
    box.run("firstfault mark start --job 4242 --nodes gpu-07 && mkdir -p /scratch/4242")
    box.run("echo 'step 1 started' >> /scratch/4242/rank0.log")
    tb = _rank2_traceback()
    box.run(f"printf %s {shlex.quote(tb)} >> /scratch/4242/rank2.log")
    xid = f"NVRM: Xid (PCI:0000:3b:00): 79, pid=999999, name=python, GPU has fallen off the bus. {uuid.uuid4().hex}"
    with open("/dev/kmsg", "w") as f:
        f.write(xid + "\n")
    box.run("firstfault mark end --job 4242")

    # the Xid names no process of the job (pid 999999): node context, in the job's lifetime on its node
    timeline_cmd = command(README, "firstfault timeline 4242 --node gpu-07")
    box.wait_for("the Xid line in job 4242's timeline",
                 lambda: xid in _in_tree(box, timeline_cmd, timeout=60).stdout, timeout=90)
    # a traceback leaves the agent once a second has passed with no line to add to it
    box.wait_for("rank 2's traceback at the collector", lambda: "ValueError: feature vector has 17 columns" in box.run(
        "firstfault timeline 4242 --rank 2", check=False).stdout, timeout=60)
    jobs = _in_tree(box, command(README, "firstfault jobs"), timeout=60)
    assert jobs.returncode == 0 and re.search(r"^4242\s", jobs.stdout, re.M), jobs.stdout + jobs.stderr
    cmd = command(README, "firstfault report 4242")
    text = _in_tree(box, cmd, timeout=60)
    whole = box.run("firstfault timeline 4242", check=False).stdout
    assert text.returncode == 0 and "rank 2" in text.stdout, f"{text.stdout}{text.stderr}\ntimeline:\n{whole}"
    rep = json.loads(_in_tree(box, cmd + " --format json", timeout=60).stdout)
    assert rep["job"] == "4242" and rep["ranks"]["2"]["node"] == "gpu-07"
    assert "ValueError: feature vector has 17 columns" in rep["ranks"]["2"]["first_error"]["text"]
    bundle = _in_tree(box, command(README, "firstfault report 4242 --bundle"), timeout=60)
    assert bundle.returncode == 0, bundle.stderr
    data = box.run(f"base64 -w0 {TREE}/4242.tar.gz").stdout
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(data))) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"report.md", "report.json"} <= names, names
