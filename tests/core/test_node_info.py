"""Node info (specs/handshake.md section 6): the hello field, its golden vectors, its
limits, and the compatibility rule, all without Twisted.

The vectors are specs/vectors/node_info.json; old hellos (without the field) are
specs/vectors/hello.json's.
"""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mconn import errors
from mconn.core import wire
from mconn.core.channel import ChannelDescriptor
from mconn.config import Config
from mconn.core.connection import Connection
from mconn.core.events import ConnectionFailed, HelloReceived
from mconn.core.handshake import check_hello, make_hello
from mconn.core.node_info import (
    MAX_NODE_INFO_BYTES,
    REFUSALS,
    NodeInfo,
    ProtocolVersion,
    check_compatible,
    node_info_field,
    node_info_of,
)
from mconn.core.wire import HelloTag, PacketType
from tests.helpers_core import NODE_A, NODE_B, expand, load_vectors, make_connection

VECTORS = load_vectors("node_info")
OLD_HELLOS = load_vectors("hello")["valid"]


def _ids(vectors):
    return [v["name"] for v in vectors]


def _info(decoded: dict | None) -> NodeInfo | None:
    """A vector's node info (full form, or the rule cases' short form)."""
    if decoded is None:
        return None
    protocol = decoded.get("protocol") or {k: decoded[k] for k in ("p2p", "block", "app") if k in decoded}
    return NodeInfo(
        network=decoded["network"],
        protocol=ProtocolVersion(**protocol),
        version=decoded.get("version", ""),
        moniker=decoded.get("moniker", ""),
        other=decoded.get("other", {}),
    )


# -- golden vectors ----------------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS["valid"], ids=_ids(VECTORS["valid"]))
def test_valid_vector_decodes_and_encodes(vector):
    """Each valid field decodes to the vector's node info, which encodes back to the same bytes."""
    expected = _info(vector["decoded"])
    assert NodeInfo.decode(expand(vector["field_hex"])) == expected
    assert expected.encode() == expand(vector["field_hex"])


@pytest.mark.parametrize("vector", VECTORS["valid"], ids=_ids(VECTORS["valid"]))
def test_valid_vector_inside_its_hello(vector):
    """The vector's hello body parses, keeps the field among its fields, and carries that node info."""
    hello = wire.decode_hello(expand(vector["hello_hex"]))
    assert (HelloTag.NODE_INFO, expand(vector["field_hex"])) in hello.fields
    assert node_info_of(hello) == _info(vector["decoded"])
    assert wire.encode_hello(hello) == expand(vector["hello_hex"])


def test_make_hello_appends_the_field_after_the_others():
    """make_hello with node_info gives the first vector's hello body byte for byte."""
    vector = VECTORS["valid"][0]
    hello = make_hello(
        node_id="21fe31dfa154a261626bf854046fd2271b7bed4b",
        channels=[
            ChannelDescriptor(0x20, priority=5, recv_message_capacity=22020096),
            ChannelDescriptor(0x30, priority=1, recv_message_capacity=1048576),
        ],
        max_packet_payload=1024,
        listen_address="127.0.0.1:26656",
        node_info=_info(vector["decoded"]),
    )
    assert wire.encode_hello(hello) == expand(vector["hello_hex"])


@pytest.mark.parametrize("vector", OLD_HELLOS, ids=_ids(OLD_HELLOS))
def test_an_old_hello_has_no_node_info(vector):
    """A hello without the field (hello.json, written before it existed) parses, and its node info is None."""
    hello = wire.decode_hello(expand(vector["hex"]))
    assert node_info_of(hello) is None


@pytest.mark.parametrize("vector", VECTORS["invalid"], ids=_ids(VECTORS["invalid"]))
def test_invalid_field_is_malformed(vector):
    """Each invalid field value is MalformedPacket, with a message naming the node info or the varint."""
    assert vector["error"] == "MalformedPacket"
    with pytest.raises(errors.MalformedPacket, match="node info|varint"):
        NodeInfo.decode(expand(vector["field_hex"]))


INVALID = VECTORS["invalid"] + VECTORS["invalid_hello"]


@pytest.mark.parametrize("vector", INVALID, ids=_ids(INVALID))
def test_invalid_node_info_fails_the_connection(vector):
    """A hello whose node info is invalid (or given twice) fails the connection with MalformedPacket.

    The hello itself is well-formed: an older node would accept it and ignore the field.
    """
    if "hello_hex" in vector:
        body = expand(vector["hello_hex"])
    else:
        hello = make_hello(node_id=NODE_B, channels=[ChannelDescriptor(0x20)], max_packet_payload=1024)
        hello = dataclasses.replace(hello, fields=((HelloTag.NODE_INFO, expand(vector["field_hex"])),))
        body = wire.encode_hello(hello)
    wire.decode_hello(body)  # well-formed as a hello
    events = make_connection().receive_data(wire.encode_extension(PacketType.HELLO, body), 0.5)
    assert [type(e) for e in events] == [ConnectionFailed]
    assert type(events[0].error) is errors.MalformedPacket
    assert "node info" in str(events[0].error) or "varint" in str(events[0].error)


