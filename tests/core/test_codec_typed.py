"""Typed messages (specs/reactor-api.md section 11): ChannelDescriptor's codec, the
decoding step before ``receive``, and the encoding step of ``send``. No Twisted here; the
protobuf class is built at run time (tests/typed_messages.py)."""

import json

import pytest

from mconn import errors
from mconn.core.channel import ChannelDescriptor
from mconn.core.codec import ProtobufCodec, encode_message, typed_receiver
from tests.typed_messages import NOT_PROTOBUF, Tx


class JsonCodec:
    """A codec that is not protobuf: any object with encode/decode will do."""

    def encode(self, obj) -> bytes:
        return json.dumps(obj, sort_keys=True).encode()

    def decode(self, data: bytes):
        return json.loads(data)

    def __repr__(self) -> str:
        return "JsonCodec()"


def test_raw_is_the_default():
    """A channel declared without message_type or codec has no codec: raw bytes."""
    assert ChannelDescriptor(0x20).codec is None


def test_message_type_alone_is_protobuf():
    """A protobuf message class alone becomes a ProtobufCodec that round-trips its messages."""
    desc = ChannelDescriptor(0x20, message_type=Tx)
    assert desc.codec == ProtobufCodec(Tx)
    tx = Tx(data=b"\x00\x01", nonce=7, sender="n0")
    assert desc.codec.decode(desc.codec.encode(tx)) == tx
    assert repr(desc.codec) == "ProtobufCodec(mconn.test.Tx)"


def test_any_codec_is_kept():
    """An object with encode and decode is the channel's codec as it is."""
    codec = JsonCodec()
    assert ChannelDescriptor(0x21, codec=codec).codec is codec


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(message_type=dict), "channel 0x20: message_type .* is not a protobuf message class"),
        (dict(codec=object()), "channel 0x20: codec .* must have encode"),
        (dict(codec=JsonCodec(), message_type="Tx"), "channel 0x20: message_type must be a class"),
    ],
)
def test_bad_codec_declarations(kwargs, match):
    """A codec without encode/decode, or a message_type that is not a protobuf class, is a
    ValueError naming the channel."""
    with pytest.raises(ValueError, match=match):
        ChannelDescriptor(0x20, **kwargs)


def test_typed_receiver_decodes_before_receive():
    """The reactor's receive gets the decoded object, with the channel and peer unchanged."""
    got, failed = [], []
    receive = typed_receiver(
        lambda ch, peer, msg: got.append((ch, peer, msg)), ProtobufCodec(Tx), lambda *a: failed.append(a)
    )
    tx = Tx(data=b"x", nonce=1)
    receive(0x20, "peer", tx.SerializeToString())
    assert got == [(0x20, "peer", tx)] and failed == []


def test_undecodable_message_is_a_decode_error_and_never_reaches_receive():
    """Bytes the codec refuses: on_error gets a DecodeError naming channel, codec, size and
    cause; receive is not called."""
    got, failed = [], []
    receive = typed_receiver(
        lambda *a: got.append(a), ProtobufCodec(Tx), lambda peer, error: failed.append((peer, error))
    )
    assert receive(0x20, "peer", NOT_PROTOBUF) is None
    assert got == []
    [(peer, error)] = failed
    assert peer == "peer"
    assert isinstance(error, errors.DecodeError) and isinstance(error, errors.RemoteProtocolError)
    assert error.channel_id == 0x20
    message = str(error)
    assert "3 bytes on channel 0x20" in message and "ProtobufCodec(mconn.test.Tx)" in message
    assert "DecodeError" in message  # protobuf's own error class, as the cause


def test_receive_return_value_is_passed_back():
    """What receive returns (a Deferred, for a slow reactor) comes back through the decoding step."""
    marker = object()
    receive = typed_receiver(lambda *a: marker, JsonCodec(), lambda *a: None)
    assert receive(1, None, b"[1]") is marker


def test_encode_message_encodes_objects_and_passes_bytes():
    """Objects are encoded with the codec; bytes-like messages are taken as already encoded."""
    codec = ProtobufCodec(Tx)
    tx = Tx(nonce=5)
    assert encode_message(codec, Tx, 0x20, tx) == tx.SerializeToString()
    assert encode_message(codec, Tx, 0x20, b"\x10\x05") == b"\x10\x05"
    assert encode_message(codec, Tx, 0x20, bytearray(b"\x10\x05")) == b"\x10\x05"
    assert encode_message(JsonCodec(), None, 0x21, {"a": 1}) == b'{"a": 1}'


def test_encode_message_refuses_the_wrong_type():
    """An object that is not the channel's message_type is a TypeError naming the channel and both types."""
    with pytest.raises(TypeError, match="channel 0x20 carries Tx messages, got dict"):
        encode_message(ProtobufCodec(Tx), Tx, 0x20, {"nonce": 5})


def test_encode_message_refuses_a_codec_that_returns_no_bytes():
    """A codec whose encode returns something other than bytes is a TypeError naming it."""

    class Broken(JsonCodec):
        def encode(self, obj):
            return "text"

    with pytest.raises(TypeError, match=r"channel 0x21: JsonCodec\(\).encode returned str"):
        encode_message(Broken(), None, 0x21, {"a": 1})
