"""The handshake and session-answer paths of a real Switch as a fuzz target, with checks.

Shared by the hypothesis tests (tests/adapter/test_fuzz_handshake.py) and the atheris
harness (fuzz_switch.py). A *scenario* says which side our Switch is on and what it
already holds, the first packet the other end sends (a structure-aware hello or session
answer from tests/fuzz/handshake_inputs.py, or nothing: the stream is raw bytes), the
bytes after it, and how the whole is cut and timed:

* listener: a raw peer connects and sends a hello (session request in field 01). The
  Switch holds nothing, a connected session with a good Switch, or that session
  suspended (with unacknowledged messages, so resume counts matter); ``CLAIMED`` and
  ``HELD`` name that node and session, so a hello can prove, claim or miss it;
* dialer: the Switch dials a scripted listener that sends a valid hello, then the
  fuzzed session answer (packet 07). The Switch holds nothing (a first dial), a
  suspended session it is re-dialing to resume, or a connected session the dialed node
  opened to us meanwhile (a simultaneous dial; ``low`` says whose node id is smaller).

After every step: nothing escaped into the clock and nothing was logged as a failure;
``_check_invariants`` holds on every Switch; every Peer's reactor calls follow the
contract and agree with its state and with the peer table; every live connection holds
no more than the configured limits and a peer that does not read gets no more than the
transport window plus one write. At the end (time passed for every timer): the fuzzed
connection is closed for a specific reason (a specific RemoteProtocolError, a
PeerRejected reason, the peer's own close), and the Switch wrote exactly one close
packet naming it (none for a pong timeout or the peer's close, which may also come in the
read we would refuse it for), as the last packet.
``run`` raises AssertionError when a check fails; any other exception is a bug as well.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from twisted.internet.protocol import Factory
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure

from helpers import RawPeer, RecordingReactor
from mconn import MConnError, NodeKey, PeerClosed, PeerRejected, PeerState, RemoteProtocolError
from mconn.core import wire
from mconn.core.connection import State
from mconn.errors import AckError, PongTimeout
from mconn.core.events import CloseReceived, ConnectionFailed
from mconn.core.frame_buffer import FrameBuffer
from mconn.core.handshake import make_hello
from mconn.testing import MemoryNetwork
from mconn.core.wire import HelloTag, PacketType, SessionRequest

from tests.fuzz.declared import Reader
from tests.fuzz.handshake_inputs import HELDS, SIZES, Names, Scenario, draw_answer, draw_hello
from tests.fuzz.target import CHANNELS, CONFIG, MAX_BUFFERED, MAX_HEADER, SPECIFIC, WAITS, check_bounds

#: Room for a hello listing 257 channels, so that the hello's own channel limit is reached.
SWITCH_CONFIG = CONFIG.replace(max_hello_size=1536, resume_grace=1.0, stats_interval=0)
assert SWITCH_CONFIG.max_hello_size + MAX_HEADER <= MAX_BUFFERED  # check_bounds still applies
#: Bytes on their way to a peer that does not read before our side is paused.
WINDOW = 256
#: What one write may add past the window: a batch of data, the control backlog, a close.
MAX_WRITE = SWITCH_CONFIG.write_batch_bytes + (SWITCH_CONFIG.max_control_backlog + 1) * (
    SWITCH_CONFIG.max_control_size + MAX_HEADER
)
#: The specific reasons a connection may end for (the core's, and the session layer's).
SWITCH_SPECIFIC = SPECIFIC | {AckError}
#: PeerRejected reasons a Switch without TLS, limits or authorize may give (specs/resume.md:
#: a duplicate, ourselves, a lost simultaneous dial, a held session nothing proves a claim
#: to). ``internal_error`` is not one: it means a decision raised.
REJECTIONS = frozenset({"duplicate", "self", "simultaneous_dial", "session_held"})
#: Long enough for every timer a silent peer can start to run out, re-dials included.
SETTLE = (
    SWITCH_CONFIG.handshake_timeout
    + SWITCH_CONFIG.ping_interval
    + SWITCH_CONFIG.pong_timeout
    + SWITCH_CONFIG.resume_grace
    + SWITCH_CONFIG.close_linger
    + 2
)
PORT = 26656


def _key(seed: int) -> NodeKey:
    return NodeKey(Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32))


#: Fixed keys, so that a replay is exact (node ids decide simultaneous dials).
OUR_KEY, GOOD_KEY = _key(1), _key(2)
LOW_ID, HIGH_ID = "01" * 20, "fe" * 20
assert LOW_ID < OUR_KEY.node_id < HIGH_ID


# -- the world ------------------------------------------------------------------------


class Recorder(RecordingReactor):
    """A RecordingReactor that records peer_suspended and peer_resumed too."""

    def peer_suspended(self, peer) -> None:
        self.calls.append(("peer_suspended", peer))

    def peer_resumed(self, peer) -> None:
        self.calls.append(("peer_resumed", peer))


class ScriptedNode(Factory):
    """A listening node whose connections are RawPeers that send its hello."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.connections: list[RawPeer] = []

    def buildProtocol(self, addr):
        self.connections.append(RawPeer(hello_packet(self.node_id)))
        return self.connections[-1]


