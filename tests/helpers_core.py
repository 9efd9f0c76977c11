"""Helpers for the pure-core tests: vectors, a reference packet splitter, CorePair.

Nothing here imports Twisted. ``CorePair`` is two sans-I/O Connections wired back to back
(like h11's ConnectionPair): ``pump(now)`` moves each side's ``data_to_send`` into the
other's ``receive_data`` until both are quiet.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pathlib
import re

from hypothesis import strategies as st

from mconn.core import wire
from mconn.core.channel import ChannelDescriptor
from mconn.config import Config
from mconn.core.connection import CHANNEL_COUNTS_LIMIT, Connection
from mconn.core.events import HelloReceived
from mconn.core.frame_buffer import RUN, FrameBuffer
from mconn.core.handshake import make_hello
from mconn.core.wire import PacketType

SPECS = pathlib.Path(__file__).resolve().parents[1] / "specs"
NODE_A = "aa" * 20
NODE_B = "bb" * 20
CH = 0x20


# -- vectors -----------------------------------------------------------------------


def load_vectors(name: str) -> dict:
    """specs/vectors/<name>.json."""
    return json.loads((SPECS / "vectors" / f"{name}.json").read_text())


def expand(spec) -> bytes:
    """Bytes of a vector value: hex (spaces allowed) or a list of hex / {repeat, count} parts."""
    if isinstance(spec, str):
        return bytes.fromhex(spec)
    if isinstance(spec, dict):
        return bytes.fromhex(spec["repeat"]) * spec["count"]
    return b"".join(expand(part) for part in spec)


# -- the reference splitter: the construct declarations, never the hot path ----------


def split_packets(data: bytes) -> list[bytes]:
    """Cut a stream of whole packets into packets, using only wire.py's declarations."""
    stream = io.BytesIO(data)
    out = []
    while stream.tell() < len(data):
        start = stream.tell()
        kind = stream.read(1)[0]
        if kind == PacketType.MSG:
            wire.MsgPacket.parse_stream(stream)
        elif kind >= wire.FIRST_EXTENSION_TYPE:
            wire.ExtensionBody.parse_stream(stream)
        elif kind not in (PacketType.PING, PacketType.PONG):
            raise AssertionError(f"packet type {kind:#04x} at offset {start}")
        out.append(data[start : stream.tell()])
    return out


def decode_stream(data: bytes) -> list:
    """Every packet of ``data`` as ``wire.decode_packet`` returns it."""
    return [wire.decode_packet(p) for p in split_packets(data)]


def msg_payloads(data: bytes) -> list[tuple[int, bool, bytes]]:
    """(channel_id, eof, payload) of the msg packets in ``data``."""
    return [payload for kind, payload in decode_stream(data) if kind == PacketType.MSG]


# -- connections ----------------------------------------------------------------------


def make_connection(
    *,
    node_id: str = NODE_A,
    channels: list[ChannelDescriptor] | None = None,
    config: Config | None = None,
    now: float = 0.0,
) -> Connection:
    channels = [ChannelDescriptor(CH)] if channels is None else channels
    config = config or Config()
    hello = make_hello(node_id=node_id, channels=channels, max_packet_payload=config.max_packet_payload)
    return Connection(config=config, hello=hello, channels=channels, now=now)


def hello_packet(
    node_id: str = NODE_B,
    channels=None,
    *,
    max_packet_payload: int = 1024,
    version: int = wire.PROTOCOL_VERSION,
    listen_address: str = "",
) -> bytes:
    """A peer's whole hello packet (specs/handshake.md), built from the declaration.

    ``channels`` (any iterable of ChannelDescriptor) defaults to the one channel CH.
    The adapter tests use it too, through tests/helpers.py.
    """
    channels = [ChannelDescriptor(CH)] if channels is None else list(channels)
    hello = make_hello(
        node_id=node_id, channels=channels, max_packet_payload=max_packet_payload, listen_address=listen_address
    )
    hello = dataclasses.replace(hello, version=version)
    return wire.encode_packet(PacketType.HELLO, body=wire.encode_hello(hello))


