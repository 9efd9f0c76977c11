"""specs/resume.md against two real Switches on the in-memory network, so neither drifts.

The state table of section 3 is parsed; every row names a (state, input) pair, and a
scenario of this module, keyed by that pair, drives a dialer and a listener
(``mconn.testing.MemoryNetwork`` on one ``task.Clock``) until the Peer of the row's side
is in the row's state, then applies the input. The Peer must then be in the row's next
state, the reactors of that side must have got exactly the calls of the row, and the
Switch of that side must have emitted exactly the session events and dial attempts of
the row. A row without a scenario, or a scenario without a row, fails too.

Below the table: the resume sequence of section 4 (what each side re-sends), re-dialing
after failed attempts and giving up, the refusal reasons of section 5.2, and the session
request vectors of specs/vectors/resume.json fed to a listening Switch.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import secrets

import pytest

from helpers import RawPeer, RecordingReactor, close_packets_in, parse_packets
from helpers_core import parse_session_table
from mconn import ChannelDescriptor, Config
from mconn.core import wire
from mconn.errors import MalformedPacket
from mconn.core.handshake import make_hello
from mconn.testing import MemoryNetwork
from mconn.core.wire import PacketType

SPEC = pathlib.Path(__file__).resolve().parents[2] / "specs" / "resume.md"
VECTORS = pathlib.Path(__file__).resolve().parents[2] / "specs" / "vectors" / "resume.json"
SPEC_TEXT = SPEC.read_text()
CLOSE_LINGER = Config().close_linger

CHANNELS = [
    ChannelDescriptor(0x20, priority=5, send_queue_capacity=16),
    ChannelDescriptor(0x21, priority=1, send_queue_capacity=16),
]
#: A long dial_timeout: a re-dial into a black hole stays pending instead of failing
#: every few seconds, so a step sees only what its input causes.
CONFIG = Config(stats_interval=0, dial_timeout=1000.0)
GRACE = CONFIG.resume_grace
#: The events a row's "Telemetry" column lists.
SESSION_EVENTS = {"session_started", "session_suspended", "session_resumed", "session_ended", "dial_attempt"}


# -- the table --------------------------------------------------------------------------


ROWS = parse_session_table(SPEC_TEXT, "session-states")
CASES = [(row, side) for row in ROWS for side in (("dialer", "listener") if row.side == "both" else (row.side,))]


# -- two nodes ----------------------------------------------------------------------------


class Recorder(RecordingReactor):
    """A RecordingReactor that also records the resume hooks."""

    def peer_suspended(self, peer) -> None:
        self.calls.append(("peer_suspended", peer))

    def peer_resumed(self, peer) -> None:
        self.calls.append(("peer_resumed", peer))


@dataclasses.dataclass
class Node:
    switch: object
    reactor: Recorder


class World:
    """A dialer and a listener with one session between them (the dialer used Switch.dial)."""

    def __init__(self, config: Config = CONFIG):
        self.config = config
        self.network = MemoryNetwork()
        self.listener = self._node()
        self.listener.switch.listen("tcp:26656")
        self.dialer = self._node()
        results = []
        self.dialer.switch.dial(self.network.dial_address(self.listener.switch)).addBoth(results.append)
        self.network.flush()
        [peer] = results
        assert peer.state == "connected", peer
        self.peers = {"dialer": peer, "listener": self.listener.switch.peers[self.dialer.switch.node_id]}
        #: What must have caused the step's events: {event name: (field, expected value)}.
        self.causes: dict[str, tuple[str, str]] = {}

    def _node(self) -> Node:
        reactor = Recorder(CHANNELS)
        switch = self.network.switch([reactor], config=self.config)
        switch.startService()
        return Node(switch, reactor)

    def node(self, side: str) -> Node:
        return self.dialer if side == "dialer" else self.listener

    def other(self, side: str) -> str:
        return "listener" if side == "dialer" else "dialer"

    def link(self):
        """The live connection between the two nodes (the newest, if several)."""
        return self.network.links_between(self.dialer.switch, self.listener.switch)[-1]

    def protocol(self, side: str):
        link = self.link()
        return link.outbound if side == "dialer" else link.inbound

    def isolate(self) -> None:
        """Break the session and keep the nodes apart: both suspend, no re-dial gets through."""
        self.network.blackhole(self.dialer.switch, self.listener.switch)
        self.link().reset()
        self.network.flush()

    def connecting(self) -> None:
        """Break the session over a path with a 1 s delay and let the re-dial connect:
        the dialer is connecting, its hello is on the way (the answer comes 2 s later)."""
        self.network.delay(self.dialer.switch, self.listener.switch, 1.0)
        self.link().reset()
        self.network.flush()  # the re-dial starts...
        self.network.advance(1.0)  # ...and its connection is up a second later

    def restart(self, side: str) -> Node:
        """That side's process restarts: same node id, host and ports, no sessions."""
        reactor = Recorder(CHANNELS)
        node = Node(self.network.restart(self.node(side).switch, [reactor]), reactor)
        setattr(self, side, node)
        return node


