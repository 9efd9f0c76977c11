"""Lockout and memory exhaustion through dormant sessions, on real sockets.

A suspended session keeps a peer slot and its recovery buffer for ``resume_grace``. Two
attacks used that: one address opening and dropping sessions with made-up node ids until
every inbound slot was held by a suspended session, and made-up identities that read but
never acknowledge, each pinning a full recovery buffer. The limits of specs/resume.md
section 1.3 and specs/connection.md section 6 (``mconn.switch.session_limits``) must hold: an
address holds at most ``max_connections_per_ip`` sessions, suspended ones included; a
peer from another address still gets in; suspended sessions and all unacknowledged
bytes are bounded, and what is dropped is counted as undelivered, never silently.
"""

from __future__ import annotations

import random
import socket
import time

import pytest
import pytest_twisted

from helpers import bounded, sleep, the_reactor, until
from mconn import ChannelDescriptor, Config, Reactor, Switch
from mconn.core.frame_buffer import FrameBuffer
from mconn.core.wire import PacketType

from .attackers import made_up_hello, reset
from .test_loopback import stop

pytestmark = pytest.mark.integration

CHANNELS = [ChannelDescriptor(0x20, priority=1, send_queue_capacity=64, recv_message_capacity=1 << 20)]


class Pusher(Reactor):
    """Sends 256 KiB messages to every new peer until its session takes no more (a
    bounded loop), like a reactor serving data to whoever asks; records removals."""

    def __init__(self, push: bool = True):
        self.push = push
        self.removed = []
        self.added = []

    def get_channels(self):
        return CHANNELS

    def add_peer(self, peer):
        self.added.append(peer)
        if self.push:
            for _ in range(256):
                if not peer.try_send(0x20, bytes(256 << 10)):
                    break

    def remove_peer(self, peer, reason):
        self.removed.append((peer, reason))

    def receive(self, channel_id, peer, message):
        pass


#: Made-up identities; the hellos come from attackers.py, as the load test's do.
RNG = random.Random(5)


