"""Attacks on session ownership, on real sockets (specs/resume.md section 6.4).

Each test is an attack that worked before the rules of section 6.4: a connection that
proves nothing taking over a session a certificate proved, two newcomers defeating the
duplicate-connection probe, one plaintext hello ending a suspended session; and a send
refused while a resetting link was between a failure and the suspension. Real Switches
on 127.0.0.1 (pytest-twisted), raw sockets that speak mconn bytes where the attacker is
not a Switch; every wait is bounded and everything started is stopped.
"""

from __future__ import annotations

import random
import time

import pytest
import pytest_twisted
from twisted.internet import defer, endpoints

from faultproxy import FaultProxy
from helpers import RawPeer, bounded, close_packets_in, sleep, the_reactor, until
from mconn import ChannelDescriptor, Config, NodeKey, PeerClosed, Reactor, Switch, TLSOptions
from mconn.core import wire
from mconn.core.handshake import make_hello

from .test_loopback import stop
from .test_tls import CA, ca_options

pytestmark = pytest.mark.integration

#: How long the stream through the resetting link runs (the reported failure came at ~6 s).
STREAM_SECONDS = 6.0

CHANNELS = [
    ChannelDescriptor(0x20, priority=1, send_queue_capacity=64),
    ChannelDescriptor(0x21, priority=5, send_queue_capacity=64),
    ChannelDescriptor(0x30, priority=10, send_queue_capacity=64),
]


class Log(Reactor):
    """Records every call; messages by channel."""

    def __init__(self):
        self.calls = []
        self.messages = {c.id: [] for c in CHANNELS}

    def get_channels(self):
        return CHANNELS

    def add_peer(self, peer):
        self.calls.append(("add_peer", peer))

    def remove_peer(self, peer, reason):
        self.calls.append(("remove_peer", peer, reason))

    def peer_suspended(self, peer):
        self.calls.append(("peer_suspended", peer))

    def peer_resumed(self, peer):
        self.calls.append(("peer_resumed", peer))

    def receive(self, channel_id, peer, message):
        self.messages[channel_id].append((peer, message))

    def removed(self):
        return [c for c in self.calls if c[0] == "remove_peer"]


def node(config=None, **kwargs):
    log = Log()
    switch = Switch([log], clock=the_reactor(), config=config or Config(stats_interval=0), **kwargs)
    switch.startService()
    return switch, log


async def listen(switch) -> int:
    port = await switch.listen("tcp:0:interface=127.0.0.1")
    return port.getHost().port


async def raw_connect(port: int, greeting: bytes) -> RawPeer:
    endpoint = endpoints.TCP4ClientEndpoint(the_reactor(), "127.0.0.1", port)
    return await endpoints.connectProtocol(endpoint, RawPeer(greeting))


def claiming_hello(node_id: str, *, session_id: bytes | None = None, resume: bool = False) -> bytes:
    """A hello claiming ``node_id``, asking for a new session (or to resume ``session_id``)."""
    request = wire.SessionRequest(session_id=session_id or random.randbytes(16), resume=resume)
    fields = ((wire.HelloTag.SESSION, wire.encode_session_request(request)),)
    hello = make_hello(node_id=node_id, channels=CHANNELS, max_packet_payload=1024, fields=fields)
    return wire.encode_extension(wire.PacketType.HELLO, wire.encode_hello(hello))


