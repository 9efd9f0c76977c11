"""The golden vectors of specs/vectors/*.json through every codec of the core.

Each valid packet goes through the construct declaration (wire.decode_packet /
encode_packet), through the hand-written FrameBuffer (whole and one byte at a time) and
through an open Connection; each invalid one is refused by exactly the layers the vector
names (see "invalid_comment" in wire.json), with exactly the error class it names.
"""

import pytest

from mconn import errors
from mconn.core import wire
from mconn.core.channel import Channel, ChannelDescriptor
from mconn.core.events import CloseReceived, ConnectionFailed, HelloReceived, MessageReceived
from mconn.core.handshake import check_hello, make_hello
from mconn.core.node_key import node_id_from_public_key
from mconn.core.wire import PacketType
from tests.helpers_core import (
    expand,
    check_frames,
    check_invalid_frames,
    feed_bytewise,
    load_vectors,
    make_connection,
    open_connection,
    vector_frame_buffer,
    split_packets,
)

WIRE = load_vectors("wire")
HELLO = load_vectors("hello")
LIMITS = WIRE["limits"]
VALID = {v["name"]: v for v in WIRE["valid"]}
OPEN_CHANNELS = [ChannelDescriptor(0x20), ChannelDescriptor(0x30)]


def _ids(vectors):
    return [v["name"] for v in vectors]


def _expected(decoded: dict):
    """A vector's "decoded" in the form wire.decode_packet returns."""
    kind = decoded["type"]
    if kind == "ping":
        return PacketType.PING, None
    if kind == "pong":
        return PacketType.PONG, None
    if kind == "msg":
        return PacketType.MSG, (decoded["channel_id"], decoded["eof"], expand(decoded["data"]))
    return decoded["packet_type"], expand(decoded["body"])


def test_vector_files_are_well_formed():
    """wire.json and hello.json are consistent: unique names, coherent rejected_by layers and fails_at."""
    for vectors in (WIRE["valid"], WIRE["invalid"], HELLO["valid"], HELLO["invalid"]):
        names = _ids(vectors)
        assert len(names) == len(set(names)), "vector names must be unique"
    for v in WIRE["invalid"]:
        assert set(v["rejected_by"]) <= {"decode_packet", "stream", "connection"}, v["name"]
        assert ("fails_at" in v) == ("stream" in v["rejected_by"]), v["name"]
        assert "stream" not in v["rejected_by"] or "connection" in v["rejected_by"], v["name"]


# -- valid packets ---------------------------------------------------------------------


@pytest.mark.parametrize("vector", WIRE["valid"], ids=_ids(WIRE["valid"]))
def test_valid_vector_decodes_with_the_declaration(vector):
    """Each valid wire vector decodes with the declaration to the values the file gives."""
    assert wire.decode_packet(expand(vector["hex"])) == _expected(vector["decoded"])


@pytest.mark.parametrize("vector", WIRE["valid"], ids=_ids(WIRE["valid"]))
def test_valid_vector_encodes_to_its_canonical_bytes(vector):
    """Encoding a valid vector's values gives its canonical bytes."""
    kind, payload = _expected(vector["decoded"])
    if kind == PacketType.MSG:
        channel_id, eof, data = payload
        built = wire.encode_packet(kind, channel_id=channel_id, eof=eof, data=data)
    elif kind in (PacketType.PING, PacketType.PONG):
        built = wire.encode_packet(kind)
    else:
        built = wire.encode_packet(kind, body=payload)
    assert built == expand(vector.get("canonical_hex", vector["hex"]))


@pytest.mark.parametrize("vector", WIRE["valid"], ids=_ids(WIRE["valid"]))
def test_valid_vector_through_frame_buffer(vector):
    """Each valid wire vector comes out of the FrameBuffer, fed whole or byte by byte."""
    data = expand(vector["hex"])
    expected = [_expected(vector["decoded"])]

    check_frames(LIMITS, data, expected)


