"""The ingest port fuzzed while a real agent ships (tests/faults/ingestfuzz.py): a small
run of bench/fuzz_ingest.py. The collector stays up and answers its HTTP API, closes
every bad connection with an error, stays within its memory bound, and the good agent
(SIGKILLed and restarted during the flood) loses and duplicates nothing."""

from __future__ import annotations

import pytest

from tests.faults.ingestfuzz import run

# The collector at rest is ~50 MiB; the fuzz adds decoders and buffers bounded by
# limits.max_inflight_records (100,000 records) and max_frame_bytes per connection.
PEAK_RSS_MIB = 250


@pytest.mark.slow
def test_fuzzed_ingest_port_keeps_the_collector_up_and_the_good_agent_whole(tmp_path):
    f = run(tmp_path, frames=30_000, workers=2, idle=1000, slowloris=5, read_timeout_s=3)
    assert f["frames_sent"] >= 30_000 and f["bombs"] >= 1
    assert f["collector_alive"] and f["collector_tracebacks"] == 0
    assert "train-7" in f["api_jobs"]  # its HTTP API answers (/metrics too)
    assert f["collector_peak_rss_mib"] < PEAK_RSS_MIB, f
    errors = f["collector_errors_by_code"]
    assert errors.get("malformed", 0) > 0 and errors.get("too_large", 0) > 0, errors
    assert f["fuzzer_got"].get("malformed", 0) > 0, f  # the bad connections were told why
    assert f["idle_opened"] == 1000 and f["idle_closed_by_collector"] == 1000, f
    # the first 5 are closed at the 3 s hello timeout; replacements may still be within theirs
    assert f["slowloris_closed_by_collector"] >= 5, f
    assert f["good_lines_written"] > 0
    assert f["good_lines_stored"] == f["good_lines_written"], f
    assert f["good_lines_lost"] == f["good_lines_duplicated"] == 0, f
    assert f["agent_exit"] == 0
