"""TLS between real Switches on 127.0.0.1 (specs/tls.md), with certificates made here.

Identity mode (self-signed certificates from the NodeKeys), CA mode (a CA made by the test,
mutual TLS, host names), the plaintext refusal, reload, who may join (allowed_peers and
authorize, bool and Deferred, both directions) and resume over TLS through a FaultProxy.
Every wait is bounded; every Switch and proxy started is stopped.
"""

from __future__ import annotations

import datetime
import ipaddress
import os

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from OpenSSL import SSL
from twisted.internet import defer, protocol, task
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.interfaces import IOpenSSLContextFactory
from zope.interface import implementer

from faultproxy import FaultProxy
from helpers import sleep, the_reactor, until
from mconn import (
    AuthenticationError,
    CertificateMismatch,
    ChannelDescriptor,
    Config,
    DialGaveUp,
    NodeKey,
    PeerClosed,
    PeerIdMismatch,
    Switch,
    TLSError,
)
import mconn.net.tls
from mconn.core import pre_hello
from mconn.core import wire
from mconn.switch.dialer import is_not_retried
from mconn.errors import MalformedPacket
from mconn.net.protocol import MConnectionFactory
from mconn.net.tls import TLSOptions, node_id_of_certificate, self_signed_certificate
from mconn.net.tls_transport import PRE_HELLO, TLS_RECORD_TYPES
from tests.helpers_core import expand, load_vectors

from .test_loopback import Collector, bounded, stop

pytestmark = pytest.mark.integration

CHANNELS = [
    ChannelDescriptor(0x20, priority=1, send_queue_capacity=64),
    ChannelDescriptor(0x30, priority=10, send_queue_capacity=64),
]
CONFIG = Config(stats_interval=0, max_reconnect_delay=0.05)
CLOSE_LINGER = Config().close_linger
NOW = datetime.datetime.now(datetime.UTC)
DAY = datetime.timedelta(days=1)


def node(tls, **kwargs):
    kwargs.setdefault("config", CONFIG)
    reactor = Collector(CHANNELS)
    switch = Switch([reactor], tls=tls, clock=the_reactor(), **kwargs)
    switch.startService()
    return switch, reactor


async def listen(switch):
    port = await switch.listen("tcp:0:interface=127.0.0.1")
    return port.getHost().port


def identity_node(**kwargs):
    return node(TLSOptions.identity(NodeKey.generate()), **kwargs)


def protocol_version(peer):
    return peer._protocol.transport.getHandle().get_protocol_version_name()


# -- a CA made by the test ----------------------------------------------------------------


class CA:
    """A certificate authority (ECDSA P-256) that issues node certificates to files."""

    def __init__(self, name="mconn test CA"):
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - DAY)
            .not_valid_after(NOW + 30 * DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )

    def write(self, path):
        path.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))
        return path

    def issue(self, node_key, *, hosts=("127.0.0.1",), not_before=NOW - DAY, not_after=NOW + 30 * DAY):
        names = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_key.node_id)]))
            .issuer_name(self.certificate.subject)
            .public_key(node_key.private_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )


def ca_files(tmp_path, ca, name, node_key=None, **issue):
    """cert, key and CA files for one node; returns (cert_file, key_file, ca_file, node_key)."""
    node_key = node_key or NodeKey.generate()
    key_file = tmp_path / f"{name}.key"
    node_key.save(key_file)
    cert_file = tmp_path / f"{name}.crt"
    cert_file.write_bytes(ca.issue(node_key, **issue).public_bytes(serialization.Encoding.PEM))
    return cert_file, key_file, ca.write(tmp_path / f"{name}-ca.pem"), node_key


def ca_options(tmp_path, ca, name, require_client_cert=True, **issue):
    cert_file, key_file, ca_file, _ = ca_files(tmp_path, ca, name, **issue)
    return TLSOptions.from_files(
        cert_file=cert_file, key_file=key_file, ca_file=ca_file, require_client_cert=require_client_cert
    )


# -- certificates and options --------------------------------------------------------------


def test_the_identity_certificate_carries_the_node_key_and_names_the_node():
    """An identity certificate is self-signed by the node key, names the node id as its common name, proves
    that id and is valid now."""
    key = NodeKey.generate()
    cert = self_signed_certificate(key)
    assert node_id_of_certificate(cert) == key.node_id
    assert cert.subject == cert.issuer
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == key.node_id
    cert.verify_directly_issued_by(cert)  # self-signed, by the node key
    assert cert.not_valid_before_utc < NOW < cert.not_valid_after_utc


def test_a_certificate_without_an_ed25519_key_proves_no_node_id():
    """A certificate whose key is not Ed25519 proves no node id: AuthenticationError says so."""
    ca = CA()
    with pytest.raises(AuthenticationError, match="Ed25519"):
        node_id_of_certificate(ca.certificate)


def test_a_key_file_others_can_read_stops_the_node(tmp_path):
    """A private key file that others can read (mode 0644) is refused at load, naming the file and its mode."""
    cert_file, key_file, ca_file, _ = ca_files(tmp_path, CA(), "a")
    os.chmod(key_file, 0o644)
    with pytest.raises(ValueError, match=r"has mode 0644") as info:
        TLSOptions.from_files(cert_file=cert_file, key_file=key_file, ca_file=ca_file)
    assert str(key_file) in str(info.value)