def test_valid_vectors_concatenated_through_frame_buffer():
    """All valid wire vectors back to back come out of the FrameBuffer one by one."""
    data = b"".join(expand(v["hex"]) for v in WIRE["valid"])
    expected = [_expected(v["decoded"]) for v in WIRE["valid"]]
    check_frames(LIMITS, data, expected)


def test_close_vectors_decode_to_code_and_text():
    """Close vectors decode to their code and text, and encode back to the same body."""
    closes = [v for v in WIRE["valid"] if "close" in v["decoded"]]
    assert closes
    for v in closes:
        body = expand(v["decoded"]["body"])
        expected = (v["decoded"]["close"]["code"], v["decoded"]["close"]["text"])
        assert wire.decode_close(body) == expected
        assert wire.encode_close(*expected) == body


@pytest.mark.parametrize("vector", WIRE["valid"], ids=_ids(WIRE["valid"]))
def test_valid_vector_through_an_open_connection(vector):
    """An open Connection gives each valid vector's event (or none) without error; a ping gets a pong."""
    conn = open_connection(channels=OPEN_CHANNELS)
    events = conn.receive_data(expand(vector["hex"]), 1.0)
    decoded = vector["decoded"]
    if decoded["type"] == "msg" and decoded["eof"]:
        expected = [MessageReceived(channel_id=decoded["channel_id"], message=expand(decoded["data"]))]
    elif "close" in decoded:
        expected = [CloseReceived(**decoded["close"])]
    else:
        expected = []  # ping, pong nobody asked for, a first chunk, an optional extension
    assert events == expected
    assert conn.error is None
    assert conn.data_to_send(1.0) == (b"\x02" if decoded["type"] == "ping" else b"")


# -- chunking --------------------------------------------------------------------------


@pytest.mark.parametrize("case", WIRE["messages"], ids=_ids(WIRE["messages"]))
def test_message_is_chunked_into_the_vector_packets(case):
    """A message is cut into exactly the packets the vector file lists for its payload size."""
    message = expand(case["message"])
    expected = [expand(VALID[name]["hex"]) for name in case["packets"]]
    channel = Channel(ChannelDescriptor(case["channel_id"]))
    assert channel.enqueue(message)
    parts: list = []
    channel.emit(parts, case["max_packet_payload"], budget=1 << 30)
    assert split_packets(b"".join(parts)) == expected


@pytest.mark.parametrize("case", WIRE["messages"], ids=_ids(WIRE["messages"]))
def test_chunked_vector_packets_reassemble_in_a_connection(case):
    """A Connection reassembles a message's vector packets and delivers it once, on the last one."""
    conn = open_connection(channels=[ChannelDescriptor(case["channel_id"])])
    first, *rest = [expand(VALID[name]["hex"]) for name in case["packets"]]
    assert conn.receive_data(first, 1.0) == []
    events = conn.receive_data(b"".join(rest), 1.0)
    assert events == [MessageReceived(channel_id=case["channel_id"], message=expand(case["message"]))]


# -- invalid packets -------------------------------------------------------------------


@pytest.mark.parametrize("vector", WIRE["invalid"], ids=_ids(WIRE["invalid"]))
def test_invalid_vector_with_decode_packet(vector):
    """decode_packet refuses exactly the invalid wire vectors naming it."""
    data = expand(vector["hex"])
    if "decode_packet" in vector["rejected_by"]:
        # The reference decoder reports every failure as MalformedPacket.
        with pytest.raises(errors.MalformedPacket):
            wire.decode_packet(data)
    else:
        wire.decode_packet(data)


@pytest.mark.parametrize("vector", WIRE["invalid"], ids=_ids(WIRE["invalid"]))
def test_invalid_vector_with_frame_buffer(vector):
    """The FrameBuffer refuses just the vectors naming stream, with the named error at the named byte."""
    check_invalid_frames(LIMITS, vector, getattr(errors, vector["error"]))