def hello_packet(node_id: str, request: SessionRequest | None = None) -> bytes:
    fields = ((HelloTag.SESSION, wire.encode_session_request(request)),) if request is not None else ()
    hello = make_hello(node_id=node_id, channels=CHANNELS, max_packet_payload=CONFIG.max_packet_payload, fields=fields)
    return wire.encode_extension(PacketType.HELLO, wire.encode_hello(hello))


@dataclasses.dataclass
class World:
    network: MemoryNetwork
    switch: object
    reactors: list  # (Switch, Recorder) of every Switch
    names: Names
    target: object = None  # our protocol on the fuzzed connection
    other: RawPeer = None  # its other end
    theirs: object = None  # the other end's transport
    written: bytearray = dataclasses.field(default_factory=bytearray)  # what we wrote on it
    failures: list = dataclasses.field(default_factory=list)  # logged failures
    dials: list = dataclasses.field(default_factory=list)  # what Switch.dial fired with
    peer_closed: bool = False  # our core read a close packet of the other end
    opened: bool = False  # the fuzzed connection carried a session at some point
    first_reason: Exception | None = None  # why we were closing when the core failed after

    def advance(self, seconds: float) -> None:
        self.network.complete_dials()
        self.network.advance(seconds)
        self.network.complete_dials()
        self.network.flush()

    def watch(self, link, ours: int) -> None:
        """Fuzz ``link``: our protocol is on side ``ours``; record what we write on it."""
        self.target = (link.outbound, link.inbound)[ours]
        self.other = (link.outbound, link.inbound)[1 - ours]
        self.theirs = link.transports[1 - ours]
        transport = link.transports[ours]
        write = transport.write

        def recording(data) -> None:
            self.written += data
            write(data)

        transport.write = recording
        core, receive = self.target.core, self.target.core.receive_data

        def receiving(data, now):
            before = self.target.end_reason
            events = receive(data, now)
            kinds = {type(e) for e in events}
            self.peer_closed = self.peer_closed or CloseReceived in kinds
            if before is not None and ConnectionFailed in kinds and self.first_reason is None:
                self.first_reason = before  # the adapter replaces it: see check_end
            return events

        core.receive_data = receiving


def new_world(scenario: Scenario) -> World:
    network = MemoryNetwork(MemoryReactorClock(), window=WINDOW)
    reactor = Recorder(CHANNELS)
    switch = network.switch([reactor], config=SWITCH_CONFIG, node_key=OUR_KEY, reconnect_delay=lambda attempt: 0.1)
    world = World(network, switch, [(switch, reactor)], Names(claimed=LOW_ID, ours=switch.node_id, channels=CHANNELS))
    globalLogPublisher.addObserver(world.failures.append)
    try:
        (_dialer_world if scenario.dialer else _listener_world)(world, scenario)
    except BaseException:
        globalLogPublisher.removeObserver(world.failures.append)
        raise
    return world


def _listener_world(world: World, scenario: Scenario) -> None:
    network, switch = world.network, world.switch
    if scenario.held != "none":
        good_reactor = Recorder(CHANNELS)
        good = network.switch([good_reactor], config=SWITCH_CONFIG, node_key=GOOD_KEY)
        world.reactors.append((good, good_reactor))
        link = network.connect(good, switch)
        peer = link.peer_of(switch)
        for channel_id, message in ((0x20, b"one"), (0x20, b"two"), (0x21, b"three")):
            peer.try_send(channel_id, message)  # unacknowledged yet: resume counts matter
        network.flush()
        if scenario.held == "suspended":
            link.reset()
            network.flush()
        world.names = dataclasses.replace(world.names, claimed=good.node_id, held=peer.session.id)
    world.watch(network.connect_raw(RawPeer(), switch), ours=1)


