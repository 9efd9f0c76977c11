"""TLS for a Switch: contexts, certificates, and the node id a certificate proves (specs/tls.md).

A ``TLSOptions`` says how a Switch speaks TLS; build one with a class method:

* ``TLSOptions.identity(node_key)``: each node presents a self-signed certificate made
  from its Ed25519 NodeKey; any self-signed certificate passes the TLS layer, and the
  Switch then requires the node id derived from its key to be the one in the hello (and
  the one dialed). No CA, no host names: the node id is the identity.
* ``TLSOptions.from_files(cert_file=..., key_file=..., ca_file=...)``: certificates
  signed by a CA; the dialer checks the listener's host name or IP (service_identity);
  the listener asks for client certificates and, by default, requires them (mutual TLS).
  The leaf key is the node's Ed25519 key, so the node id still comes from the key.
* ``TLSOptions.custom(context_factory)``: the deployment's own pyOpenSSL context factory;
  the Switch still binds the node id to the certificate's key.

TLS comes first: the TLS handshake runs before any mconn byte, so the hello never travels
in clear. A TLS listener refuses a plaintext mconn start with a plaintext close packet
(code ``tls_required``) the dialer can read. A dialer built with ``upgrade=True`` starts
in plaintext instead: it sends the 8-byte pre-hello (``mconn.core.pre_hello.PreHello``, "TLS
follows") and then its ClientHello on the same connection; a listener built with
``tls_required=False`` accepts that start as well as TLS first (specs/tls.md section 7).

Theory of operation
-------------------
``reload()`` only swaps the options' contexts: the connection creators of
``mconn.net.tls_transport`` make each new ``SSL.Connection`` from the *current* context, so
connections already up keep theirs, and no peer is dropped. Each connection carries its
own verify callback (``PeerCheck``, here), which records why a certificate was refused so
the error can say it rather than OpenSSL's "certificate verify failed". The transport
itself (the start before TLS, the TLSMemoryBIOProtocol subclass, error translation, and
``tls_server_factory`` and ``tls_client_endpoint``, which a Switch builds its listening
factory and its dials with) is ``mconn.net.tls_transport``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections.abc import Callable

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID
from OpenSSL import SSL, crypto
from service_identity import CertificateError, VerificationError
from service_identity.cryptography import verify_certificate_hostname, verify_certificate_ip_address

from mconn.errors import AuthenticationError, CertificateMismatch
from mconn.core.node_key import NodeKey, node_id_from_public_key

#: TLS 1.2 cipher suites (TLS 1.3 ones are all modern): forward secrecy, AEAD only.
TLS12_CIPHERS = b"ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL"
#: How long a generated self-signed certificate is valid (regenerated at every start
#: and every reload); it starts a day early to tolerate clock skew between nodes.
IDENTITY_CERT_LIFETIME = datetime.timedelta(days=3650)
IDENTITY_CERT_BACKDATE = datetime.timedelta(days=1)

_SELF_SIGNED_LEAF = 18  # X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT
_VERIFY_ERRORS = {
    2: "unable to get issuer certificate",
    7: "certificate signature failure",
    9: "certificate is not yet valid",
    10: "certificate has expired",
    18: "self-signed certificate: not signed by a CA this node trusts",
    19: "self-signed certificate in certificate chain: not signed by a CA this node trusts",
    20: "unable to get local issuer certificate: not signed by a CA this node trusts",
    21: "unable to verify the first certificate",
    24: "invalid CA certificate",
    26: "unsupported certificate purpose",
}


class TLSOptions:
    """How a Switch speaks TLS; build one with :meth:`identity`, :meth:`from_files` or
    :meth:`custom` and pass it as ``Switch(tls=...)``.

    :ivar mode: ``"identity"``, ``"ca"`` or ``"custom"``.
    :ivar node_key: the NodeKey whose public key the certificate carries (None for
        ``custom``, and for a CA-mode node that has no certificate of its own).
    :ivar anonymous_clients: a listener accepts dialers that present no certificate
        (``from_files(require_client_cert=False)``); their node id is then unproven.
    :ivar tls_required: a listener accepts TLS first only (True, the default) or also the
        plaintext start that upgrades (False); never plaintext mconn.
    :ivar upgrade: a dialer starts in plaintext with the pre-hello, then TLS (True), or
        with TLS at once (False, the default).

    Each builder takes ``tls_required`` and ``upgrade`` as keyword arguments.
    """

    def __init__(
        self,
        mode: str,
        *,
        node_key=None,
        anonymous_clients=False,
        loader=None,
        factory=None,
        tls_required: bool = True,
        upgrade: bool = False,
    ) -> None:
        self.mode = mode
        self.node_key = node_key
        self.anonymous_clients = anonymous_clients
        self.tls_required = bool(tls_required)
        self.upgrade = bool(upgrade)
        self._loader = loader
        self._factory = factory
        self._server_context = self._client_context = None
        self.certificate: x509.Certificate | None = None
        if loader is not None:
            self.reload()

    # -- building ------------------------------------------------------------------

    @classmethod
    def identity(cls, node_key: NodeKey, *, tls_required: bool = True, upgrade: bool = False) -> TLSOptions:
        """Identity mode: a self-signed certificate made from ``node_key``."""
        if not isinstance(node_key, NodeKey):
            raise TypeError(f"TLSOptions.identity needs a NodeKey, got {type(node_key).__name__}")

        def load():
            certificate = self_signed_certificate(node_key)
            server = _context([certificate], node_key.private_key, REQUIRE_CERT)
            client = _context([certificate], node_key.private_key, REQUIRE_CERT)
            return node_key, certificate, server, client

        return cls("identity", node_key=node_key, loader=load, tls_required=tls_required, upgrade=upgrade)

    @classmethod
    def from_files(
        cls,
        *,
        ca_file: str | os.PathLike,
        cert_file: str | os.PathLike | None = None,
        key_file: str | os.PathLike | None = None,
        require_client_cert: bool = True,
        tls_required: bool = True,
        upgrade: bool = False,
    ) -> TLSOptions:
        """CA mode: ``cert_file`` (PEM, the leaf first, then any intermediates) signed by a
        CA in ``ca_file`` (PEM bundle), and ``key_file``, the node's Ed25519 key (PEM, mode
        0600, as written by ``NodeKey.save``).

        Without ``cert_file`` and ``key_file`` the node can only dial listeners that do
        not require client certificates. ``require_client_cert=False`` lets a listener
        accept dialers without a certificate (a certificate presented is still checked).

        :raises ValueError: naming the file, when one is missing, unreadable, malformed, a
            key readable by group or other, a certificate that does not hold that key, or
            a certificate of ``cert_file`` that is expired or not yet valid (with its dates).
        """
        if (cert_file is None) != (key_file is None):
            raise ValueError("TLSOptions.from_files needs both cert_file and key_file, or neither")
        paths = [os.fspath(p) if p is not None else None for p in (ca_file, cert_file, key_file)]

        def load():
            ca, cert, key = paths
            authorities = _read_certificates(ca, "CA bundle")
            chain, node_key = [], None
            if cert is not None:
                node_key = NodeKey.load(key)  # refuses a key that group or other can read
                chain = _read_certificates(cert, "certificate")
                _check_validity(chain, cert)
                if _public_bytes(chain[0]) != node_key.public_key_bytes:
                    raise ValueError(
                        f"certificate {cert!r} holds {_describe_key(chain[0])}, but key file {key!r} is "
                        f"node {node_key.node_id}"
                    )
            private = node_key.private_key if node_key is not None else None
            client_flags = REQUIRE_CERT if require_client_cert else SSL.VERIFY_PEER
            server = _context(chain, private, client_flags, authorities) if chain else None
            client = _context(chain, private, REQUIRE_CERT, authorities)
            return node_key, chain[0] if chain else None, server, client

        return cls(
            "ca", anonymous_clients=not require_client_cert, loader=load, tls_required=tls_required, upgrade=upgrade
        )

    @classmethod
    def custom(
        cls, context_factory, *, node_key: NodeKey | None = None, tls_required: bool = True, upgrade: bool = False
    ) -> TLSOptions:
        """The deployment's own TLS policy: ``context_factory`` is anything
        ``TLSMemoryBIOFactory`` takes (``CertificateOptions``, an
        IOpenSSLServerConnectionCreator / IOpenSSLClientConnectionCreator, or an object
        whose ``getContext()`` returns an ``SSL.Context``), used for both directions.

        Its certificate must carry the node's Ed25519 key and it must ask for the peer's
        (the Switch refuses peers without one); checking host names is up to it.
        """
        return cls("custom", node_key=node_key, factory=context_factory, tls_required=tls_required, upgrade=upgrade)

    def reload(self) -> None:
        """Read the certificate and key files again; new connections use them, live ones
        keep theirs. The node id must not change.

        :raises ValueError: as ``from_files``, or if the new key is another node's; the
            old contexts stay in use.
        """
        if self._loader is None:
            return
        node_key, certificate, server, client = self._loader()
        if self._client_context is not None:  # not the first load
            before, after = (k.node_id if k is not None else "none (no certificate)" for k in (self.node_key, node_key))
            if before != after:
                raise ValueError(f"reload would change the node id from {before} to {after}; restart the node instead")
        self.node_key = node_key
        self.certificate, self._server_context, self._client_context = certificate, server, client

    # -- the Switch's side -----------------------------------------------------------

    @property
    def server_context(self) -> SSL.Context | None:
        """The current context of a listener (None for ``custom``, or without a certificate)."""
        return self._server_context

    @property
    def client_context(self) -> SSL.Context | None:
        """The current context of a dialer (None for ``custom``)."""
        return self._client_context

    @property
    def context_factory(self):
        """The deployment's own context factory of ``custom`` (None in the other modes)."""
        return self._factory

    def peer_certificate(self, transport, node_id: str, *, inbound: bool) -> x509.Certificate | None:
        """The peer's certificate, once its key is known to be node ``node_id`` (the hello's).

        :returns: None only for a dialer without a certificate that ``anonymous_clients``
            lets in (its node id is unproven).
        :raises CertificateMismatch: if the certificate's key is another node's.
        :raises AuthenticationError: if there is no certificate, or its key is not Ed25519.
        """
        handle = transport.getHandle()
        certificate = handle.get_peer_certificate(as_cryptography=True) if handle is not None else None
        if certificate is None:
            if inbound and self.anonymous_clients:
                return None
            raise AuthenticationError(f"the peer presented no TLS certificate, so its node id {node_id} is not proven")
        proven = node_id_of_certificate(certificate)
        if proven != node_id:
            raise CertificateMismatch(proven, node_id)
        return certificate