def test_hello_with_node_info_opens_a_connection_byte_by_byte():
    """The first vector's hello packet, fed one byte at a time, opens a Connection whose peer hello carries it."""
    vector = VECTORS["valid"][0]
    packet = expand(vector["packet_hex"])
    conn = make_connection()
    events = []
    for i in range(len(packet)):
        events += conn.receive_data(packet[i : i + 1], 0.5)
    assert [type(e) for e in events] == [HelloReceived]
    assert node_info_of(events[0].hello) == _info(vector["decoded"])


def test_node_info_rides_within_max_hello_size_checked_before_buffering():
    """A hello packet announcing more than max_hello_size is PacketTooLarge before its body is read."""
    info = NodeInfo(network="n", other={f"k{i}": "v" * 200 for i in range(4)})
    hello = make_hello(node_id=NODE_B, channels=[ChannelDescriptor(0x20)], max_packet_payload=1024, node_info=info)
    packet = wire.encode_extension(PacketType.HELLO, wire.encode_hello(hello))
    config = Config(max_hello_size=len(packet) - 10)
    ours = make_hello(node_id=NODE_A, channels=[], max_packet_payload=1024)
    conn = Connection(config=config, hello=ours, channels=[], now=0)
    events = conn.receive_data(packet[:4], 0.0)  # type and length only
    assert [type(e) for e in events] == [ConnectionFailed]
    assert type(events[0].error) is errors.PacketTooLarge


# -- limits of a NodeInfo ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(network=""), "network"),
        (dict(network="a b"), "network"),
        (dict(network="x" * 51), "51 bytes"),
        (dict(network="a", moniker="m" * 65), "moniker is 65 bytes"),
        (dict(network="a", moniker="bad\nname"), "moniker must be printable"),
        (dict(network="a", version="v" * 65), "version is 65 bytes"),
        (dict(network="a", other={"Key": "v"}), "other key 'Key'"),
        (dict(network="a", other={"k" * 33: "v"}), "other key"),
        (dict(network="a", other={"k": "\x1b[2J"}), r"other\['k'\] must be printable"),
        (dict(network="a", other={"k": "v" * 257}), "257 bytes"),
        (dict(network="a", other={f"k{i}": "" for i in range(17)}), "17 entries"),
        (dict(network="a", protocol=(1, 2, 3)), "ProtocolVersion"),
        (dict(network="a", other={f"k{i}": "v" * 250 for i in range(5)}), f"at most {MAX_NODE_INFO_BYTES}"),
    ],
)
def test_node_info_limits(kwargs, match):
    """Every field over its limit is a ValueError naming the field and the value."""
    with pytest.raises(ValueError, match=match):
        NodeInfo(**kwargs)


@pytest.mark.parametrize("field", ["p2p", "block", "app"])
@pytest.mark.parametrize("value", [-1, 1 << 64, True, 1.5])
def test_protocol_version_limits(field, value):
    """Protocol versions are integers in 0..2**64-1 (a uvarint); anything else names the field."""
    with pytest.raises(ValueError, match=f"ProtocolVersion.{field}"):
        ProtocolVersion(**{field: value})


def test_other_is_kept_in_key_order_and_read_only():
    """``other`` encodes in key order whatever order it was given in, and cannot be changed."""
    a = NodeInfo(network="a", other={"b": "2", "a": "1"})
    b = NodeInfo(network="a", other={"a": "1", "b": "2"})
    assert a.encode() == b.encode() and a == b and hash(a) == hash(b)
    assert list(a.other) == ["a", "b"]
    with pytest.raises(TypeError):
        a.other["c"] = "3"


# -- the compatibility rule -----------------------------------------------------------------


@pytest.mark.parametrize("case", VECTORS["rule"], ids=_ids(VECTORS["rule"]))
def test_compatibility_rule(case):
    """Each rule case of the vectors: refused with exactly the reason named, or accepted."""
    args = (_info(case["ours"]), case["our_channels"], _info(case["theirs"]), case["their_channels"])
    if case["refused"] is None:
        check_compatible(*args, peer_id=NODE_B)
        return
    with pytest.raises(errors.IncompatibleNode) as caught:
        check_compatible(*args, peer_id=NODE_B)
    assert caught.value.reason == case["refused"]
    assert caught.value.reason in REFUSALS
    assert NODE_B in str(caught.value)


def test_refusals_name_the_values():
    """A refusal's message names both sides' values: networks, block versions, channels."""
    ours = NodeInfo(network="chain-a", protocol=ProtocolVersion(block=11))
    with pytest.raises(errors.IncompatibleNode, match="network 'chain-b'; this node is on 'chain-a'"):
        check_compatible(ours, [1], NodeInfo(network="chain-b", protocol=ProtocolVersion(block=11)), [1], peer_id="p")
    with pytest.raises(errors.IncompatibleNode, match="block protocol version 12; this node runs 11"):
        check_compatible(ours, [1], NodeInfo(network="chain-a", protocol=ProtocolVersion(block=12)), [1], peer_id="p")
    with pytest.raises(errors.IncompatibleNode, match="ours 0x20, 0x30, theirs 0x40"):
        same = NodeInfo(network="chain-a", protocol=ProtocolVersion(block=11))
        check_compatible(ours, [0x30, 0x20], same, [0x40], peer_id="p")
    with pytest.raises(errors.IncompatibleNode, match="sent no node info; this node is on network 'chain-a'"):
        check_compatible(ours, [1], None, [1], peer_id="p")


