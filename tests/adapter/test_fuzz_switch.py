"""Fuzzing a Switch's inbound path with hypothesis: hostile bytes on one connection.

A Switch on the in-memory network has a good peer; a raw peer sends a fuzzed stream
(tests/fuzz/strategies.py) in chunks, with time passing between them, and then goes
silent without closing. For every input:

* no exception escapes into the event loop (the clock would raise it here);
* while it lasts, the hostile connection holds no more than the configured limits
  (tests/fuzz/target.py, ``check_bounds``);
* it ends, closed by the Switch, with a specific reason: a specific RemoteProtocolError,
  a PeerRejected with its reason word, or the peer's own close packet; never a generic
  ConnectionLost;
* afterwards the Switch has only the good peer, its invariants hold, and the good peer
  still exchanges messages both ways.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings

from helpers import RawPeer, RecordingReactor
from mconn import PeerClosed, PeerRejected
from mconn.core.session import AckError
from mconn.testing import MemoryNetwork

from tests.fuzz.strategies import schedules
from tests.fuzz.target import CHANNELS, CONFIG, SPECIFIC, check_bounds

SWITCH_CONFIG = CONFIG.replace(resume_grace=1.0, stats_interval=0)
#: The core's specific errors, and the session layer's (acks are checked by the Peer).
SWITCH_SPECIFIC = SPECIFIC | {AckError}
#: Long enough for every timer a silent hostile peer can start to run out.
SETTLE = (
    SWITCH_CONFIG.handshake_timeout
    + SWITCH_CONFIG.ping_interval
    + SWITCH_CONFIG.pong_timeout
    + SWITCH_CONFIG.resume_grace
    + SWITCH_CONFIG.close_linger
    + 1
)


def world():
    network = MemoryNetwork(window=256)  # a peer that does not read pauses our writes
    reactor = RecordingReactor(CHANNELS)
    switch = network.switch([reactor], config=SWITCH_CONFIG)
    good_reactor = RecordingReactor(CHANNELS)
    good = network.switch([good_reactor], config=SWITCH_CONFIG)
    good_link = network.connect(good, switch)
    return network, switch, reactor, good, good_reactor, good_link


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=schedules())
def test_a_hostile_stream_ends_with_a_specific_reason_and_harms_nobody_else(schedule):
    """Any hostile stream ends its connection with a specific reason, while the good peer on the same
    Switch keeps its session and both directions still work."""
    network, switch, reactor, good, good_reactor, good_link = world()
    raw = RawPeer()
    link = network.connect_raw(raw, switch)
    hostile = link.inbound
    for chunk, wait, reads in schedule:
        network.advance(wait)  # the good peer keeps its session alive meanwhile
        if raw.lost is not None:
            break
        link.transports[0].reading = reads  # the hostile peer may stop reading
        raw.send(chunk)
        network.flush()
        if hostile.core.error is None and hostile.end_reason is None:
            check_bounds(hostile.core)
    link.transports[0].reading = True
    link.transports[0].resumeProducing()
    network.advance(SETTLE, step=0.5)

    reason = hostile.end_reason
    event(type(reason).__name__)
    assert raw.lost is not None and hostile not in switch.connections
    if isinstance(reason, PeerRejected):
        assert reason.reason in ("inbound_limit", "duplicate", "self", "simultaneous_dial"), reason.reason
    else:
        assert type(reason) in SWITCH_SPECIFIC or isinstance(reason, PeerClosed), f"{type(reason).__name__}: {reason}"
    assert list(switch.peers) == [good.node_id]
    switch._check_invariants()
    good._check_invariants()
    assert good_link.peer_of(good).try_send(0x20, b"still fine")
    assert good_link.peer_of(switch).try_send(0x21, b"likewise")
    network.flush()
    assert reactor.received(0x20, good_link.peer_of(switch))[-1:] == [b"still fine"]
    assert good_reactor.received(0x21)[-1:] == [b"likewise"]