# -- certificates ------------------------------------------------------------------------


def self_signed_certificate(node_key: NodeKey, *, now: datetime.datetime | None = None) -> x509.Certificate:
    """The identity-mode certificate of ``node_key`` (specs/tls.md section 3): subject and
    issuer CN = the node id, the node's Ed25519 public key, signed by that key."""
    now = now or datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_key.node_id)])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(node_key.private_key.public_key())
        .serial_number(int.from_bytes(secrets.token_bytes(16), "big") >> 1)
        .not_valid_before(now - IDENTITY_CERT_BACKDATE)
        .not_valid_after(now + IDENTITY_CERT_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(node_key.private_key, None)
    )


def node_id_of_certificate(certificate: x509.Certificate) -> str:
    """The node id of a certificate's public key (``NodeKey.node_id``'s derivation).

    :raises AuthenticationError: if the key is not Ed25519.
    """
    key = certificate.public_key()
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise AuthenticationError(
            f"the peer's certificate holds {_describe_key(certificate)}; mconn node ids come from Ed25519 keys"
        )
    return node_id_from_public_key(_public_bytes(certificate))


def _public_bytes(certificate: x509.Certificate) -> bytes:
    from cryptography.hazmat.primitives import serialization

    key = certificate.public_key()
    if not isinstance(key, ed25519.Ed25519PublicKey):
        return b""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _describe_key(certificate: x509.Certificate) -> str:
    """'the key of node <id>' or 'a <kind> key (<bits> bits)', for messages."""
    key = certificate.public_key()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return f"the key of node {node_id_from_public_key(_public_bytes(certificate))}"
    kind = type(key).__name__.lstrip("_").replace("PublicKey", "") or "unknown"
    size = getattr(key, "key_size", None)
    return f"a {kind} key" + (f" ({size} bits)" if size else "")


