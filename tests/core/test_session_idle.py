"""A session's channels that have carried nothing share one idle stream (mconn/core/session.py,
``_IDLE``): no stream and no deque per idle channel, and the same answers as a stream of its own."""

import pytest

from mconn.core import session as session_module
from mconn.errors import AckError
from mconn.core.session import Session

CHANNELS = [0x10, 0x20, 0x30, 0x40]


def _session(**kwargs) -> Session:
    return Session(
        b"s" * 16, CHANNELS, recovery_buffer_bytes=1000, ack_every_messages=2, ack_every_bytes=10_000, **kwargs
    )


def _own_streams(session) -> set:
    return {c for c, stream in session._streams.items() if stream is not session_module._IDLE}


def test_idle_channels_share_one_stream_until_they_carry_a_message():
    """A new session has no stream of its own; accepting on one channel and delivering on
    another give exactly those two their own; the shared one stays empty."""
    session = _session()
    assert _own_streams(session) == set()
    assert session.admit(0x20, b"abc") == 0
    assert session.record_delivered(0x30, 5) is False
    assert _own_streams(session) == {0x20, 0x30}
    idle = session_module._IDLE
    assert (idle.acked, idle.unacked, idle.unacked_bytes, idle.delivered) == (0, (), 0, 0)
    assert session.accepted(0x20) == 1 and session.accepted(0x10) == 0
    assert session.unconfirmed() == {0x20: 1} and session.delivered_counts() == {0x30: 1}
    assert session.carried_traffic()


def test_idle_channels_answer_acks_resends_and_counts_as_empty_ones():
    """An ack of 0 on an idle channel changes nothing; one above 0 is refused naming the
    counts; a resume re-sends nothing for them; admit_many and record_sent take their own
    stream; none of it writes the shared stream."""
    session = _session()
    assert session.on_ack({0x10: 0, 0x40: 0}) == []
    with pytest.raises(AckError, match=r"ack says 2 messages delivered on channel 0x10, but only 0 were sent"):
        session.on_ack({0x10: 2})
    assert session.to_resend({0x10: 0, 0x99: 3}) == {}
    assert session.admit_many(0x40, [b"a", b"bb"], 3) == 0
    assert session.record_sent(0x10, b"ccc") == 0
    assert session.to_resend({0x40: 1}) == {0x40: [b"bb"], 0x10: [b"ccc"]}
    assert session.on_ack({0x40: 2, 0x10: 1}) == [(0x40, 1, 2), (0x10, 0, 1)]
    assert session.unacked_bytes == 0 and not session.unconfirmed()
    assert _own_streams(session) == {0x10, 0x40}
    idle = session_module._IDLE
    assert (idle.acked, idle.unacked, idle.unacked_bytes, idle.delivered) == (0, (), 0, 0)


def test_the_shared_stream_cannot_be_appended_to():
    """Its unacked is a tuple: a write path that forgot to take a stream of its own fails
    loudly instead of sharing messages between sessions."""
    with pytest.raises(AttributeError):
        session_module._IDLE.unacked.append(b"x")