def test_incompatible_node_is_a_refusal():
    """IncompatibleNode is a PeerRejected: the Switch counts it and closes with its reason as the code."""
    assert issubclass(errors.IncompatibleNode, errors.PeerRejected)


def test_check_hello_validates_the_node_info_not_its_compatibility():
    """check_hello refuses an undecodable node info but leaves compatibility to the Switch."""
    ours = make_hello(
        node_id=NODE_A, channels=[ChannelDescriptor(1)], max_packet_payload=2048, node_info=NodeInfo(network="a")
    )
    theirs = make_hello(
        node_id=NODE_B, channels=[ChannelDescriptor(2)], max_packet_payload=1024, node_info=NodeInfo(network="b")
    )
    assert check_hello(ours, theirs) == 1024
    broken = dataclasses.replace(theirs, fields=((HelloTag.NODE_INFO, b"\x00"),))
    with pytest.raises(errors.MalformedPacket, match="node info"):
        check_hello(ours, broken)


def test_node_info_field_is_tag_02():
    """The field's tag is 02 (specs/handshake.md section 2's table)."""
    assert node_info_field(NodeInfo(network="a"))[0] == 0x02 == HelloTag.NODE_INFO


# -- hypothesis: malformed fields ----------------------------------------------------------------


@st.composite
def node_infos(draw):
    """Valid NodeInfos over the whole range of every limit."""
    return NodeInfo(
        network=draw(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=50)),
        protocol=ProtocolVersion(
            p2p=draw(st.integers(0, (1 << 64) - 1)),
            block=draw(st.integers(0, (1 << 64) - 1)),
            app=draw(st.integers(0, (1 << 64) - 1)),
        ),
        version=draw(st.text(st.characters(categories=("L", "N", "P")), max_size=20)),
        moniker=draw(st.text(st.characters(categories=("L", "N", "P"), include_characters=" "), max_size=20)),
        other=draw(
            st.dictionaries(
                st.text("abcxyz019_.-", min_size=1, max_size=12).filter(lambda k: k[0] not in "_.-"),
                st.text(st.characters(categories=("L", "N")), max_size=30),
                max_size=16,
            )
        ),
    )


@settings(max_examples=40, deadline=None)
@given(node_infos())
def test_round_trip(info):
    """Any valid NodeInfo encodes within the limit, to the size encoded_size computes, and decodes to itself."""
    value = info.encode()
    assert len(value) == info.encoded_size() <= MAX_NODE_INFO_BYTES
    assert NodeInfo.decode(value) == info


def _mutated(value: bytes, data) -> bytes:
    """``value`` with one to four bytes changed, cut or added, as hypothesis chooses."""
    value = bytearray(value)
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "add"]))
        at = data.draw(st.integers(0, len(value)))
        if action == "flip" and at < len(value):
            value[at] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del value[at:]
        else:
            value[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    return bytes(value)


@settings(max_examples=80, deadline=None)
@given(node_infos(), st.data())
def test_mutated_field_is_node_info_or_malformed(info, data):
    """A valid field with bytes changed, cut or added decodes to a valid NodeInfo or is
    MalformedPacket: never another exception."""
    value = _mutated(info.encode(), data)
    try:
        decoded = NodeInfo.decode(value)
    except errors.MalformedPacket:
        return
    assert NodeInfo.decode(decoded.encode()) == decoded


@settings(max_examples=60, deadline=None)
@given(node_infos(), st.data())
def test_connection_opens_or_fails_on_a_mutated_node_info(info, data):
    """A hello carrying a mutated node info either opens the connection with exactly that
    node info or fails it with MalformedPacket; nothing else happens."""
    value = _mutated(info.encode(), data)
    hello = make_hello(node_id=NODE_B, channels=[ChannelDescriptor(0x20)], max_packet_payload=1024)
    hello = dataclasses.replace(hello, fields=((HelloTag.NODE_INFO, value),))
    events = make_connection().receive_data(wire.encode_extension(PacketType.HELLO, wire.encode_hello(hello)), 0.5)
    assert len(events) == 1
    if type(events[0]) is HelloReceived:
        assert node_info_of(events[0].hello) == NodeInfo.decode(value)
    else:
        assert type(events[0]) is ConnectionFailed and type(events[0].error) is errors.MalformedPacket


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1100))
def test_arbitrary_bytes_are_node_info_or_malformed(value):
    """Arbitrary bytes as the field's value: a NodeInfo or MalformedPacket, never another exception."""
    try:
        NodeInfo.decode(value)
    except errors.MalformedPacket:
        pass
