"""Typed messages: a channel's codec, and the decoding step before ``Reactor.receive``. Pure.

specs/reactor-api.md section 11 is the prose form. A ``ChannelDescriptor`` with
``message_type`` or ``codec`` makes its channel typed:

* ``message_type`` alone: a protobuf message class (the ``protobuf`` package's: the class
  has ``FromString``, its instances ``SerializeToString``); ``ProtobufCodec`` wraps it.
  Nothing here imports protobuf: any class with those two methods will do.
* ``codec``: any object with ``encode(obj) -> bytes`` and ``decode(data: bytes) -> obj``.
  With ``message_type`` too, ``send`` checks that an object is an instance of it.

On a typed channel the reactor's ``receive`` gets ``codec.decode(message)``; a message
that does not decode is the sender's fault (``DecodeError``, a ``RemoteProtocolError``:
the peer is dropped as for a malformed packet, whatever the reactor error policy).
``peer.send``/``try_send`` encode objects; ``bytes`` (and bytearray, memoryview) are
taken as already encoded, so a message can be encoded once and sent to many peers. Raw
channels (the default) pay nothing: the Switch routes them straight to ``receive`` and
the send path converts only what is not ``bytes`` (bench/history/2026-11-24-afternoon.md, typed messages).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mconn.errors import DecodeError


@dataclasses.dataclass(frozen=True, slots=True)
class ProtobufCodec:
    """The codec of a protobuf message class: ``SerializeToString`` and ``FromString``."""

    # A protobuf message class; Any, as nothing here imports protobuf's types.
    message_type: Any

    def encode(self, message: Any) -> bytes:
        data: bytes = message.SerializeToString()
        return data

    def decode(self, data: bytes) -> Any:
        return self.message_type.FromString(data)

    def __repr__(self) -> str:
        descriptor = getattr(self.message_type, "DESCRIPTOR", None)
        name = getattr(descriptor, "full_name", None) or self.message_type.__qualname__
        return f"ProtobufCodec({name})"


def codec_for(channel_id: int, message_type: Any, codec: Any) -> Any:
    """The codec of a channel declared with ``message_type`` and/or ``codec`` (None: raw).

    :raises ValueError: naming the channel, if ``codec`` lacks ``encode``/``decode`` or a
        lone ``message_type`` lacks ``FromString``/``SerializeToString``.
    """
    if codec is None:
        if message_type is None:
            return None
        if not (
            callable(getattr(message_type, "FromString", None))
            and callable(getattr(message_type, "SerializeToString", None))
        ):
            raise ValueError(
                f"channel {channel_id:#04x}: message_type {message_type!r} is not a protobuf message class "
                "(no FromString/SerializeToString); pass codec= with encode/decode"
            )
        return ProtobufCodec(message_type)
    if not (callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))):
        raise ValueError(f"channel {channel_id:#04x}: codec {codec!r} must have encode(obj) and decode(bytes)")
    if message_type is not None and not isinstance(message_type, type):
        raise ValueError(f"channel {channel_id:#04x}: message_type must be a class, got {message_type!r}")
    return codec


def typed_receiver(
    receive: Callable[[int, Any, Any], Any], codec: Any, on_error: Callable[[Any, DecodeError], object]
) -> Callable[[int, Any, bytes], Any]:
    """``receive(channel_id, peer, message)`` that decodes ``message`` with ``codec`` first.

    A message that does not decode is not given to ``receive``: ``on_error(peer, error)``
    gets a ``DecodeError`` naming the channel, the codec, the size and the codec's error
    (the Switch drops the peer with it).
    """
    decode = codec.decode

    def receive_decoded(channel_id: int, peer: Any, message: bytes) -> Any:
        try:
            decoded = decode(message)
        except Exception as error:
            on_error(peer, DecodeError(channel_id, codec, len(message), error))
            return None
        return receive(channel_id, peer, decoded)

    return receive_decoded


def encode_message(codec: Any, message_type: Any, channel_id: int, message: Any) -> bytes:
    """The bytes of ``message`` on a typed channel: bytes-like ones as they are (already
    encoded), other objects through ``codec.encode``.

    :raises TypeError: naming the channel, if ``message`` is not a ``message_type`` (when
        one is declared) or the codec did not return bytes.
    """
    if isinstance(message, bytes):
        return message
    if isinstance(message, (bytearray, memoryview)):
        return bytes(message)
    if message_type is not None and not isinstance(message, message_type):
        raise TypeError(
            f"channel {channel_id:#04x} carries {message_type.__qualname__} messages, got {type(message).__qualname__}"
        )
    data = codec.encode(message)
    if not isinstance(data, bytes):
        raise TypeError(f"channel {channel_id:#04x}: {codec!r}.encode returned {type(data).__qualname__}, not bytes")
    return data
