"""The token file and the constant-time check (firstfault/common/tokens.py)."""

from __future__ import annotations

import hmac

import pytest

from firstfault.common import tokens
from firstfault.common.tokens import accepts, read_tokens


def test_every_line_is_a_token_comments_and_blanks_aside(tmp_path):
    f = tmp_path / "token"
    f.write_text("# rotated 2026-12-02\nnew-token\n\n  old-token  \n")
    assert read_tokens(f, problems := []) == ("new-token", "old-token") and not problems
    assert read_tokens(None, problems) is None and not problems


@pytest.mark.parametrize("text, problem", [
    ("", "is empty"), ("# only a comment\n", "is empty"), ("two words\n", "one token, one word"),
    ("ok\n" + "x" * 257 + "\n", "at most 256 bytes"),
])
def test_bad_token_files_are_named(tmp_path, text, problem):
    f = tmp_path / "token"
    f.write_text(text)
    assert read_tokens(f, problems := []) is None and problem in problems[0]


def test_accepts_any_listed_token_and_nothing_else():
    assert accepts(("a1", "b2"), "a1") and accepts(("a1", "b2"), "b2")
    for wrong in ("", "a", "a1 ", "A1", "b2b2", "a1\n"):
        assert not accepts(("a1", "b2"), wrong)


def test_the_compare_is_constant_time(monkeypatch):
    """Every listed token is compared, each through hmac.compare_digest on two 32-byte
    digests, whatever the given token's length and whether (or where) it matches."""
    calls, real = [], hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)
    monkeypatch.setattr(tokens.hmac, "compare_digest", spy)
    listed = ("first-token", "second-token", "third-token")
    for given in ("first-token", "third-token", "x", "y" * 200, ""):
        calls.clear()
        accepts(listed, given)
        assert calls == [(32, 32)] * 3, given