def _dialer_world(world: World, scenario: Scenario) -> None:
    network, switch = world.network, world.switch
    node = ScriptedNode(LOW_ID if scenario.low else HIGH_ID)
    network.clock.listenTCP(PORT, node, interface="127.0.0.1")
    switch.startService()
    switch.dial(f"{node.node_id}@127.0.0.1:{PORT}").addBoth(world.dials.append)
    [link] = network.complete_dials()
    held = None
    if scenario.held == "suspended":  # a first session, broken: the Switch re-dials to resume it
        request = _request_in(node.connections[0].data)
        node.connections[0].transport.write(_answer(request.session_id))
        network.flush()
        peer = switch.peers[node.node_id]
        for channel_id, message in ((0x20, b"one"), (0x20, b"two"), (0x21, b"three")):
            peer.try_send(channel_id, message)
        network.flush()
        link.reset()
        for _ in range(50):
            world.advance(0.1)
            if len(node.connections) == 2:
                break
        link, held = network.links[-1], peer.session.id
        assert peer.state is PeerState.CONNECTING, peer.state
    elif scenario.held == "connected":  # the node dials us meanwhile, asking for a fresh session
        request = SessionRequest(session_id=bytes(range(32, 48)), resume=False)
        network.connect_raw(RawPeer(hello_packet(node.node_id, request)), switch)
        network.flush()
        peer = switch.peers.get(node.node_id)
        held = peer.session.id if peer is not None else None
    network.clock.tcpServers.clear()  # later dials are refused: the fuzzed connection is the last
    asked = _request_in(node.connections[-1].data)
    world.names = dataclasses.replace(
        world.names, claimed=node.node_id, held=held, asked=asked.session_id, resuming=asked.resume
    )
    world.watch(link, ours=0)


def _request_in(data: bytes) -> SessionRequest:
    """The session request in our hello, the first packet of ``data``."""
    [(kind, body)] = _packets(data)[:1]
    assert kind == PacketType.HELLO
    return wire.decode_session_request(dict(wire.decode_hello(bytes(body)).fields)[HelloTag.SESSION])


def _answer(session_id: bytes) -> bytes:
    answer = wire.SessionAnswer(session_id=session_id, resumed=False)
    return wire.encode_extension(PacketType.SESSION, wire.encode_session_answer(answer))


def _packets(data: bytes) -> list:
    packets, error = FrameBuffer(max_payload=1 << 20, default_extension_limit=1 << 20).feed(
        bytes(data), stop_after_extension=False
    )
    assert error is None, f"we wrote bytes that do not parse: {error}"
    return packets


# -- running a scenario -------------------------------------------------------------------


def chunks(data: bytes, steps) -> list:
    """``data`` cut by ``steps`` (size, wait, reads); what is left goes last, at once."""
    out, at = [], 0
    for size, wait, reads in steps:
        if at >= len(data):
            break
        out.append((data[at : at + size], wait, reads))
        at += size
    if at < len(data):
        out.append((data[at:], 0.0, True))
    return out


def run(scenario: Scenario) -> World:
    """Play ``scenario`` with every check; returns the world (for statistics)."""
    world = new_world(scenario)
    try:
        first = scenario.first.packet(world.names) if scenario.first is not None else b""
        for chunk, wait, reads in chunks(first + scenario.rest, scenario.steps):
            world.advance(wait)
            check_world(world)
            if world.other.lost is not None:
                break
            world.theirs.reading = reads  # the peer may stop reading: we must stop writing
            world.other.send(chunk)
            world.network.flush()
            check_world(world)
        world.theirs.resumeProducing()
        for _ in range(int(SETTLE / 0.5)):
            world.advance(0.5)
            check_world(world)
        check_end(world)
    finally:
        globalLogPublisher.removeObserver(world.failures.append)
    return world


# -- checks -----------------------------------------------------------------------------


def check_world(world: World) -> None:
    world.opened = world.opened or world.target.peer is not None
    failures = [e for e in world.failures if "log_failure" in e]
    assert not failures, failures[0]["log_failure"].getTraceback()
    for switch, reactor in world.reactors:
        switch._check_invariants()
        check_contract(switch, reactor)
        for proto in switch.connections:
            if proto.core is not None and proto.core.state is not State.CLOSED:
                check_bounds(proto.core)
    if world.target.core is not None and world.target.core.state is not State.CLOSED:
        flight = world.target.transport.in_flight
        assert flight <= WINDOW + MAX_WRITE, f"{flight} bytes in flight to a peer that does not read"


