"""Who may write a stream: the attack where a token holder sent seqs high+1..+5 on another
node's live stream (its next real records then counted as duplicates and were dropped), or
said hello as another node (per-node tokens, or the mTLS certificate's name, bind it)."""

from __future__ import annotations

import datetime
import socket
import ssl
import time

import pytest

from firstfault import wire
from firstfault.collector.config import TLSConfig
from firstfault.collector.server import make_ssl_context
from firstfault.wiredecode import FrameDecoder
from tests.collector.server.ingest_helpers import Agent, ClosedByServer, make_pki, make_records


def agent_from(address, source_ip: str, *, node="good", stream="s1", ssl_context=None) -> Agent:
    """A test agent whose connection comes from ``source_ip`` (another host, on loopback)."""
    a = Agent.__new__(Agent)
    a.node, a.stream, a.clock = node, stream, time.time_ns
    sock = socket.create_connection(address, timeout=10, source_address=(source_ip, 0))
    a.sock = ssl_context.wrap_socket(sock, server_hostname="localhost") if ssl_context else sock
    a.decoder, a.pending, a.pongs = FrameDecoder(), [], 0
    return a


def test_a_live_stream_is_not_claimed_from_another_host(serve):
    srv = serve(token="shared")
    good = agent_from(srv.address, "127.0.0.1")
    good.hello(token="shared")
    good.stream_records(0, batches=1, size=5)  # 0..4
    evil = agent_from(srv.address, "127.0.0.2")
    with pytest.raises(ClosedByServer) as e:
        evil.hello(token="shared")
    assert e.value.error.code == wire.ERR_AUTH and "live on another connection" in e.value.error.reason
    good.stream_records(5, batches=1, size=5)  # the real 5..9: stored, not duplicates
    assert srv.store.seqs("good", "s1") == list(range(10))
    assert srv.metrics.records_duplicate == 0 and srv.metrics.errors["stream_claimed"] == 1
    good.close()
    evil.close()


def test_the_same_agent_reconnecting_replaces_its_old_connection(serve):
    srv = serve(token="shared")
    old = agent_from(srv.address, "127.0.0.1")
    old.hello(token="shared")
    old.stream_records(0, batches=1, size=5)
    new = agent_from(srv.address, "127.0.0.1")  # the old one is half-open, say
    assert new.hello(token="shared").high_seq == 4
    new.stream_records(5, batches=1, size=5)
    assert old.expect_error().code == wire.ERR_PROTOCOL
    assert srv.store.seqs("good", "s1") == list(range(10))
    old.close()
    new.close()


def test_seqs_are_accepted_only_in_order_on_a_connection(serve):
    srv = serve()
    a = srv.agent(node="good")
    a.hello()
    a.send_batch(make_records("good", "s1", 10, 5))
    a.wait_ack(14)
    a.send_batch(make_records("good", "s1", 5, 5))  # going back
    err = a.expect_error()
    assert err.code == wire.ERR_PROTOCOL and "seqs must increase" in err.reason
    assert srv.store.seqs("good", "s1") == list(range(10, 15))


def test_node_tokens_bind_a_node_name_to_its_token(serve):
    srv = serve(node_tokens={"good": ("t-good",), "evil": ("t-evil",)})
    evil = srv.agent(node="good", stream="forged")
    with pytest.raises(ClosedByServer) as e:
        evil.hello(token="t-evil")
    assert e.value.error.code == wire.ERR_AUTH and "'good'" in e.value.error.reason
    for node, token in (("nobody", "t-evil"), ("good", "")):
        with pytest.raises(ClosedByServer):
            srv.agent(node=node, stream="x").hello(token=token)
    good = srv.agent(node="good")
    good.hello(token="t-good")
    good.stream_records(0, batches=1, size=3)
    me = srv.agent(node="evil", stream="e")
    me.hello(token="t-evil")
    assert srv.store.seqs("good", "forged") == [] and srv.store.seqs("good", "s1") == [0, 1, 2]


def _client_cert(pki, name: str):
    """A client certificate for ``name`` (CN), signed by the test CA of make_pki."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    crt = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
           .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
           .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
           .sign(ca_key, hashes.SHA256()))
    (pki / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))
    (pki / f"{name}.pem").write_bytes(crt.public_bytes(serialization.Encoding.PEM))
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    ctx.load_cert_chain(str(pki / f"{name}.pem"), str(pki / f"{name}.key"))
    return ctx


def test_the_mtls_certificate_names_the_node(serve, tmp_path):
    pki = make_pki(tmp_path)
    ctx = make_ssl_context(TLSConfig(cert=pki / "server.pem", key=pki / "server.key", client_ca=pki / "ca.pem",
                                     bind_node=True))
    srv = serve(ssl_context=ctx, token="t0k", bind_node=True)
    node_t = _client_cert(pki, "nodeT")
    forged = srv.agent(node="good", ssl_context=node_t)
    with pytest.raises(ClosedByServer) as e:
        forged.hello(token="t0k")
    assert e.value.error.code == wire.ERR_AUTH and "nodeT" in e.value.error.reason
    own = srv.agent(node="nodeT", ssl_context=node_t)
    own.hello(token="t0k")
    own.stream_records(0, batches=1, size=2)
    assert srv.store.seqs("good", "s1") == [] and srv.store.seqs("nodeT", "s1") == [0, 1]


def test_a_reload_keeps_node_token_sessions_and_closes_a_revoked_one(serve):
    srv = serve(token="api", node_tokens={"good": ("t-good",), "evil": ("t-evil",)})
    good, evil = srv.agent(node="good"), srv.agent(node="evil", stream="e")
    good.hello(token="t-good")
    evil.hello(token="t-evil")

    async def reload(tokens, node_tokens):
        srv.server.node_tokens = node_tokens
        return srv.server.set_tokens(tokens)
    assert srv.lt.run(reload(("api2",), {"good": ("t-good",), "evil": ("t-evil",)})) == 0  # API token rotated
    assert srv.lt.run(reload(("api2",), {"good": ("t-good",)})) == 1  # evil's token revoked
    assert evil.expect_error().code == wire.ERR_AUTH
    good.stream_records(0, batches=1, size=2)
    assert srv.store.seqs("good", "s1") == [0, 1]
