"""The check the catalog family tests share: a line written from a source's format string
matches the signature it should, first, with the role, category and named facts given."""

from __future__ import annotations

from firstfault.analysis.catalog import Catalog


def assert_line(catalog: Catalog, text: str, sig: str, role: str, category: str, facts: dict[str, str]) -> None:
    m = catalog.match(text)
    assert m is not None, f"nothing matches {text[:80]!r}"
    assert (m.signature.id, m.role, m.category) == (sig, role, category), text[:80]
    for k, v in facts.items():
        assert m.groups.get(k) == v, (k, m.groups)
