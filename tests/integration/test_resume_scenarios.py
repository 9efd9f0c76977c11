"""The resume scenarios on real sockets: resets mid-message and mid-transfer, black holes healed
within and after the grace, a restarted node, close packets, and send_confirmed around a reset.

Two real Switches on 127.0.0.1 (pytest-twisted); the dialer reaches the listener through a
FaultProxy (tests/faultproxy.py) that resets, black-holes or cuts the link. One scenario
runs the listening node as a separate process (node_proc.py) and kills it. Each test
checks every message it sent: delivered exactly once and in order per channel while the
session lives, or counted in the ``undelivered`` of the reason that ended it.

``pair_through_proxy`` builds the pair over TCP, ws or wss; the bodies of the scenarios
that test_websocket_resume.py runs again over ws (``a_cut_message_resumes``,
``a_transfer_through_resets``, ``a_black_hole_healed_within_grace``) live here, so the
two transports run one scenario each.

Every wait is bounded (``eventually``, ``bounded``); every Switch, proxy and process a test
starts is stopped in its ``finally``.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import time

import pytest
import pytest_twisted
from twisted.internet import defer, protocol

from faultproxy import FaultProxy
from helpers import message_packets, sleep, the_reactor
from mconn import (
    ChannelDescriptor,
    Config,
    ConnectionClosed,
    DeliveryNotConfirmed,
    NodeKey,
    PeerClosed,
    Reactor,
    SessionExpired,
    SessionRejected,
    Switch,
)

from mconn.net.tls import TLSOptions

from .test_loopback import bounded, stop

pytestmark = pytest.mark.integration

#: Generous: two shared cores, other test runs beside this one.
TIMEOUT = 20.0
NODE_PROC = pathlib.Path(__file__).with_name("node_proc.py")
ROOT = pathlib.Path(__file__).resolve().parents[2]

#: The same three channels as node_proc.py: different priorities, room for bursts.
CHANNELS = [
    ChannelDescriptor(0x20, priority=1, send_queue_capacity=64),
    ChannelDescriptor(0x21, priority=5, send_queue_capacity=64),
    ChannelDescriptor(0x30, priority=10, send_queue_capacity=64),
]
IDS = [c.id for c in CHANNELS]


async def eventually(predicate, what, timeout=TIMEOUT, step=0.005):
    """Wait until ``predicate()`` is true; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await sleep(step)


class Tally(Reactor):
    """Keeps every message per channel, cheaply (100,000 of them), and every peer event."""

    def __init__(self, channels=CHANNELS):
        self.channels = list(channels)
        self.messages = {c.id: [] for c in self.channels}
        self.total = 0
        #: ("add_peer" | "peer_suspended" | "peer_resumed", peer) or ("remove_peer", peer, reason)
        self.events = []
        #: Every Peer object a message came from.
        self.senders = set()
        self.on_receive = None

    def get_channels(self):
        return self.channels

    def receive(self, channel_id, peer, message):
        self.messages[channel_id].append(message)
        self.total += 1
        self.senders.add(peer)
        if self.on_receive is not None:
            self.on_receive()

    def add_peer(self, peer):
        self.events.append(("add_peer", peer))

    def remove_peer(self, peer, reason):
        self.events.append(("remove_peer", peer, reason))

    def peer_suspended(self, peer):
        self.events.append(("peer_suspended", peer))

    def peer_resumed(self, peer):
        self.events.append(("peer_resumed", peer))

    def names(self):
        return [e[0] for e in self.events]

    def removed(self):
        return [(e[1], e[2]) for e in self.events if e[0] == "remove_peer"]

    def counts(self):
        return {c: len(m) for c, m in self.messages.items()}


class Pair:
    """Listener ``a`` and dialer ``b``; b reached a through ``proxy``; ``peer`` is b's Peer of a."""

    def __init__(self, a, b, ra, rb, proxy, peer):
        self.a, self.b, self.ra, self.rb, self.proxy, self.peer = a, b, ra, rb, proxy, peer
        self.peer_a = a.peers[b.node_id]  # a's Peer of b

    def connected(self):
        return self.peer.state == "connected" and self.peer_a.state == "connected"

    async def close(self):
        await self.proxy.stop()
        await stop(self.a, self.b)


#: The path of the ws:// and wss:// listeners.
WS_PATH = "/mconn"


