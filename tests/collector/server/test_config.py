"""firstfault/collector/config.py: TOML and flags, every problem at once, the token rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from firstfault.collector import config
from firstfault.collector.config import (
    Address,
    CollectorConfig,
    ConfigError,
    HelpRequested,
    load_config,
    parse_args,
)


def test_defaults():
    cfg, check = parse_args([])
    assert check is False
    assert cfg == CollectorConfig()
    assert str(cfg.listen) == "127.0.0.1:7140" and str(cfg.http) == "127.0.0.1:7141"
    assert cfg.db == "./firstfault.db" and cfg.token is None and not cfg.tls.enabled
    assert cfg.limits.max_batch_records == 10000 and cfg.retention.max_age_days == 30


def test_docstring_example_loads(tmp_path):
    """The whole-file example in the module docstring is valid but for its absent files."""
    toml = re.search(r"file.*?::\n\n(.*?)\n\nFlags", config.__doc__, re.S).group(1)
    path = tmp_path / "collector.toml"
    path.write_text("\n".join(line[4:] for line in toml.splitlines()))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert all("cannot read" in p for p in e.value.problems), e.value.problems
    assert {p.split(":")[0] for p in e.value.problems} == {
        "tls.cert", "tls.key", "tls.client_ca", "token_file", "node_tokens_file"}


def test_file_and_flags_flags_win(tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    path = tmp_path / "c.toml"
    path.write_text(f'''
listen = "0.0.0.0:7140"
db = "/var/lib/ff.db"
token_file = "{tmp_path / 'token'}"
[limits]
read_timeout_s = 30
max_connections = 10
[clock]
ping_interval_s = 5
''')
    cfg, _ = parse_args(["--config", str(path), "--limits-max-connections=20", "--db", "x.db",
                      "--listen", "[::]:9000", "--retention-max-age-days", "7.5"])
    assert cfg.listen == Address("::", 9000) and str(cfg.listen) == "[::]:9000"
    assert cfg.db == "x.db" and cfg.limits.max_connections == 20
    assert cfg.limits.read_timeout_s == 30 and cfg.clock.ping_interval_s == 5
    assert cfg.retention.max_age_days == 7.5
    assert cfg.token == "s3cret" and "s3cret" not in repr(cfg)
    assert "s3cret" not in config.describe(cfg)


def test_every_problem_reported_at_once(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('''
listen = "nowhere"
colour = "blue"
db = "mysql://db"
[limits]
max_connections = "many"
max_batch_records = 20000
read_timeout_s = -1
[tls]
cert = "/no/such.pem"
[retention]
max_age_days = true
[nonsense]
x = 1
''')
    with pytest.raises(ConfigError) as e:
        parse_args(["--config", str(path), "--bogus", "1", "--clock-samples", "zero"])
    text = str(e.value)
    for expected in ("listen: expected HOST:PORT", "colour: unknown key", "db: expected a SQLite",
                     "limits.max_connections: expected an integer",
                     "limits.max_batch_records: expected a value >= 1 and <= 10000",
                     "limits.read_timeout_s: expected a value > 0",
                     "tls: cert and key go together", "tls.cert: cannot read",
                     "retention.max_age_days: expected a number", "nonsense: unknown key",
                     "--bogus: unknown flag", "--clock-samples: expected an integer"):
        assert expected in text, expected
    assert len(e.value.problems) == 12
    assert text.startswith("12 problems in the collector configuration:")


def test_non_loopback_listen_needs_a_token(tmp_path):
    for listen in ("0.0.0.0:7140", "10.1.2.3:7140", "[::]:7140", "headnode:7140"):
        with pytest.raises(ConfigError, match="is not a loopback address: a token is required"):
            parse_args(["--listen", listen])
    for listen in ("127.0.0.1:7140", "localhost:7140", "[::1]:7140", "127.0.0.2:0"):
        assert parse_args(["--listen", listen])[0].token is None
    token = tmp_path / "token"
    token.write_text("abc")
    assert parse_args(["--listen", "0.0.0.0:1", "--token-file", str(token)])[0].token == "abc"


@pytest.mark.parametrize("content, problem", [
    ("", "is empty"), ("   \n", "is empty"), ("two words", "one word"),
    ("x" * 300, "at most 256 bytes"),
])
def test_bad_token_files(tmp_path, content, problem):
    token = tmp_path / "token"
    token.write_text(content)
    with pytest.raises(ConfigError, match=problem):
        parse_args(["--token-file", str(token)])
    with pytest.raises(ConfigError, match="cannot read"):
        parse_args(["--token-file", str(tmp_path / "absent")])


def test_usage_problems():
    with pytest.raises(HelpRequested):
        parse_args(["--listen", "x:1", "--help"])
    with pytest.raises(ConfigError) as e:
        parse_args(["stray", "--db"])
    assert e.value.problems == ["'stray': unexpected argument (every setting is a --flag)",
                                "--db: needs a value"]
    with pytest.raises(ConfigError, match="not valid TOML"):
        bad = Path(__file__).with_suffix(".py")  # Python is not TOML
        load_config(bad)


def test_cross_checks():
    with pytest.raises(ConfigError, match="must exceed clock.ping_interval_s"):
        parse_args(["--limits-read-timeout-s", "5", "--clock-ping-interval-s", "10"])
    with pytest.raises(ConfigError, match="at least limits.max_batch_records"):
        parse_args(["--limits-max-inflight-records", "100"])
    with pytest.raises(ConfigError, match="client_ca needs tls.cert"):
        parse_args(["--tls-client-ca", __file__])


def test_every_key_has_a_flag():
    for table, keys in config._PARSERS.items():
        for key in keys:
            flag = "--" + (f"{table}-" if table else "") + key
            assert flag.replace("_", "-") in config._FLAGS
    assert "--token-file" in config._FLAGS and "--tls-client-ca" in config._FLAGS


def test_postgres_url_is_accepted_by_the_config():
    cfg, _ = parse_args(["--db", "postgres://ff:pw@db.example:5432/firstfault"])
    assert cfg.db_is_url and "pw" not in config.describe(cfg)
