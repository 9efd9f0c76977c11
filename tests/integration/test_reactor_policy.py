"""The reactor policies of specs/reactor-api.md sections 4 and 5.4 on real sockets
(127.0.0.1): a failing ``async def receive`` drops only its sender, and
``close(flush=True)`` delivers a queue that TCP had not taken yet before it closes.
"""

import pytest
import pytest_twisted
from twisted.internet import defer, task

from helpers import RecordingReactor, bounded, the_reactor, until
from mconn import ChannelDescriptor, Config, PeerClosed, ReactorError, Switch

pytestmark = pytest.mark.integration

CH = 0x60
CHANNELS = [ChannelDescriptor(CH, send_queue_capacity=512)]


class Strict(RecordingReactor):
    """An ``async def receive`` that awaits 10 ms on the loop, then refuses b"bad"."""

    async def receive(self, channel_id, peer, message):
        super().receive(channel_id, peer, message)
        await task.deferLater(the_reactor(), 0.01, lambda: None)
        if message == b"bad":
            raise ValueError("a message this chain does not allow")


async def started(*reactors, config=None):
    switches = [Switch([r], clock=the_reactor(), config=config or Config(stats_interval=0)) for r in reactors]
    for s in switches:
        s.startService()
    port = (await switches[0].listen("tcp:0:interface=127.0.0.1")).getHost().port
    return switches, f"{switches[0].node_id}@127.0.0.1:{port}"


async def stop(*switches):
    await bounded(defer.gatherResults([defer.maybeDeferred(s.stopService) for s in switches]))


@pytest_twisted.ensureDeferred
async def test_a_failing_async_receive_drops_only_its_sender():
    """The coroutine's exception drops the peer that sent b"bad" (ReactorError at the hub,
    PeerClosed reactor_error at the sender); the other peer's messages keep arriving."""
    strict, bad_side, good_side = Strict(CHANNELS), RecordingReactor(CHANNELS), RecordingReactor(CHANNELS)
    (hub, bad, good), address = await started(strict, bad_side, good_side)
    try:
        bad_peer = await bounded(bad.dial(address))
        good_peer = await bounded(good.dial(address))
        assert bad_peer.try_send(CH, b"bad") and good_peer.try_send(CH, b"ok-1")
        await until(lambda: bad_side.removed(), "the bad sender to be dropped")
        assert good_peer.try_send(CH, b"ok-2")
        await until(lambda: strict.received(CH, hub.peers.get(good.node_id)) == [b"ok-1", b"ok-2"], "the good peer")
        [(_, reason)] = strict.removed()
        assert isinstance(reason, ReactorError) and reason.reactor == "Strict" and "does not allow" in str(reason)
        assert isinstance(bad_side.removed()[0][1], PeerClosed) and bad_side.removed()[0][1].code == "reactor_error"
        assert list(hub.peers) == [good.node_id] and hub.reactor_errors == {"Strict": 1}
    finally:
        await stop(hub, bad, good)


@pytest_twisted.ensureDeferred
async def test_close_flush_delivers_a_queue_tcp_had_not_taken():
    """400 messages of 16 KiB are accepted at once (more than the socket buffers take), then
    close(flush=True): the receiver gets every one, in order, before the session ends, and
    the close reason confirms all of them (unconfirmed is empty)."""
    receiver, sender_side = RecordingReactor(CHANNELS), RecordingReactor(CHANNELS)
    (hub, sender), address = await started(receiver, sender_side)
    try:
        peer = await bounded(sender.dial(address))
        messages = [b"%04d" % i + b"z" * 16380 for i in range(400)]
        assert peer.try_send_many(CH, messages) == 400
        assert peer.stats.channels[0].queue_depth > 0  # some still wait in mconn's queue
        peer.close("done", flush=True)
        assert not peer.try_send(CH, b"too late")
        await until(lambda: sender_side.removed(), "the flushed close", 20)
        [(_, reason)] = sender_side.removed()
        assert reason.code == "closed" and reason.unconfirmed == {}
        assert receiver.received(CH) == messages
    finally:
        await stop(hub, sender)