def _read_certificates(path: str, what: str) -> list[x509.Certificate]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"cannot read {what} {path!r}: {e.strerror or e}") from e
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise ValueError(f"{what} {path!r} is not PEM certificates ({e})") from e
    return certificates


def _check_validity(chain: list[x509.Certificate], path: str, now: datetime.datetime | None = None) -> None:
    """Refuse to start with a certificate of our own that peers would refuse for its dates."""
    now = now or datetime.datetime.now(datetime.UTC)
    for depth, certificate in enumerate(chain):
        start, end = certificate.not_valid_before_utc, certificate.not_valid_after_utc
        if start <= now <= end:
            continue
        state = "has expired" if now > end else "is not yet valid"
        which = "" if depth == 0 else f" (intermediate {depth}, {_subject(certificate)})"
        raise ValueError(
            f"certificate {path!r}{which} {state}: valid from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC, "
            f"now is {now:%Y-%m-%d %H:%M} UTC; renew it"
        )


# -- contexts ----------------------------------------------------------------------------

#: The verify mode that asks for the peer's certificate and fails without one.
REQUIRE_CERT = SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT


def _context(chain, private_key, verify_flags: int, authorities=None) -> SSL.Context:
    """A context: TLS 1.2 at least (1.3 preferred), no compression, no renegotiation, no
    session resumption (every connection verifies its peer), modern ciphers only.
    ``authorities`` None means identity mode (no CA store)."""
    ctx = SSL.Context(SSL.TLS_METHOD)
    ctx.set_min_proto_version(SSL.TLS1_2_VERSION)
    ctx.set_options(
        SSL.OP_NO_COMPRESSION | SSL.OP_NO_RENEGOTIATION | SSL.OP_NO_TICKET | SSL.OP_CIPHER_SERVER_PREFERENCE
    )
    ctx.set_cipher_list(TLS12_CIPHERS)
    ctx.set_session_cache_mode(SSL.SESS_CACHE_OFF)
    ctx.set_session_id(b"mconn")
    if chain:
        ctx.use_certificate(chain[0])
        for extra in chain[1:]:
            ctx.add_extra_chain_cert(extra)
        ctx.use_privatekey(private_key)
        ctx.check_privatekey()
    if authorities is not None:
        store = ctx.get_cert_store()
        assert store is not None  # a context always has its store
        for authority in authorities:
            store.add_cert(crypto.X509.from_cryptography(authority))
    ctx.set_verify(verify_flags)  # each connection sets its own callback (PeerCheck)
    return ctx


