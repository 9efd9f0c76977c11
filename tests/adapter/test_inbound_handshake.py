"""A listener's inbound handshake does its per-peer work once (bench/history/2026-11-25.md,
"Connect storm": the listener's work once per Switch): the pending count of Admission ends without a callback on the
handshake Deferred, the session answer comes from bytes encoded once, and peers that
announce the same channels share one table of message limits. What a peer sees is what
per-peer work would give it.
"""

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.internet.error import ConnectionDone
from twisted.python.failure import Failure

from helpers import RecordingReactor, dialer_hello
from mconn import ChannelDescriptor, Config, Switch
from mconn.core import wire
from mconn.errors import ConnectionLost
from mconn.net.protocol import MConnectionFactory
from mconn.core.session_table import UNKNOWN_AFTER_RESTART
from mconn.core.wire import PacketType, SessionAnswer, SessionRequest

CHANNELS = [ChannelDescriptor(0x20, recv_message_capacity=5000)]


def _dialer_hello(request: SessionRequest, capacity: int = 5000) -> bytes:
    return dialer_hello(request, channels=[ChannelDescriptor(0x20, recv_message_capacity=capacity)])


def _inbound(switch, host="198.51.100.7"):
    proto = MConnectionFactory(switch, is_outbound=False).buildProtocol(None)
    transport = StringTransport(peerAddress=IPv4Address("TCP", host, 40000))
    proto.makeConnection(transport)
    transport.clear()
    return proto, transport


def _switch():
    return Switch([RecordingReactor(CHANNELS)], clock=Clock(), config=Config(stats_interval=0))


def test_the_pending_handshake_ends_at_the_session_and_at_a_loss_without_a_deferred_callback():
    """Admitted, a connection is pending; a session ends the pending count (Admission is
    told directly, not by a callback on the handshake Deferred) and fires the Deferred
    with the Peer, and a connection lost before its hello ends it too and fires the
    Deferred (a failure nobody waits for). The invariants hold at each step."""
    switch = _switch()
    admission = switch._connections.admission
    first, _ = _inbound(switch)
    second, _ = _inbound(switch)
    assert admission.pending == 2
    switch._check_invariants()
    first.dataReceived(_dialer_hello(SessionRequest(session_id=b"\x11" * 16, resume=False)))
    assert admission.pending == 1 and first.handshake.called
    assert first.handshake.result is first.peer and first.peer.state == "connected"
    switch._check_invariants()
    second.connectionLost(Failure(ConnectionDone()))
    assert admission.pending == 0 and second.handshake.called
    assert isinstance(second.end_reason, ConnectionLost)
    switch._check_invariants()


def test_the_session_answer_is_the_declared_one_for_a_new_session_and_a_refused_resume():
    """A new session's answer names the dialer's session id; a resume of a session this
    node does not hold gets a new id and the reason: the bytes are exactly the encoded
    SessionAnswer each time, after our hello."""
    switch = _switch()
    proto, transport = _inbound(switch)
    proto.dataReceived(_dialer_hello(SessionRequest(session_id=b"\x22" * 16, resume=False)))
    answer = SessionAnswer(session_id=b"\x22" * 16, resumed=False)
    assert transport.value() == wire.encode_extension(PacketType.SESSION, wire.encode_session_answer(answer))
    proto, transport = _inbound(switch, host="198.51.100.8")
    proto.dataReceived(_dialer_hello(SessionRequest(session_id=b"\x33" * 16, resume=True, delivered={0x20: 4})))
    new_id = proto.peer.session.id
    assert new_id != b"\x33" * 16
    answer = SessionAnswer(session_id=new_id, resumed=False, reason=UNKNOWN_AFTER_RESTART)
    assert transport.value() == wire.encode_extension(PacketType.SESSION, wire.encode_session_answer(answer))


def test_peers_that_announce_the_same_channels_share_one_limits_table():
    """Two peers announcing the same channels refer to one limits dict (read only by a
    Peer); a peer announcing another capacity gets its own, with the smaller capacity,
    and the first ones keep theirs."""
    switch = _switch()
    peers = []
    for index, capacity in enumerate((9000, 9000, 100)):
        proto, _ = _inbound(switch, host=f"198.51.100.{10 + index}")
        proto.dataReceived(_dialer_hello(SessionRequest(session_id=bytes([index]) * 16, resume=False), capacity))
        peers.append(proto.peer)
    assert peers[0]._limits is peers[1]._limits == {0x20: 5000}
    assert peers[2]._limits == {0x20: 100} and peers[2]._limits is not peers[0]._limits
    assert peers[0]._limits == {0x20: 5000}


def test_an_inbound_connection_keeps_its_attributes_within_the_instance_values():
    """After its handshake an inbound connection's protocol has at most 28 instance
    attributes (rarely set ones are class defaults): CPython keeps up to ~30 in the
    instance itself and builds a dict of them past that (~1.2 KiB per connection, ~20%
    of a connected peer's memory), so each one added counts."""
    switch = _switch()
    proto, _ = _inbound(switch)
    proto.dataReceived(_dialer_hello(SessionRequest(session_id=b"\x44" * 16, resume=False)))
    assert proto.peer is not None and proto.session_request is None
    assert len(vars(proto)) <= 28, sorted(vars(proto))


def test_an_inbound_handshake_makes_its_deferred_only_when_asked_for_it():
    """Nobody waits on an inbound handshake, so a listener makes no Deferred for one:
    the outcome is kept (``handshake_ended``), and a Deferred asked for afterwards fires
    with it at once (the Peer; a failure, which an inbound one consumes); one asked for
    before fires when it ends, once, with the first outcome."""
    switch = _switch()
    done, _ = _inbound(switch)
    lost, _ = _inbound(switch)
    waited, _ = _inbound(switch)
    early = waited.handshake
    done.dataReceived(_dialer_hello(SessionRequest(session_id=b"\x55" * 16, resume=False)))
    lost.connectionLost(Failure(ConnectionDone()))
    waited.dataReceived(_dialer_hello(SessionRequest(session_id=b"\x66" * 16, resume=False)))
    assert done._handshake is None and lost._handshake is None
    assert done.handshake_ended and lost.handshake_ended
    assert done.handshake.result is done.peer and done.peer.state == "connected"
    assert lost.handshake.called and isinstance(lost._outcome, ConnectionLost)  # its failure consumed, as ever
    assert early.called and early.result is waited.peer
    waited.end_handshake(ConnectionLost("later"))  # a second outcome changes nothing
    assert waited.handshake is early and early.result is waited.peer
