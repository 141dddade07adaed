"""The shared secret between agents, collector and the query API: the token file and the check.

A token file holds one token a line (blank lines and lines starting with ``#`` ignored),
each one word of at most 256 bytes. An agent sends the first; the collector (ingest
and HTTP API) accepts any of them, so a token can be rotated without a restart:

1. add the new token as a second line on the collector, reload it (SIGHUP);
2. give every agent the new token (first line), reload them (SIGHUP);
3. remove the old line on the collector, reload it: connections still using the old
   token are closed, and agents that kept it are refused until they have the new one.

A node token file (the collector's ``node_tokens_file``) binds node names to tokens: one
``NODE TOKEN`` a line (a node may have several lines: rotation as above). A hello is then
accepted only with a token of the node it names, so a token stolen from one node cannot
write as another.

``accepts(tokens, given)`` compares in constant time: both sides are hashed (SHA-256),
so the time depends neither on where they differ nor on the given token's length, and
every accepted token is compared (no early exit).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from pathlib import Path

MAX_TOKEN_BYTES = 256  # wire.MAX_NAME_BYTES: a hello's token field


def _read(path: Path | None, key: str, problems: list[str]) -> str | None:
    """The text of the file ``key`` names (None: no file given, or a problem appended)."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        problems.append(f"{key}: cannot read {path}: {getattr(e, 'strerror', None) or e}")
        return None


def read_tokens(path: Path | None, problems: list[str]) -> tuple[str, ...] | None:
    """The tokens in ``path`` (None when no file is given); a problem is appended for a
    file that cannot be read, holds none, or holds something that is not a token."""
    text = _read(path, "token_file", problems)
    if text is None:
        return None
    tokens = tuple(ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))
    if not tokens:
        problems.append(f"token_file: {path} is empty")
        return None
    if any(len(t.encode()) > MAX_TOKEN_BYTES or any(c.isspace() for c in t) for t in tokens):
        problems.append(f"token_file: each line of {path} must be one token, one word of at most "
                        f"{MAX_TOKEN_BYTES} bytes")
        return None
    return tokens


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def accepts(tokens: Sequence[str], given: str) -> bool:
    """Whether ``given`` is one of ``tokens``, in constant time (see the module docstring)."""
    want = digest(given)
    ok = False
    for t in tokens:
        ok |= hmac.compare_digest(digest(t), want)
    return ok


def read_node_tokens(path: Path | None, problems: list[str]) -> dict[str, tuple[str, ...]] | None:
    """{node: its tokens} from a node token file (None when no file is given); a problem is
    appended for a file that cannot be read, holds no line, or a line that is not ``NODE TOKEN``."""
    text = _read(path, "node_tokens_file", problems)
    if text is None:
        return None
    out: dict[str, list[str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        words = line.split()
        if len(words) != 2 or any(len(w.encode()) > MAX_TOKEN_BYTES for w in words):
            problems.append(f"node_tokens_file: {path}:{n}: expected NODE TOKEN (two words, each at "
                            f"most {MAX_TOKEN_BYTES} bytes)")
            return None
        out.setdefault(words[0], []).append(words[1])
    if not out:
        problems.append(f"node_tokens_file: {path} is empty")
        return None
    return {node: tuple(tokens) for node, tokens in out.items()}