@pytest.mark.parametrize("vector", WIRE["invalid"], ids=_ids(WIRE["invalid"]))
def test_invalid_vector_with_a_connection(vector):
    """A Connection fails with the named error on exactly the invalid vectors naming it."""
    data = expand(vector["hex"])
    if data[0] == PacketType.HELLO:
        conn = make_connection(channels=OPEN_CHANNELS)
    else:
        conn = open_connection(channels=OPEN_CHANNELS)
    events = conn.receive_data(data, 1.0)
    if "connection" in vector["rejected_by"]:
        assert [type(e) for e in events] == [ConnectionFailed]
        assert type(events[0].error) is getattr(errors, vector["error"])
        assert conn.error is events[0].error
    else:
        assert not any(isinstance(e, ConnectionFailed) for e in events)


# -- hellos ----------------------------------------------------------------------------


def _hello_from(decoded: dict) -> wire.Hello:
    return wire.Hello(
        version=decoded["version"],
        node_id=decoded["node_id"],
        max_packet_payload=decoded["max_packet_payload"],
        channels=tuple(wire.ChannelInfo(**c) for c in decoded["channels"]),
        listen_address=decoded["listen_address"],
        fields=tuple((tag, expand(value)) for tag, value in decoded["fields"]),
    )


@pytest.mark.parametrize("vector", HELLO["valid"], ids=_ids(HELLO["valid"]))
def test_hello_vector_decodes_and_encodes(vector):
    """Each valid hello body decodes to its values and encodes back to the same bytes."""
    body = expand(vector["hex"])
    expected = _hello_from(vector["decoded"])
    assert wire.decode_hello(body) == expected
    assert wire.encode_hello(expected) == body


@pytest.mark.parametrize("vector", HELLO["valid"], ids=_ids(HELLO["valid"]))
def test_hello_vector_node_id_is_derived_from_its_public_key(vector):
    """Each hello vector's node id is the one derived from its public key."""
    assert node_id_from_public_key(bytes.fromhex(vector["public_key"])) == vector["decoded"]["node_id"]


@pytest.mark.parametrize("vector", [v for v in HELLO["valid"] if "packet_hex" in v])
def test_hello_packet_vector_opens_a_connection(vector):
    """A hello packet vector decodes, passes the FrameBuffer byte by byte, and opens a Connection."""
    packet = expand(vector["packet_hex"])
    assert wire.decode_packet(packet) == (PacketType.HELLO, expand(vector["hex"]))
    assert feed_bytewise(vector_frame_buffer(LIMITS), packet) == (
        [(PacketType.HELLO, expand(vector["hex"]))],
        None,
        None,
    )
    conn = make_connection()
    expected = _hello_from(vector["decoded"])
    assert conn.receive_data(packet, 0.5) == [HelloReceived(hello=expected, max_packet_payload=1024)]


@pytest.mark.parametrize("vector", HELLO["invalid"], ids=_ids(HELLO["invalid"]))
def test_invalid_hello_vector(vector):
    """Each invalid hello body is MalformedPacket from decode_hello."""
    assert vector["error"] == "MalformedPacket"
    with pytest.raises(errors.MalformedPacket, match="hello|varint"):
        wire.decode_hello(expand(vector["hex"]))


@pytest.mark.parametrize("vector", HELLO["invalid"], ids=_ids(HELLO["invalid"]))
def test_invalid_hello_vector_fails_a_connection(vector):
    """An invalid hello body inside a hello packet fails the connection with MalformedPacket."""
    conn = make_connection()
    body = expand(vector["hex"])
    events = conn.receive_data(wire.encode_extension(PacketType.HELLO, body), 0.5)
    assert [type(e) for e in events] == [ConnectionFailed]
    assert type(events[0].error) is errors.MalformedPacket


@pytest.mark.parametrize("vector", HELLO["incompatible"], ids=_ids(HELLO["incompatible"]))
def test_incompatible_hello_vector(vector):
    """A well-formed but incompatible hello is refused by check_hello with the named error."""
    theirs = wire.decode_hello(expand(vector["hex"]))
    ours = make_hello(node_id="cc" * 20, channels=[], max_packet_payload=1024)
    with pytest.raises(getattr(errors, vector["error"])):
        check_hello(ours, theirs)