def open_connection(*, peer_payload: int = 1024, now: float = 0.0, **kwargs) -> Connection:
    """A Connection that has sent its hello and accepted the peer's, at time ``now``."""
    conn = make_connection(now=now, **kwargs)
    assert conn.data_to_send(now)[0] == PacketType.HELLO
    events = conn.receive_data(hello_packet(max_packet_payload=peer_payload), now)
    assert [type(e) for e in events] == [HelloReceived], events
    return conn


def msg(channel_id: int, data: bytes, eof: bool = True) -> bytes:
    return wire.encode_packet(PacketType.MSG, channel_id=channel_id, eof=eof, data=data)


class CorePair:
    """Two Connections talking to each other through their byte interfaces."""

    def __init__(self, a: Connection, b: Connection) -> None:
        self.a = a
        self.b = b
        #: Every chunk each side wrote, in order.
        self.sent_by_a: list[bytes] = []
        self.sent_by_b: list[bytes] = []

    @classmethod
    def make(
        cls,
        *,
        config_a: Config | None = None,
        config_b: Config | None = None,
        channels_a: list[ChannelDescriptor] | None = None,
        channels_b: list[ChannelDescriptor] | None = None,
        now: float = 0.0,
    ) -> CorePair:
        a = make_connection(node_id=NODE_A, channels=channels_a, config=config_a, now=now)
        b = make_connection(node_id=NODE_B, channels=channels_b, config=config_b, now=now)
        return cls(a, b)

    def pump(self, now: float, *, budget: int | None = None) -> tuple[list, list]:
        """Move bytes both ways until neither side has any; returns (events of a, events of b)."""
        events_a: list = []
        events_b: list = []
        while True:
            to_b = self.a.data_to_send(now, budget)
            to_a = self.b.data_to_send(now, budget)
            if not to_b and not to_a:
                return events_a, events_b
            if to_b:
                self.sent_by_a.append(to_b)
                events_b += self.b.receive_data(to_b, now)
            if to_a:
                self.sent_by_b.append(to_a)
                events_a += self.a.receive_data(to_a, now)


# -- the frame buffer ---------------------------------------------------------------


def frame_buffer(max_payload: int = 1024, max_hello_size: int = 4096, max_control_size: int = 1024) -> FrameBuffer:
    """A FrameBuffer with the limits a Connection gives it."""
    return FrameBuffer(
        max_payload=max_payload,
        default_extension_limit=max_control_size,
        extension_limits={
            PacketType.HELLO: max_hello_size,
            PacketType.ACK: max_control_size + CHANNEL_COUNTS_LIMIT,
            PacketType.SESSION: max_control_size + CHANNEL_COUNTS_LIMIT,
        },
    )


def expand_runs(packets: list) -> list:
    """FrameBuffer output with each RUN spelled out as the msg packets it stands for."""
    out = []
    for packet in packets:
        if packet[0] == RUN:
            out += [(PacketType.MSG, packet[1], 0, data) for data in packet[2]]
        else:
            out.append(packet)
    return out


def merge_not_last(decoded: list) -> list:
    """Decoded packets (``wire.decode_packet``'s form) with each series of consecutive
    not-last msg packets of one channel merged into one: what a FrameBuffer's output
    and the declaration's agree on. (The frame buffer copies a run's small payloads
    into one piece, so the boundaries between them are not kept; a message is their
    concatenation either way.)"""
    out: list = []
    for kind, body in decoded:
        if kind == PacketType.MSG and not body[1] and out:
            last_kind, last = out[-1]
            if last_kind == PacketType.MSG and not last[1] and last[0] == body[0]:
                out[-1] = (kind, (body[0], False, last[2] + body[2]))
                continue
        out.append((kind, body))
    return out