def hello_read_and_drop(port: int, source: str, *, read: int = 0) -> None:
    """Connect from ``source``, send a made-up hello, read until the session answer and
    up to ``read`` bytes (never acknowledging anything), then reset the connection (no
    close packet). Waiting for the answer makes the session certain: a reset that
    reaches the node before it has read the hello discards the hello with it (the node
    may send its own hello before it reads ours)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    packets = FrameBuffer(max_payload=1 << 20, default_extension_limit=1 << 20)
    try:
        sock.sendall(made_up_hello(RNG))
        got, answered, deadline = 0, False, time.monotonic() + 5
        sock.settimeout(0.2)
        while (got < read or not answered) and time.monotonic() < deadline:
            try:
                data = sock.recv(1 << 16)
            except TimeoutError:
                continue
            if not data:
                break
            got += len(data)
            if not answered:
                found, error = packets.feed(data, stop_after_extension=False)
                answered = error is not None or any(p[0] in (PacketType.SESSION, PacketType.CLOSE) for p in found)
    finally:
        reset(sock)  # RST, no close packet


def node(config, reactor=None, **kwargs):
    reactor = reactor or Pusher(push=False)
    switch = Switch([reactor], clock=the_reactor(), config=config, **kwargs)
    switch.startService()
    return switch, reactor


async def run_blocking(function, *args, **kwargs):
    """Run a blocking socket client in a thread, so the node under test keeps serving."""
    from twisted.internet import threads

    return await threads.deferToThreadPool(the_reactor(), the_reactor().getThreadPool(), function, *args, **kwargs)


@pytest_twisted.ensureDeferred
async def test_one_address_cannot_hold_every_inbound_slot_with_dormant_sessions():
    """Forty made-up node ids from one address, each a hello and a reset within a moment:
    that address holds at most max_connections_per_ip sessions, suspended ones included
    (its oldest suspended one gives way), and a peer from another address gets in."""
    config = Config(stats_interval=0, max_inbound_peers=40, max_connections_per_ip=8, resume_grace=30.0)
    victim, log = node(config)
    good = None
    try:
        port = (await victim.listen("tcp:0:interface=127.0.0.1")).getHost().port
        for _ in range(40):
            await run_blocking(hello_read_and_drop, port, "127.0.0.2")
        await until(lambda: victim.peers and all(p.state == "suspended" for p in victim.peers.values()), "suspensions")
        from_attacker = [p for p in victim.peers.values() if p.remote_address.rsplit(":", 1)[0] == "127.0.0.2"]
        assert len(from_attacker) <= config.max_connections_per_ip
        evicted = [r for _, r in log.removed if r.reason.startswith("evicted:")]
        assert len(evicted) >= 40 - config.max_connections_per_ip
        good, _ = node(Config(stats_interval=0, local_address="127.0.0.3"))
        peer = await bounded(good.dial(f"{victim.node_id}@127.0.0.1:{port}"), 10)
        assert peer.state == "connected"
        await until(lambda: good.node_id in victim.peers, "the good peer's session")
        victim._check_invariants()
    finally:
        await stop(victim, *([good] if good is not None else []))


@pytest_twisted.ensureDeferred
async def test_made_up_identities_that_never_acknowledge_cannot_pin_unbounded_memory():
    """Made-up identities that read what the node sends and never acknowledge, then drop:
    the unacknowledged bytes of all sessions stay under max_unacked_bytes, suspended ones
    under max_suspended_bytes (the largest gives way first), and every session that gave
    way ends with its messages counted as undelivered."""
    config = Config(
        stats_interval=0,
        recovery_buffer_bytes=4 << 20,
        max_unacked_bytes=12 << 20,
        max_suspended_bytes=6 << 20,
        max_suspended_sessions=32,
        resume_grace=30.0,
    )
    pusher = Pusher(push=True)
    victim, _ = node(config, pusher)
    try:
        port = (await victim.listen("tcp:0:interface=127.0.0.1")).getHost().port
        peak = 0
        for i in range(12):
            await run_blocking(hello_read_and_drop, port, f"127.0.0.{10 + i}", read=1 << 20)
            await sleep(0.05)
            peak = max(peak, victim._sessions.budget.used)
        await until(lambda: victim.peers and all(p.state == "suspended" for p in victim.peers.values()), "suspensions")
        suspended = [p for p in victim.peers.values() if p.state == "suspended"]
        held = sum(p.session.unacked_bytes for p in suspended)
        assert held <= config.max_suspended_bytes, f"{held} bytes held by {len(suspended)} suspended sessions"
        assert peak <= config.max_unacked_bytes + len(CHANNELS) * ((64 << 10) + (256 << 10)) * 12
        assert victim._sessions.budget.used == held  # ended sessions gave their bytes back
        evicted = [(p, r) for p, r in pusher.removed if r.reason.startswith("evicted:")]
        assert evicted, "nothing gave way"
        for _, reason in evicted:
            assert reason.unconfirmed.get(0x20, 0) > 0  # counted, never dropped silently
        assert len(pusher.added) == 12
        victim._check_invariants()
    finally:
        await stop(victim)


@pytest_twisted.ensureDeferred
async def test_a_connected_peer_that_stops_acknowledging_gets_no_more_once_the_node_budget_is_spent():
    """Two connected peers that never acknowledge: once the node-wide max_unacked_bytes is
    spent, try_send takes nothing more beyond a channel's reserve, for either of them."""
    config = Config(stats_interval=0, recovery_buffer_bytes=8 << 20, max_unacked_bytes=4 << 20)
    victim, _ = node(config)
    socks = []
    try:
        port = (await victim.listen("tcp:0:interface=127.0.0.1")).getHost().port
        for source in ("127.0.0.21", "127.0.0.22"):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
            sock.sendall(made_up_hello(RNG))
            socks.append(sock)
        await until(lambda: len(victim.peers) == 2, "two sessions")
        peers = list(victim.peers.values())
        chunk = bytes(256 << 10)
        taken = 0
        for _ in range(64):  # bounded: 16 MiB offered
            if any(p.try_send(0x20, chunk) for p in peers):
                taken += len(chunk)
        reserve = len(peers) * ((64 << 10) + len(chunk))
        assert victim._sessions.budget.used <= config.max_unacked_bytes + reserve
        assert taken <= config.max_unacked_bytes + reserve
        assert not any(p.try_send(0x20, chunk) for p in peers)
    finally:
        for sock in socks:
            sock.close()
        await stop(victim)