# -- scenarios: reach the row's state, return the input --------------------------------------

#: (state, input) -> (make_world, drive); drive(world, side) returns the input to apply.
SCENARIOS: dict[tuple[str, str], tuple] = {}


def scenario(state: str, input_: str, *, config: Config = CONFIG):
    def register(drive):
        assert (state, input_) not in SCENARIOS
        SCENARIOS[(state, input_)] = (lambda: World(config), drive)
        return drive

    return register


def needs(side: str, *allowed: str) -> None:
    if side not in allowed:
        pytest.fail(f"no scenario for this input on the {side} side: the table names a pair the build does not have")


@scenario("connected", "break")
def _(world, side):
    world.causes = {"session_suspended": ("reason_type", "ConnectionLost")}
    return world.link().reset


@scenario("connected", "pong timeout")
def _(world, side):
    world.causes = {"session_suspended": ("reason_type", "PongTimeout")}

    def half_open():
        world.network.blackhole(world.dialer.switch, world.listener.switch)
        world.network.advance(world.config.ping_interval)
        world.network.advance(world.config.pong_timeout)  # both time out and close...
        world.network.advance(CLOSE_LINGER)  # ...into the hole, so each aborts its transport

    return half_open


@scenario("connected", "break, resume_grace 0", config=CONFIG.replace(resume_grace=0))
def _(world, side):
    return lambda: (world.link().reset(), world.network.flush())


@scenario("connected", "close received")
def _(world, side):
    other = world.peers[world.other(side)]
    return lambda: (other.close("bye"), world.network.flush())


@scenario("connected", "peer.close")
def _(world, side):
    return lambda: (world.peers[side].close("bye"), world.network.flush())


@scenario("connected", "switch stop")
def _(world, side):
    return lambda: (world.node(side).switch.stopService(), world.network.flush())


@scenario("connected", "protocol error")
def _(world, side):
    # The other side claims more deliveries on 0x20 than this side ever sent.
    world.causes = {"session_ended": ("reason_type", "AckError")}
    bad_ack = wire.encode_extension(PacketType.ACK, wire.encode_ack({0x20: 1}))
    protocol = world.protocol(side)
    return lambda: (protocol.dataReceived(bad_ack), world.network.flush())


@scenario("suspended", "redial connected")
def _(world, side):
    needs(side, "dialer")
    world.network.delay(world.dialer.switch, world.listener.switch, 1.0)
    world.link().reset()
    world.network.flush()  # the first attempt is on its way
    return lambda: world.network.advance(1.0)


@scenario("suspended", "redial failed", config=CONFIG.replace(dial_timeout=5.0))
def _(world, side):
    needs(side, "dialer")
    world.isolate()  # the first attempt goes into the black hole and times out
    return lambda: world.network.advance(world.config.dial_timeout)


@scenario("suspended", "resume accepted")
def _(world, side):
    needs(side, "listener")
    world.link().reset()  # the dialer's re-dial goes out when the clock next runs
    return world.network.flush


def raw_dialer(world, *, session_id: bytes, resume: bool, delivered=None, channels=CHANNELS) -> RawPeer:
    """A scripted dialer with the dialer's node id, asking for a session in its hello."""
    request = wire.SessionRequest(session_id=session_id, resume=resume, delivered=delivered or {})
    hello = make_hello(
        node_id=world.dialer.switch.node_id,
        channels=channels,
        max_packet_payload=1024,
        fields=((wire.HelloTag.SESSION, wire.encode_session_request(request)),),
    )
    return RawPeer(wire.encode_extension(PacketType.HELLO, wire.encode_hello(hello)))


def _listener_alone(world) -> None:
    """The dialer's process dies: the listener's session is suspended, nobody re-dials."""
    world.network.kill(world.dialer.switch)
    world.network.flush()


CHANGED = [ChannelDescriptor(0x20, priority=5), ChannelDescriptor(0x21, priority=2)]


