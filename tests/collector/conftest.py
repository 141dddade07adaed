"""Fixtures shared by the collector's tests: a private PostgreSQL server (pg_server.py)."""

from __future__ import annotations

import pytest

from tests.collector import pg_server


@pytest.fixture(scope="session")
def postgres():
    """The session's PostgreSQL server (started on first use); skips where there is none."""
    why = pg_server.missing()
    if why is not None:
        pytest.skip(f"no PostgreSQL server for this test: {why}")
    server = pg_server.PgServer()
    yield server
    server.close()


@pytest.fixture
def pg_url(postgres) -> str:
    """The URL of a new, empty database on the session's server."""
    return postgres.create_database()
