"""firstfault/agent/config.py: TOML file + flags -> AgentConfig, every problem at once."""

from __future__ import annotations

import pytest

from firstfault.agent.config import ConfigError, describe, load_config, parse_args
from firstfault.common.settings import Address


def write(tmp_path, text: str):
    p = tmp_path / "agent.toml"
    p.write_text(text)
    return str(p)


def test_file_and_flags_and_source_options_typed_from_the_sources_signatures(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    path = write(tmp_path, f'''
node = "gpu-07"
collectors = ["head-01:7140", "head-02:7140"]
token_file = "{token}"
metrics = ""
[spool]
max_bytes = 2097152
fsync = "always"
[sources.cgroup]
interval_s = 2
notify = false
[sources.ranklog]
globs = ["/logs/{{job}}/rank{{rank}}.log"]
''')
    cfg, check = parse_args(["--config", path, "--collector", "10.1.1.1:7140", "--cgroup-interval-s", "0.5",
                             "--ranklog", "/a/rank{rank}.log", "--ranklog", "/b/rank{rank}.log",
                             "--procs-enabled", "false", "--job", "nightly", "--check-config"])
    assert check and cfg.node == "gpu-07" and cfg.token == "s3cret" and cfg.metrics is None
    assert cfg.collectors == (Address("10.1.1.1", 7140),)  # flags win over the file
    assert cfg.spool.max_bytes == 2097152 and cfg.spool.fsync == "always"
    assert dict(cfg.sources["cgroup"].options) == {"interval_s": 0.5, "notify": False}
    assert cfg.sources["ranklog"].options["globs"] == ["/a/rank{rank}.log", "/b/rank{rank}.log"]
    assert cfg.sources["ranklog"].wanted and not cfg.sources["procs"].wanted
    assert cfg.sources["kmsg"].wanted and not cfg.sources["journal"].wanted
    assert "s3cret" not in describe(cfg) and "s3cret" not in repr(cfg)


def test_every_problem_is_listed_at_once(tmp_path):
    path = write(tmp_path, '''
collectors = ["nohost"]
colour = "blue"
sources = 3
[tls]
cert = "/nonexistent/agent.pem"
[spool]
fsync = "sometimes"
''')
    with pytest.raises(ConfigError) as e:
        load_config(path)
    text = str(e.value)
    for problem in ("collectors: expected HOST:PORT", "colour: unknown key",
                    "[sources] must be a table", "tls: cert and key go together",
                    "tls.cert: cannot read /nonexistent/agent.pem",
                    "spool.fsync: expected one of always, interval, never"):
        assert problem in text, text


def test_unknown_sources_options_and_flags(tmp_path):
    path = write(tmp_path, 'collectors = ["127.0.0.1:7140"]\n[sources.gpu]\n[sources.kmsg]\nspeed = 3\n')
    with pytest.raises(ConfigError) as e:
        parse_args(["--config", path, "--kmsg-colour", "x", "--nope"])
    text = str(e.value)
    assert "unknown source 'gpu'" in text and "sources.kmsg.speed: unknown option of source kmsg" in text
    assert "--kmsg-colour: unknown option" in text and "--nope: unknown flag" in text


def test_a_remote_collector_needs_a_token_and_a_collector_is_needed():
    with pytest.raises(ConfigError, match="not a loopback address: a token is required"):
        load_config(None, {(None, "collectors"): ["10.0.0.5:7140"]})
    with pytest.raises(ConfigError, match="collectors: none given"):
        load_config(None, {})


def test_a_ranklog_glob_that_can_never_name_a_job_is_refused_unless_the_agent_has_one():
    """Lines of no job are stored and listed under no job: ``firstfault jobs`` stays empty."""
    base = ["--collector", "127.0.0.1:7140", "--check-config"]
    with pytest.raises(ConfigError) as e:
        parse_args([*base, "--ranklog", "/scratch/jobs/*/rank*.log"])
    assert "'/scratch/jobs/*/rank*.log' can never name a job" in str(e.value) and "--job" in str(e.value)
    for named in ("/scratch/{job}/rank{rank}.log",  # the job's part
                  "/runs/*/attempt_*/*/stderr.log",  # torchrun's run folder names it
                  "/runs/trainrun_k3x9q2ab/attempt_*/*/stdout.log"):
        assert parse_args([*base, "--ranklog", named])[0].sources["ranklog"].wanted
    with pytest.raises(ConfigError):  # a run folder without mkdtemp's suffix names no run id
        parse_args([*base, "--ranklog", "/runs/fixed/attempt_*/*/stdout.log"])
    cfg, _ = parse_args([*base, "--ranklog", "/scratch/jobs/*/rank*.log", "--job", "nightly"])
    assert cfg.job == "nightly"


@pytest.mark.parametrize("given, want", [
    ("localhost:7140", Address("localhost", 7140)), ("tcp://localhost:7150", Address("localhost", 7150)),
    ("http://127.0.0.5:7140/", Address("127.0.0.5", 7140)), ("http://localhost", Address("localhost", 7140)),
    ("[::1]:7140", Address("::1", 7140)), ("http://[::1]:9", Address("::1", 9))])
def test_collector_is_host_port_or_the_url_the_query_commands_take(given, want):
    assert parse_args(["--collector", given])[0].collectors == (want,)


@pytest.mark.parametrize("given", ["head-01", "ftp://head-01:7140", "http://head-01:7140/api", "http://:7140"])
def test_a_collector_in_neither_form_is_one_problem_that_says_both(given):
    with pytest.raises(ConfigError) as e:
        parse_args(["--collector", given])
    assert "HOST:PORT" in str(e.value) and "http://HOST:PORT" in str(e.value) and "loopback" not in str(e.value)