def addresses(scheme):
    """(the listener's endpoint, the dial address after "<node id>@" with {port} left to fill) for a scheme."""
    if scheme == "tcp":
        return "tcp:0:interface=127.0.0.1", "127.0.0.1:{port}"
    return f"{scheme}:tcp:0:interface=127.0.0.1:path={WS_PATH}", f"{scheme}://127.0.0.1:{{port}}{WS_PATH}"


async def pair_through_proxy(config, channels=CHANNELS, scheme="tcp"):
    """Listener ``a`` and dialer ``b``, started; b dialed a through a FaultProxy. ``scheme``: "tcp", "ws", or
    "wss" (identity-mode TLS beneath the WebSocket); a WebSocket listener is on WS_PATH."""
    ra, rb = Tally(channels), Tally(channels)
    tls = (lambda: TLSOptions.identity(NodeKey.generate())) if scheme == "wss" else (lambda: None)
    a = Switch([ra], clock=the_reactor(), config=config, tls=tls())
    b = Switch([rb], clock=the_reactor(), config=config, tls=tls())
    a.startService()
    b.startService()
    proxy = None
    listen, dial = addresses(scheme)
    try:
        port = await a.listen(listen)
        proxy = FaultProxy("127.0.0.1", port.getHost().port)
        proxy_port = await proxy.start()
        peer = await bounded(b.dial(f"{a.node_id}@" + dial.format(port=proxy_port)), TIMEOUT)
        await eventually(lambda: b.node_id in a.peers, "the listener's side of the session")
    except BaseException:
        if proxy is not None:
            await proxy.stop()
        await stop(a, b)
        raise
    return Pair(a, b, ra, rb, proxy, peer)


def burst(peer, sent, tag, counts):
    """try_send ``counts[channel]`` messages on each channel; record them in ``sent``."""
    for channel_id, n in counts.items():
        for i in range(n):
            message = b"%s %02x %d" % (tag, channel_id, len(sent[channel_id]))
            assert peer.try_send(channel_id, message), f"{tag!r} #{i} refused on {channel_id:#04x}"
            sent[channel_id].append(message)


def first_mismatch(got, want):
    """None if the lists are equal, else where they first differ (no 100,000-item diff)."""
    if got == want:
        return None
    for i, (g, w) in enumerate(zip(got, want, strict=False)):  # up to the shorter: the lengths differ
        if g != w:
            return f"item {i}: got {g!r}, wanted {w!r} (got {len(got)}, wanted {len(want)})"
    return f"got {len(got)} items, wanted {len(want)}; the shorter is a prefix of the other"


def expected_undelivered(sent, delivered):
    """Per channel, accepted minus delivered, non-zero only (the shape of ``undelivered``)."""
    out = {c: len(sent[c]) - delivered[c] for c in sent}
    return {c: n for c, n in out.items() if n}


def fully_acked(peer):
    return all(c.acked == c.accepted for c in peer.stats.channels)


def assert_one_session(p, resumes=None):
    """The same Peer objects throughout, never removed, each side told of each of its resumes (``resumes`` of them
    on both sides, if given)."""
    assert p.a.peers[p.b.node_id] is p.peer_a and p.b.peers[p.a.node_id] is p.peer
    for r, peer in ((p.ra, p.peer_a), (p.rb, p.peer)):
        assert "remove_peer" not in r.names()
        assert {e[1] for e in r.events} == {peer}
        assert r.names().count("peer_resumed") == peer.resumes
        assert resumes is None or peer.resumes == resumes, (peer.resumes, resumes)
    p.a._check_invariants()
    p.b._check_invariants()


# -- 1. a reset in the middle of a message ----------------------------------------------

