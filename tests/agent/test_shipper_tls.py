"""TLS and mutual TLS between the shipper and a real ingest server, with certificates made
here (tests/collector/server/ingest_helpers.py make_pki): what works, and every refusal as
one clear error on both sides -- the agent's (ShipperStats.last_error, logged) and the
collector's (its log line, its error counter). Nothing is acked in any refusal."""

from __future__ import annotations

import logging
import ssl
import time

import pytest

from firstfault.agent.spool import Spool
from firstfault.collector.config import TLSConfig
from firstfault.collector.server import make_ssl_context
from tests.agent.test_shipper import NODE, Collector, drafts, fast
from tests.collector.server.ingest_helpers import FakeStore, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def server_ctx(pki, cert: str | None, mutual: bool = False):
    if cert is None:
        return None
    return make_ssl_context(TLSConfig(cert=pki / f"{cert}.pem", key=pki / f"{cert}.key",
                                      client_ca=pki / "ca.pem" if mutual else None))


def agent_ctx(pki, ca: str | None = "ca", cert: str | None = None):
    if ca is None:
        return None
    ctx = ssl.create_default_context(cafile=str(pki / f"{ca}.pem"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"))
    return ctx


def ship(tmp_path, server, agent, wait_for: str = "failures") -> tuple:
    """Run a shipper with three spooled records against a collector; (stats, store)."""
    store = FakeStore()
    col = Collector(store, ssl_context=server).start()
    spool = Spool(tmp_path / "spool", node=NODE, max_bytes=4 << 20, segment_bytes=256 << 10,
                  fsync="never")
    spool.append(drafts(0, 3))
    sh = fast(spool, [col.address], ssl_context=agent, server_name="localhost").start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (
            sh.stats.failures >= 1 if wait_for == "failures" else sh.stats.acked_seq == 3):
        time.sleep(0.02)
    sh.stop(0)
    spool.close()
    col.stop()
    return sh.stats, store, col.server.metrics


def refused(caplog, tmp_path, server, agent, agent_says: str | tuple[str, ...], collector_says: str,
            code: str):
    """``agent_says``: what the agent's error holds (one of them: with TLS 1.3 a refused client
    certificate reaches the agent as the server's alert or as the connection closing, by timing)."""
    with caplog.at_level(logging.WARNING):
        stats, store, metrics = ship(tmp_path, server, agent)
    assert stats.acked_seq is None and store.rows == {}
    says = agent_says if isinstance(agent_says, tuple) else (agent_says,)
    told = [r.getMessage() for r in caplog.records if r.name == "firstfault.agent.shipper"
            and "collector session failed" in r.getMessage()]
    assert told and all(any(m in t for m in says) for t in told), told  # every attempt says why
    agent_says = next(m for m in says if m in stats.last_error)
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("firstfault.collector")]
    assert any(collector_says in m for m in logged), logged
    assert metrics.errors.get(code, 0) >= 1, metrics.errors



def test_tls_and_mutual_tls_ship(pki, tmp_path):
    stats, store, _ = ship(tmp_path, server_ctx(pki, "server"), agent_ctx(pki), "acked")
    assert stats.acked_seq == 3 and len(store.rows) == 3
    stats, store, _ = ship(tmp_path / "m", server_ctx(pki, "server", mutual=True),
                           agent_ctx(pki, cert="client"), "acked")
    assert stats.acked_seq == 3 and len(store.rows) == 3


@pytest.mark.parametrize("server, ca, agent_says", [
    ("server", "other-ca", "certificate is not accepted: unable to get local issuer certificate"),
    ("server-expired", "ca", "certificate is not accepted: certificate has expired"),
    ("server-wrong-name", "ca", "certificate is not accepted: Hostname mismatch"),
])
def test_the_agent_refuses_a_collector_certificate_it_cannot_trust(pki, tmp_path, caplog, server,
                                                                    ca, agent_says):
    refused(caplog, tmp_path, server_ctx(pki, server), agent_ctx(pki, ca),
            agent_says, "TLS handshake failed peer=127.0.0.1:", "tls")
    assert any("(check [tls] ca and server_name)" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("cert, collector_says", [
    (None, "PEER_DID_NOT_RETURN_A_CERTIFICATE"),
    ("client-other-ca", "unable to get local issuer certificate"),
    ("client-expired", "certificate has expired"),
])
def test_mutual_tls_refuses_a_client_without_a_good_certificate(pki, tmp_path, caplog, cert,
                                                                 collector_says):
    refused(caplog, tmp_path, server_ctx(pki, "server", mutual=True), agent_ctx(pki, cert=cert),
            ("a collector that asks for client certificates closes on one it does not accept",
             "TLS: the collector refused this agent"),
            "TLS handshake failed peer=127.0.0.1:", "tls")
    assert any(collector_says in r.getMessage() for r in caplog.records)


def test_a_plain_agent_on_a_tls_port(pki, tmp_path, caplog):
    refused(caplog, tmp_path, server_ctx(pki, "server"), None,
            "collector refused: protocol: this port speaks TLS and this client does not: "
            "configure [tls] ca on the agent", "plain-text client on the TLS port", "tls_mismatch")


def test_a_tls_agent_on_a_plain_port(pki, tmp_path, caplog):
    refused(caplog, tmp_path, None, agent_ctx(pki),
            "does the collector speak TLS on this port?",
            "TLS client on a port without TLS peer=127.0.0.1:", "tls_mismatch")