@scenario("suspended", "resume refused: channels changed")
def _(world, side):
    needs(side, "listener")
    _listener_alone(world)
    world.raw = raw_dialer(world, session_id=world.peers["listener"].session.id, resume=True, channels=CHANGED)
    return lambda: (world.network.connect_raw(world.raw, world.listener.switch), world.network.flush())


@scenario("suspended", "resume refused: unknown session, unproven")
def _(world, side):
    needs(side, "listener")
    _listener_alone(world)
    world.raw = raw_dialer(world, session_id=secrets.token_bytes(16), resume=True)
    return lambda: (world.network.connect_raw(world.raw, world.listener.switch), world.network.flush())


@scenario("suspended", "new session request, unproven")
def _(world, side):
    needs(side, "listener")
    world.link().reset()
    restarted = world.restart("dialer")  # before its re-dial goes out

    def dial_again():
        restarted.switch.dial(world.network.dial_address(world.listener.switch))
        world.network.flush()

    return dial_again


@scenario("suspended", "resume with impossible counts")
def _(world, side):
    needs(side, "listener")
    _listener_alone(world)
    world.raw = raw_dialer(world, session_id=world.peers["listener"].session.id, resume=True, delivered={0x20: 5})
    return lambda: (world.network.connect_raw(world.raw, world.listener.switch), world.network.flush())


@scenario("suspended", "grace expired")
def _(world, side):
    world.isolate()
    return lambda: world.network.advance(GRACE)


@scenario("suspended", "peer.close")
def _(world, side):
    world.isolate()
    return lambda: (world.peers[side].close("bye"), world.network.flush())


@scenario("suspended", "switch stop")
def _(world, side):
    world.isolate()
    return lambda: (world.node(side).switch.stopService(), world.network.flush())


@scenario("connecting", "resume accepted")
def _(world, side):
    needs(side, "dialer")
    world.connecting()
    return lambda: world.network.advance(2.0, step=0.25)  # hello there, answer back


@scenario("connecting", "resume refused")
def _(world, side):
    needs(side, "dialer")
    world.network.delay(world.dialer.switch, world.listener.switch, 1.0)
    world.link().reset()
    world.restart("listener")  # the re-dial reaches a process that knows no session
    world.network.flush()
    world.network.advance(1.0)
    return lambda: world.network.advance(2.0, step=0.25)


@scenario("connecting", "break")
def _(world, side):
    needs(side, "dialer")
    world.connecting()
    return lambda: (world.link().reset(), world.network.flush())


@scenario("connecting", "close received")
def _(world, side):
    needs(side, "dialer")
    world.connecting()
    # The listener stops while the resume request travels: its close packet "shutdown"
    # reaches the dialer before any answer, and ends the session.
    return lambda: (world.listener.switch.stopService(), world.network.advance(1.0))


@scenario("connecting", "grace expired", config=CONFIG.replace(resume_grace=5.0))
def _(world, side):
    needs(side, "dialer")
    world.connecting()
    world.network.blackhole(world.dialer.switch, world.listener.switch)  # no answer will come
    # The grace (5 s) ends before the handshake_timeout (10 s) of the attempt.
    return lambda: world.network.advance(world.config.resume_grace - 1.0)


@scenario("connecting", "peer.close")
def _(world, side):
    needs(side, "dialer")
    world.connecting()
    return lambda: (world.peers[side].close("bye"), world.network.flush())


@scenario("connecting", "switch stop")
def _(world, side):
    needs(side, "dialer")
    world.connecting()
    return lambda: (world.node(side).switch.stopService(), world.network.flush())


def _closed(world, side):
    world.peers[side].close("first")
    world.network.flush()


@scenario("closed", "peer.close")
def _(world, side):
    _closed(world, side)
    return lambda: (world.peers[side].close("again"), world.network.flush())


@scenario("closed", "switch stop")
def _(world, side):
    _closed(world, side)
    return lambda: (world.node(side).switch.stopService(), world.network.flush())


# -- the table, row by row ----------------------------------------------------------------


def reactor_calls(calls: list[tuple], peer) -> tuple[str, ...]:
    """A reactor's lifecycle calls in the table's notation (receives are not listed)."""
    out = []
    for call in calls:
        name, subject = call[0], call[1]
        if name == "receive":
            continue
        if name == "add_peer":
            assert subject is not peer and subject.node_id == peer.node_id, "add_peer for another node"
            assert subject.state == "connected", "the new Peer is not connected"
            out.append("add_peer")
            continue
        assert subject is peer, f"{name} for another Peer"
        out.append(f"remove_peer({type(call[2]).__name__})" if name == "remove_peer" else name)
    return tuple(out)