def packet_end(data: bytes, pos: int) -> int | None:
    """Where the packet that starts at ``pos`` ends, read from its header alone (the type
    and the length, nothing else checked): None when it is not all in ``data``."""
    kind = data[pos]
    if kind in (PacketType.PING, PacketType.PONG):
        return pos + 1
    at = pos + 3 if kind == PacketType.MSG else pos + 1  # the length's size byte
    if at >= len(data):
        return None
    start = at + 1 + data[at]
    if start > len(data):
        return None
    end = start + int.from_bytes(data[at + 1 : start], "big")
    return end if end <= len(data) else None


class PacketByPacket:
    """A FrameBuffer fed one whole packet at a time, so that every msg packet comes out
    as itself, ``(MSG, channel_id, eof, bytes)``: for tests that look at the packets a
    node sent one by one (a FrameBuffer hands a read's not-last packets of a channel over
    as one run, their small payloads joined). The FrameBuffer still judges every packet."""

    def __init__(self, buffer: FrameBuffer) -> None:
        self.buffer = buffer
        self.kept = b""

    @property
    def buffered(self) -> int:
        return len(self.kept) + self.buffer.buffered

    def feed(self, data: bytes) -> tuple[list, Exception | None]:
        data = self.kept + bytes(data)
        out: list = []
        pos = 0
        while pos < len(data):
            end = packet_end(data, pos)
            if end is None:
                break
            packets, error = self.buffer.feed(data[pos:end], stop_after_extension=False)
            for packet in packets:
                if packet[0] == RUN:  # one packet: one payload
                    packet = (PacketType.MSG, packet[1], 0, b"".join(bytes(d) for d in packet[2]))
                out.append(packet)
            if error is not None:
                self.kept = b""
                return out, error
            pos = end
        self.kept = data[pos:]
        return out, None


def msg_payload_sizes(data: bytes) -> list[int]:
    """The payload sizes of the whole msg packets in ``data``, packet by packet (up to
    an incomplete one at the end)."""
    packets, error = PacketByPacket(FrameBuffer(max_payload=1 << 30, default_extension_limit=1 << 30)).feed(data)
    assert error is None, error
    return [len(p[3]) for p in packets if p[0] == PacketType.MSG]


def as_decoded(packet: tuple):
    """A FrameBuffer packet in the form ``wire.decode_packet`` returns."""
    kind = packet[0]
    if kind == PacketType.MSG:
        return kind, (packet[1], bool(packet[2]), bytes(packet[3]))
    if len(packet) == 1:
        return kind, None
    return kind, bytes(packet[1])


def feed_whole(buffer, data: bytes) -> tuple[list, Exception | None]:
    """Feed ``data`` in one call (resuming after extension packets); decoded packets, error."""
    packets, error = buffer.feed(data)
    out = [as_decoded(p) for p in expand_runs(packets)]
    while error is None and buffer.paused:
        packets, error = buffer.feed(b"")
        out += [as_decoded(p) for p in expand_runs(packets)]
    return out, error


def feed_bytewise(buffer, data: bytes) -> tuple[list, Exception | None, int | None]:
    """Feed ``data`` one byte at a time; decoded packets, error, index of the failing byte."""
    out: list = []
    for i in range(len(data)):
        packets, error = feed_whole(buffer, data[i : i + 1])
        out += packets
        if error is not None:
            return out, error, i
    return out, None, None


# -- golden vectors through a FrameBuffer --------------------------------------------------


def vector_frame_buffer(limits: dict) -> FrameBuffer:
    """A FrameBuffer with the ``limits`` of a vectors file (specs/vectors/*.json)."""
    return frame_buffer(limits["max_packet_payload"], limits["max_hello_size"], limits["max_control_size"])


def check_frames(limits: dict, data: bytes, expected: list) -> None:
    """``data`` decodes to ``expected``, fed whole and byte by byte, leaving nothing buffered."""
    buffer = vector_frame_buffer(limits)
    assert feed_whole(buffer, data) == (expected, None)
    assert buffer.buffered == 0
    buffer = vector_frame_buffer(limits)
    assert feed_bytewise(buffer, data) == (expected, None, None)
    assert buffer.buffered == 0


