"""The worked example of specs/scheduling.md section 7 is what the scheduler does.

The example (between ``<!-- scheduling-example:begin -->`` and ``end``) is parsed: the
channels with their priorities and queued messages, and the packets in order with each
channel's ratio before the packet. The real Scheduler must produce exactly those
packets, packet by packet and in one call, and a Connection must send them after its
control packets.
"""

import re

import pytest

from mconn.core.channel import Channel, ChannelDescriptor, Scheduler
from mconn.core.wire import PacketType
from tests.helpers_core import SPECS, decode_stream, msg_payloads, open_connection, split_packets

NOT_PENDING = "—"


def _rows(table: list[str]) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table]


def _spec_example():
    """(payload, setup rows, header, packet rows) of the example."""
    text = (SPECS / "scheduling.md").read_text()
    block = text.split("<!-- scheduling-example:begin -->")[1].split("<!-- scheduling-example:end -->")[0]
    payload = int(re.search(r"^P = (\d+)$", block, re.M).group(1))
    tables, current = [], []
    for line in block.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(_rows(current))
            current = []
    if current:
        tables.append(_rows(current))
    assert len(tables) == 2, f"expected a setup table and a packet table, found {len(tables)}"
    setup, packets = tables
    assert setup[0][:2] == ["Channel", "Priority"], setup[0]
    assert packets[0][0] == "#" and packets[0][-5:] == ["Sends", "Message", "Payload", "eof", "Wire bytes"], packets[0]
    return payload, setup[2:], packets[0], packets[2:]


def _setup(rows):
    """Channels (declaration order) with their messages queued, and each channel's
    messages as (name, bytes) in order."""
    channels, messages = [], {}
    for channel_id, priority, queued in rows:
        named = [(name, _message(name, int(size))) for name, size in (entry.split() for entry in queued.split(","))]
        channel = Channel(
            ChannelDescriptor(int(channel_id, 16), priority=int(priority), send_queue_capacity=len(named))
        )
        for _, message in named:
            assert channel.enqueue(message)
        messages[channel.id] = named
        channels.append(channel)
    return channels, messages


def _message(name: str, size: int) -> bytes:
    """Distinct bytes per message, so that a packet's payload shows which message it is from."""
    return (name.encode() * size)[:size]


def _expected(header, rows):
    """(channel, message, payload, eof, wire) per packet, and the ratio cells per packet."""
    ratio_columns = header[1:-5]
    packets, ratios = [], []
    for n, row in enumerate(rows, start=1):
        assert row[0] == str(n), f"packet rows must be numbered 1, 2, ...: {row}"
        sends, name, payload, eof, wire = row[-5:]
        packets.append((int(sends, 16), name, int(payload), {"00": False, "01": True}[eof], int(wire)))
        ratios.append(dict(zip((int(c, 16) for c in ratio_columns), row[1:-5], strict=True)))
    return packets, ratios


def _describe(data: bytes, messages) -> list[tuple]:
    """The msg packets of ``data`` as (channel, message name, payload, eof, wire bytes),
    checking that each carries the next bytes of its channel's current message."""
    pending = {channel: list(named) for channel, named in messages.items()}
    offsets = dict.fromkeys(messages, 0)
    wires = [len(p) for p in split_packets(data) if p[0] == PacketType.MSG]
    out = []
    for (channel, eof, payload), wire in zip(msg_payloads(data), wires, strict=True):
        name, message = pending[channel][0]
        start = offsets[channel]
        assert bytes(payload) == message[start : start + len(payload)], (
            f"packet on {channel:#04x} is not {name}'s next bytes"
        )
        offsets[channel] = start + len(payload)
        if eof:
            assert offsets[channel] == len(message), f"{name} ended early"
            pending[channel].pop(0)
            offsets[channel] = 0
        out.append((channel, name, len(payload), eof, wire))
    return out


@pytest.fixture(scope="module")
def example():
    return _spec_example()


def test_the_spec_example_is_the_order_packet_by_packet(example):
    payload, setup, header, rows = example
    expected, expected_ratios = _expected(header, rows)
    channels, messages = _setup(setup)
    by_id = {c.id: c for c in channels}
    scheduler = Scheduler(channels, now=0.0)
    stream = []
    for n, ratios in enumerate(expected_ratios, start=1):
        for channel_id, cell in ratios.items():
            channel = by_id[channel_id]
            if cell == NOT_PENDING:
                assert not channel.is_pending, f"packet {n}: channel {channel_id:#04x} still has something pending"
            else:
                ratio = scheduler.recently_sent(channel, 0.0) / channel.priority
                assert channel.is_pending and f"{ratio:.1f}" == cell, (
                    f"packet {n}: channel {channel_id:#04x} ratio {ratio:.1f}, the spec says {cell}"
                )
        parts, wire = scheduler.next_packets(0.0, payload, budget=1)
        assert len(split_packets(b"".join(parts))) == 1 and wire == len(b"".join(parts))
        stream.extend(parts)
    assert not scheduler.pending(), "the scheduler has packets the spec example does not list"
    assert _describe(b"".join(stream), messages) == expected


def test_the_spec_example_is_the_order_in_one_call(example):
    payload, setup, header, rows = example
    expected, _ = _expected(header, rows)
    channels, messages = _setup(setup)
    parts, sent = Scheduler(channels, now=0.0).next_packets(0.0, payload, budget=1 << 20)
    data = b"".join(parts)
    assert _describe(data, messages) == expected
    assert sent == len(data) == sum(packet[-1] for packet in expected)


def test_a_connection_sends_the_example_after_its_control_packets(example):
    """Connection.data_to_send: the pong queued by a ping first, then the spec's packets."""
    payload, setup, header, rows = example
    expected, _ = _expected(header, rows)
    template, messages = _setup(setup)
    descriptors = [ChannelDescriptor(c.id, priority=c.priority, send_queue_capacity=c.capacity) for c in template]
    conn = open_connection(channels=descriptors, peer_payload=payload)
    assert conn.receive_data(bytes([PacketType.PING]), 0.0) == []
    for channel_id, named in messages.items():
        for _, message in named:
            assert conn.queue_message(channel_id, message)
    data = conn.data_to_send(0.0)
    kinds = [kind for kind, _ in decode_stream(data)]
    assert kinds == [PacketType.PONG] + [PacketType.MSG] * len(expected)
    assert _describe(data, messages) == expected