PAYLOAD = 1024
BIG = bytes((i * 7 + i // 251) & 0xFF for i in range(6 * PAYLOAD + 300))  # 7 msg packets
WIRE = len(message_packets(0x21, BIG, PAYLOAD))
PACKET = len(message_packets(0x21, BIG[:PAYLOAD], PAYLOAD))  # one full msg packet
CUTS = {
    "inside-the-first-header": 2,
    "at-a-packet-boundary": 2 * PACKET,
    "inside-the-fourth-packet": 3 * PACKET + 500,
    "one-byte-short": WIRE - 1,
    "after-the-last-byte": WIRE,  # whole, but the ack may be lost: not delivered twice
}


async def a_cut_message_resumes(p, cut, direction):
    """Cut p's link after exactly ``cut`` more bytes ``direction`` ("up": dialer to listener) while BIG crosses it on
    0x21, then send b"after" on 0x30: one resume on both sides, each message arrives once and whole."""
    sender, receiver = (p.peer, p.ra) if direction == "up" else (p.peer_a, p.rb)
    [link] = p.proxy.links
    before = link.bytes_up if direction == "up" else link.bytes_down
    link.cut_after(cut, direction)
    assert sender.try_send(0x21, BIG)
    await eventually(lambda: p.peer.resumes == 1 and p.peer_a.resumes == 1 and p.connected(), "the resume")
    assert link.closed
    assert (link.bytes_up if direction == "up" else link.bytes_down) - before == cut
    assert sender.try_send(0x30, b"after")
    await eventually(lambda: receiver.total >= 2, "both messages")
    await sleep(0.05)  # room for a duplicate to show up
    assert receiver.messages[0x21] == [BIG]
    assert receiver.messages[0x30] == [b"after"]
    for r in (p.ra, p.rb):
        assert r.names() == ["add_peer", "peer_suspended", "peer_resumed"]
    assert_one_session(p, 1)


@pytest.mark.parametrize("direction", ["up", "down"])
@pytest.mark.parametrize("cut", list(CUTS))
@pytest_twisted.ensureDeferred
async def test_a_reset_in_the_middle_of_a_message_delivers_it_once_and_whole(cut, direction):
    """The link dies after exactly N bytes of a 7-packet message, from either side."""
    config = Config(stats_interval=0, resume_grace=10.0, max_packet_payload=PAYLOAD)
    p = await pair_through_proxy(config)
    try:
        await a_cut_message_resumes(p, CUTS[cut], direction)
    finally:
        await p.close()


# -- 2. a hundred resets during a hundred thousand messages -----------------------------

BULK_CHANNELS = [
    ChannelDescriptor(0x20, priority=1, send_queue_capacity=512),
    ChannelDescriptor(0x21, priority=5, send_queue_capacity=512),
    ChannelDescriptor(0x30, priority=10, send_queue_capacity=512),
]
PER_CHANNEL = {0x20: 33_334, 0x21: 33_333, 0x30: 33_333}
TOTAL = sum(PER_CHANNEL.values())  # 100,000
MIN_RESETS = 100
WINDOW = 200  # unacked messages per channel the sender allows itself
MAX_ROUNDS = 500_000  # sender rounds (bursts, or 1 ms waits for acks)


class Transfer:
    """Three senders on b's Peer, and a breaker that resets the link as the receiver progresses.

    The senders try_send ``per_channel[c]`` messages on each channel c in bursts, keeping at
    most WINDOW messages of their channel unacked. Without the window the sender runs
    thousands of messages ahead (socket buffers), the receiver reads them in 64 KiB chunks
    of ~3,000 messages and resets, which strike between reads, come too seldom (~40 in the
    transfer). The breaker resets the link just after a burst was written, so that the
    burst is in flight, once the receiver has passed the next ``reset_every`` messages.
    """

    def __init__(self, pair, per_channel, reset_every):
        self.p, self.per_channel, self.reset_every = pair, per_channel, reset_every
        self.sent = {c: [b"%02x:%06d" % (c, i) + b"." * (i % 17) for i in range(n)] for c, n in per_channel.items()}
        self.resets = []  # messages received when each reset struck

    def maybe_reset(self):
        p = self.p
        due = (len(self.resets) + 1) * self.reset_every
        if p.ra.total >= due and p.connected() and p.proxy.reset_all():
            self.resets.append(p.ra.total)

    async def sender(self, channel_id):
        peer, messages, i = self.p.peer, self.sent[channel_id], 0
        index = IDS.index(channel_id)
        for _ in range(MAX_ROUNDS):
            if i == len(messages):
                return
            stats = peer.stats.channels[index]
            room = min(WINDOW - (stats.accepted - stats.acked), len(messages) - i)
            before = i
            while room > 0 and peer.try_send(channel_id, messages[i]):
                i += 1
                room -= 1
            if i > before:
                self.maybe_reset()
            await sleep(0 if i > before else 0.001)  # no room: wait for acks
        raise AssertionError(f"sender of {channel_id:#04x} did not finish in {MAX_ROUNDS} rounds")

    def run(self):
        senders = [defer.ensureDeferred(self.sender(c)) for c in self.per_channel]
        return defer.gatherResults(senders, consumeErrors=True)


async def a_transfer_through_resets(p, per_channel, min_resets, timeout):
    """Run a Transfer of ``per_channel`` messages with a reset every total / (min_resets + 50%) received; every
    message arrives once and in order, at least ``min_resets`` resets struck. Returns the Transfer."""
    total = sum(per_channel.values())
    transfer = Transfer(p, per_channel, reset_every=total // (min_resets * 3 // 2))
    await bounded(transfer.run(), timeout)
    await eventually(lambda: p.ra.total >= total and p.connected(), "every message", timeout=timeout)
    await sleep(0.1)  # room for a late duplicate
    assert len(transfer.resets) >= min_resets, f"only {len(transfer.resets)} resets: the transfer outran the breaker"
    assert p.ra.total == total
    for c in per_channel:
        mismatch = first_mismatch(p.ra.messages[c], transfer.sent[c])
        assert mismatch is None, f"channel {c:#04x}: {mismatch}"
    return transfer


@pytest_twisted.ensureDeferred
async def test_a_hundred_resets_during_a_hundred_thousand_messages_lose_and_duplicate_nothing():
    """A hundred resets during a hundred thousand messages: each is resumed, every message arrives once and in
    order, to the same Peers."""
    config = Config(
        stats_interval=0, resume_grace=30.0, ack_every_messages=128, send_timeout=60.0, max_reconnect_delay=0.05
    )
    p = await pair_through_proxy(config, BULK_CHANNELS)
    try:
        started = time.monotonic()
        transfer = await a_transfer_through_resets(p, PER_CHANNEL, MIN_RESETS, timeout=120)
        elapsed = time.monotonic() - started
        resets, resent = len(transfer.resets), p.peer.stats.messages_resent
        print(f"\n{TOTAL} messages, {resets} resets, {p.peer.resumes} resumes, {resent} re-sent in {elapsed:.1f}s")
        assert p.peer.resumes >= MIN_RESETS and p.peer_a.resumes >= MIN_RESETS
        assert resent >= resets, "the resets did not catch messages in flight"
        assert p.connected()
        assert p.ra.senders == {p.peer_a}
        assert_one_session(p)
    finally:
        await p.close()


# -- 3 and 4. black holes ---------------------------------------------------------------

HOLE_CONFIG = dict(
    stats_interval=0,
    ping_interval=0.2,
    pong_timeout=0.4,
    handshake_timeout=0.5,  # a redial into the hole gives up soon and tries again
    max_reconnect_delay=0.1,
)


async def a_black_hole_healed_within_grace(p, telemetry):
    """Messages both ways before, into and after a black hole that the keepalive finds on both sides and two
    redials go into; healed, one resume delivers every one of them once, in order, in one session."""
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
    assert p.peer_a.state == "suspended" and p.peer.state in ("suspended", "connecting")
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


@pytest_twisted.ensureDeferred
async def test_a_black_hole_healed_within_grace_resumes_and_delivers_everything_once(telemetry):
    """A black hole found by the keepalive suspends both sides; healed within grace, one resume delivers every
    message once, in order."""
    p = await pair_through_proxy(Config(resume_grace=20.0, **HOLE_CONFIG))
    try:
        await a_black_hole_healed_within_grace(p, telemetry)
    finally:
        await p.close()


@pytest_twisted.ensureDeferred
async def test_a_black_hole_healed_after_grace_ends_the_session_with_counts_then_a_fresh_dial_works(telemetry):
    """A black hole outlasting grace ends the session with exact undelivered counts and stops redials; a fresh
    dial then re-sends nothing old."""
    p = await pair_through_proxy(Config(resume_grace=1.0, **HOLE_CONFIG))
    try:
        to_a, to_b = {c: [] for c in IDS}, {c: [] for c in IDS}
        burst(p.peer, to_a, b"before", dict.fromkeys(IDS, 4))
        burst(p.peer_a, to_b, b"before", dict.fromkeys(IDS, 4))
        await eventually(lambda: p.ra.total == p.rb.total == 12, "the first messages")
        # Acknowledged too, so that "undelivered" can only mean what the hole swallowed.
        await eventually(lambda: fully_acked(p.peer) and fully_acked(p.peer_a), "the acks")
        p.proxy.blackhole_all()
        burst(p.peer, to_a, b"lost", {0x20: 1, 0x21: 2, 0x30: 3})
        burst(p.peer_a, to_b, b"lost", {0x20: 3, 0x21: 0, 0x30: 5})
        await eventually(lambda: p.ra.removed() and p.rb.removed(), "grace expiry on both sides")
        for r, peer, sent, receiver in ((p.rb, p.peer, to_a, p.ra), (p.ra, p.peer_a, to_b, p.rb)):
            [(removed, reason)] = r.removed()
            assert removed is peer and isinstance(reason, SessionExpired), reason
            assert reason.unconfirmed == expected_undelivered(sent, receiver.counts())
            assert r.names() == ["add_peer", "peer_suspended", "remove_peer"]
            assert peer.state == "closed"
        assert p.ra.counts() == dict.fromkeys(IDS, 4) and p.rb.counts() == dict.fromkeys(IDS, 4)
        assert p.a.peers == {} and p.b.peers == {}
        assert [e["reason_type"] for e in telemetry.named("session_suspended")] == ["PongTimeout"] * 2
        # The dialer stopped redialing with the session (an attempt takes at most
        # handshake_timeout + max_reconnect_delay = 0.6 s).
        dials = p.proxy.connections_accepted
        await sleep(0.8)
        assert p.proxy.connections_accepted == dials
        p.proxy.heal()
        fresh = await bounded(p.b.dial(f"{p.a.node_id}@127.0.0.1:{p.proxy.port}"), TIMEOUT)
        assert fresh is not p.peer and fresh.state == "connected" and fresh.resumes == 0
        await eventually(lambda: p.b.node_id in p.a.peers, "the listener's side of the fresh session")
        assert p.rb.events[-1] == ("add_peer", fresh)
        assert p.ra.events[-1] == ("add_peer", p.a.peers[p.b.node_id])
        assert fresh.try_send(0x30, b"fresh")
        await eventually(lambda: p.ra.total == 13, "the fresh session's message")
        await sleep(0.05)
        assert p.ra.messages[0x30][-1] == b"fresh" and p.ra.total == 13  # nothing old re-sent
    finally:
        await p.close()


# -- 5. a node process restarted -------------------------------------------------------


class NodeProcess(protocol.ProcessProtocol):
    """node_proc.py seen from the test: its JSON lines, and when it ended."""

    def __init__(self):
        self.lines = []
        self.stderr = b""
        self.ended = defer.Deferred()
        self._partial = b""
        self.pid = None

    def outReceived(self, data):
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        self.lines.extend(json.loads(line) for line in lines if line.strip())

    def errReceived(self, data):
        self.stderr += data

    def processEnded(self, reason):
        self.ended.callback(reason.value)  # ProcessDone or ProcessTerminated, as a value

    def named(self, event):
        return [line for line in self.lines if line["event"] == event]

    def received(self):
        out = {c: [] for c in IDS}
        for line in self.named("receive"):
            out[line["channel_id"]].append(line["message"].encode("latin-1"))
        return out


async def start_node(key_file, port, started):
    node = NodeProcess()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    transport = the_reactor().spawnProcess(
        node, sys.executable, [sys.executable, str(NODE_PROC), str(key_file), str(port)], env=env, path=str(ROOT)
    )
    node.pid = transport.pid
    started.append(node)
    await eventually(lambda: node.named("listening") or node.named("error") or node.ended.called, "node_proc to listen")
    [listening] = node.named("listening") or [None]
    assert listening is not None, f"node_proc did not listen: {node.lines} {node.stderr.decode(errors='replace')}"
    return node, listening


async def kill(node):
    if not node.ended.called:
        try:
            os.kill(node.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    await bounded(node.ended, TIMEOUT)


@pytest_twisted.ensureDeferred
async def test_a_restarted_node_process_knows_no_session_so_a_fresh_one_starts_with_counts(tmp_path):
    """A node killed and restarted with the same key refuses the resume: the old session ends with exact
    undelivered counts and a fresh one starts."""
    key_file = tmp_path / "node.key"
    key = NodeKey.generate()
    key.save(key_file)
    started = []
    rb = Tally()
    config = Config(stats_interval=0, resume_grace=30.0, max_reconnect_delay=0.1, dial_timeout=1.0)
    b = Switch([rb], clock=the_reactor(), config=config)
    b.startService()
    try:
        first, listening = await start_node(key_file, 0, started)
        assert listening["node_id"] == key.node_id
        port = listening["port"]
        peer = await bounded(b.dial(f"{key.node_id}@127.0.0.1:{port}"), TIMEOUT)
        sent = {c: [] for c in IDS}
        burst(peer, sent, b"delivered", {0x20: 3, 0x21: 4, 0x30: 5})
        await eventually(lambda: len(first.named("receive")) == 12 and fully_acked(peer), "delivery and acks")
        # A hung node: it reads nothing more, then dies without a word.
        os.kill(first.pid, signal.SIGSTOP)
        burst(peer, sent, b"sent to the hung node", {0x20: 2, 0x21: 0, 0x30: 1})
        await sleep(0.05)
        os.kill(first.pid, signal.SIGKILL)
        await bounded(first.ended, TIMEOUT)
        delivered = {c: len(m) for c, m in first.received().items()}
        assert delivered == {0x20: 3, 0x21: 4, 0x30: 5}
        await eventually(lambda: "peer_suspended" in rb.names(), "the session to be suspended")
        burst(peer, sent, b"sent while suspended", {0x20: 1, 0x21: 1, 0x30: 0})
        assert peer.state in ("suspended", "connecting")
        second, listening = await start_node(key_file, port, started)
        assert listening == {"event": "listening", "node_id": key.node_id, "port": port}
        await eventually(lambda: rb.removed(), "the resume to be refused")
        [(removed, reason)] = rb.removed()
        assert removed is peer and isinstance(reason, SessionRejected), reason
        assert reason.unconfirmed == expected_undelivered(sent, delivered) == {0x20: 3, 0x21: 1, 0x30: 1}
        assert peer.state == "closed"
        await eventually(lambda: key.node_id in b.peers, "the fresh session")
        fresh = b.peers[key.node_id]
        assert fresh is not peer and fresh.state == "connected"
        assert rb.names() == ["add_peer", "peer_suspended", "remove_peer", "add_peer"]
        assert rb.events[-1] == ("add_peer", fresh)
        assert fresh.try_send(0x21, b"to the new process")
        await eventually(lambda: second.named("receive"), "the new process to receive")
        await sleep(0.05)
        # The new process got the new session's message and nothing of the old session's.
        assert second.received() == {0x20: [], 0x21: [b"to the new process"], 0x30: []}
        assert [line["peer_id"] for line in second.named("add_peer")] == [b.node_id]
    finally:
        try:
            await stop(b)
        finally:
            for node in started:
                await kill(node)


# -- 6. a close packet ends the session at once -----------------------------------------


@pytest.mark.parametrize("how", ["peer.close", "stopService"])
@pytest.mark.parametrize("closer", ["dialer", "listener"])
@pytest_twisted.ensureDeferred
async def test_a_close_packet_ends_the_session_at_once_without_grace_or_redial(closer, how, telemetry):
    """A close from either side (peer.close or stopService) ends the session on both at once: no suspension,
    no grace, no redial."""
    config = Config(stats_interval=0, resume_grace=10.0, max_reconnect_delay=0.05)
    p = await pair_through_proxy(config)
    try:
        if closer == "dialer":
            switch, mine, theirs, own_r, other_r = p.b, p.peer, p.peer_a, p.rb, p.ra
        else:
            switch, mine, theirs, own_r, other_r = p.a, p.peer_a, p.peer, p.ra, p.rb
        code = "closed" if how == "peer.close" else "shutdown"
        if how == "peer.close":
            mine.close("done")
        else:
            await stop(switch)
        await eventually(lambda: other_r.removed() and own_r.removed(), "remove_peer on both sides")
        [(removed, reason)] = other_r.removed()
        assert removed is theirs and isinstance(reason, PeerClosed) and reason.code == code, reason
        [(removed, own)] = own_r.removed()
        assert removed is mine and isinstance(own, ConnectionClosed) and own.code == code, own
        assert mine.state == theirs.state == "closed"
        assert p.a.peers == {} and p.b.peers == {}
        await sleep(0.3)  # a redial or a resume would show by now
        assert p.proxy.connections_accepted == 1
        for r in (p.ra, p.rb):
            assert r.names() == ["add_peer", "remove_peer"]
        assert telemetry.named("session_suspended") == []
        assert telemetry.named("dial_attempt") == []
        assert [e["reason_type"] for e in telemetry.named("session_ended")] in (
            ["PeerClosed", "ConnectionClosed"],
            ["ConnectionClosed", "PeerClosed"],
        )
    finally:
        await p.close()


# -- 7. send_confirmed across a reset, and at grace expiry ---------------------------------


#: No ack by time (5 s) and, for fewer than five deliveries, none by count: within a test
#: only a resume, or five more deliveries, can confirm a message.
CONFIRM_CONFIG = Config(stats_interval=0, resume_grace=10.0, ack_interval=5.0, ack_every_messages=5)


@pytest_twisted.ensureDeferred
async def test_send_confirmed_fires_true_when_the_reset_fell_between_delivery_and_ack():
    """The resume itself proves these delivered: its counts must fire the confirmations.

    (At 7d6c857 they did not: Peer._attach let Session.to_resend apply the counts, then
    called _on_ack({}), which saw no change and confirmed nothing.)
    """
    p = await pair_through_proxy(CONFIRM_CONFIG)
    confirmed = []
    try:
        confirmed += [p.peer.send_confirmed(0x21, b"delivered, unacked %d" % i) for i in range(4)]
        await eventually(lambda: p.ra.total == 4, "the messages")
        assert not any(d.called for d in confirmed), "acked before the reset: nothing tested"
        p.proxy.reset_all()
        await eventually(lambda: p.peer.resumes == 1 and p.connected(), "the resume")
        # The resume told the sender that all four were delivered...
        assert p.peer.stats.channels[IDS.index(0x21)].acked == 4 and p.peer.session.unconfirmed() == {}
        # ...so their confirmations are due now, not after some later ack.
        await eventually(lambda: all(d.called for d in confirmed), "the confirmations", timeout=2.0)
        assert await bounded(defer.gatherResults(confirmed), TIMEOUT) == [True] * 4
        assert p.ra.messages[0x21] == [b"delivered, unacked %d" % i for i in range(4)]
    finally:
        await p.close()
        for d in confirmed:  # if unconfirmed, stopping fails them: no unhandled errors
            d.addErrback(lambda failure: None)


@pytest_twisted.ensureDeferred
async def test_send_confirmed_fires_true_when_the_reset_fell_between_send_and_delivery():
    """Messages lost on the wire before a reset are re-sent by the resume, and their send_confirmed Deferreds
    fire True."""
    p = await pair_through_proxy(CONFIRM_CONFIG)
    try:
        [link] = p.proxy.links
        link.blackhole()  # what is sent now is lost on the wire
        lost = [p.peer.send_confirmed(0x30, b"lost on the wire %d" % i) for i in range(5)]
        await sleep(0.05)
        assert p.ra.total == 0 and not any(d.called for d in lost)
        link.reset()
        await eventually(lambda: p.peer.resumes == 1 and p.connected(), "the resume")
        # Re-sent on the new transport, delivered, acknowledged (five deliveries: by count).
        assert await bounded(defer.gatherResults(lost), TIMEOUT) == [True] * 5
        assert p.ra.messages[0x30] == [b"lost on the wire %d" % i for i in range(5)]
    finally:
        await p.close()


@pytest_twisted.ensureDeferred
async def test_send_confirmed_fails_with_delivery_not_confirmed_when_grace_expires():
    """When grace expires, every unconfirmed send_confirmed fails with DeliveryNotConfirmed naming its
    channel, sequence and the session's end."""
    config = Config(stats_interval=0, resume_grace=0.5, max_reconnect_delay=0.05)
    p = await pair_through_proxy(config)
    try:
        [link] = p.proxy.links
        link.blackhole()
        on_the_wire = [p.peer.send_confirmed(0x20, b"on the wire %d" % i) for i in range(3)]
        p.proxy.refuse(True)  # the listener is unreachable from now on
        link.reset()
        await eventually(lambda: p.peer.state != "connected", "the break")
        while_suspended = [p.peer.send_confirmed(0x21, b"while suspended %d" % i) for i in range(2)]
        await eventually(lambda: p.rb.removed(), "grace expiry")
        [(_, reason)] = p.rb.removed()
        assert isinstance(reason, SessionExpired) and reason.unconfirmed == {0x20: 3, 0x21: 2}
        failures, confirmed = [], []
        for d in on_the_wire + while_suspended:
            assert d.called
            d.addCallbacks(confirmed.append, failures.append)
        assert confirmed == []
        for f in failures:
            assert f.check(DeliveryNotConfirmed) and f.value.reason is reason
        assert [(f.value.channel_id, f.value.sequence) for f in failures] == [
            (0x20, 0),
            (0x20, 1),
            (0x20, 2),
            (0x21, 0),
            (0x21, 1),
        ]
        assert p.ra.total == 0
    finally:
        await p.close()
