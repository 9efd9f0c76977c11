"""Hypothesis strategies of the CI fuzz tests.

Inbound byte streams: random, valid, and valid-then-mutated. Valid streams are built
from every kind of packet (hello, msg, ping, pong, close, ack, session answer, unknown
extensions, over-limit headers, long messages, ping bursts); mutations flip, insert,
delete, cut and repeat bytes. ``schedules`` cuts a stream into chunks with waits and
read flags (tests/fuzz/target.py).

Structure-aware inputs: ``Drawn`` lets the generators of tests/fuzz/declared.py draw
with hypothesis; ``handshake_scenarios`` (tests/fuzz/switch_target.py), ``pex_messages``
and ``chat_messages`` (tests/fuzz/message_target.py) use it.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from mconn.core import wire
from mconn.core.wire import PacketType, SessionAnswer

from tests.fuzz.handshake_inputs import HELDS, SIZES, Scenario, draw_answer, draw_hello
from tests.fuzz.message_target import draw_chat, draw_pex
from tests.fuzz.target import CHANNELS, SESSION_ID, WAITS, extension, peer_hello

channel_ids = st.sampled_from([c.id for c in CHANNELS] + [0x22, 0x00, 0xFF])
counts = st.dictionaries(channel_ids, st.integers(0, 2**40), max_size=3)


def _msg(channel_id: int, eof: bool, data: bytes) -> bytes:
    return wire.encode_packet(PacketType.MSG, channel_id=channel_id, eof=eof, data=data)


def _long_message(channel_id: int, packets: int) -> bytes:
    return b"".join(_msg(channel_id, i == packets - 1, bytes(64)) for i in range(packets))


def _session_answer(session_id: bytes, resumed: bool, delivered: dict) -> bytes:
    answer = SessionAnswer(session_id=session_id, resumed=resumed, reason="", delivered=delivered)
    return extension(PacketType.SESSION, wire.encode_session_answer(answer))


packets = st.one_of(
    st.builds(_msg, channel_ids, st.booleans(), st.binary(max_size=80)),
    st.just(bytes([PacketType.PING])),
    st.just(bytes([PacketType.PONG])),
    # Below the payload floor (refused), at it, and above it (the smaller, ours, holds).
    st.builds(peer_hello, st.sampled_from([1, 1023, 1024, 4096]), st.sampled_from([wire.PROTOCOL_VERSION, 99])),
    st.builds(
        lambda code, text: extension(PacketType.CLOSE, wire.encode_close(code, text)),
        st.text(max_size=10),
        st.text(max_size=40),
    ),
    st.builds(lambda c: extension(PacketType.ACK, wire.encode_ack(c)), counts),
    st.builds(_session_answer, st.sampled_from([SESSION_ID, bytes(16)]), st.booleans(), counts),
    st.builds(extension, st.integers(0x08, 0xFF), st.binary(max_size=40)),
    # Over-limit lengths: a msg payload, any extension body.
    st.builds(lambda n: bytes([PacketType.MSG, 0x20, 1]) + wire.encode_uvarint(n), st.integers(1025, 2**64 - 1)),
    st.builds(lambda t, n: bytes([t]) + wire.encode_uvarint(n), st.integers(0x04, 0xFF), st.integers(129, 2**64 - 1)),
    # A long message in full packets (past recv_message_capacity 300 on 0x20 from 5 on).
    st.builds(_long_message, st.sampled_from([0x20, 0x21]), st.integers(1, 20)),
    st.builds(lambda n: bytes([PacketType.PING]) * n, st.integers(1, 12)),
)


@st.composite
def valid_streams(draw) -> bytes:
    """A hello (usually) followed by packets of every kind."""
    start = draw(st.sampled_from([peer_hello(), peer_hello(4096), b""]))
    return start + b"".join(draw(st.lists(packets, max_size=12)))


@st.composite
def mutated(draw, streams) -> bytes:
    data = bytearray(draw(streams))
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "cut", "repeat"]))
        at = draw(st.integers(0, len(data)))
        if kind == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "cut":
            del data[at:]
        elif kind == "repeat":
            data[at:at] = data[max(0, at - draw(st.integers(1, 16))) : at]
    return bytes(data)


streams = st.one_of(st.binary(max_size=300), valid_streams(), mutated(valid_streams()))


@st.composite
def schedules(draw, streams=streams):
    """A stream cut into chunks, each with a wait before it and whether the peer reads after."""
    data = draw(streams)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    bounds = [0, *cuts, len(data)]
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    steps = draw(st.lists(st.tuples(st.sampled_from(WAITS), st.booleans()), min_size=len(chunks), max_size=len(chunks)))
    return [(chunk, wait, reads) for chunk, (wait, reads) in zip(chunks, steps, strict=True)]


# -- structure-aware inputs (tests/fuzz/declared.py) ------------------------------------------


class Drawn:
    """A chooser for tests/fuzz/declared.py's generators that draws with hypothesis (the
    atheris harnesses use ``declared.Reader`` over plain bytes instead). Each choice
    shrinks towards its first option, a valid value."""

    def __init__(self, draw) -> None:
        self.draw = draw

    def pick(self, options):
        return self.draw(st.sampled_from(options))

    def number(self, limit: int) -> int:
        return self.draw(st.integers(0, limit))

    def blob(self, max_size: int) -> bytes:
        return self.draw(st.binary(max_size=max_size))


@st.composite
def handshake_scenarios(draw, dialer: bool):
    """A tests/fuzz/handshake_inputs.py Scenario: what our Switch holds, a structure-aware hello
    (listener) or session answer (dialer), mostly, else a raw stream; packets after it; how
    it is cut and timed."""
    held = draw(st.sampled_from(HELDS))
    low = draw(st.booleans())
    if draw(st.integers(0, 9)):
        first = (draw_answer if dialer else draw_hello)(Drawn(draw))
        rest = b"".join(draw(st.lists(packets, max_size=4)))
    else:
        first, rest = None, draw(streams)
    steps = draw(st.lists(st.tuples(st.sampled_from(SIZES), st.sampled_from(WAITS), st.booleans()), max_size=6))
    return Scenario(dialer, held, low, first, rest, tuple(steps))


@st.composite
def pex_messages(draw) -> bytes:
    """A PEX message: built from pex_wire's declarations (tests/fuzz/message_target.py)
    four times in five, else any bytes."""
    return draw_pex(Drawn(draw)) if draw(st.integers(0, 4)) else draw(st.binary(max_size=300))


@st.composite
def chat_messages(draw, channel_id: int) -> bytes:
    """A message of ``channel_id``: built from chat_wire.DECLARATIONS four times in five,
    else any bytes."""
    return draw_chat(Drawn(draw), channel_id) if draw(st.integers(0, 4)) else draw(st.binary(max_size=300))
