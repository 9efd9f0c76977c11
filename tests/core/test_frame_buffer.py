"""FrameBuffer: bytes in, whole packets out; bad bytes refused at the earliest byte.

specs/wire.md sections 2 and 5: every header byte is judged as it arrives, and every
length against its limit before a byte of the body is kept.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mconn.errors import MalformedPacket, PacketTooLarge, UnknownPacketType
from mconn.core.frame_buffer import FrameBuffer
from mconn.core.wire import PacketType
from tests.helpers_core import feed_bytewise, feed_whole, frame_buffer, msg


def _hex(text: str) -> bytes:
    return bytes.fromhex(text)


def test_packets_come_out_on_their_last_byte_when_fed_one_byte_at_a_time():
    """Fed byte by byte, each packet comes out exactly on its last byte, and nothing stays buffered."""
    stream = _hex("01") + msg(0x20, b"hello") + _hex("02") + _hex("80 01 03 010203") + msg(0x21, b"")
    buffer = frame_buffer()
    emitted_at = []
    for i in range(len(stream)):
        packets, error = feed_whole(buffer, stream[i : i + 1])
        assert error is None
        emitted_at += [(i, p) for p in packets]
    assert emitted_at == [
        (0, (PacketType.PING, None)),
        (10, (PacketType.MSG, (0x20, True, b"hello"))),
        (11, (PacketType.PONG, None)),
        (17, (0x80, b"\x01\x02\x03")),
        (21, (PacketType.MSG, (0x21, True, b""))),
    ]
    assert buffer.buffered == 0


def test_incomplete_packet_is_kept_not_refused():
    """An incomplete packet is kept and completed by the next feed, not refused."""
    buffer = frame_buffer()
    assert buffer.feed(_hex("03 20 01 01 05 6865")) == ([], None)
    assert buffer.buffered == 7
    packets, error = buffer.feed(_hex("6c6c6f 01"))
    assert error is None
    assert [(p[0], p[1], p[2], bytes(p[3])) for p in packets[:1]] == [(PacketType.MSG, 0x20, 1, b"hello")]
    assert packets[1:] == [(PacketType.PING,)]
    assert buffer.buffered == 0


BAD_INPUTS = [
    # (name, bytes, error class, index of the byte that fails, words the message must name)
    ("type 00", "00", UnknownPacketType, 0, ["0x00"]),
    ("type 00 after a ping", "01 00", UnknownPacketType, 1, ["0x00"]),
    ("eof 02", "03 20 02 01 05", MalformedPacket, 2, ["eof", "0x02", "0x20"]),
    ("eof ff", "03 07 ff", MalformedPacket, 2, ["eof", "0xff", "0x07"]),
    ("size byte 09", "03 20 01 09 00", MalformedPacket, 3, ["0x09", "8"]),
    ("size byte f1 (negative in go-wire)", "03 20 01 f1 01", MalformedPacket, 3, ["0xf1"]),
    ("length 1025", "03 20 01 02 04 01", PacketTooLarge, 5, ["1025", "1024", "0x20"]),
    ("length 65536, refused at its first byte", "03 20 01 03 01 00 00", PacketTooLarge, 4, ["65536", "1024"]),
    ("length 2**64-1", "03 20 01 08 ff ff ff ff ff ff ff ff", PacketTooLarge, 4, ["1024"]),
    (
        "non-minimal length 1025, refused at its last byte",
        "03 20 01 08 00 00 00 00 00 00 04 01",
        PacketTooLarge,
        11,
        ["1025"],
    ),
    ("hello body 4097", "04 02 10 01", PacketTooLarge, 3, ["0x04", "4097", "4096"]),
    ("hello body 65536", "04 03 01 00 00", PacketTooLarge, 2, ["0x04", "4096"]),
    ("close body 1025", "05 02 04 01", PacketTooLarge, 3, ["0x05", "1025", "1024"]),
    ("optional extension body 1025", "80 02 04 01", PacketTooLarge, 3, ["0x80", "1025", "1024"]),
    ("extension size byte 09", "7f 09", MalformedPacket, 1, ["0x09"]),
]


@pytest.mark.parametrize("name, data, error_class, fails_at, words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_fails_at_its_earliest_byte(name, data, error_class, fails_at, words):
    """Each bad input fails on the first byte that makes it bad, with the same error fed whole or bytewise."""
    data = _hex(data)
    buffer = frame_buffer()
    packets, error, index = feed_bytewise(buffer, data)
    assert type(error) is error_class
    assert index == fails_at
    for word in words:
        assert word in str(error), (word, str(error))
    assert buffer.buffered == 0

    # Fed whole, the same error; fed only up to the failing byte, already the error.
    assert type(feed_whole(frame_buffer(), data)[1]) is error_class
    assert type(feed_whole(frame_buffer(), data[: fails_at + 1])[1]) is error_class
    # One byte less is only "need more" (unless nothing but the failing byte came before).
    assert feed_whole(frame_buffer(), data[:fails_at])[1] is None


def test_packets_before_the_bad_bytes_are_returned_with_the_error():
    """Packets complete before the bad bytes are returned together with the error."""
    packets, error = frame_buffer().feed(_hex("01") + msg(0x20, b"ok") + _hex("02 00 01"))
    assert [p[0] for p in packets] == [PacketType.PING, PacketType.MSG, PacketType.PONG]
    assert bytes(packets[1][3]) == b"ok"
    assert isinstance(error, UnknownPacketType)


def test_oversized_msg_is_refused_before_its_body_arrives():
    """A msg length over max_payload is PacketTooLarge from the header alone; no body is kept."""
    buffer = frame_buffer(max_payload=100)
    header = _hex("03 20 00 01 65")  # 101 bytes declared
    packets, error = buffer.feed(header)
    assert packets == []
    assert isinstance(error, PacketTooLarge)
    assert "101" in str(error) and "100" in str(error)
    assert buffer.buffered == 0


def test_exactly_the_limit_is_accepted():
    """A msg of exactly max_payload and an extension of exactly its limit are accepted."""
    buffer = frame_buffer(max_payload=100, max_control_size=64)
    data = msg(0x20, b"x" * 100) + _hex("80 01 40") + b"y" * 64
    packets, error = feed_whole(buffer, data)
    assert error is None
    assert packets == [(PacketType.MSG, (0x20, True, b"x" * 100)), (0x80, b"y" * 64)]


def test_extension_limits_are_per_type():
    """An extension type with its own limit uses it; other types use the default limit."""
    buffer = FrameBuffer(max_payload=1024, default_extension_limit=10, extension_limits={0x81: 20})
    assert feed_whole(buffer, _hex("81 01 14") + bytes(20))[1] is None
    assert isinstance(feed_whole(buffer, _hex("80 01 14"))[1], PacketTooLarge)


def test_decoding_pauses_after_an_extension_so_limits_can_change():
    """A Connection lowers max_payload after the hello; the next packet must see it."""
    buffer = frame_buffer(max_payload=1024)
    hello = _hex("04 01 02 abcd")
    packet = msg(0x20, b"z" * 600)
    packets, error = buffer.feed(hello + packet)
    assert (packets, error, buffer.paused) == ([(PacketType.HELLO, b"\xab\xcd")], None, True)
    assert buffer.buffered == len(packet)
    buffer.max_payload = 512
    packets, error = buffer.feed(b"")
    assert packets == []
    assert isinstance(error, PacketTooLarge) and "600" in str(error) and "512" in str(error)


def test_without_pausing_extensions_do_not_stop_decoding():
    """With stop_after_extension=False, packets after an extension come out in the same feed."""
    packets, error = frame_buffer().feed(_hex("80 00 01 02"), stop_after_extension=False)
    assert ([p[0] for p in packets], error) == ([0x80, PacketType.PING, PacketType.PONG], None)


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=6),
    cuts=st.lists(st.integers(0, 2000), max_size=10),
)
def test_buffer_holds_at_most_one_incomplete_packet(payloads, cuts):
    """However the stream is cut, only the bytes of the one incomplete packet are kept."""
    packets = [msg(0x20, p) for p in payloads]
    stream = b"".join(packets)
    ends = [sum(len(p) for p in packets[: i + 1]) for i in range(len(packets))]
    buffer = frame_buffer(max_payload=300)
    fed = 0
    for cut in sorted({c % (len(stream) + 1) for c in cuts}) + [len(stream)]:
        assert feed_whole(buffer, stream[fed:cut])[1] is None
        fed = cut
        start_of_incomplete = max([e for e in ends if e <= fed], default=0)
        # Exactly the bytes of the packet still incomplete are kept, nothing more.
        assert buffer.buffered == fed - start_of_incomplete
        assert buffer.buffered <= 4 + 2 + 300
    assert buffer.buffered == 0


def _shaped(packets: list) -> list:
    """Payloads as (type name, bytes), to tell views from copies."""
    from mconn.core.frame_buffer import RUN

    def shape(p):
        if p[0] == RUN:
            return (p[0], p[1], [(type(d).__name__, bytes(d)) for d in p[2]])
        if p[0] == PacketType.MSG:
            return (*p[:3], (type(p[3]).__name__, bytes(p[3])))
        return p

    return [shape(p) for p in packets]


def test_not_last_packets_of_one_channel_come_out_as_one_run():
    """Consecutive not-last packets of a channel are one RUN, full or not; small
    payloads (under KEEP_VIEW_MIN) are copied together into one bytes object. A small
    one alone is the msg packet it is, its payload a view (no copy of it alone)."""
    from mconn.core.frame_buffer import RUN

    buffer = frame_buffer(max_payload=4)
    stream = (
        msg(0x20, b"aaaa", eof=False)
        + msg(0x20, b"bb", eof=False)  # not full: the same run
        + msg(0x20, b"", eof=False)
        + msg(0x20, b"cccc", eof=False)
        + msg(0x21, b"dddd", eof=False)  # another channel: a new run
        + msg(0x20, b"eeee", eof=False)
        + msg(0x20, b"ff")  # the last packet of a message is never part of a run
        + _hex("01")
        + msg(0x20, b"g", eof=False)
    )
    packets, error = buffer.feed(stream)
    assert error is None
    assert _shaped(packets) == [
        (RUN, 0x20, [("bytes", b"aaaabbcccc")]),
        (PacketType.MSG, 0x21, 0, ("memoryview", b"dddd")),
        (PacketType.MSG, 0x20, 0, ("memoryview", b"eeee")),
        (PacketType.MSG, 0x20, 1, ("bytes", b"ff")),
        (PacketType.PING,),
        (PacketType.MSG, 0x20, 0, ("memoryview", b"g")),
    ]


def test_a_run_keeps_large_payloads_as_views_between_its_copied_small_ones():
    """Payloads of KEEP_VIEW_MIN bytes or more stay views of the read (the bulk path:
    no copy before the reassembly's join); the small ones around them are joined."""
    from mconn.core.channel import KEEP_VIEW_MIN
    from mconn.core.frame_buffer import RUN

    big = bytes(range(256)) * (KEEP_VIEW_MIN // 256)
    full = bytes(8192)
    buffer = frame_buffer(max_payload=8192)
    stream = (
        msg(0x20, b"a", eof=False)
        + msg(0x20, b"bc", eof=False)
        + msg(0x20, big, eof=False)
        + msg(0x20, full, eof=False)
        + msg(0x20, big[:-1], eof=False)  # one byte short: copied
        + msg(0x20, b"d", eof=False)
        + msg(0x20, b"end")
    )
    packets, error = buffer.feed(stream)
    assert error is None
    assert _shaped(packets) == [
        (RUN, 0x20, [("bytes", b"abc"), ("memoryview", big), ("memoryview", full), ("bytes", big[:-1] + b"d")]),
        (PacketType.MSG, 0x20, 1, ("bytes", b"end")),
    ]
    views = [d for d in packets[0][2] if type(d) is memoryview]
    assert all(v.obj is stream for v in views)


@pytest.mark.parametrize(
    ("bad", "error_class", "words"),
    [
        ("03 20 02 01 01 00", MalformedPacket, ["eof byte 0x02"]),
        ("03 20 00 09 00", MalformedPacket, ["size byte 0x09"]),
        ("03 20 00 02 04 01", PacketTooLarge, ["declares 1025 payload bytes"]),
        ("00", UnknownPacketType, ["0x00", "+16"]),
    ],
)
def test_a_run_ends_at_a_bad_packet_with_the_packets_before_it_delivered(bad, error_class, words):
    """The decoder stops at the first bad packet, as without runs: the run before it
    comes out whole, and the error is the one that packet alone gives."""
    from mconn.core.frame_buffer import RUN

    stream = msg(0x20, b"abc", eof=False) + msg(0x20, b"de", eof=False) + _hex("01") + _hex(bad)
    packets, error = frame_buffer().feed(stream)
    assert _shaped(packets) == [(RUN, 0x20, [("bytes", b"abcde")]), (PacketType.PING,)]
    assert type(error) is error_class and all(w in str(error) for w in words), error
    # The same bytes before the bad packet as whole messages (no run): the same error.
    plain = msg(0x20, b"abc") + msg(0x20, b"de") + _hex("01") + _hex(bad)
    plain_packets, plain_error = frame_buffer().feed(plain)
    assert len(plain_packets) == 3
    assert (type(plain_error), str(plain_error)) == (type(error), str(error))
