"""What every Peer of a Switch shares about the Switch's own channels (``ChannelShape``).

Built per session, these would be three small dicts per handshake that never change
once the Switch is built (its channels are fixed at construction). The
``SessionManager`` builds one ``ChannelShape`` and every Peer refers to it
(bench/history/2026-11-24-night.md, "Connect storm": lighter peers).
"""

from __future__ import annotations

from mconn.core.codec import encode_message


class ChannelShape:
    """Our channels' send and receive capacities and codecs, by channel id.

    :param channels: the Switch's ``ChannelDescriptor``s.
    """

    __slots__ = ("send_capacity", "recv_capacity", "codecs", "_limits")

    #: How many peers' channel lists ``limits`` remembers (nodes of one network announce
    #: a handful of distinct ones).
    LIMITS_KEPT = 64

    def __init__(self, channels) -> None:
        #: ``send_queue_capacity`` per channel: sends held while suspended stop there.
        self.send_capacity = {d.id: d.send_queue_capacity for d in channels}
        #: ``recv_message_capacity`` per channel (ours; a session's limit is the smaller
        #: of ours and the peer's, ``limits``).
        self.recv_capacity = {d.id: d.recv_message_capacity for d in channels}
        #: Typed channels (mconn.core.codec): channel id -> (codec, message_type).
        self.codecs = {d.id: (d.codec, d.message_type) for d in channels if d.codec is not None}
        #: The peer's announced ChannelInfos (a tuple) -> ``limits``' answer.
        self._limits: dict = {}

    def limits(self, announced) -> dict[int, int]:
        """Per channel both sides have (``announced``: the ChannelInfos of the peer's
        hello): the largest message it accepts, the smaller recv_message_capacity.

        The answer depends on nothing else, so peers that announce the same channels
        share one dict (up to ``LIMITS_KEPT`` different ones are kept): a Peer only reads it."""
        kept = self._limits.get(announced) if type(announced) is tuple else None
        if kept is not None:
            return kept
        theirs = {c.id: c.recv_message_capacity for c in announced}
        limits = {
            channel_id: min(ours, theirs[channel_id])
            for channel_id, ours in self.recv_capacity.items()
            if channel_id in theirs
        }
        if type(announced) is tuple and len(self._limits) < self.LIMITS_KEPT:
            self._limits[announced] = limits
        return limits

    def bytes_of(self, channel_id: int, message) -> bytes:
        """The bytes to send: a typed channel's objects encoded (mconn.core.codec), bytes as
        they are. :raises TypeError: for an object a raw channel cannot carry."""
        typed = self.codecs.get(channel_id)
        if typed is None:
            if isinstance(message, bytes):
                return message
            if isinstance(message, (bytearray, memoryview)):
                return bytes(message)
            raise TypeError(f"messages are bytes, got {type(message).__name__}")
        return encode_message(typed[0], typed[1], channel_id, message)
