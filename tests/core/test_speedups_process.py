"""The compiled twin of the msg fast path does what ``connection.process_msgs`` does, exactly.

``mconn.core.connection.process_msgs`` is the reference; ``mconn.core._speedups.process_msgs``
must return the same index, append the same events (the same type, channel and message
bytes, bytes or not), leave the channels in the same state (partial messages, sizes and
counters) and raise the same errors (type and message), on valid and malformed packet
lists: unknown channels, messages over a channel's capacity, runs, partial messages, and
packets of other types where the fast path stops. Both are called directly, so these run
whatever MCONN_PURE says; they are skipped only when the extension is not built.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mconn.core import connection, frame_buffer, speedups
from mconn.core.channel import Channel, ChannelDescriptor
from mconn.core.events import ConnectionFailed, MessageReceived
from mconn.core.frame_buffer import MSG, PING, PONG, RUN
from mconn.core.wire import PacketType
from tests.core.test_codec_equivalence import run_streams
from tests.helpers_core import open_connection

try:
    compiled = importlib.import_module("mconn.core._speedups")
except ImportError as e:  # pragma: no cover - the build skipped it
    pytest.skip(f"the compiled twin mconn.core._speedups is not built ({e}); `make` builds it", allow_module_level=True)

TWIN = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: The channels both sides have; 0x12 is one they do not.
CHANNEL_IDS = (0x10, 0x11)


def _payload(draw, *, whole: bool):
    """Bytes, or a view of a larger read (as the decoder gives not-last payloads)."""
    body = draw(st.binary(max_size=24) | st.binary(min_size=4096, max_size=4200))
    if whole or draw(st.booleans()):
        return body
    pad = draw(st.integers(0, 8))
    return memoryview(b"\0" * pad + body + b"\1" * pad)[pad : pad + len(body)]


@st.composite
def packet_lists(draw):
    """What the frame buffer hands a connection: msg, run and other packets."""
    packets = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["msg", "msg", "msg", "run", "other"]))
        channel_id = draw(
            st.sampled_from([*CHANNEL_IDS, 0x12]) if draw(st.integers(0, 9)) == 0 else st.sampled_from(CHANNEL_IDS)
        )
        if kind == "msg":
            eof = draw(st.sampled_from([0, 1]))
            packets.append((MSG, channel_id, eof, _payload(draw, whole=bool(eof))))
        elif kind == "run":
            packets.append((RUN, channel_id, [_payload(draw, whole=False) for _ in range(draw(st.integers(0, 3)))]))
        else:
            packets.append(draw(st.sampled_from([(PING,), (PONG,), (PacketType.ACK, b"\x01"), (0x90, b"")])))
    return packets


def _channels(capacities, partial):
    """Fresh channels; those in ``partial`` hold the start of a message already (when
    it fits their capacity)."""
    channels = {
        cid: Channel(ChannelDescriptor(cid, recv_message_capacity=cap))
        for cid, cap in zip(CHANNEL_IDS, capacities, strict=True)
    }
    for cid, piece in partial.items():
        if len(piece) <= channels[cid].recv_capacity:
            channels[cid].reassemble(0, piece)
    return channels


def _bytes_of(value):
    return (type(value).__name__, bytes(value))


def _state(channels):
    return {
        cid: (
            None if c.receiving is None else [_bytes_of(p) for p in c.receiving],
            c.receiving_size,
            c.stats.bytes_received,
            c.stats.messages_received,
        )
        for cid, c in channels.items()
    }


def _run(process, packets, start, capacities, partial):
    channels = _channels(capacities, partial)
    events: list[object] = []
    try:
        result = ("index", process(packets, start, channels, events.append))
    except Exception as e:
        result = ("error", type(e).__name__, str(e))
    said = [(type(e).__name__, e.channel_id, _bytes_of(e.message)) for e in events]
    return result, said, _state(channels)


@TWIN
@given(
    packet_lists(),
    st.data(),
    st.tuples(*[st.sampled_from([0, 5, 24, 4100, 1 << 30]) for _ in CHANNEL_IDS]),
    st.dictionaries(st.sampled_from(CHANNEL_IDS), st.binary(max_size=6)),
)
def test_process_msgs_twin_on_valid_and_malformed_packets(packets, data, capacities, partial):
    """The same index, events, channel state and error, packet list for packet list."""
    start = data.draw(st.integers(0, len(packets)))
    pure = _run(connection.process_msgs, packets, start, capacities, partial)
    twin = _run(compiled.process_msgs, packets, start, capacities, partial)
    assert twin == pure


def test_the_twin_makes_the_same_message_events():
    """The twin builds MessageReceived without its __init__: it must stay a plain slotted
    dataclass of exactly these two fields, and the events equal the reference's."""
    assert [f.name for f in dataclasses.fields(MessageReceived)] == ["channel_id", "message"]
    assert not hasattr(MessageReceived, "__post_init__")
    packets = [(MSG, 0x10, 1, b"one"), (MSG, 0x11, 0, b"tw"), (MSG, 0x11, 1, b"o"), (PING,)]
    for process in (connection.process_msgs, compiled.process_msgs):
        events: list[object] = []
        assert process(packets, 0, _channels((100, 100), {}), events.append) == 3
        assert events == [
            MessageReceived(channel_id=0x10, message=b"one"),
            MessageReceived(channel_id=0x11, message=b"two"),
        ]
        assert all(type(e) is MessageReceived and type(e.message) is bytes for e in events)