def telemetry_of(events: list[dict]) -> list[str]:
    """Session events and dial attempts in the table's notation."""
    out = []
    for event in events:
        if event["event"] in SESSION_EVENTS:
            out.append(f"dial_attempt({event['result']})" if event["event"] == "dial_attempt" else event["event"])
    return out


def test_every_row_has_a_scenario_and_every_scenario_a_row():
    """Each (state, input) row of the spec's table has exactly one scenario here, and each scenario a row."""
    keys = {(row.state, row.input) for row in ROWS}
    assert len(keys) == len({(row.state, row.side, row.input) for row in ROWS}), "a (state, input) pair twice"
    assert keys == set(SCENARIOS), (
        f"rows without a scenario: {sorted(keys - set(SCENARIOS))}; "
        f"scenarios without a row: {sorted(set(SCENARIOS) - keys)}"
    )
    assert {row.state for row in ROWS} == {"connected", "suspended", "connecting", "closed"}


@pytest.mark.parametrize("row, side", CASES, ids=[f"{r.state}-{s}-{r.input}" for r, s in CASES])
def test_state_table_row(row, side, telemetry):
    """Applying a row's input leads to its next state, with exactly its reactor calls and session events."""
    assert (row.state, row.input) in SCENARIOS, f"no scenario for ({row.state}, {row.input})"
    make_world, drive = SCENARIOS[(row.state, row.input)]
    world = make_world()
    apply = drive(world, side)
    node, peer = world.node(side), world.peers[side]
    assert peer.state == row.state, f"the scenario reached {peer.state}, not the row's {row.state}"
    calls_before, events_before = len(node.reactor.calls), len(telemetry.events)

    apply()

    assert peer.state == row.next_state
    assert reactor_calls(node.reactor.calls[calls_before:], peer) == row.reactor_calls
    events = [e for e in telemetry.events[events_before:] if e.get("node_id") == node.switch.node_id]
    emitted = telemetry_of(events)
    assert collections.Counter(emitted) == collections.Counter(row.telemetry), emitted
    for name, (field, expected) in world.causes.items():
        assert [e[field] for e in events if e["event"] == name] == [expected], f"{name} for another cause"
    if peer.state == "closed":
        assert node.switch.peers.get(peer.node_id) is not peer
        assert not peer.try_send(0x20, b"after the end")
    else:
        assert node.switch.peers[peer.node_id] is peer
    node.switch._check_invariants()


# -- section 4: the sequence ----------------------------------------------------------------


def test_resume_sequence_resends_exactly_what_each_side_lacks(telemetry):
    """Deliveries not yet acknowledged are covered by the resume counts (not re-sent);
    messages accepted while suspended go out once; acks then empty both buffers."""
    world = World()
    a, b = world.peers["dialer"], world.peers["listener"]
    for i in range(3):
        assert a.try_send(0x20, b"a%d" % i)
    for i in range(2):
        assert b.try_send(0x21, b"b%d" % i)
    world.network.flush()  # delivered; the clock has not moved, so no ack yet
    assert a.session.unconfirmed() == {0x20: 3} and b.session.unconfirmed() == {0x21: 2}

    world.network.delay(world.dialer.switch, world.listener.switch, 1.0)
    world.link().reset()
    assert a.state == b.state == "suspended"
    assert a.try_send(0x20, b"a3") and b.try_send(0x21, b"b2")  # accepted while suspended
    world.network.flush()
    world.network.advance(1.0)
    assert a.state == "connecting"
    world.network.advance(1.0, step=0.25)  # the hello reaches the listener, which resumes at once
    assert b.state == "connected" and a.state == "connecting"
    [field] = [value for tag, value in world.link().inbound.hello.fields if tag == wire.HelloTag.SESSION]
    request = wire.decode_session_request(field)
    assert request == wire.SessionRequest(session_id=b.session.id, resume=True, delivered={0x21: 2})
    assert b.session.acked(0x21) == 2 and b.session.unconfirmed() == {0x21: 1}  # only b2 is re-sent
    world.network.advance(1.0, step=0.25)  # the 07 answer, with the listener's counts, reaches the dialer
    assert a.state == "connected"
    assert a.session.acked(0x20) == 3 and a.session.unconfirmed() == {0x20: 1}  # only a3 is re-sent

    resumed = {e["node_id"]: e["resent"] for e in telemetry.named("session_resumed")}
    assert resumed == {world.dialer.switch.node_id: 1, world.listener.switch.node_id: 1}
    world.network.advance(1.0 + CONFIG.ack_interval, step=0.05)  # last messages arrive, acks flow
    assert world.listener.reactor.received(0x20) == [b"a0", b"a1", b"a2", b"a3"]
    assert world.dialer.reactor.received(0x21) == [b"b0", b"b1", b"b2"]
    world.network.advance(1.0 + CONFIG.ack_interval, step=0.05)
    assert a.session.unconfirmed() == {} and b.session.unconfirmed() == {}
    assert a.resumes == b.resumes == 1


