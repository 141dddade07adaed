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
                             "--procs-enabled", "false", "--check-config"])
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
