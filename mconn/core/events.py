"""Events: the facts the sans-I/O core reports, as h2's ``h2/events.py`` does.

Each is a frozen, keyword-only dataclass named in the past tense (MessageReceived, the
hot path, is not frozen). The Twisted adapter
(protocol.py) dispatches on their type.
"""

from __future__ import annotations

import dataclasses
import typing

from mconn.errors import RemoteProtocolError
from mconn.core.wire import Hello, SessionAnswer

_T = typing.TypeVar("_T")


@typing.dataclass_transform(frozen_default=True, kw_only_default=True)
def _event(cls: type[_T]) -> type[_T]:
    return dataclasses.dataclass(frozen=True, kw_only=True, slots=True)(cls)


@_event
class HelloReceived:
    """The peer's hello arrived and is compatible; the connection is open."""

    hello: Hello
    max_packet_payload: int


@dataclasses.dataclass(kw_only=True, slots=True)
class MessageReceived:
    """A whole message was reassembled on a channel.

    Not frozen, unlike the other events: one is made per message, and a frozen
    dataclass's ``__init__`` (``object.__setattr__`` per field) costs twice as much
    (bench/history/2026-11-22.md, "MessageReceived not frozen"). Nothing changes it after it is made.
    """

    channel_id: int
    message: bytes


@_event
class PongReceived:
    """A pong answered our ping after ``round_trip`` seconds."""

    round_trip: float


@_event
class CloseReceived:
    """The peer closed the connection on purpose (specs/wire.md section 3.2)."""

    code: str
    text: str


@_event
class ConnectionFailed:
    """The peer broke the protocol or went silent; the connection is over."""

    error: RemoteProtocolError


@_event
class AckReceived:
    """The peer confirmed per-channel counts of messages delivered to its reactor."""

    delivered: dict[int, int]


@_event
class SessionAnswered:
    """The listener answered our session request (specs/resume.md section 2)."""

    answer: SessionAnswer