def test_a_failed_redial_attempt_is_followed_by_another(telemetry):
    """Section 4: re-dialing goes on after a failed attempt (max_reconnects None: until
    the grace ends); once the path heals, an attempt gets through and the session resumes."""
    world = World(CONFIG.replace(dial_timeout=5.0))
    world.isolate()
    world.network.advance(5.0)  # the first attempt times out in the black hole
    world.network.heal()
    world.network.advance(10.0, step=0.25)
    results = [e["result"] for e in telemetry.named("dial_attempt")]
    assert results[0] == "failed" and results[-1] == "connected", results
    assert world.peers["dialer"].state == world.peers["listener"].state == "connected"


def test_redialing_gives_up_after_max_reconnects_failed_attempts(telemetry):
    """Section 4: after max_reconnects failed attempts in a row the dialer gives up and the
    suspended session ends with SessionRejected, before its grace would expire."""
    world = World(CONFIG.replace(dial_timeout=5.0, max_reconnects=2))
    world.isolate()
    world.network.advance(12.0, step=0.5)
    assert [e["result"] for e in telemetry.named("dial_attempt")] == ["failed", "failed"]
    assert len(telemetry.named("dial_gave_up")) == 1
    [(peer, reason)] = world.dialer.reactor.removed()
    assert peer is world.peers["dialer"] and peer.state == "closed"
    assert type(reason).__name__ == "SessionRejected" and reason.reason.startswith("gave up re-dialing: ")
    assert world.peers["listener"].state == "suspended"  # it waits for its own grace


# -- section 5.2: refusal reasons ---------------------------------------------------------------


REFUSALS = [
    ("connecting", "resume refused", "dialer", "unknown session (expired, or this node restarted)"),
    (
        "suspended",
        "resume refused: channels changed",
        "listener",
        "channels changed: 0x21 prio 1 removed, 0x21 prio 2 added",
    ),
]


@pytest.mark.parametrize("state, input_, side, expected", REFUSALS, ids=[r[1] for r in REFUSALS])
def test_refusal_reason_is_the_one_the_spec_names(state, input_, side, expected, telemetry):
    """The old session ends with SessionRejected(reason); the new one's session_started
    says why the resume was refused; a scripted dialer gets the reason in the 07 answer."""
    make_world, drive = SCENARIOS[(state, input_)]
    world = make_world()
    drive(world, side)()
    node = world.node(side)
    [(old, reason)] = node.reactor.removed()
    assert type(reason).__name__ == "SessionRejected" and reason.reason == expected
    assert f"| `{expected}` |" in SPEC_TEXT, "section 5.2 does not list this reason"
    new = node.switch.peers[old.node_id]
    assert new is not old and new.state == "connected"
    started = [e for e in telemetry.named("session_started") if e["node_id"] == node.switch.node_id][-1]
    assert started["resume_refused"] == expected
    raw = getattr(world, "raw", None)
    if raw is not None:
        [answer] = _answers(raw.data)
        assert not answer.resumed and answer.reason == expected


@pytest.mark.parametrize("input_", ["resume refused: unknown session, unproven", "new session request, unproven"])
def test_an_unproven_hello_cannot_end_a_suspended_session(input_, telemetry):
    """Within its grace a suspended session is ended only by a connection that proves it
    (specs/resume.md section 6.4): a plaintext hello naming another session, or asking for
    a new one, is refused with close code session_held and the held session is untouched;
    once the grace has expired the node gets a fresh session."""
    make_world, drive = SCENARIOS[("suspended", input_)]
    world = make_world()
    held = world.peers["listener"]
    drive(world, "listener")()
    listener = world.listener
    assert listener.switch.peers[held.node_id] is held and held.state == "suspended"
    assert listener.reactor.removed() == []
    assert listener.switch.refusals.get("session_held") == 1
    raw = getattr(world, "raw", None)
    if raw is not None:
        assert [code for code, _ in close_packets_in(bytes(raw.data))] == ["session_held"]
        assert _answers(raw.data) == []
    world.network.run(GRACE + 1)
    [(old, reason)] = listener.reactor.removed()
    assert old is held and type(reason).__name__ == "SessionExpired"
    listener.switch._check_invariants()


