"""Typed messages between real Switches on 127.0.0.1 (specs/reactor-api.md section 11):
protobuf and any-codec channels deliver decoded objects, and a message that does not
decode drops its sender while the node serves its other peers.

Every wait is bounded (helpers.bounded / until) and every Switch started is stopped.
"""

import json

import pytest
import pytest_twisted

from helpers import RecordingReactor, bounded, listening_switches, stop_switches, until
from mconn import ChannelDescriptor, DecodeError, PeerClosed
from typed_messages import NOT_PROTOBUF, Tx

pytestmark = pytest.mark.integration

TXS, JSON, RAW = 0x40, 0x41, 0x42


class JsonCodec:
    """Any object with encode/decode: here JSON."""

    def encode(self, obj) -> bytes:
        return json.dumps(obj, sort_keys=True).encode()

    def decode(self, data: bytes):
        return json.loads(data)


def channels():
    return [
        ChannelDescriptor(TXS, priority=5, send_queue_capacity=16, message_type=Tx),
        ChannelDescriptor(JSON, send_queue_capacity=16, codec=JsonCodec()),
        ChannelDescriptor(RAW, send_queue_capacity=16),
    ]


async def _nodes(n):
    """``n`` started Switches with the typed channels; the first listens. Returns (switches, reactors, port)."""
    reactors = [RecordingReactor(channels()) for _ in range(n)]
    switches, port = await listening_switches(reactors)
    return switches, reactors, port


@pytest_twisted.ensureDeferred
async def test_typed_messages_arrive_decoded():
    """Objects sent with send/try_send/send_confirmed arrive as equal objects on typed
    channels (protobuf and JSON), pre-encoded bytes decode too, and a raw channel beside
    them still delivers bytes."""
    (a, b), (ra, rb), port = await _nodes(2)
    try:
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        txs = [Tx(data=bytes([i]) * i, nonce=i, sender="b") for i in range(1, 6)]
        assert await bounded(peer.send(TXS, txs[0]))
        assert peer.try_send(TXS, txs[1]) and peer.try_send_many(TXS, txs[2:4]) == 2
        assert await bounded(peer.send_confirmed(TXS, txs[4].SerializeToString()))  # already encoded
        assert peer.try_send(JSON, {"height": 7, "round": [0, 1]})
        assert peer.try_send(RAW, b"\x08\xff\xff")  # not protobuf, but this channel is raw
        await until(lambda: len(ra.received()) == 7, "seven messages at a")
        assert ra.received(TXS) == txs
        assert all(type(m) is Tx for m in ra.received(TXS))
        assert ra.received(JSON) == [{"height": 7, "round": [0, 1]}]
        assert ra.received(RAW) == [b"\x08\xff\xff"]
    finally:
        await stop_switches(a, b)


@pytest_twisted.ensureDeferred
async def test_wrong_object_type_is_refused_at_send():
    """Sending an object that is not the channel's message type raises TypeError naming both; nothing is sent."""
    (a, b), (ra, rb), port = await _nodes(2)
    try:
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        with pytest.raises(TypeError, match="channel 0x40 carries Tx messages, got dict"):
            peer.try_send(TXS, {"nonce": 1})
        with pytest.raises(TypeError, match="messages are bytes, got dict"):
            peer.try_send(RAW, {"nonce": 1})
        assert peer.try_send(TXS, Tx(nonce=9))
        await until(lambda: ra.received(), "the good message")
        assert ra.received() == [Tx(nonce=9)]
    finally:
        await stop_switches(a, b)


@pytest_twisted.ensureDeferred
async def test_garbage_on_a_typed_channel_drops_the_sender_only(telemetry):
    """A message that does not decode never reaches the reactor: its sender is dropped
    with DecodeError (close code DecodeError on its side), and another peer of the same
    node keeps exchanging typed messages."""
    (a, bad, good), (ra, rbad, rgood), port = await _nodes(3)
    try:
        bad_peer = await bounded(bad.dial(f"{a.node_id}@127.0.0.1:{port}"))
        good_peer = await bounded(good.dial(f"{a.node_id}@127.0.0.1:{port}"))
        assert bad_peer.try_send(TXS, Tx(nonce=1))
        await until(lambda: len(ra.received()) == 1, "the bad node's good message")
        assert bad_peer.try_send(TXS, NOT_PROTOBUF)  # bytes are taken as already encoded
        await until(lambda: len(ra.removed()) == 1, "a drops the bad node")
        [(dropped, reason)] = ra.removed()
        assert dropped.node_id == bad.node_id
        assert isinstance(reason, DecodeError) and reason.channel_id == TXS
        assert "3 bytes on channel 0x40" in str(reason) and "mconn.test.Tx" in str(reason)
        await until(lambda: rbad.removed(), "the bad node's remove_peer")
        [(_, their_reason)] = rbad.removed()
        assert isinstance(their_reason, PeerClosed) and their_reason.code == "DecodeError"
        [event] = [e for e in telemetry.named("protocol_error") if e["node_id"] == a.node_id]
        assert event["error_type"] == "DecodeError" and event["peer_id"] == bad.node_id
        assert ra.received() == [Tx(nonce=1)]  # the garbage never reached receive
        assert good_peer.try_send(TXS, Tx(nonce=2, sender="good"))
        await until(lambda: len(ra.received()) == 2, "the good node's message")
        assert ra.received()[-1] == Tx(nonce=2, sender="good")
        assert list(a.peers) == [good.node_id]
    finally:
        await stop_switches(a, bad, good)