@pytest_twisted.ensureDeferred
async def test_an_anonymous_client_cannot_take_over_a_session_its_certificate_proved(tmp_path):
    """CA mode with anonymous dialers allowed: two connections without a client certificate,
    each claiming a connected node's certificate-proven id, back to back, are both refused
    (unproven); the node's session, its connection and its messages are untouched."""
    ca = CA()
    victim, victim_log = node(tls=ca_options(tmp_path, ca, "victim", require_client_cert=False))
    alice, _ = node(tls=ca_options(tmp_path, ca, "alice"))
    attacker, _ = node(tls=TLSOptions.from_files(ca_file=ca.write(tmp_path / "ca.pem")))
    attacker.node_id = alice.node_id  # its hellos claim Alice; it has no certificate
    try:
        port = await listen(victim)
        alice_peer = await bounded(alice.dial(f"{victim.node_id}@127.0.0.1:{port}"))
        await until(lambda: alice.node_id in victim.peers, "the victim's side of Alice's session")
        held = victim.peers[alice.node_id]
        held_connection = held._protocol
        attempts = [attacker.dial(f"{victim.node_id}@127.0.0.1:{port}") for _ in range(2)]
        for attempt in attempts:
            with pytest.raises(PeerClosed) as info:
                await bounded(attempt)
            assert info.value.code == "unproven"
        await sleep(Config().duplicate_probe_timeout + 0.5)  # a probe, had one started, is decided
        assert victim.peers[alice.node_id] is held and held.state == "connected" and held._protocol is held_connection
        assert victim_log.removed() == [] and held.resumes == 0
        assert victim.refusals.get("unproven") == 2 and held.proven
        assert alice_peer.try_send(0x21, b"still Alice")
        await until(lambda: victim_log.messages[0x21], "Alice's message")
        assert victim_log.messages[0x21] == [(held, b"still Alice")]
        victim._check_invariants()
    finally:
        await stop(victim, alice, attacker)


@pytest_twisted.ensureDeferred
async def test_two_newcomers_cannot_defeat_the_duplicate_probe():
    """Plaintext: two raw connections claiming a connected node's id, back to back. The
    first gets the probe and is refused when the live connection answers; the second is
    refused at once (one probe per session). The live connection is never aborted."""
    config = Config(stats_interval=0, duplicate_probe_timeout=0.5)
    a, a_log = node(config)
    b, _ = node(config)
    try:
        port = await listen(a)
        b_peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        await until(lambda: b.node_id in a.peers, "a's side of the session")
        held = a.peers[b.node_id]
        live = held._protocol
        newcomers = [await raw_connect(port, claiming_hello(b.node_id)) for _ in range(2)]
        await until(lambda: all(n.lost is not None for n in newcomers), "both newcomers refused", 5)
        await sleep(config.duplicate_probe_timeout * 3)  # a probe that missed its answer would have expired
        codes = [[code for code, _ in close_packets_in(bytes(n.data))] for n in newcomers]
        assert codes == [["duplicate"], ["duplicate"]], codes
        assert a.peers[b.node_id] is held and held._protocol is live and held.state == "connected"
        assert a_log.removed() == [] and held.resumes == 0
        assert a.node_counters[b.node_id]["duplicates_replaced"] == 0
        assert b_peer.try_send(0x20, b"still here")
        await until(lambda: a_log.messages[0x20], "b's message")
        a._check_invariants()
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_one_plaintext_hello_cannot_end_a_suspended_session():
    """Plaintext: while Alice's session is suspended (her re-dials cannot get through), an
    impostor's hello asking for a new session with her id is refused (session_held) and
    the session is untouched; when her path heals, Alice resumes it with her session id:
    the same Peer, nothing removed, her messages delivered."""
    config = Config(stats_interval=0, resume_grace=20.0, max_reconnect_delay=0.1)
    a, a_log = node(config)
    alice, _ = node(config)
    proxy = None
    try:
        port = await listen(a)
        proxy = FaultProxy("127.0.0.1", port)
        proxy_port = await proxy.start()
        alice_peer = await bounded(alice.dial(f"{a.node_id}@127.0.0.1:{proxy_port}"))
        await until(lambda: alice.node_id in a.peers, "a's side of the session")
        held = a.peers[alice.node_id]
        proxy.refuse(True)  # Alice's re-dials are refused until the path heals
        proxy.reset_all()
        await until(lambda: held.state == "suspended", "the suspension")
        impostor = await raw_connect(port, claiming_hello(alice.node_id))
        await until(lambda: impostor.lost is not None, "the impostor refused", 5)
        assert [code for code, _ in close_packets_in(bytes(impostor.data))] == ["session_held"]
        assert a.peers[alice.node_id] is held and held.state == "suspended" and a_log.removed() == []
        assert alice_peer.try_send(0x30, b"sent while suspended")
        proxy.refuse(False)
        await until(lambda: held.state == "connected", "Alice's resume", 10)
        await until(lambda: a_log.messages[0x30], "Alice's message")
        assert a_log.messages[0x30] == [(held, b"sent while suspended")]
        assert held.resumes == 1 and a_log.removed() == []
        a._check_invariants()
    finally:
        if proxy is not None:
            await proxy.stop()
        await stop(a, alice)