def test_a_certificate_for_another_key_is_refused_at_load(tmp_path):
    """A certificate file paired with another node's key file is refused at load."""
    ca = CA()
    cert_file, _, ca_file, _ = ca_files(tmp_path, ca, "a")
    _, other_key_file, _, _ = ca_files(tmp_path, ca, "b")
    with pytest.raises(ValueError, match="holds the key of node"):
        TLSOptions.from_files(cert_file=cert_file, key_file=other_key_file, ca_file=ca_file)


def test_the_switch_key_must_be_the_certificate_key():
    """A Switch refuses a node key other than its TLS certificate's; without one, it takes the certificate's
    node id."""
    with pytest.raises(ValueError, match="TLS certificate key is node"):
        Switch([], node_key=NodeKey.generate(), tls=TLSOptions.identity(NodeKey.generate()))
    key = NodeKey.generate()
    assert Switch([], tls=TLSOptions.identity(key)).node_id == key.node_id


# -- identity mode ---------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_identity_mode_both_ways_over_tls_1_3():
    """Two identity-mode nodes talk both ways over TLS 1.3, and authorize sees each node id proven by its
    certificate."""
    seen = []

    def authorize(node_id, address, certificate):
        seen.append((node_id, node_id_of_certificate(certificate)))
        return True

    a, ra = identity_node(authorize=authorize)
    b, rb = identity_node(authorize=authorize)
    try:
        port = await listen(a)
        peer_of_a = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        peer_of_b = await bounded(ra.added)
        assert protocol_version(peer_of_a) == "TLSv1.3"
        big = os.urandom(300_000)
        assert await peer_of_a.send(0x20, big)
        assert await peer_of_b.send(0x30, b"back")
        await ra.until(1)
        await rb.until(1)
        assert ra.received(0x20) == [big] and rb.received(0x30) == [b"back"]
        assert sorted(seen) == sorted([(a.node_id, a.node_id), (b.node_id, b.node_id)])
        a._check_invariants()
        b._check_invariants()
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_close_over_tls_completes_at_once_on_both_sides():
    """The close packet, then TLS close_notify both ways: no waiting for the linger abort."""
    a, ra = identity_node()
    b, rb = identity_node()
    try:
        port = await listen(a)
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        await bounded(ra.added)
        peer.close("done")
        reason = await bounded(ra.removed_d, CLOSE_LINGER / 2)
        assert isinstance(reason, PeerClosed) and reason.text == "done"
        await bounded(rb.removed_d, CLOSE_LINGER / 2)
        assert a.connections == set() and b.connections == set()
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_dialing_another_node_id_is_refused_and_the_address_banned(telemetry):
    """Dialing an address whose certificate proves another node id fails with PeerIdMismatch, not retried; a
    persistent dial bans the address."""
    a, ra = identity_node()
    b, rb = identity_node()
    try:
        port = await listen(a)
        wanted = NodeKey.generate().node_id
        with pytest.raises(PeerIdMismatch) as info:
            await bounded(b.dial(f"{wanted}@127.0.0.1:{port}"))
        assert wanted in str(info.value) and a.node_id in str(info.value)
        assert is_not_retried(info.value)
        # A persistent dial bans the address instead of retrying it, and gives up naming why.
        with pytest.raises(DialGaveUp) as gave_up:
            await bounded(b.dial(f"{wanted}@127.0.0.1:{port}", persistent=True))
        assert isinstance(gave_up.value.__cause__, PeerIdMismatch) and "all are banned" in gave_up.value.reason
        await sleep(0.3)
        inbound = [e for e in telemetry.named("connection_made") if e["direction"] == "inbound"]
        assert len(inbound) == 2, "the banned address was dialed again"
        assert b.address_pool(wanted) is None  # every address banned: the dialer gave up
        assert a.peers == {} and b.peers == {}
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_dialer_whose_hello_is_not_its_certificate_key_is_refused(telemetry):
    """A dialer whose hello claims a node id other than its certificate's is closed with id_mismatch, counted
    and not retried."""
    a, ra = identity_node()
    b, rb = identity_node()
    liar, _ = identity_node()
    real_id = liar.node_id
    liar.node_id = b.node_id  # its hello claims to be b; its certificate is its own key
    try:
        port = await listen(a)
        with pytest.raises(PeerClosed) as info:
            await bounded(liar.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert info.value.code == "id_mismatch"
        assert real_id in info.value.text and b.node_id in info.value.text
        [event] = telemetry.named("peer_rejected")
        assert event["reason"] == "id_mismatch" and event["peer_id"] == b.node_id
        assert is_not_retried(info.value) and a.peers == {}
    finally:
        await stop(a, b, liar)


@pytest_twisted.ensureDeferred
async def test_a_listener_whose_hello_is_not_its_certificate_key_is_refused():
    """A listener whose hello claims a node id other than its certificate's is refused by the dialer with
    CertificateMismatch."""
    a, ra = identity_node()
    b, rb = identity_node()
    real_id = a.node_id
    a.node_id = fake = NodeKey.generate().node_id
    try:
        port = await listen(a)
        with pytest.raises(CertificateMismatch) as info:
            await bounded(b.dial(f"{fake}@127.0.0.1:{port}"))
        assert info.value.reason == "id_mismatch" and is_not_retried(info.value)
        assert real_id in str(info.value) and fake in str(info.value)
        assert b.peers == {}
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_plaintext_dialer_gets_a_close_saying_tls_is_required(telemetry):
    """A plaintext dialer at a TLS listener gets a close with code tls_required, and the listener keeps no
    connection."""
    a, ra = identity_node()
    plain, _ = node(None)
    try:
        port = await listen(a)
        with pytest.raises(PeerClosed) as info:
            await bounded(plain.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert info.value.code == "tls_required" and "TLS" in info.value.text
        [event] = telemetry.named("peer_rejected")
        assert event["reason"] == "tls_required" and event["peer_id"] is None
        assert a.peers == {} and a.connections == set()
    finally:
        await stop(a, plain)


class Silent(protocol.Protocol):
    """Connects and never says a word (no TLS ClientHello either)."""

    def __init__(self):
        self.lost = defer.Deferred()

    def connectionLost(self, reason):
        self.lost.callback(None)


@pytest_twisted.ensureDeferred
async def test_a_connection_refused_by_a_limit_is_dropped_even_if_it_never_does_tls():
    """The refusal's close packet waits for a TLS handshake that never comes: the
    connection is aborted CLOSE_LINGER later rather than kept."""
    a, ra = identity_node(config=CONFIG.replace(max_connections_per_ip=1, handshake_timeout=30.0))
    try:
        port = await listen(a)
        endpoint = TCP4ClientEndpoint(the_reactor(), "127.0.0.1", port)
        admitted, refused = Silent(), Silent()
        await bounded(endpoint.connect(protocol.Factory.forProtocol(lambda: admitted)))
        await bounded(endpoint.connect(protocol.Factory.forProtocol(lambda: refused)))
        await bounded(refused.lost, CLOSE_LINGER + 2)
        assert not admitted.lost.called and a.refusals.get("ip_limit") == 1
    finally:
        await stop(a)


@pytest_twisted.ensureDeferred
async def test_a_tls_dialer_to_a_plaintext_listener_says_the_peer_does_not_speak_tls():
    """A TLS dialer at a plaintext listener fails with a TLSError saying the peer does not seem to speak TLS."""
    plain, _ = node(None)
    b, rb = identity_node()
    try:
        port = await listen(plain)
        with pytest.raises(TLSError, match="does not seem to speak TLS"):
            await bounded(b.dial(f"127.0.0.1:{port}"))
        assert plain.peers == {}
    finally:
        await stop(plain, b)


@implementer(IOpenSSLContextFactory)
class OwnContext:
    """A deployment's own context factory: any certificate, any peer certificate accepted."""

    def __init__(self, node_key, certificate=None, max_version=None):
        self.context = SSL.Context(SSL.TLS_METHOD)
        self.context.set_min_proto_version(SSL.TLS1_2_VERSION)
        if max_version is not None:
            self.context.set_max_proto_version(max_version)
        self.context.use_certificate(certificate or self_signed_certificate(node_key))
        self.context.use_privatekey(node_key.private_key)
        self.context.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, lambda *args: True)

    def getContext(self):
        return self.context


@pytest_twisted.ensureDeferred
async def test_a_custom_context_factory_sets_its_own_policy():
    """A deployment's own context (here: TLS 1.2 only); the node id is still proven."""
    ka, kb = NodeKey.generate(), NodeKey.generate()
    a, ra = node(TLSOptions.custom(OwnContext(ka, max_version=SSL.TLS1_2_VERSION), node_key=ka))
    b, rb = node(TLSOptions.custom(OwnContext(kb, max_version=SSL.TLS1_2_VERSION)), node_key=kb)
    try:
        port = await listen(a)
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert protocol_version(peer) == "TLSv1.2"
        assert peer.try_send(0x30, b"over 1.2")
        await ra.until(1)
        assert ra.received(0x30) == [b"over 1.2"]
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_identity_mode_refuses_expired_and_ca_signed_certificates(telemetry):
    """Identity mode refuses a dialer's expired certificate and a CA-signed one, and logs why."""
    a, ra = identity_node()
    key = NodeKey.generate()
    expired = self_signed_certificate(key, now=NOW - datetime.timedelta(days=4000))
    ca_signed = CA().issue(key)
    try:
        port = await listen(a)
        for certificate, why in ((expired, "certificate has expired"), (ca_signed, "unable to get local issuer")):
            b, rb = node(TLSOptions.custom(OwnContext(key, certificate)), node_key=key)
            try:
                with pytest.raises(TLSError, match="refused this node's certificate"):
                    await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
            finally:
                await stop(b)
            lost = [e["reason"] for e in telemetry.named("connection_lost") if e["node_id"] == a.node_id]
            assert "refused in identity mode" in lost[-1] and why in lost[-1]
        assert a.peers == {}
    finally:
        await stop(a)


# -- CA mode --------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_ca_mode_mutual_tls_works(tmp_path):
    """In CA mode two nodes with certificates from one CA connect, and authorize gets the dialer's CA-issued
    certificate."""
    ca = CA()
    certificates = []
    a, ra = node(ca_options(tmp_path, ca, "a"), authorize=lambda n, addr, cert: certificates.append(cert) or True)
    b, rb = node(ca_options(tmp_path, ca, "b"))
    try:
        port = await listen(a)
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert peer.try_send(0x30, b"signed")
        await ra.until(1)
        [cert] = certificates
        assert cert.issuer == ca.certificate.subject and node_id_of_certificate(cert) == b.node_id
    finally:
        await stop(a, b)


async def refused_dial(tmp_path, listener_options, dialer_options):
    a, ra = node(listener_options)
    b, rb = node(dialer_options)
    try:
        port = await listen(a)
        with pytest.raises(TLSError) as info:
            await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert a.peers == {} and b.peers == {}
        return info.value
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_ca_mode_a_listener_signed_by_another_ca_is_refused(tmp_path):
    """In CA mode a listener whose certificate is from an untrusted CA is refused, saying so."""
    error = await refused_dial(tmp_path, ca_options(tmp_path, CA("other CA"), "a"), ca_options(tmp_path, CA(), "b"))
    assert "not signed by a CA this node trusts" in str(error)


@pytest_twisted.ensureDeferred
async def test_ca_mode_an_expired_certificate_is_refused(tmp_path, monkeypatch):
    """A listener whose certificate expired while it ran (a node does not start with one:
    test_a_node_whose_own_certificate_is_out_of_date_refuses_to_start)."""
    ca = CA()
    monkeypatch.setattr(mconn.net.tls, "_check_validity", lambda chain, path: None)  # loaded before it expired
    expired = ca_options(tmp_path, ca, "a", not_before=NOW - 10 * DAY, not_after=NOW - DAY)
    monkeypatch.undo()
    error = await refused_dial(tmp_path, expired, ca_options(tmp_path, ca, "b"))
    assert "certificate has expired" in str(error)


@pytest_twisted.ensureDeferred
async def test_ca_mode_a_certificate_for_another_host_is_refused(tmp_path):
    """In CA mode a listener certificate that does not name the dialed IP address is refused, saying which
    address."""
    ca = CA()
    elsewhere = ca_options(tmp_path, ca, "a", hosts=("node-a.example", "10.1.2.3"))
    error = await refused_dial(tmp_path, elsewhere, ca_options(tmp_path, ca, "b"))
    assert "does not name the IP address '127.0.0.1'" in str(error)


@pytest_twisted.ensureDeferred
async def test_ca_mode_a_dialer_without_a_certificate_is_refused_where_one_is_required(tmp_path):
    """In CA mode a dialer without a certificate is refused by a listener that requires one."""
    ca = CA()
    no_certificate = TLSOptions.from_files(ca_file=ca.write(tmp_path / "ca.pem"))
    error = await refused_dial(tmp_path, ca_options(tmp_path, ca, "a"), no_certificate)
    assert "requires a client certificate" in str(error)


@pytest_twisted.ensureDeferred
async def test_ca_mode_a_listener_may_let_dialers_without_certificates_in(tmp_path):
    """With require_client_cert=False a dialer without a certificate gets in and authorize sees None; such a
    node cannot listen."""
    ca = CA()
    certificates = []
    a, ra = node(
        ca_options(tmp_path, ca, "a", require_client_cert=False),
        authorize=lambda n, addr, cert: certificates.append(cert) or True,
    )
    b, rb = node(TLSOptions.from_files(ca_file=ca.write(tmp_path / "ca.pem")))
    try:
        port = await listen(a)
        await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        await bounded(ra.added)
        assert certificates == [None]  # its node id is unproven, and authorize is told so
        with pytest.raises(ValueError, match="needs a certificate"):
            await b.listen("tcp:0:interface=127.0.0.1")
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_reload_takes_new_certificates_without_dropping_peers(tmp_path):
    """reload() takes a renewed certificate without dropping peers, refuses another node's files, and new
    dials see the new certificate."""
    ca = CA()
    cert_file, key_file, ca_file, key_a = ca_files(tmp_path, ca, "a")
    options = TLSOptions.from_files(cert_file=cert_file, key_file=key_file, ca_file=ca_file)
    serials = []

    def authorize(node_id, address, certificate):
        serials.append(certificate.serial_number)
        return True

    a, ra = node(options)
    b, rb = node(ca_options(tmp_path, ca, "b"))
    c, rc = node(ca_options(tmp_path, ca, "c"), authorize=authorize)
    try:
        port = await listen(a)
        peer_b = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        old_serial = options.certificate.serial_number
        renewed = ca.issue(key_a)
        cert_file.write_bytes(renewed.public_bytes(serialization.Encoding.PEM))
        options.reload()
        assert options.certificate.serial_number == renewed.serial_number != old_serial
        # Files of another node are refused; the renewed certificate stays in use.
        other_cert, other_key, _, other = ca_files(tmp_path, ca, "x")
        os.replace(other_key, key_file)
        with pytest.raises(ValueError, match="holds the key of node"):
            options.reload()
        os.replace(other_cert, cert_file)
        with pytest.raises(ValueError, match=f"would change the node id from {a.node_id} to {other.node_id}"):
            options.reload()
        assert options.node_key.node_id == a.node_id
        assert peer_b.try_send(0x30, b"still here")
        await ra.until(1)
        assert ra.received(0x30) == [b"still here"] and peer_b.state == "connected"
        await bounded(c.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert serials == [renewed.serial_number]
        assert [name for name, *_ in rb.calls if name in ("add_peer", "remove_peer")] == ["add_peer"]
    finally:
        await stop(a, b, c)


# -- who may join ---------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_node_not_in_allowed_peers_is_refused_inbound_and_not_redialed(telemetry):
    """A dialer outside the listener's allowed_peers is closed as unauthorized, counted, and its persistent
    dialer gives up."""
    b, rb = identity_node()
    a, ra = identity_node(allowed_peers={NodeKey.generate().node_id})
    try:
        port = await listen(a)
        with pytest.raises(DialGaveUp) as info:
            await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}", persistent=True))
        refusal = info.value.__cause__
        assert isinstance(refusal, PeerClosed) and refusal.code == "unauthorized"
        await sleep(0.3)
        assert b.address_pool(a.node_id) is None  # its only address banned: the dialer gave up
        [event] = telemetry.named("peer_rejected")
        assert event["reason"] == "unauthorized" and "allowed_peers" in event["message"]
        assert event["peer_id"] == b.node_id
        assert len(telemetry.named("connection_made")) == 2  # one attempt, seen by both nodes
        assert a.refusals.get("unauthorized") == 1
        assert [name for name, *_ in ra.calls if name == "add_peer"] == []
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_allowed_peers_outbound_refuses_the_listener():
    """A dialer refuses a listener outside its own allowed_peers without retrying; adding it to the set lets
    the next dial in."""
    a, ra = identity_node()
    b, rb = identity_node(allowed_peers={NodeKey.generate().node_id})
    try:
        port = await listen(a)
        with pytest.raises(AuthenticationError, match="allowed_peers") as info:
            await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert is_not_retried(info.value) and b.peers == {}
        b.allowed_peers.add(a.node_id)  # the set may change at any time
        await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
    finally:
        await stop(a, b)


def later(value, seconds=0.2):
    return task.deferLater(the_reactor(), seconds, lambda: value)


@pytest_twisted.ensureDeferred
async def test_authorize_inbound_deferred_false_refuses_with_unauthorized():
    """An authorize that answers False through a Deferred refuses the dialer as unauthorized; it was asked
    once, with the address."""
    asked = []
    a, ra = identity_node(authorize=lambda n, addr, cert: asked.append((n, addr)) or later(False))
    b, rb = identity_node()
    try:
        port = await listen(a)
        with pytest.raises(PeerClosed) as info:
            await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert info.value.code == "unauthorized" and is_not_retried(info.value)
        assert [n for n, _ in asked] == [b.node_id] and asked[0][1].startswith("127.0.0.1:")
        assert a.peers == {} and ra.calls == []
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_authorize_inbound_deferred_true_lets_the_peer_in():
    """An authorize that answers True through a Deferred lets the dialer in, and its messages arrive."""
    a, ra = identity_node(authorize=lambda n, addr, cert: later(True))
    b, rb = identity_node()
    try:
        port = await listen(a)
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert peer.try_send(0x30, b"in")
        await ra.until(1)
        assert ra.received(0x30) == [b"in"]
    finally:
        await stop(a, b)


class Greeter(Collector):
    """Sends a message to every peer as soon as add_peer is called."""

    def add_peer(self, peer):
        super().add_peer(peer)
        peer.try_send(0x30, b"welcome")


@pytest_twisted.ensureDeferred
async def test_authorize_outbound_deferred_true_holds_what_the_listener_sends_meanwhile():
    """The listener starts its session, and sends, while the dialer's authorize is still
    deciding: those bytes wait, and arrive once it says yes."""
    greeter = Greeter(CHANNELS)
    a = Switch([greeter], tls=TLSOptions.identity(NodeKey.generate()), clock=the_reactor(), config=CONFIG)
    a.startService()
    b, rb = identity_node(authorize=lambda n, addr, cert: later(True, 0.3))
    try:
        port = await listen(a)
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        await rb.until(1)
        assert rb.received(0x30) == [b"welcome"] and peer.state == "connected"
        a._check_invariants()
        b._check_invariants()
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_authorize_outbound_false_refuses_the_listener():
    """A dialer whose authorize answers False refuses the listener; neither side keeps a peer."""
    a, ra = identity_node()
    b, rb = identity_node(authorize=lambda n, addr, cert: False)
    try:
        port = await listen(a)
        with pytest.raises(AuthenticationError, match="refused it"):
            await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        # The listener may have started its side before the refusal: it ends, closed.
        await sleep(0.1)
        assert a.peers == {} and b.peers == {}
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_authorize_that_raises_or_never_answers_refuses(telemetry):
    """An authorize that raises refuses as unauthorized with its message; one that never answers refuses at
    the handshake timeout, retryably."""

    def broken(node_id, address, certificate):
        raise RuntimeError("policy store down")

    a, ra = identity_node(authorize=broken)
    slow, _ = identity_node(
        authorize=lambda n, addr, cert: defer.Deferred(), config=CONFIG.replace(handshake_timeout=0.3)
    )
    b, rb = identity_node()
    try:
        port = await listen(a)
        with pytest.raises(PeerClosed) as info:
            await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert info.value.code == "unauthorized" and "policy store down" in info.value.text
        slow_port = await listen(slow)
        with pytest.raises(PeerClosed) as info:
            await bounded(b.dial(f"{slow.node_id}@127.0.0.1:{slow_port}"))
        assert info.value.code == "authorize_timeout" and not is_not_retried(info.value)
    finally:
        await stop(a, slow, b)


# -- resume over TLS ----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_resume_over_tls_after_a_reset():
    """Over TLS, a reset is healed by resume: every message arrives once, in order, to the same peer."""
    config = CONFIG.replace(resume_grace=10.0)
    a, ra = identity_node(config=config)
    b, rb = identity_node(config=config)
    proxy = FaultProxy("127.0.0.1", await listen(a))
    proxy_port = await proxy.start()
    try:
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{proxy_port}"))
        sent = [b"m%d" % i * 50 for i in range(400)]
        for i, message in enumerate(sent):
            assert await peer.send(0x20, message)
            if i in (100, 250):
                resumes = peer.resumes
                assert proxy.reset_all() == 1
                await until(lambda resumes=resumes: peer.resumes > resumes, "the session to resume", seconds=5.0)
        await ra.until(len(sent))
        assert ra.received(0x20) == sent
        assert peer.resumes >= 1 and peer.state == "connected"
        assert [name for name, *_ in ra.calls if name in ("add_peer", "remove_peer")] == ["add_peer"]
    finally:
        await proxy.stop()
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_resume_attempt_by_another_node_is_refused(telemetry):
    """Node c knows b's session id and claims b's node id in its hello, but its
    certificate is its own key: the listener refuses it, and b's session carries on."""
    a, ra = identity_node(config=CONFIG.replace(resume_grace=10.0))
    b, rb = identity_node(config=CONFIG.replace(resume_grace=10.0))
    c, _ = identity_node()
    try:
        port = await listen(a)
        peer_of_a = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        peer_of_b = await bounded(ra.added)
        live = peer_of_b._protocol
        c.node_id = b.node_id
        factory = MConnectionFactory(c, is_outbound=True, expected_node_id=a.node_id, resuming=peer_of_a)
        from mconn.core.address import parse_address

        proto = await bounded(c._endpoint(parse_address(f"127.0.0.1:{port}")).connect(factory))
        assert proto.session_request.resume and proto.session_request.session_id == peer_of_a.session.id
        with pytest.raises(PeerClosed) as info:
            await bounded(proto.handshake)
        assert info.value.code == "id_mismatch"
        assert peer_of_b.state == "connected" and peer_of_b._protocol is live and peer_of_b.resumes == 0
        assert peer_of_a.try_send(0x30, b"unharmed")
        await ra.until(1)
        assert ra.received(0x30) == [b"unharmed"]
    finally:
        await stop(a, b, c)


# -- the plaintext start that upgrades (specs/tls.md section 7) -------------------------------

TLS_VECTORS = load_vectors("tls")
THREE = CHANNELS + [ChannelDescriptor(0x40, priority=5, send_queue_capacity=64)]


def three_channel_node(tls, **kwargs):
    kwargs.setdefault("config", CONFIG)
    reactor = Collector(THREE)
    switch = Switch([reactor], tls=tls, clock=the_reactor(), **kwargs)
    switch.startService()
    return switch, reactor


def test_the_pre_hello_is_the_golden_vector_and_no_mconn_packet_or_tls_record():
    """The pre-hello matches its golden vector, and its first byte is neither a TLS record type nor an mconn
    packet type."""
    vector = TLS_VECTORS["pre_hello"]
    assert PRE_HELLO == pre_hello.encode_pre_hello() == expand(vector["hex"])
    assert len(PRE_HELLO) == pre_hello.PRE_HELLO_SIZE == vector["size"]
    parsed = pre_hello.PreHello.parse(PRE_HELLO)
    assert (parsed.marker, parsed.version, parsed.next) == (
        expand(vector["decoded"]["marker"]),
        vector["decoded"]["version"],
        vector["decoded"]["next"],
    )
    pre_hello.decode_pre_hello(PRE_HELLO)
    first = TLS_VECTORS["first_bytes"]
    assert PRE_HELLO[:1] == expand(first["pre_hello"])
    assert {expand(b)[0] for b in first["tls_record_types"]} == TLS_RECORD_TYPES
    assert PRE_HELLO[0] not in TLS_RECORD_TYPES and PRE_HELLO[0] != expand(first["plaintext_mconn_hello"])[0]
    with pytest.raises(MalformedPacket):  # 00 is no mconn packet type
        wire.decode_packet(PRE_HELLO[:1])


@pytest.mark.parametrize("vector", TLS_VECTORS["invalid"], ids=[v["name"] for v in TLS_VECTORS["invalid"]])
def test_an_invalid_pre_hello_vector_is_refused_by_the_decoder(vector):
    """Each invalid pre-hello vector is refused with MalformedPacket naming the expected error, the bytes got
    and the bytes expected."""
    data = expand(vector["hex"])
    with pytest.raises(MalformedPacket, match=vector["error"]) as info:
        pre_hello.decode_pre_hello(data)
    assert data.hex(" ") in str(info.value) and PRE_HELLO.hex(" ") in str(info.value)


class Recorder(protocol.Protocol):
    """One side of the recording relay: what it receives goes to the other side."""

    def __init__(self, relay, direction):
        self.relay, self.direction, self.other = relay, direction, None
        self.lost = defer.Deferred()

    def dataReceived(self, data):
        self.relay.streams[self.direction] += data
        self.other.transport.write(data)

    def connectionLost(self, reason):
        if self.other is not None and self.other.transport is not None:
            self.other.transport.loseConnection()
        self.lost.callback(None)


class Accepted(Recorder):
    """The dialer's side: nothing is read from it until the listener is reached."""

    def connectionMade(self):
        self.transport.pauseProducing()
        self.other = Recorder(self.relay, "down")
        self.other.other = self
        self.relay.sides.append(self.other)
        connecting = self.relay.target.connect(protocol.Factory.forProtocol(lambda: self.other))
        connecting.addCallbacks(lambda _: self.transport.resumeProducing(), lambda _: self.transport.abortConnection())


class RecordingRelay:
    """A loopback relay that records both directions of the connections it carries:
    ``streams["up"]`` is what the dialer sent, ``streams["down"]`` what the listener sent."""

    def __init__(self, target_port):
        self.target = TCP4ClientEndpoint(the_reactor(), "127.0.0.1", target_port)
        self.streams = {"up": b"", "down": b""}
        self.sides = []

    async def start(self):
        self.port = await TCP4ServerEndpoint(the_reactor(), 0, interface="127.0.0.1").listen(
            protocol.Factory.forProtocol(self._accepted)
        )
        return self.port.getHost().port

    def _accepted(self):
        side = Accepted(self, "up")
        self.sides.append(side)
        return side

    async def stop(self):
        await self.port.stopListening()
        for side in self.sides:
            if side.transport is not None and side.transport.connected:
                side.transport.abortConnection()
        await bounded(defer.gatherResults([s.lost for s in self.sides if s.transport is not None]))


@pytest_twisted.ensureDeferred
async def test_the_upgrade_start_proves_the_node_and_carries_three_channels_with_only_the_pre_hello_in_clear():
    """An upgrade start proves both nodes and carries three channels over TLS 1.3; only the pre-hello travels
    in clear."""
    proven = []

    def authorize(node_id, address, certificate):
        proven.append((node_id, node_id_of_certificate(certificate)))
        return True

    key_a, key_b = NodeKey.generate(), NodeKey.generate()
    a, ra = three_channel_node(TLSOptions.identity(key_a, tls_required=False), authorize=authorize)
    b, rb = three_channel_node(TLSOptions.identity(key_b, upgrade=True), authorize=authorize)
    relay = RecordingRelay(await listen(a))
    relay_port = await relay.start()
    try:
        peer_of_a = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{relay_port}"))
        peer_of_b = await bounded(ra.added)
        assert protocol_version(peer_of_a) == "TLSv1.3"
        marker = b"clear-text-marker:" + os.urandom(8).hex().encode()
        for channel in (0x20, 0x30, 0x40):
            assert await peer_of_a.send(channel, marker + bytes([channel]))
            assert await peer_of_b.send(channel, marker + b"back" + bytes([channel]))
        await ra.until(3)
        await rb.until(3)
        for channel in (0x20, 0x30, 0x40):
            assert ra.received(channel) == [marker + bytes([channel])]
            assert rb.received(channel) == [marker + b"back" + bytes([channel])]
        assert sorted(proven) == sorted([(a.node_id, a.node_id), (b.node_id, b.node_id)])
        up, down = relay.streams["up"], relay.streams["down"]
        # The dialer's first bytes are the pre-hello, then a TLS handshake record; the
        # listener answers with TLS at once. No hello and no message travel in clear.
        assert up[:8] == PRE_HELLO and up[8:10] == b"\x16\x03", up[:16].hex(" ")
        assert down[:2] == b"\x16\x03", down[:8].hex(" ")
        for stream in (up, down):
            assert marker not in stream
            assert bytes.fromhex(a.node_id) not in stream and bytes.fromhex(b.node_id) not in stream
        a._check_invariants()
        b._check_invariants()
    finally:
        await stop(a, b)
        await relay.stop()


@pytest_twisted.ensureDeferred
async def test_a_tls_required_listener_refuses_the_pre_hello_and_the_dialer_says_why(telemetry):
    """A tls_required listener refuses an upgrading dialer's pre-hello with a tls_required close, counted and
    reported to the dialer."""
    a, ra = identity_node()  # tls_required=True is the default
    b, rb = node(TLSOptions.identity(NodeKey.generate(), upgrade=True))
    try:
        port = await listen(a)
        with pytest.raises(PeerClosed) as info:
            await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert info.value.code == "tls_required" and "pre-hello" in info.value.text
        assert a.refusals == {"tls_required": 1}
        [event] = telemetry.named("peer_rejected")
        assert event["reason"] == "tls_required" and event["peer_id"] is None
        assert a.peers == {} and b.peers == {}
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_listener_that_allows_the_upgrade_still_takes_tls_first_and_refuses_plaintext_mconn():
    """A listener that allows the upgrade still accepts TLS first, and refuses a plaintext mconn hello as
    tls_required."""
    a, ra = node(TLSOptions.identity(NodeKey.generate(), tls_required=False))
    b, rb = identity_node()
    plain, _ = node(None)
    try:
        port = await listen(a)
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert protocol_version(peer) == "TLSv1.3"
        assert peer.try_send(0x20, b"tls first")
        await ra.until(1)
        assert ra.received(0x20) == [b"tls first"]
        with pytest.raises(PeerClosed) as info:
            await bounded(plain.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert info.value.code == "tls_required"
        assert a.refusals == {"tls_required": 1} and list(a.peers) == [b.node_id]
    finally:
        await stop(a, b, plain)


class Raw(protocol.Protocol):
    """Writes ``data`` on connect and records the answer."""

    def __init__(self, data):
        self.data, self.received = data, b""
        self.lost = defer.Deferred()

    def connectionMade(self):
        self.transport.write(self.data)

    def dataReceived(self, data):
        self.received += data

    def connectionLost(self, reason):
        self.lost.callback(None)


async def raw_exchange(port, data, seconds=5.0):
    raw = Raw(data)
    endpoint = TCP4ClientEndpoint(the_reactor(), "127.0.0.1", port)
    await bounded(endpoint.connect(protocol.Factory.forProtocol(lambda: raw)))
    await bounded(raw.lost, seconds)
    return raw.received


@pytest_twisted.ensureDeferred
async def test_malformed_pre_hellos_are_refused_with_their_reason_and_counted(telemetry):
    """Each malformed pre-hello gets a close with its vector's code and reason, and is counted as
    malformed_pre_hello."""
    a, ra = node(TLSOptions.identity(NodeKey.generate(), tls_required=False))
    try:
        port = await listen(a)
        for vector in TLS_VECTORS["invalid"]:
            answer = await raw_exchange(port, expand(vector["hex"]) + b"\x16\x03\x01")
            packet_type, body = wire.decode_packet(answer)
            code, text = wire.decode_close(body)
            assert packet_type == wire.PacketType.CLOSE and code == vector["close_code"], vector["name"]
            assert expand(vector["hex"]).hex(" ") in text and vector["error"] in text
        assert a.refusals == {"malformed_pre_hello": len(TLS_VECTORS["invalid"])}
        assert {e["reason"] for e in telemetry.named("peer_rejected")} == {"malformed_pre_hello"}
        assert a.peers == {} and a.connections == set()
    finally:
        await stop(a)


@pytest_twisted.ensureDeferred
async def test_a_pre_hello_in_pieces_is_read_whole_and_then_tls_starts(telemetry):
    """A pre-hello arriving in pieces is waited for, not refused; once whole, TLS starts on the bytes after
    it."""
    a, ra = node(TLSOptions.identity(NodeKey.generate(), tls_required=False))
    try:
        port = await listen(a)
        raw = Raw(b"")
        endpoint = TCP4ClientEndpoint(the_reactor(), "127.0.0.1", port)
        await bounded(endpoint.connect(protocol.Factory.forProtocol(lambda: raw)))
        for piece in (PRE_HELLO[:1], PRE_HELLO[1:5], PRE_HELLO[5:]):
            raw.transport.write(piece)
            await sleep(0.05)
        assert not raw.lost.called and raw.received == b""  # neither refused nor answered
        raw.transport.write(b"\x16\x03\x01\x00\x04\x01\x00\x00\x00")  # an empty ClientHello
        await bounded(raw.lost)
        assert raw.received[:1] == b"\x15", raw.received.hex(" ")  # a TLS alert: TLS had started
        [lost] = telemetry.named("connection_lost")
        assert lost["reason_type"] == "TLSError", lost
        assert a.refusals == {} and a.connections == set()
    finally:
        await stop(a)


@pytest_twisted.ensureDeferred
async def test_a_pre_hello_that_stalls_is_ended_by_the_handshake_timeout():
    """A truncated pre-hello that never completes is ended by the handshake timeout, and no connection is
    left."""
    config = CONFIG.replace(handshake_timeout=0.3)
    a, ra = node(TLSOptions.identity(NodeKey.generate(), tls_required=False), config=config)
    try:
        port = await listen(a)
        [truncated] = TLS_VECTORS["truncated"]
        raw = Raw(expand(truncated["hex"]))
        endpoint = TCP4ClientEndpoint(the_reactor(), "127.0.0.1", port)
        await bounded(endpoint.connect(protocol.Factory.forProtocol(lambda: raw)))
        await sleep(0.1)
        assert not raw.lost.called and len(a.connections) == 1  # still waiting for the rest
        await bounded(raw.lost, config.handshake_timeout + CLOSE_LINGER + 2)
        assert raw.received == b""  # the timeout's close went to TLS, which never started
        assert a.connections == set() and a.peers == {}
    finally:
        await stop(a)


@pytest_twisted.ensureDeferred
async def test_an_upgrading_dialer_at_a_plaintext_listener_says_the_peer_does_not_speak_tls():
    """An upgrading dialer at a plaintext listener fails with a TLSError saying the peer answered in
    plaintext."""
    plain, _ = node(None)
    b, rb = node(TLSOptions.identity(NodeKey.generate(), upgrade=True))
    try:
        port = await listen(plain)
        with pytest.raises(TLSError, match="answered the pre-hello in plaintext.*does not seem to speak TLS") as info:
            await bounded(b.dial(f"127.0.0.1:{port}"))
        assert "(a plaintext mconn hello)" in str(info.value)
        assert plain.peers == {} and b.peers == {}
    finally:
        await stop(plain, b)


# -- our own certificate's dates ---------------------------------------------------------------


@pytest.mark.parametrize(
    "dates, state",
    [((NOW - 30 * DAY, NOW - DAY), "has expired"), ((NOW + DAY, NOW + 30 * DAY), "is not yet valid")],
    ids=["expired", "not-yet-valid"],
)
def test_a_node_whose_own_certificate_is_out_of_date_refuses_to_start(tmp_path, dates, state):
    """A node's own expired or not-yet-valid certificate is refused at load, naming the file and its validity
    dates."""
    not_before, not_after = dates
    cert_file, key_file, ca_file, _ = ca_files(tmp_path, CA(), "a", not_before=not_before, not_after=not_after)
    with pytest.raises(ValueError, match=state) as info:
        TLSOptions.from_files(cert_file=cert_file, key_file=key_file, ca_file=ca_file)
    message = str(info.value)
    assert str(cert_file) in message
    assert f"valid from {not_before:%Y-%m-%d %H:%M} to {not_after:%Y-%m-%d %H:%M} UTC" in message


def test_a_reload_to_an_expired_certificate_is_refused_and_the_old_one_kept(tmp_path):
    """reload() to an expired certificate is refused and the current certificate stays in use."""
    ca = CA()
    cert_file, key_file, ca_file, key = ca_files(tmp_path, ca, "a")
    options = TLSOptions.from_files(cert_file=cert_file, key_file=key_file, ca_file=ca_file)
    current = options.certificate
    expired = ca.issue(key, not_before=NOW - 30 * DAY, not_after=NOW - DAY)
    cert_file.write_bytes(expired.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(ValueError, match="has expired"):
        options.reload()
    assert options.certificate is current
