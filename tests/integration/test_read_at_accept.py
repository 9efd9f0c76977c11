"""Read at accept on real loopback sockets (mconn/net/write_through.py ``read_now``,
specs/connection.md section 7): an inbound plain TCP connection reads what its dialer
sent before the listener accepted it while the connection is set up, so the hello is
answered (our hello and the session answer, in one send) before ``connectionMade``
returns, and the transport never watches for writability; a dialer that has not spoken
yet, one that is gone before the accept, and an error while reading change nothing else.
"""

import socket
import struct

import pytest
import pytest_twisted
from twisted.internet import tcp

from helpers import (
    RecordingReactor,
    Telemetry,
    bounded,
    buffered,
    dialer_hello,
    listening_switches,
    parse_packets,
    stop_switches,
    the_reactor,
    until,
)
from mconn import ChannelDescriptor, Switch
from mconn.net.protocol import MConnectionProtocol
from mconn.core.wire import PacketType

pytestmark = pytest.mark.integration

CH = 0x20


@pytest.fixture
def made(monkeypatch):
    """What each inbound connection looked like when its connectionMade returned: (the
    protocol, whether it carried a session, the bytes Twisted still held), and the
    transports that asked the reactor to watch for writability."""
    seen = {"made": [], "writing": set()}
    connection_made, start_writing = MConnectionProtocol.connectionMade, tcp.Server.startWriting

    def recording(self):
        connection_made(self)
        seen["made"].append((self, self.peer is not None, buffered(self.transport)))

    def watching(self):
        seen["writing"].add(self)
        start_writing(self)

    monkeypatch.setattr(MConnectionProtocol, "connectionMade", recording)
    monkeypatch.setattr(tcp.Server, "startWriting", watching)
    return seen


def client(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setblocking(False)
    return s


async def received(s: socket.socket, kinds: list) -> list:
    """The packets read from ``s`` once their types begin with ``kinds``."""
    data = bytearray()

    def enough():
        try:
            data.extend(s.recv(65536))
        except BlockingIOError:
            pass
        try:
            return [p[0] for p in parse_packets(bytes(data))][: len(kinds)] == kinds
        except AssertionError:  # a packet not whole yet
            return False

    await until(enough, f"packets {kinds}")
    return parse_packets(bytes(data))


@pytest_twisted.ensureDeferred
async def test_a_hello_sent_before_the_accept_is_answered_as_the_connection_is_set_up(made):
    """The dialer's hello is in the socket before the listener accepts: when
    connectionMade returns the session is up and Twisted holds nothing (our hello and
    the answer went to the kernel in one send); the transport never watched for
    writability, and the dialer gets both. Without the read at accept the session waits
    for the next read, and our hello for the next write, a turn later."""
    (listener,), port = await listening_switches([RecordingReactor([ChannelDescriptor(CH)])])
    s = client(port)
    try:
        s.sendall(dialer_hello(node_id="ab" * 20))  # before the reactor runs again: before the accept
        packets = await received(s, [PacketType.HELLO, PacketType.SESSION])
        [(proto, carried, held)] = made["made"]
        assert carried and held == 0
        assert proto.transport not in made["writing"]
        assert listener.peers["ab" * 20].state == "connected"
        assert packets[1][0] == PacketType.SESSION
    finally:
        s.close()
        await stop_switches(listener)


@pytest_twisted.ensureDeferred
async def test_a_dialer_that_speaks_later_is_read_when_it_does(made):
    """Nothing was sent before the accept: our hello goes out like any other write (buffered,
    sent in the next turn), and the dialer's hello is read when it comes."""
    (listener,), port = await listening_switches([RecordingReactor([ChannelDescriptor(CH)])])
    s = client(port)
    try:
        await received(s, [PacketType.HELLO])
        [(proto, carried, held)] = made["made"]
        assert not carried and held > 0
        assert proto.transport in made["writing"]
        s.sendall(dialer_hello(node_id="ab" * 20))
        await received(s, [PacketType.SESSION])
        await until(lambda: "ab" * 20 in listener.peers, "the session")
    finally:
        s.close()
        await stop_switches(listener)


@pytest.mark.parametrize("how", ["close", "reset", "hello then close"])
@pytest_twisted.ensureDeferred
async def test_a_dialer_gone_before_the_accept_is_released_and_the_port_goes_on(made, how):
    """The dialer closed (or reset) its end before the listener accepted: the
    connection ends as any other (connection_lost, its admission released), and the
    listener accepts and answers the next dialer."""
    telemetry = Telemetry().start()
    (listener,), port = await listening_switches([RecordingReactor([ChannelDescriptor(CH)])])
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if how == "hello then close":
            s.sendall(dialer_hello(node_id="ef" * 20))
        if how == "reset":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        await until(lambda: len(telemetry.named("connection_lost")) == 1, "the first connection's end")
        # With a hello before the close, the read at accept answered it (a reset or a
        # close alone leaves the end to the reactor's read, which reports it).
        assert made["made"][0][1] is (how == "hello then close")
        assert not listener.connections and listener._admission.pending == 0
        assert listener._admission.per_ip == {}
        other = Switch([RecordingReactor([ChannelDescriptor(CH)])], clock=the_reactor())
        other.startService()
        try:
            peer = await bounded(other.dial(f"{listener.node_id}@127.0.0.1:{port}"))
            assert peer.state == "connected"
        finally:
            await stop_switches(other)
    finally:
        telemetry.stop()
        await stop_switches(listener)


@pytest_twisted.ensureDeferred
async def test_an_error_while_reading_at_accept_drops_that_connection_only(made, monkeypatch):
    """An exception out of the read at accept is logged and aborts that connection,
    as the reactor's own read would; the listening port is untouched and the next
    dialer is accepted and answered."""
    data_received = MConnectionProtocol.dataReceived
    failures = []

    def failing_once(self, data):
        if not failures:
            failures.append((self, len(made["made"])))  # 0: inside connectionMade
            raise RuntimeError("a bug in dataReceived")
        data_received(self, data)

    monkeypatch.setattr(MConnectionProtocol, "dataReceived", failing_once)
    (listener,), port = await listening_switches([RecordingReactor([ChannelDescriptor(CH)])])
    first = client(port)
    try:
        first.sendall(dialer_hello(node_id="ab" * 20))
        await until(lambda: failures and not failures[0][0].transport.connected, "the failed connection's end")
        assert failures[0][1] == 0  # it was the read at accept that failed
        assert "ab" * 20 not in listener.peers
        s = client(port)
        s.sendall(dialer_hello(node_id="ef" * 20))
        await received(s, [PacketType.HELLO, PacketType.SESSION])
        assert listener.peers["ef" * 20].state == "connected"
        s.close()
    finally:
        first.close()
        await stop_switches(listener)