@pytest_twisted.ensureDeferred
async def test_send_is_never_refused_on_a_live_session_while_the_link_keeps_resetting():
    """Through a proxy that resets the link every 0.1-0.4 s, send streams numbered
    messages on three channels: every send fires True (none is refused while the session
    lives) and every message arrives once, in order."""
    config = Config(stats_interval=0, resume_grace=30.0, send_timeout=30.0, max_reconnect_delay=0.05)
    a, a_log = node(config)
    b, _ = node(config)
    proxy = None
    rng = random.Random(12)
    try:
        port = await listen(a)
        proxy = FaultProxy("127.0.0.1", port)
        proxy_port = await proxy.start()
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{proxy_port}"))
        sent = {c.id: [] for c in CHANNELS}
        refused = []
        stopping = []

        def breaker():
            if not stopping:
                proxy.reset_all()
                the_reactor().callLater(rng.uniform(0.1, 0.4), breaker)

        async def stream(channel_id):
            deadline = time.monotonic() + STREAM_SECONDS
            for i in range(20000):  # about 6 s of messages, bounded in count too
                if time.monotonic() > deadline:
                    return
                message = b"%02x:%05d" % (channel_id, i)
                if not await peer.send(channel_id, message):
                    refused.append((channel_id, i, peer.state))
                    return
                sent[channel_id].append(message)
                if i % 10 == 0:
                    await sleep(0.002)

        the_reactor().callLater(0.1, breaker)
        await bounded(_gather([stream(c.id) for c in CHANNELS]), 60)
        stopping.append(True)
        assert refused == []
        await until(lambda: all(len(a_log.messages[c]) == len(sent[c]) for c in sent), "every message", 30)
        for c in sent:
            assert [m for _, m in a_log.messages[c]] == sent[c]
        assert peer.resumes >= 3, "the link was not reset often enough to test anything"
    finally:
        if proxy is not None:
            await proxy.stop()
        await stop(a, b)


def _gather(coroutines):
    return defer.gatherResults([defer.ensureDeferred(c) for c in coroutines], consumeErrors=True)


@pytest_twisted.ensureDeferred
async def test_with_tls_a_restarted_node_proves_its_key_and_gets_a_fresh_session_at_once():
    """Identity-mode TLS: a node that restarted (same key, no session) while the other
    side holds its suspended session proves its key, so its new-session hello ends the
    held session ("new session") and a fresh one starts at once, without waiting out the
    grace (specs/resume.md section 3.1, the proven rows)."""
    config = Config(stats_interval=0, resume_grace=20.0, max_reconnect_delay=0.1)
    key = NodeKey.generate()
    a, a_log = node(config, tls=TLSOptions.identity(NodeKey.generate()))
    b, _ = node(config, tls=TLSOptions.identity(key))
    restarted = None
    proxy = None
    try:
        port = await listen(a)
        proxy = FaultProxy("127.0.0.1", port)
        proxy_port = await proxy.start()
        await bounded(b.dial(f"{a.node_id}@127.0.0.1:{proxy_port}"))
        await until(lambda: b.node_id in a.peers, "a's side of the session")
        held = a.peers[b.node_id]
        proxy.refuse(True)
        proxy.reset_all()
        await until(lambda: held.state == "suspended", "the suspension")
        await stop(b)  # the process is gone; its session with it
        restarted, _ = node(config, tls=TLSOptions.identity(key))
        fresh = await bounded(restarted.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert fresh.state == "connected"
        [(_, old, reason)] = a_log.removed()
        assert old is held and type(reason).__name__ == "SessionRejected" and reason.reason == "new session"
        assert a.peers[key.node_id] is not held and a.peers[key.node_id].proven
        a._check_invariants()
    finally:
        if proxy is not None:
            await proxy.stop()
        await stop(a, *([restarted] if restarted is not None else []))
