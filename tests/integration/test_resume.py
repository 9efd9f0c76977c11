"""Sessions across real transport breaks, through the fault proxy (specs/resume.md).

Two real Switches on 127.0.0.1; the dialer reaches the listener through a FaultProxy that
resets the link while messages flow on three channels of different priorities. Every
message accepted by ``send`` must arrive exactly once, in order per channel.
"""

import pytest
import pytest_twisted
from twisted.internet import defer

from faultproxy import FaultProxy
from helpers import sleep, the_reactor, until
from mconn import ChannelDescriptor, Config, PeerClosed, SessionExpired, Switch

from .test_loopback import Collector, bounded, stop

pytestmark = pytest.mark.integration

CHANNELS = [
    ChannelDescriptor(0x20, priority=1, send_queue_capacity=64),
    ChannelDescriptor(0x21, priority=5, send_queue_capacity=64),
    ChannelDescriptor(0x30, priority=10, send_queue_capacity=64),
]


async def pair_through_proxy(config):
    ra, rb = Collector(CHANNELS), Collector(CHANNELS)
    a = Switch([ra], clock=the_reactor(), config=config)
    b = Switch([rb], clock=the_reactor(), config=config)
    a.startService()
    b.startService()
    port = await a.listen("tcp:0:interface=127.0.0.1")
    proxy = FaultProxy("127.0.0.1", port.getHost().port)
    proxy_port = await proxy.start()
    peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{proxy_port}"))
    return a, b, ra, rb, proxy, peer


@pytest_twisted.ensureDeferred
async def test_resets_during_a_transfer_lose_and_duplicate_nothing():
    """Repeated resets during a three-channel transfer are healed by resume: every message arrives once, in
    order, to the same Peer."""
    config = Config(stats_interval=0, resume_grace=10.0, ack_every_messages=64)
    a, b, ra, rb, proxy, peer = await pair_through_proxy(config)
    try:
        per_channel = 1500
        sent = {c.id: [b"%d:%d:" % (c.id, i) + b"x" * (i % 700) for i in range(per_channel)] for c in CHANNELS}
        resets = 0

        async def sender(channel_id):
            for message in sent[channel_id]:
                assert await peer.send(channel_id, message)

        async def breaker():
            nonlocal resets
            for _ in range(8):
                await sleep(0.05)
                resets += proxy.reset_all()

        senders = [defer.ensureDeferred(sender(c.id)) for c in CHANNELS]
        await bounded(defer.gatherResults(senders + [defer.ensureDeferred(breaker())]), 30)
        await ra.until(3 * per_channel)
        assert resets >= 3, "the transfer outran the resets; the test proved nothing"
        for c in CHANNELS:
            assert ra.received(c.id) == sent[c.id], f"channel {c.id:#04x}: lost, duplicated or reordered"
        # The last reset may land after the last message arrived: its resume is then still under way.
        await until(lambda: peer.state == "connected", "the last reset's resume")
        assert peer.resumes >= 3
        # Same Peer object on both sides, never removed: the session survived every reset.
        assert [name for name, *_ in ra.calls if name in ("add_peer", "remove_peer")] == ["add_peer"]
        a._check_invariants()
        b._check_invariants()
    finally:
        await proxy.stop()
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_a_reset_in_the_middle_of_a_message_resends_it_whole():
    """A link cut in the middle of a 2 MiB message is healed by one resume: the message arrives whole, and the
    next one after it."""
    config = Config(stats_interval=0, resume_grace=10.0)
    a, b, ra, rb, proxy, peer = await pair_through_proxy(config)
    try:
        big = bytes(range(256)) * 8192  # 2 MiB, many packets
        proxy.links[0].cut_after(700_000, "up")  # the link dies mid-message
        assert await peer.send(0x20, big)
        assert await peer.send(0x30, b"after")
        await ra.until(2)
        assert ra.received(0x20) == [big]
        assert ra.received(0x30) == [b"after"]
        assert peer.resumes == 1
    finally:
        await proxy.stop()
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_grace_expiry_ends_the_session_with_undelivered_counts():
    """With the listener unreachable, the session ends on both sides when the grace expires, with
    SessionExpired counting the undelivered."""
    config = Config(stats_interval=0, resume_grace=0.3, max_reconnect_delay=0.05)
    a, b, ra, rb, proxy, peer = await pair_through_proxy(config)
    try:
        proxy.refuse(True)  # the listener is unreachable from now on
        proxy.reset_all()
        await sleep(0.05)
        assert peer.state in ("suspended", "connecting")
        assert peer.try_send(0x21, b"queued while suspended")
        reason = await bounded(rb.removed_d)
        assert isinstance(reason, SessionExpired)
        assert reason.unconfirmed == {0x21: 1}
        assert peer.state == "closed" and a.node_id not in b.peers
        assert not peer.try_send(0x21, b"too late")
        # The listener waited as long, then ended its side of the session too.
        assert isinstance(await bounded(ra.removed_d), SessionExpired)
        assert b.node_id not in a.peers
    finally:
        await proxy.stop()
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_close_ends_the_session_at_once_without_resume():
    """peer.close() ends the session on both sides at once, with PeerClosed carrying the text; nothing is
    resumed."""
    config = Config(stats_interval=0, resume_grace=10.0)
    a, b, ra, rb, proxy, peer = await pair_through_proxy(config)
    try:
        peer.close("done")
        reason = await bounded(ra.removed_d)
        assert isinstance(reason, PeerClosed) and reason.text == "done"
        assert a.peers == {} and (await bounded(rb.removed_d)) is not None
        assert b.peers == {}
    finally:
        await proxy.stop()
        await stop(a, b)