def check_contract(switch, reactor: Recorder) -> None:
    """Every Peer's reactor calls follow specs/reactor-api.md, and its state agrees with
    them and with the peer table (specs/resume.md: suspended and connecting come after
    peer_suspended; closed after remove_peer, and out of the table)."""
    calls: dict[int, tuple] = {}
    for method, peer, *rest in reactor.calls:
        if method != "receive":
            calls.setdefault(id(peer), (peer, []))[1].append((method, *rest))
    for peer in switch.peers.values():
        assert id(peer) in calls, f"{peer!r} is in the table but its reactors never got add_peer"
    allowed = {("add_peer", "peer_suspended"), ("peer_suspended", "peer_resumed"), ("peer_resumed", "peer_suspended")}
    for peer, methods in calls.values():
        names = [m[0] for m in methods]
        assert names[0] == "add_peer", names
        ended = names[-1] == "remove_peer"
        assert names.count("remove_peer") == int(ended), names
        for pair in itertools.pairwise(names[:-1] if ended else names):
            assert pair in allowed, f"{peer!r}: {names}"
        if ended:
            assert isinstance(methods[-1][1], MConnError), methods[-1]
            assert peer.state is PeerState.CLOSED and switch.peers.get(peer.node_id) is not peer, (peer, names)
            continue
        assert switch.peers.get(peer.node_id) is peer, f"{peer!r} is not closed but left the table"
        waiting = peer.state in (PeerState.SUSPENDED, PeerState.CONNECTING)
        assert waiting == (names[-1] == "peer_suspended"), (peer, names)


def close_code(reason: Exception) -> str | None:
    """The close code we send for ``reason`` (None: we send no close)."""
    if isinstance(reason, (PongTimeout, PeerClosed)):
        return None
    if isinstance(reason, RemoteProtocolError):
        return type(reason).__name__
    return reason.reason


def check_end(world: World) -> None:
    """The fuzzed connection ended for a specific reason, named by one last close packet."""
    target = world.target
    reason = target.end_reason
    assert world.other.lost is not None and target not in world.switch.connections, "the connection outlived SETTLE"
    if isinstance(reason, PeerRejected):
        assert reason.reason in REJECTIONS, reason.reason
    else:
        assert type(reason) in SWITCH_SPECIFIC or isinstance(reason, PeerClosed), f"{type(reason).__name__}: {reason}"
    packets = _packets(world.written)
    closes = [wire.decode_close(bytes(p[1]))[0] for p in packets if p[0] == PacketType.CLOSE]
    # A close of ours on its way names the first reason; bytes read while it lingers can
    # still fail the core, and MConnectionProtocol._on_failed then replaces end_reason.
    code = close_code(world.first_reason or reason)
    if world.peer_closed and closes == []:
        code = None  # its close came in the read that we would have refused it for
    assert closes == ([] if code is None else [code]), (closes, reason)
    if code is not None:
        assert packets[-1][0] == PacketType.CLOSE, "the close packet is the last we write"
    for switch, _ in world.reactors:
        for peer in switch.peers.values():
            assert peer.state is PeerState.CONNECTED, f"{peer!r} still waits after resume_grace"
    for result in world.dials:  # Switch.dial fires with the Peer or fails with an mconn error
        assert not isinstance(result, Failure) or result.check(MConnError), result


# -- inputs from plain bytes (atheris, the seed corpus) -----------------------------------


def scenario_from_bytes(data: bytes) -> Scenario:
    """Byte 0 chooses the world (bit 0 dialer, bits 1-2 what is held, bit 3 raw, bit 4 the
    dialed node's id is the smaller); byte 1 seeds how the stream is cut and timed. The
    rest is the first packet's field choices (tests/fuzz/declared.py ``Reader``), then the
    bytes that follow it; with bit 3 set, all of it is the raw stream."""
    mode = data[0] if data else 0
    rng = random.Random(data[1] if len(data) > 1 else 0)
    steps = tuple((rng.choice(SIZES), rng.choice(WAITS), rng.random() < 0.8) for _ in range(rng.randint(1, 8)))
    dialer = bool(mode & 1)
    first, rest = None, data[2:]
    if not mode & 8:
        reader = Reader(rest)
        first = draw_answer(reader) if dialer else draw_hello(reader)
        rest = reader.rest()
    return Scenario(dialer, HELDS[min((mode >> 1) & 3, 2)], bool(mode & 16), first, rest, steps)


#: Bugs this target found that are not fixed yet: (exception class, words of its message,
#: what goes wrong). ``known_bug`` recognises them so that a run goes on to find others;
#: tests/adapter/test_fuzz_handshake.py reproduces each one (xfail, strict: a fix shows).
KNOWN_BUGS: tuple = ()


def known_bug(error: BaseException) -> str | None:
    """What ``error`` is, if it is one of KNOWN_BUGS."""
    for kind, words, what in KNOWN_BUGS:
        if type(error) is kind and words in str(error):
            return what
    return None


def fuzz_one(data: bytes) -> None:
    """The atheris target: any input must pass every check (known bugs aside)."""
    try:
        run(scenario_from_bytes(data))
    except Exception as error:
        if known_bug(error) is None:
            raise
