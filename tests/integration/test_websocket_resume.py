"""The resume scenarios of the fault proxy over ws:// (specs/websocket.md section 5).

Two real Switches on 127.0.0.1; the dialer reaches the listener's ws:// endpoint through
a FaultProxy (mconn/faultproxy.py) that resets the links, black-holes them, or cuts one
after exactly N bytes, in the middle of a WebSocket frame. Sessions resume across the
breaks as over TCP: every message arrives once and in order, one session throughout.
Every wait is bounded; every Switch and proxy started is stopped.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import defer

from faultproxy import FaultProxy
from helpers import message_packets, sleep, the_reactor
from mconn import ChannelDescriptor, Config, NodeKey, Switch
from mconn.tls import TLSOptions
from mconn.websocket_endpoints import transport_kind

from .test_loopback import bounded, stop
from .test_resume_scenarios import CHANNELS, IDS, Pair, Tally, burst, eventually, first_mismatch

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
PATH = "/mconn"


async def ws_pair_through_proxy(config, channels=CHANNELS, scheme="ws"):
    """Listener ``a`` on ws:// (or wss://, identity-mode TLS), dialer ``b`` through a
    FaultProxy in front of it."""
    ra, rb = Tally(channels), Tally(channels)
    tls = (lambda: TLSOptions.identity(NodeKey.generate())) if scheme == "wss" else (lambda: None)
    a = Switch([ra], clock=the_reactor(), config=config, tls=tls())
    b = Switch([rb], clock=the_reactor(), config=config, tls=tls())
    a.startService()
    b.startService()
    proxy = None
    try:
        port = await a.listen(f"{scheme}:tcp:0:interface=127.0.0.1:path={PATH}")
        proxy = FaultProxy("127.0.0.1", port.getHost().port)
        proxy_port = await proxy.start()
        peer = await bounded(b.dial(f"{a.node_id}@{scheme}://127.0.0.1:{proxy_port}{PATH}"), TIMEOUT)
        await eventually(lambda: b.node_id in a.peers, "the listener's side of the session")
        assert transport_kind(peer._protocol.transport) == scheme
    except BaseException:
        if proxy is not None:
            await proxy.stop()
        await stop(a, b)
        raise
    return Pair(a, b, ra, rb, proxy, peer)


def assert_one_session(p, resumes):
    """The same Peer objects throughout, suspended and resumed ``resumes`` times, never removed."""
    assert p.a.peers[p.b.node_id] is p.peer_a and p.b.peers[p.a.node_id] is p.peer
    for r, peer in ((p.ra, p.peer_a), (p.rb, p.peer)):
        assert "remove_peer" not in r.names()
        assert {e[1] for e in r.events} == {peer}
        assert r.names().count("peer_resumed") == peer.resumes == resumes
    p.a._check_invariants()
    p.b._check_invariants()


# -- a cut in the middle of a WebSocket frame -----------------------------------------------

PAYLOAD = 1024
BIG = bytes((i * 7 + i // 251) & 0xFF for i in range(6 * PAYLOAD + 300))  # 7 msg packets, one ws message
WIRE = len(message_packets(0x21, BIG, PAYLOAD))  # the mconn bytes, after a 4-byte (8 masked) frame header
CUTS = {"inside-the-frame-header": 3, "inside-the-third-packet": 2 * PAYLOAD + 700, "inside-the-last-packet": WIRE - 1}


@pytest.mark.parametrize("direction", ["up", "down"])
@pytest.mark.parametrize("cut", list(CUTS))
@pytest_twisted.ensureDeferred
async def test_a_cut_inside_a_websocket_frame_delivers_the_message_once_and_whole(cut, direction):
    """The link dies after exactly N bytes of a WebSocket frame carrying a 7-packet
    message, from either side: one resume, the message arrives once and whole."""
    config = Config(stats_interval=0, resume_grace=10.0, max_packet_payload=PAYLOAD, max_reconnect_delay=0.05)
    p = await ws_pair_through_proxy(config)
    try:
        sender, receiver = (p.peer, p.ra) if direction == "up" else (p.peer_a, p.rb)
        [link] = p.proxy.links
        before = link.bytes_up if direction == "up" else link.bytes_down
        link.cut_after(CUTS[cut], direction)
        assert sender.try_send(0x21, BIG)
        await eventually(lambda: p.peer.resumes == 1 and p.peer_a.resumes == 1 and p.connected(), "the resume")
        assert link.closed
        assert (link.bytes_up if direction == "up" else link.bytes_down) - before == CUTS[cut]
        assert sender.try_send(0x30, b"after")
        await eventually(lambda: receiver.total >= 2, "both messages")
        await sleep(0.05)  # room for a duplicate to show up
        assert receiver.messages[0x21] == [BIG] and receiver.messages[0x30] == [b"after"]
        assert_one_session(p, 1)
    finally:
        await p.close()


# -- resets during a transfer -----------------------------------------------------------

BULK_CHANNELS = [ChannelDescriptor(c.id, priority=c.priority, send_queue_capacity=512) for c in CHANNELS]
PER_CHANNEL = {0x20: 4_000, 0x21: 4_000, 0x30: 4_000}
TOTAL = sum(PER_CHANNEL.values())
MIN_RESETS = 20
RESET_EVERY = TOTAL // (MIN_RESETS + 10)
WINDOW = 200  # unacked messages per channel the sender allows itself (see test_resume_scenarios.Transfer)
MAX_ROUNDS = 200_000


async def send_with_resets(p, sent, resets, channel_id):
    """try_send ``sent[channel_id]`` in bursts within WINDOW unacked; after a burst, reset
    every link once the receiver has passed the next RESET_EVERY messages."""
    peer, messages, i = p.peer, sent[channel_id], 0
    index = IDS.index(channel_id)
    for _ in range(MAX_ROUNDS):
        if i == len(messages):
            return
        stats = peer.stats.channels[index]
        room, before = min(WINDOW - (stats.accepted - stats.acked), len(messages) - i), i
        while room > 0 and peer.try_send(channel_id, messages[i]):
            i, room = i + 1, room - 1
        if i > before and p.ra.total >= (len(resets) + 1) * RESET_EVERY and p.connected() and p.proxy.reset_all():
            resets.append(p.ra.total)
        await sleep(0 if i > before else 0.001)
    raise AssertionError(f"sender of {channel_id:#04x} did not finish in {MAX_ROUNDS} rounds")


@pytest_twisted.ensureDeferred
async def test_resets_during_a_transfer_over_ws_lose_duplicate_and_reorder_nothing():
    """Twenty-odd resets during 12,000 messages on three channels over ws: each is
    resumed, every message arrives once and in order, to the same Peers."""
    config = Config(
        stats_interval=0, resume_grace=30.0, ack_every_messages=128, send_timeout=60.0, max_reconnect_delay=0.05
    )
    p = await ws_pair_through_proxy(config, BULK_CHANNELS)
    try:
        sent = {c: [b"%02x:%06d" % (c, i) + b"." * (i % 17) for i in range(n)] for c, n in PER_CHANNEL.items()}
        resets = []
        senders = [defer.ensureDeferred(send_with_resets(p, sent, resets, c)) for c in PER_CHANNEL]
        await bounded(defer.gatherResults(senders, consumeErrors=True), 60)
        await eventually(lambda: p.ra.total >= TOTAL and p.connected(), "every message", timeout=60)
        await sleep(0.1)  # room for a late duplicate
        assert len(resets) >= MIN_RESETS, f"only {len(resets)} resets: the transfer outran the breaker"
        assert p.ra.total == TOTAL
        for c in PER_CHANNEL:
            mismatch = first_mismatch(p.ra.messages[c], sent[c])
            assert mismatch is None, f"channel {c:#04x}: {mismatch}"
        assert p.peer.stats.messages_resent >= 1, "no reset caught a message in flight"
        assert_one_session(p, p.peer.resumes)
        assert p.peer.resumes >= MIN_RESETS
    finally:
        await p.close()


# -- a black hole healed within grace ------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_black_hole_over_ws_healed_within_grace_resumes_and_delivers_everything_once(telemetry):
    """mconn's keepalive (not WebSocket pings) finds a black hole on both sides; redials
    into the hole give up at ws_handshake_timeout (1 s); healed within grace, one resume
    delivers every message once, in order."""
    config = Config(
        stats_interval=0, resume_grace=20.0, ping_interval=0.2, pong_timeout=0.4, handshake_timeout=0.5,
        ws_handshake_timeout=1.0, max_reconnect_delay=0.1,
        retry_initial_dial=True,  # a loaded machine may miss the short timeouts once
    )
    p = await ws_pair_through_proxy(config)
    try:
        to_a, to_b = {c: [] for c in IDS}, {c: [] for c in IDS}
        five = dict.fromkeys(IDS, 5)

        def both(tag):
            burst(p.peer, to_a, tag, five)
            burst(p.peer_a, to_b, tag, five)

        both(b"before")
        await eventually(lambda: p.ra.total == p.rb.total == 15, "the first messages")
        p.proxy.blackhole_all()
        both(b"into the hole")
        await eventually(
            lambda: "peer_suspended" in p.ra.names() and "peer_suspended" in p.rb.names(),
            "the keepalive to find the hole on both sides",
        )
        assert [e["reason_type"] for e in telemetry.named("session_suspended")] == ["PongTimeout"] * 2
        both(b"while suspended")
        await eventually(lambda: p.proxy.connections_accepted > 2, "redials into the hole")
        assert p.peer.resumes == 0 and p.ra.total == p.rb.total == 15
        p.proxy.heal()
        await eventually(p.connected, "the resume after the heal")
        both(b"after")
        await eventually(lambda: p.ra.total == p.rb.total == 60, "every message")
        await sleep(0.05)
        assert p.ra.messages == to_a and p.rb.messages == to_b
        for r in (p.ra, p.rb):
            assert r.names() == ["add_peer", "peer_suspended", "peer_resumed"]
        assert_one_session(p, 1)
    finally:
        await p.close()


@pytest_twisted.ensureDeferred
async def test_resets_over_wss_resume_with_every_message_once():
    """Over wss (identity-mode TLS beneath the WebSocket) five resets during a burst
    stream: each is resumed, every message arrives once and in order, one session."""
    config = Config(stats_interval=0, resume_grace=10.0, max_reconnect_delay=0.05)
    p = await ws_pair_through_proxy(config, scheme="wss")
    try:
        sent = {c: [] for c in IDS}
        for round_ in range(5):
            before = p.ra.total
            burst(p.peer, sent, b"r%d" % round_, dict.fromkeys(IDS, 20))
            await eventually(lambda: p.ra.total >= before + 10, "part of the burst")
            assert p.proxy.reset_all()
            await eventually(lambda: p.connected() and p.peer.resumes == round_ + 1, "the resume")
        total = sum(len(m) for m in sent.values())
        await eventually(lambda: p.ra.total == total, "every message")
        await sleep(0.05)
        assert p.ra.messages == sent
        assert_one_session(p, 5)
    finally:
        await p.close()