def test_the_right_session_id_resumes_after_an_impostor_was_refused(telemetry):
    """An impostor's hello for a suspended session is refused; the dialer that presents
    the right session id then resumes it, the same Peer, with nothing removed."""
    make_world, drive = SCENARIOS[("suspended", "resume refused: unknown session, unproven")]
    world = make_world()
    held = world.peers["listener"]
    drive(world, "listener")()
    assert held.state == "suspended"
    genuine = raw_dialer(world, session_id=held.session.id, resume=True)
    world.network.connect_raw(genuine, world.listener.switch)
    world.network.flush()
    [answer] = _answers(genuine.data)
    assert answer.resumed and answer.session_id == held.session.id
    assert held.state == "connected" and world.listener.switch.peers[held.node_id] is held
    assert world.listener.reactor.removed() == []


def _answers(data: bytes) -> list[wire.SessionAnswer]:
    return [wire.decode_session_answer(p[1]) for p in parse_packets(data) if p[0] == PacketType.SESSION]


# -- specs/vectors/resume.json through a listening Switch ----------------------------------------

RESUME_VECTORS = json.loads(VECTORS.read_text())
REQUEST_VALID = [v for v in RESUME_VECTORS["valid"] if v["kind"] == "session_request"]
REQUEST_INVALID = [v for v in RESUME_VECTORS["invalid"] if "switch" in v["rejected_by"]]


def _hello_with_field(node_id: str, value: bytes) -> bytes:
    hello = make_hello(
        node_id=node_id, channels=CHANNELS, max_packet_payload=1024, fields=((wire.HelloTag.SESSION, value),)
    )
    return wire.encode_extension(PacketType.HELLO, wire.encode_hello(hello))


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def _listener():
    network = MemoryNetwork()
    reactor = Recorder(CHANNELS)
    switch = network.switch([reactor], config=CONFIG)
    return network, switch, reactor


@pytest.mark.parametrize("vector", REQUEST_VALID, ids=[v["name"] for v in REQUEST_VALID])
def test_session_request_vector_gets_a_session(vector):
    """A listener that holds no session starts one under the requested id; a resume
    request gets a fresh answer with the 'unknown session' reason, under a new id."""
    network, switch, reactor = _listener()
    raw = RawPeer(_hello_with_field(secrets.token_hex(20), _hex(vector["hex"])))
    network.connect_raw(raw, switch)
    network.flush()
    requested = bytes.fromhex(vector["decoded"]["session_id"])
    [answer] = _answers(raw.data)
    resume = vector["decoded"]["resume"]
    expected_reason = "unknown session (expired, or this node restarted)" if resume else ""
    session_id = answer.session_id
    assert (session_id != requested) if resume else (session_id == requested)
    assert answer == wire.SessionAnswer(session_id=session_id, resumed=False, reason=expected_reason)
    [peer] = switch.peers.values()
    assert peer.session.id == session_id and peer.state == "connected"
    assert [c[0] for c in reactor.calls] == ["add_peer"]


@pytest.mark.parametrize("vector", REQUEST_INVALID, ids=[v["name"] for v in REQUEST_INVALID])
def test_invalid_session_request_vector_is_refused_by_a_listener(vector, telemetry):
    """The listener fails the connection with the decoder's error; no session starts."""
    network, switch, reactor = _listener()
    raw = RawPeer(_hello_with_field(secrets.token_hex(20), _hex(vector["hex"])))
    network.connect_raw(raw, switch)
    network.flush()
    with pytest.raises(MalformedPacket) as decoding:
        wire.decode_session_request(_hex(vector["hex"]))
    [(_, text)] = close_packets_in(raw.data)
    assert text == str(decoding.value)  # the close says what the decoder found
    assert raw.lost is not None and _answers(raw.data) == []
    assert switch.peers == {} and reactor.calls == []
    [error] = telemetry.named("protocol_error")
    assert error["error_type"] == vector["error"]
