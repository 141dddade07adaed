"""What `pip install .` puts into site-packages: one import package, `firstfault`, with its data
file, the console script, and the metadata a user of PyPI expects (built wheel, read as pip
reads it). Slow: builds the wheel."""

from __future__ import annotations

import email
import subprocess
import sys
import zipfile

import pytest

import firstfault
from tests.readme import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(out)],
                   check=True, capture_output=True, timeout=600)
    (path,) = out.glob("firstfault-*.whl")
    with zipfile.ZipFile(path) as z:
        yield z


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


def test_only_firstfault_goes_into_site_packages(wheel):
    record = _dist_info(wheel, "RECORD")
    tops = {line.split(",", 1)[0].split("/", 1)[0] for line in record.splitlines() if line}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"firstfault"}
    names = set(wheel.namelist())
    assert "firstfault/analysis/signatures/99-fallback.toml" in names and "firstfault/__main__.py" in names
    assert not any(n.startswith("tests/") for n in names)


def test_metadata_a_pypi_user_expects(wheel):
    meta = email.message_from_string(_dist_info(wheel, "METADATA"))
    assert meta["Name"] == "firstfault" and meta["Version"] == firstfault.__version__
    assert meta["License-Expression"] == "Apache-2.0" and meta["License-File"] == "LICENSE"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel.namelist())
    classifiers = meta.get_all("Classifier")
    assert "Operating System :: POSIX :: Linux" in classifiers and "Programming Language :: Python :: 3.11" in classifiers
    assert meta["Requires-Python"] == ">=3.11"
    extras = set(meta.get_all("Provides-Extra"))
    assert {"nvml", "journal", "postgres", "test", "realjobs"} <= extras
    assert "firstfault = firstfault.cli:main" in _dist_info(wheel, "entry_points.txt")


def test_version_from_one_place():
    out = subprocess.run([sys.executable, "-m", "firstfault", "--version"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"firstfault {firstfault.__version__}"
    assert 'dynamic = ["version"]' in (ROOT / "pyproject.toml").read_text()
