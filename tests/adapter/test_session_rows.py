"""Rows of specs/resume.md section 3.1 driven on a real Switch against a scripted peer.

tests/adapter/test_resume_spec.py drives the rows of section 3 with two real Switches.
Some rows of section 3.1 need a peer that misbehaves in a way a real Switch never does;
here a real dialing Switch (``mconn.testing.MemoryNetwork`` whose clock is a
``MemoryReactorClock``, so its dials reach whatever listens at the port) re-dials a
scripted listener, and the Peer's state, the reactor calls and the telemetry are checked
against the spec's row.
"""

from __future__ import annotations

import pathlib
import re

from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock

from helpers import RecordingReactor, close_packets_in, hello_packet, new_node_id, parse_packets
from mconn import ChannelDescriptor, Config
from mconn.core import wire
from mconn.errors import AckError
from mconn.core.session_table import PeerState, SessionInput, step
from mconn.testing import MemoryNetwork
from mconn.core.wire import PacketType

SPEC_TEXT = (pathlib.Path(__file__).resolve().parents[2] / "specs" / "resume.md").read_text()
CHANNELS = [ChannelDescriptor(0x20, priority=5), ChannelDescriptor(0x21, priority=1)]
CONFIG = Config(stats_interval=0)
#: The events a row's "Telemetry" column lists.
SESSION_EVENTS = {"session_started", "session_suspended", "session_resumed", "session_ended", "dial_attempt"}


def spec_row(state: str, side: str, input_: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(next state, reactor calls, telemetry) of one row of specs/resume.md section 3.1."""
    block = SPEC_TEXT.split("<!-- session-states-more:begin -->")[1].split("<!-- session-states-more:end -->")[0]
    start = f"| `{state}` | {side} | `{input_}` |"
    [line] = [line for line in block.splitlines() if line.startswith(start)]
    cells = [c.strip() for c in line.strip().strip("|").split("|")]

    def items(cell: str) -> tuple[str, ...]:
        return () if cell == "—" else tuple(re.findall(r"`([^`]+)`", cell))

    [next_state] = items(cells[3])
    return next_state, items(cells[4]), items(cells[5])


class ScriptedListener(Protocol):
    """Sends its hello on connect, records the dialer's session request, and answers it
    only when the test calls ``answer``."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.data = bytearray()
        self.request: wire.SessionRequest | None = None
        self.lost = None

    def connectionMade(self) -> None:
        self.transport.write(hello_packet(self.node_id, CHANNELS))

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        if self.request is None:
            hellos = [p[1] for p in parse_packets(self.data) if p[0] == PacketType.HELLO]
            if hellos:
                fields = dict(wire.decode_hello(hellos[0]).fields)
                self.request = wire.decode_session_request(fields[wire.HelloTag.SESSION])

    def answer(self, answer: wire.SessionAnswer) -> None:
        self.transport.write(wire.encode_extension(PacketType.SESSION, wire.encode_session_answer(answer)))

    def connectionLost(self, reason) -> None:
        self.lost = reason


class ScriptedNode(Factory):
    """A listening node id whose connections are ScriptedListeners (newest last)."""

    def __init__(self) -> None:
        self.node_id = new_node_id()
        self.connections: list[ScriptedListener] = []

    def buildProtocol(self, addr):
        protocol = ScriptedListener(self.node_id)
        self.connections.append(protocol)
        return protocol


def session_events(telemetry, node_id: str) -> list[dict]:
    return [e for e in telemetry.events if e["event"] in SESSION_EVENTS and e.get("node_id") == node_id]


def notation(event: dict) -> str:
    return f"dial_attempt({event['result']})" if event["event"] == "dial_attempt" else event["event"]


def test_connecting_dialer_gets_a_resume_with_impossible_counts(telemetry):
    """Section 3.1, (connecting, dialer, resume with impossible counts): the listener's
    answer resumes the session but claims 5 deliveries on 0x20, where the dialer sent
    none. The dialer's Peer goes to closed with remove_peer(AckError) and session_ended
    (exactly the row's calls and events), the connection fails with close code AckError,
    and no further re-dial goes out."""
    network = MemoryNetwork(MemoryReactorClock())
    reactor = RecordingReactor(CHANNELS)
    switch = network.switch([reactor], config=CONFIG)
    switch.startService()
    scripted = ScriptedNode()
    network.clock.listenTCP(26656, scripted, interface="127.0.0.1")

    # The first session: a plain dial, answered fresh under the dialer's id.
    results = []
    switch.dial(f"{scripted.node_id}@127.0.0.1:26656").addBoth(results.append)
    network.complete_dials()
    first = scripted.connections[0]
    assert first.request is not None and not first.request.resume
    first.answer(wire.SessionAnswer(session_id=first.request.session_id, resumed=False))
    network.flush()
    [peer] = results
    assert peer.state == "connected" and peer.address is not None

    # A break: the dialer suspends and re-dials; the re-dial reaches the scripted node.
    network.links[-1].reset()
    assert peer.state == "suspended"
    for _ in range(20):  # the re-dial's HostnameEndpoint attempt goes out within a second
        network.complete_dials()
        network.clock.advance(0.1)
        if len(scripted.connections) == 2:
            break
    network.flush()
    second = scripted.connections[1]
    assert second.request == wire.SessionRequest(session_id=first.request.session_id, resume=True, delivered={})
    assert peer.state == "connecting"
    calls_before, events_before = len(reactor.calls), len(telemetry.events)
    node_id = switch.node_id

    second.answer(wire.SessionAnswer(session_id=second.request.session_id, resumed=True, delivered={0x20: 5}))
    network.flush()

    next_state, calls, events = spec_row("connecting", "dialer", "resume with impossible counts")
    assert (next_state, calls, events) == ("closed", ("remove_peer(AckError)",), ("session_ended",))
    row = step(PeerState.CONNECTING, SessionInput.IMPOSSIBLE_COUNTS)  # the row the session manager applied
    assert (row.next.value, row.reactor_calls(), row.telemetry()) == (next_state, calls, events)
    assert peer.state == next_state
    [(name, removed, reason)] = reactor.calls[calls_before:]
    assert (name, removed) == ("remove_peer", peer) and isinstance(reason, AckError)
    assert f"remove_peer({type(reason).__name__})" == calls[0]
    emitted = [e for e in session_events(telemetry, node_id) if e in telemetry.events[events_before:]]
    assert tuple(notation(e) for e in emitted) == events, [notation(e) for e in emitted]
    assert emitted[0]["reason_type"] == "AckError"
    [(code, text)] = close_packets_in(second.data)
    assert code == "AckError" and text == str(reason)
    assert "5 messages delivered on channel 0x20" in text
    assert second.lost is not None
    assert node_id not in [p.node_id for p in switch.peers.values()] and not peer.try_send(0x20, b"late")
    switch._check_invariants()
    for _ in range(50):  # the session is over: its re-dialer has stopped
        network.complete_dials()
        network.clock.advance(0.1)
    assert len(scripted.connections) == 2
