"""Which errors are link failures and which are a peer's misbehaviour (mconn/errors.py ``kind``).

Logs, metrics and telemetry read the kind from here (specs/telemetry.md ``link_failed`` and
``protocol_error``; specs/status.md ``mconn_link_failures_total``), so a network blip is
never reported as the peer's protocol error.
"""

import pytest

from mconn import errors

LINK_FAILURES = (
    errors.PongTimeout("no pong"),
    errors.HandshakeTimeout("no hello"),
    errors.ConnectionLost("connection lost: Connection reset by peer"),
    errors.ConnectionLost("connection lost: [Errno 110] Connection timed out"),  # TCP_USER_TIMEOUT
    errors.TLSError("TLS failed"),
    errors.WebSocketError("the connection ended before the WebSocket upgrade"),
    errors.ProxyError("no tunnel"),
)
MISBEHAVIOUR = (
    errors.MalformedPacket("bad bytes"),
    errors.UnknownPacketType("type 0x99"),
    errors.PacketTooLarge("too large"),
    errors.UnexpectedPacket("ack before the session"),
    errors.UnknownChannel("channel 0x99"),
    errors.MessageTooLarge("over recv_message_capacity"),
    errors.AckError("more than sent"),
    errors.ControlFlood("pings too fast"),
    errors.DecodeError(0x20, "codec", 3, ValueError("bad")),
    errors.IncompatiblePeer("no common version"),
    errors.RecvRateTooSmall("10 bytes/s"),
    errors.HandshakeError("no hello"),
)
OTHER = (
    errors.PeerClosed("shutdown", ""),
    errors.ConnectionClosed("shutdown"),
    errors.ReactorError("r", 0x20, ValueError("x")),
    errors.SessionExpired(30.0, {}),
    errors.SessionRejected("unknown session", {}),
    errors.PeerRejected("duplicate", "a second connection"),
    errors.LocalProtocolError("sent on a closed connection"),
    errors.DialGaveUp(None, "max_reconnects"),
)


@pytest.mark.parametrize("error", LINK_FAILURES, ids=lambda e: type(e).__name__)
def test_timeouts_and_broken_transports_are_link_failures(error):
    """A silent peer, a handshake that never came, a reset and a TCP user timeout are link failures."""
    assert errors.error_kind(error) == error.kind == errors.LINK == "link"


@pytest.mark.parametrize("error", MISBEHAVIOUR, ids=lambda e: type(e).__name__)
def test_what_the_protocol_forbids_is_misbehaviour(error):
    """Malformed and oversize packets, violations, floods and bad hellos are the peer's misbehaviour."""
    assert errors.error_kind(error) == errors.MISBEHAVIOUR == "misbehaviour"


@pytest.mark.parametrize("error", OTHER, ids=lambda e: type(e).__name__)
def test_closes_refusals_and_session_ends_are_neither(error):
    """Closes on purpose, refusals, session ends and local misuse are neither kind."""
    assert errors.error_kind(error) == errors.OTHER == "other"


def test_a_reactors_own_protocol_error_is_misbehaviour_and_a_foreign_exception_is_other():
    """A reactor's RemoteProtocolError subclass inherits misbehaviour; an exception outside mconn is other."""

    class Misbehaved(errors.RemoteProtocolError):
        pass

    assert errors.error_kind(Misbehaved("bad vote")) == errors.MISBEHAVIOUR
    assert errors.error_kind(OSError("reset")) == errors.OTHER
    assert errors.error_kind(ValueError("x")) == errors.OTHER
    assert set(errors.KINDS) == {"link", "misbehaviour", "other"}