def check_invalid_frames(limits: dict, vector: dict, error_class: type) -> None:
    """An invalid vector: refused by the stream at byte ``fails_at`` with ``error_class``
    (fed whole and byte by byte) if ``rejected_by`` names the stream, else framed fine."""
    data = expand(vector["hex"])
    if "stream" in vector["rejected_by"]:
        packets, error = feed_whole(vector_frame_buffer(limits), data)
        assert packets == [] and type(error) is error_class, error
        buffer = vector_frame_buffer(limits)
        packets, error, index = feed_bytewise(buffer, data)
        assert (packets, type(error), index) == ([], error_class, vector["fails_at"])
        assert buffer.buffered == 0
    else:
        assert feed_whole(vector_frame_buffer(limits), data)[1] is None
        assert feed_bytewise(vector_frame_buffer(limits), data)[1] is None


# -- the session state tables of specs/resume.md ------------------------------------------

SESSION_TABLE_HEADER = ["State", "Side", "Input", "Next state", "Reactors get", "Telemetry", "Also"]


@dataclasses.dataclass(frozen=True)
class SessionRow:
    """One row of a spec table, in the spec's words, with where it came from."""

    where: str  # "session-states row 3", for failure messages
    state: str
    side: str
    input: str
    next_state: str
    reactor_calls: tuple[str, ...]
    telemetry: tuple[str, ...]


def _items(cell: str) -> tuple[str, ...]:
    """`a`, `b(c)` -> ("a", "b(c)"); an em dash -> ()."""
    cell = cell.strip()
    if cell == "—":
        return ()
    items = re.findall(r"`([^`]+)`", cell)
    assert items and re.sub(r"`[^`]+`|[,\s]", "", cell) == "", f"cannot read cell {cell!r}"
    return tuple(items)


def _one(cell: str, line: str) -> str:
    items = _items(cell)
    assert len(items) == 1, f"expected one item in {cell!r} of {line!r}"
    return items[0]


def parse_session_table(text: str, marker: str) -> list[SessionRow]:
    """The rows of a session state table of specs/resume.md (sections 3 and 3.1), between
    ``<!-- marker:begin -->`` and ``<!-- marker:end -->``."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, f"specs/resume.md needs one {begin} and one {end}"
    block = text.split(begin)[1].split(end)[0]
    lines = [line for line in block.strip().splitlines() if line.strip()]
    header = [c.strip() for c in lines[0].strip().strip("|").split("|")]
    assert header == SESSION_TABLE_HEADER, f"{marker}: header {header}"
    assert set(lines[1].replace("|", "").strip()) <= {"-", " "}, f"{marker}: no separator line under the header"
    rows = []
    for number, line in enumerate(lines[2:], start=1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == len(SESSION_TABLE_HEADER), f"{marker} row {number} has {len(cells)} cells: {line!r}"
        assert cells[1] in ("dialer", "listener", "both"), f"{marker} row {number}: side {cells[1]!r}"
        rows.append(
            SessionRow(
                where=f"{marker} row {number}",
                state=_one(cells[0], line),
                side=cells[1],
                input=_one(cells[2], line),
                next_state=_one(cells[3], line),
                reactor_calls=_items(cells[4]),
                telemetry=_items(cells[5]),
            )
        )
    assert rows, f"{marker}: no rows"
    return rows


# -- malformed input for the codec properties -----------------------------------------


@st.composite
def edited(draw, data: bytes, edits: tuple[int, int], values: list[int]) -> bytes:
    """``data`` after ``edits`` (min, max) drawn edits, each a byte set, the tail cut off or a byte inserted; the
    byte is one of ``values`` (lengths, types and varint edges that matter to the codec) or any byte."""
    out = bytearray(data)
    for _ in range(draw(st.integers(*edits))):
        op = draw(st.sampled_from(["set", "cut", "insert"]))
        at = draw(st.integers(0, len(out)))
        value = draw(st.sampled_from(values) | st.integers(0, 255))
        if op == "set" and at < len(out):
            out[at] = value
        elif op == "cut":
            del out[at:]
        else:
            out.insert(at, value)
    return bytes(out)
