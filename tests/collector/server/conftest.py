"""Fixtures of the ingest server tests; the helpers live in ingest_helpers.py."""

from __future__ import annotations

import pytest

from firstfault.collector.config import ClockConfig, LimitsConfig
from firstfault.collector.server import IngestServer
from tests.collector.server.ingest_helpers import FakeStore, LoopThread, Running


@pytest.fixture
def serve():
    """serve(store=None, **IngestServer kwargs, limits=..., clock=...) -> Running."""
    lt = LoopThread()
    started: list[Running] = []

    def start(store=None, *, host: str = "127.0.0.1", **kw) -> Running:
        kw.setdefault("limits", LimitsConfig(read_timeout_s=5))
        kw.setdefault("clock", ClockConfig(ping_interval_s=0.5, save_interval_s=0.5))

        async def make():
            server = IngestServer(store if store is not None else FakeStore(), **kw)
            await server.start(host, 0)
            return server

        running = Running(lt, lt.run(make()))
        started.append(running)
        return running

    yield start
    for r in started:
        for a in r.agents:
            a.close()
        if not r.server._stopping:
            r.stop(grace_s=2)
    lt.close()
