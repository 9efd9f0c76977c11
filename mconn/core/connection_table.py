"""The MConnection's states, inputs and transition table, as data (specs/connection.md
section 1 is derived from ``TRANSITIONS``, and a test compares the two).

A (state, input) pair missing from the table is a protocol error; ``mconn.core.connection``
applies it.
"""

from __future__ import annotations

import enum


class State(enum.Enum):
    HANDSHAKING = "handshaking"  # our hello is out; waiting for theirs
    OPEN = "open"
    CLOSING = "closing"  # we sent a close packet
    CLOSED = "closed"


class Input(enum.Enum):
    HELLO = "hello"
    MSG = "msg"
    PING = "ping"
    PONG = "pong"
    CLOSE_RECEIVED = "close received"
    CLOSE_SENT = "close sent"
    ACK = "ack"
    SESSION = "session"
    TRANSPORT_LOST = "transport lost"


S, I = State, Input  # noqa: E741 -- one letter each keeps a table row on one line
#: (state, input) -> next state. Anything missing is a protocol error.
TRANSITIONS: dict[tuple[State, Input], State] = {
    (S.HANDSHAKING, I.HELLO): S.OPEN,
    (S.HANDSHAKING, I.CLOSE_RECEIVED): S.CLOSED,
    (S.HANDSHAKING, I.CLOSE_SENT): S.CLOSING,
    (S.OPEN, I.MSG): S.OPEN,
    (S.OPEN, I.PING): S.OPEN,
    (S.OPEN, I.PONG): S.OPEN,
    (S.OPEN, I.CLOSE_RECEIVED): S.CLOSED,
    (S.OPEN, I.CLOSE_SENT): S.CLOSING,
    (S.OPEN, I.ACK): S.OPEN,
    (S.OPEN, I.SESSION): S.OPEN,
    # After our close, the peer's last packets are read and ignored.
    (S.CLOSING, I.MSG): S.CLOSING,
    (S.CLOSING, I.PING): S.CLOSING,
    (S.CLOSING, I.PONG): S.CLOSING,
    (S.CLOSING, I.HELLO): S.CLOSING,
    (S.CLOSING, I.ACK): S.CLOSING,
    (S.CLOSING, I.SESSION): S.CLOSING,
    (S.CLOSING, I.CLOSE_RECEIVED): S.CLOSED,
    # The transport beneath is gone, whatever was happening (the adapter says so).
    (S.HANDSHAKING, I.TRANSPORT_LOST): S.CLOSED,
    (S.OPEN, I.TRANSPORT_LOST): S.CLOSED,
    (S.CLOSING, I.TRANSPORT_LOST): S.CLOSED,
    (S.CLOSED, I.TRANSPORT_LOST): S.CLOSED,
}
del S, I
