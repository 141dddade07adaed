"""The HTTP API fuzzed (every route and parameter, hostile values, pastes that inflate, bytes
that are not HTTP) against a real collector while a good agent ships and a prober times
/healthz: a short run of bench/fuzz_http.py (tests/collector/httpfuzz.py says what it does)."""

from __future__ import annotations

import pytest

from tests.collector import httpfuzz


@pytest.mark.slow
def test_the_api_holds_under_a_fuzz(tmp_path):
    f = httpfuzz.run(tmp_path, seconds=6, workers=2, seed=7)
    assert f["attacker_failures"] == []
    assert f["requests"] > 100 and set(f["by_route"]) >= {*httpfuzz.ROUTES, "raw"}
    assert f["server_errors"] == [], f["server_errors"]  # no 5xx: every bad value is a 4xx
    assert f["collector_alive"] and f["answers_after"] == [200, 200, 200]
    assert f["tracebacks_in_log"] == 0 and not f["evil_file_written"]
    assert f["agent"]["error"] is None and f["agent"]["acked"] == f["agent"]["batches"] > 20
    h = f["healthz"]
    assert h["failures"] == 0 and h["count"] > 100
    assert h["p99_ms"] < 100, f  # the bound, while attacked
