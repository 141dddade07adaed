"""[notify] and [[notify.target]] in collector.toml: every problem at once, secrets kept out
of repr and the start-up line (tests/deploy/test_units.py loads the shipped example)."""

from __future__ import annotations

import pytest

from firstfault.collector.config import ConfigError, describe, load_config


def write(tmp_path, text):
    p = tmp_path / "collector.toml"
    p.write_text(text)
    return p


def test_targets_of_every_type_with_filters(tmp_path):
    (tmp_path / "secret").write_text("k3y\n")
    cfg = load_config(write(tmp_path, f'''
[notify]
quiet_s = 5
[[notify.target]]
name = "ops"
type = "webhook"
url = "https://hooks.example.com/x"
secret_file = "{tmp_path / 'secret'}"
categories = ["hardware"]
min_confidence = "medium"
[[notify.target]]
name = "chat"
type = "slack"
url = "https://hooks.slack.com/services/T/B/XYZ"
signatures = ["kernel.*"]
job = "^prod-"
[[notify.target]]
name = "pager"
type = "command"
command = ["/bin/cat"]
'''))
    ops, chat, pager = cfg.notify.target
    assert ops.secret == b"k3y" and ops.filter.categories == ("hardware",) and ops.filter.min_confidence == "medium"
    assert chat.filter.signatures == ("kernel.*",) and chat.filter.job == "^prod-"
    assert pager.command == ("/bin/cat",) and cfg.notify.quiet_s == 5
    shown = repr(cfg) + describe(cfg)
    assert "XYZ" not in shown and "k3y" not in shown and "hooks.example" not in shown
    assert "notify.targets=ops:webhook,chat:slack,pager:command" in describe(cfg)


def test_every_problem_of_every_target_is_reported(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, '''
[notify]
quiet_s = 0
[[notify.target]]
type = "webhook"
[[notify.target]]
name = "b"
type = "pager"
[[notify.target]]
name = "c"
type = "command"
url = "http://x"
colour = "red"
categories = ["gpu"]
job = "("
min_confidence = "certain"
'''))
    text = str(e.value)
    for want in ("notify.quiet_s", "notify.target[0].url: required for type webhook", "notify.target[1].type",
                 "notify.target[2].command: required", "notify.target[2].url: not for type command",
                 "notify.target[2].colour: unknown key", "notify.target[2].categories",
                 "notify.target[2].job: not a regular expression", "notify.target[2].min_confidence"):
        assert want in text, want


def test_postgres_with_targets_needs_a_queue_dir(tmp_path):
    with pytest.raises(ConfigError, match="notify.queue_dir: required with a PostgreSQL db"):
        load_config(write(tmp_path, '''
db = "postgresql://u@h/d"
[[notify.target]]
type = "command"
command = ["true"]
'''))


def test_check_config_names_a_queue_folder_it_cannot_write(tmp_path):
    from firstfault.collector.daemon import check_config

    (tmp_path / "a-file").write_text("")
    cfg = load_config(write(tmp_path, f'''
db = "{tmp_path / 'c.db'}"
[notify]
queue_dir = "{tmp_path / 'a-file' / 'q'}"
[[notify.target]]
type = "command"
command = ["true"]
'''))
    with pytest.raises(ConfigError, match=r"notify.queue_dir .*a-file/q: cannot write in .*a-file"):
        check_config(cfg)
