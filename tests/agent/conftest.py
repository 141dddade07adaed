"""Agent tests that need a collector use the ingest server's test helpers."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "collector" / "server"))