def test_the_twin_refuses_what_is_not_a_packet_list():
    with pytest.raises(TypeError):
        compiled.process_msgs((), 0, {}, [].append)


def test_the_twin_is_what_the_connection_uses_unless_mconn_pure():
    """With the extension built and MCONN_PURE unset, Connection runs its msg packets
    through the twin; with MCONN_PURE=1 (the second run of tests/core), the reference."""
    if speedups.SPEEDUPS is None:
        assert connection._process_msgs is connection.process_msgs
    else:
        assert connection._process_msgs is compiled.process_msgs


def _receive(stream, cuts, capacity, decode, process):
    """A connection that decodes with ``decode`` and processes with ``process`` fed
    ``stream`` cut at ``cuts``: its events and its channels' state."""
    channels = [ChannelDescriptor(0x20, recv_message_capacity=capacity), ChannelDescriptor(0x21)]
    with (
        mock.patch.object(frame_buffer, "_decode_packets", decode),
        mock.patch.object(connection, "_process_msgs", process),
    ):
        conn = open_connection(peer_payload=65536, channels=channels)
        events = []
        points = sorted({c % (len(stream) + 1) for c in cuts})
        for a, b in itertools.pairwise([0, *points, len(stream)]):
            events += conn.receive_data(stream[a:b], 1.0)
    said = [
        ("failed", type(e.error).__name__, str(e.error))
        if type(e) is ConnectionFailed
        else (type(e).__name__, getattr(e, "channel_id", None), _bytes_of(getattr(e, "message", b"")))
        for e in events
    ]
    return said, _state(conn.channels)


@TWIN
@given(st.data(), st.lists(st.integers(0, 30000), max_size=6), st.sampled_from([30, 5000, 1 << 30]))
def test_receive_path_twin_on_runs_cut_anywhere(data, cuts, capacity):
    """Decoder and msg fast path together, pure against compiled, on runs of small and
    large packets of two channels (eof in the middle, pings between, bad bytes after a
    run) cut anywhere, under a channel capacity that runs may cross: the same events,
    errors and channel state."""
    stream = data.draw(run_streams(broken=data.draw(st.booleans())))
    pure = _receive(stream, cuts, capacity, frame_buffer.decode_packets, connection.process_msgs)
    twin = _receive(stream, cuts, capacity, compiled.decode_packets, compiled.process_msgs)
    assert twin == pure


def test_the_twin_takes_a_small_packet_alone_without_a_python_call():
    """Channels whose packets alternate one by one leave no run to join: the twin copies
    each small not-last payload onto the message's bytearray itself, with the state
    Channel.reassemble leaves (the reference, run on a twin channel), and calls no
    Python method for it."""
    packets = [(MSG, 0x10, 0, memoryview(b"xab")[1:]), (MSG, 0x11, 0, b"cd"), (MSG, 0x10, 0, b"ef"), (PING,)]
    expected = _channels((100, 100), {})
    assert connection.process_msgs(packets, 0, expected, [].append) == 3
    channels = _channels((100, 100), {})
    with mock.patch.object(Channel, "reassemble", side_effect=AssertionError("a Python call")):
        assert compiled.process_msgs(packets, 0, channels, [].append) == 3
    assert _state(channels) == _state(expected)
    assert channels[0x10].receiving == [bytearray(b"abef")] and channels[0x10].receiving_size == 4