class PeerCheck:
    """The verify callback of one connection: identity mode accepts exactly a self-signed
    leaf (the key is what counts, checked after the handshake); CA mode accepts what
    OpenSSL's chain check accepts, and a dial also checks the host name."""

    def __init__(self, by_ca: bool, host: str | None = None) -> None:
        self.by_ca = by_ca
        self.host = host
        #: Why the peer's certificate was refused, once it was.
        self.failure: str | None = None

    def __call__(self, connection, certificate, errnum: int, depth: int, ok: int) -> bool:
        try:
            self.failure = self._refusal(certificate.to_cryptography(), errnum, depth, ok)
        except Exception as e:  # never let an exception escape into OpenSSL
            self.failure = f"certificate check failed: {type(e).__name__}: {e}"
        return self.failure is None

    def _refusal(self, certificate: x509.Certificate, errnum: int, depth: int, ok: int) -> str | None:
        subject = _subject(certificate)
        if not self.by_ca:
            if depth == 0 and (ok or errnum == _SELF_SIGNED_LEAF):
                return None
            return f"certificate {subject} refused in identity mode: {_verify_error(errnum, certificate)}"
        if not ok:
            return f"certificate {subject} (depth {depth}) refused: {_verify_error(errnum, certificate)}"
        if depth == 0 and self.host is not None:
            return _host_mismatch(certificate, self.host)
        return None


def _host_mismatch(certificate: x509.Certificate, host: str) -> str | None:
    """Why the certificate does not name ``host`` (service_identity), or None if it does."""
    check: Callable[[x509.Certificate, str], None]
    if is_ip(host):
        check, kind = verify_certificate_ip_address, "IP address"
    else:
        check, kind = verify_certificate_hostname, "host name"
    try:
        check(certificate, host)
    except (VerificationError, CertificateError) as e:
        return f"certificate {_subject(certificate)} does not name the {kind} {host!r} that was dialed ({e})"
    return None


def _verify_error(errnum: int, certificate: x509.Certificate) -> str:
    text = _VERIFY_ERRORS.get(errnum, f"X509 verify error {errnum}")
    if errnum in (9, 10):
        text += (
            f" (valid {certificate.not_valid_before_utc:%Y-%m-%d %H:%M} to "
            f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC)"
        )
    return text


def _subject(certificate: x509.Certificate) -> str:
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return repr(names[0].value) if names else certificate.subject.rfc4514_string() or "(no subject)"


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
