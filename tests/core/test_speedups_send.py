"""The compiled twin of the send path (``schedule`` in mconn/core/_speedups.pyx) does what
``mconn.core.channel.schedule`` does: the scheduler's pick across channels, the packets'
chunking and their headers.

The reference and the twin run side by side on two copies of the same channels, drawn at
random: priorities, decayed byte counts (``stored_sent``), queued messages of every size
around the packet payload and the twin's copy threshold, a message half sent, send-delay
sampling, times that rescale the stored counts, payloads and budgets from 1 byte up and
past what a C integer holds. Over a few calls in a row they must give the same bytes
(``parts`` joined: the twin frames runs of small packets into one bytes object, so its
pieces differ), the same wire byte counts, the same errors (type and message), and leave
the channels, their statistics, the send-delay histograms and the scheduler in the same
state. Both are called directly, so this runs whatever MCONN_PURE says; skipped only when
the extension is not built.
"""

from __future__ import annotations

import importlib
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mconn.core import channel, connection, speedups
from mconn.core.channel import Channel, ChannelDescriptor, Scheduler, SendDelay

try:
    compiled = importlib.import_module("mconn.core._speedups")
except ImportError as e:  # pragma: no cover - the build skipped it
    pytest.skip(f"the compiled twin mconn.core._speedups is not built ({e}); `make` builds it", allow_module_level=True)

TWIN = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HUGE = 1 << 70  # past any C integer: "no limit"
COPY_MAX = compiled.COPY_MAX


class Ticks:
    """A send-delay clock that moves 0.25 s a reading: both copies read the same times
    if, and only if, they read it equally often."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


def _sizes(payload: int) -> st.SearchStrategy[int]:
    """Message sizes around where the framing changes: 0, the payload, COPY_MAX."""
    edges = {0, 1, payload - 1, payload, payload + 1, 2 * payload + 3, COPY_MAX, COPY_MAX + 1}
    return st.sampled_from(sorted(e for e in edges if 0 <= e <= 20000)) | st.integers(0, 3 * min(payload, 5000))


@st.composite
def worlds(draw):
    """A description of channels and calls; ``_build`` makes identical copies of it."""
    payload = draw(st.sampled_from([1, 2, 7, 100, 1024, COPY_MAX, COPY_MAX + 1, 65536, HUGE]))
    ids = draw(st.lists(st.integers(0, 255), min_size=1, max_size=4, unique=True))
    specs = []
    for cid in ids:
        sizes = draw(st.lists(_sizes(payload), max_size=6))
        specs.append(
            {
                "id": cid,
                "priority": draw(st.sampled_from([1, 1, 2, 3, 5, 10, 1000])),
                "stored": draw(st.sampled_from([0.0, 1.0, 512.5, 1e6, 3.3e9]) | st.floats(0, 1e7)),
                "messages": [bytes([n % 251]) * size for n, size in enumerate(sizes)],
                # A message half sent before the calls (its first packets went out).
                "sending": draw(st.one_of(st.none(), st.integers(1, 3 * min(payload, 3000) + 1))),
                "delay_every": draw(st.sampled_from([None, None, 1, 3])),
                "stamped": draw(st.booleans()),
            }
        )
    calls = [
        (
            draw(st.sampled_from([0.0, 0.001, 1.5, 30.0, 300.0, 1e4]) | st.floats(0, 1e3)),
            draw(st.sampled_from([-1, 0, 1, 50, 1500, 65536, 1 << 20, HUGE]) | st.integers(1, 40000)),
        )
        for _ in range(draw(st.integers(1, 4)))
    ]
    return {"payload": payload, "channels": specs, "epoch": draw(st.sampled_from([0.0, 5.0])), "calls": calls}


def _build(world):
    """Channels and a scheduler as the description says, each with its own clock."""
    channels = []
    for spec in world["channels"]:
        c = Channel(ChannelDescriptor(spec["id"], priority=spec["priority"], send_queue_capacity=16))
        c.stored_sent = spec["stored"]
        if spec["delay_every"] is not None:
            c.set_send_delay(SendDelay(Ticks(), every=spec["delay_every"]))
        if spec["sending"] is not None:
            message = bytes(range(256)) * (spec["sending"] // 256 + 1)
            c.writable_queue().append(message[: spec["sending"]] + b"!")
            c.emit([], world["payload"], 1)  # its first packet (or all of it) is out
        for m in spec["messages"]:
            if spec["stamped"]:
                c.writable_queue().append(m)
            else:
                c.enqueue(m)
        channels.append(c)
    return channels, Scheduler(channels, now=world["epoch"])


def _float(value):
    return "nan" if isinstance(value, float) and math.isnan(value) else value


def _state(channels, scheduler):
    out = []
    for c in channels:
        delay = c.send_delay
        out.append(
            (
                c.id,
                [bytes(m) for m in c.queue],
                type(c.queue).__name__,
                None if c.sending is None else (type(c.sending).__name__, bytes(c.sending)),
                c.offset,
                _float(c.stored_sent),
                (c.stats.messages_sent, c.stats.bytes_sent, c.stats.messages_received, c.stats.bytes_received),
                (c._stamp_at, c._stamp_time, c._skipping),
                None if delay is None else (list(delay.counts), delay.total, delay.count, delay.clock.now),
            )
        )
    return out, _float(scheduler.epoch), scheduler.taken


def _run(schedule, world):
    channels, scheduler = _build(world)
    said = []
    for now, budget in world["calls"]:
        parts: list = []
        try:
            sent = schedule(scheduler, parts, now, world["payload"], budget)
            result = ("sent", sent)
        except Exception as e:
            result = ("error", type(e).__name__, str(e))
        assert all(type(p) in (bytes, memoryview) for p in parts)
        said.append((result, b"".join(parts)))
    return said, _state(channels, scheduler)


@TWIN
@given(worlds())
def test_schedule_twin_sends_the_same_bytes_and_leaves_the_same_state(world):
    pure = _run(channel.schedule, world)
    twin = _run(compiled.schedule, world)
    assert twin == pure


@TWIN
@given(worlds(), st.sampled_from([0, -3]))
def test_a_payload_below_one_byte_is_refused_by_both(world, payload):
    world = {**world, "payload": 1}
    for schedule in (channel.schedule, compiled.schedule):
        channels, scheduler = _build(world)
        with pytest.raises(ValueError, match=f"packet payload must be at least 1 byte, got {payload}"):
            schedule(scheduler, [], 1.0, payload, 1000)


@pytest.mark.parametrize(
    "now, error",
    [
        (-1e4, "ZeroDivisionError"),  # exp() of the decay underflows to 0
        (math.nan, "ValueError"),  # int(NaN)
    ],
)
def test_times_that_break_the_arithmetic_fail_alike(now, error):
    """Two pending channels compare ratios: a time far before the epoch or NaN fails in
    the reference's arithmetic, and the twin raises the same error."""
    world = {
        "payload": 100,
        "epoch": 0.0,
        "calls": [(now, 1000)],
        "channels": [
            {"id": i, "priority": 1, "stored": 0.0, "messages": [b"x" * 300], "sending": None}
            | {"delay_every": None, "stamped": False}
            for i in (1, 2)
        ],
    }
    pure, twin = _run(channel.schedule, world), _run(compiled.schedule, world)
    assert pure[0][0][0][:2] == ("error", error)
    assert twin == pure


def test_a_run_of_small_messages_is_one_bytes_object():
    """The twin frames a run of small packets into one bytes object (what it saves the
    join), and keeps a large message as it is (no copy before the join)."""
    c = Channel(ChannelDescriptor(0x10, send_queue_capacity=8))
    big = bytes(COPY_MAX + 1)
    for m in (b"a", b"bc", big, b"d"):
        assert c.enqueue(m)
    parts: list = []
    sent = compiled.schedule(Scheduler([c], now=0.0), parts, 0.0, 65536, 1 << 20)
    assert [type(p) for p in parts] == [bytes, bytes, bytes]
    assert parts[1] is big
    assert b"".join(parts) == (
        b"\x03\x10\x01\x01\x01a"
        + b"\x03\x10\x01\x01\x02bc"
        + b"\x03\x10\x01\x02\x10\x01"
        + big
        + b"\x03\x10\x01\x01\x01d"
    )
    assert sent == len(b"".join(parts))


def test_a_channel_subclass_is_scheduled_by_the_reference():
    """The twin reads Channel's slots where they are stored: any other class goes to the
    reference, which gives the same bytes."""

    class Traced(Channel):
        __slots__ = ("emits",)

        def emit(self, parts, payload, budget):
            self.emits = getattr(self, "emits", 0) + 1
            return super().emit(parts, payload, budget)

    c = Traced(ChannelDescriptor(0x10, send_queue_capacity=4))
    c.enqueue(b"hello")
    parts: list = []
    assert compiled.schedule(Scheduler([c], now=0.0), parts, 0.0, 1024, 1000) == 10
    assert c.emits == 1 and b"".join(parts) == b"\x03\x10\x01\x01\x05hello"


def test_the_twin_is_current_and_its_constants_are_the_schedulers():
    assert compiled.INTERFACE == speedups.INTERFACE
    assert compiled.DECAY_TAU == channel.DECAY_TAU
    assert compiled.RESCALE_EXPONENT == channel._RESCALE_EXPONENT


def test_the_twin_is_what_the_scheduler_and_connection_use_unless_mconn_pure():
    """With the extension built and MCONN_PURE unset, Scheduler.next_packets and
    Connection.data_to_send run the twin; with MCONN_PURE=1, the reference."""
    expected = channel.schedule if speedups.SPEEDUPS is None else compiled.schedule
    assert channel.active_schedule is expected
    assert connection.active_schedule is expected


def test_an_unset_slot_fails_as_getattr_does():
    """A Channel made without __init__ has no ``sending``: the twin, reading the slot
    where it is stored, raises the AttributeError the reference's getattr raises."""
    errors = []
    for schedule in (channel.schedule, compiled.schedule):
        with pytest.raises(AttributeError) as raised:
            schedule(Scheduler([Channel.__new__(Channel)], now=0.0), [], 0.0, 100, 100)
        errors.append(str(raised.value))
    assert errors[0] == errors[1] == "'Channel' object has no attribute 'sending'"


# -- Connection.buffers_to_send: data_to_send unjoined ------------------------------------


def _open_pair(config, channels):
    """A dialing and a listening Connection, their hellos exchanged (both open)."""
    from mconn.config import Config
    from mconn.core.handshake import make_hello

    ends = []
    for node_id in ("a" * 40, "b" * 40):
        cfg = config or Config()
        hello = make_hello(node_id=node_id, channels=channels, max_packet_payload=cfg.max_packet_payload)
        ends.append(connection.Connection(config=cfg, hello=hello, channels=channels, now=0.0))
    a, b = ends
    b.receive_data(a.data_to_send(0.0), 0.0)
    a.receive_data(b.data_to_send(0.0), 0.0)
    assert a.state is connection.State.OPEN
    return a


@st.composite
def send_runs(draw):
    """Queued messages on two channels, a packet payload, a send rate or none, and the
    budgets of a few calls in a row (None: the default write_batch_bytes)."""
    sizes = st.integers(0, 3 * COPY_MAX) | st.sampled_from([0, COPY_MAX, COPY_MAX + 1, 65536, 70000])
    return {
        "messages": draw(st.lists(st.tuples(st.sampled_from([0x10, 0x20]), sizes), max_size=12)),
        "payload": draw(st.sampled_from([1024, 4096, 65536])),
        "send_rate": draw(st.sampled_from([None, 1 << 20])),
        "budgets": draw(st.lists(st.none() | st.integers(1, 300000), min_size=1, max_size=6)),
        "control": draw(st.booleans()),
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(send_runs())
def test_buffers_to_send_is_data_to_send_unjoined(run):
    """``Connection.buffers_to_send`` returns what ``data_to_send`` returns, as the pieces
    it joins: call for call, on two copies of the same open connection, the same bytes
    (the pieces joined), ``more_to_send``, ``bytes_sent`` and send-rate state; [] exactly
    when data_to_send gives b"". Whatever the active scheduler (compiled or pure)."""
    from mconn.config import Config

    channels = [ChannelDescriptor(0x10, send_queue_capacity=16), ChannelDescriptor(0x20, send_queue_capacity=16)]
    config = Config(send_rate=run["send_rate"])
    joined, pieces = _open_pair(config, channels), _open_pair(config, channels)
    for end in (joined, pieces):
        end.set_packet_payload(run["payload"])
        for i, (channel_id, size) in enumerate(run["messages"]):
            end.queue_message(channel_id, bytes([i % 251]) * size)
        if run["control"]:
            end.send_ack({0x10: 1})
    for step, budget in enumerate(run["budgets"]):
        now = 1.0 + step * 0.01
        data = joined.data_to_send(now, budget)
        buffers = pieces.buffers_to_send(now, budget)
        assert all(type(b) in (bytes, memoryview) for b in buffers)
        assert b"".join(buffers) == data
        assert (buffers == []) == (data == b"")
        assert pieces.more_to_send == joined.more_to_send
        assert pieces.bytes_sent == joined.bytes_sent
        if run["send_rate"] is not None:
            assert pieces._send_bucket.available(now) == joined._send_bucket.available(now)


def test_a_bulk_write_keeps_its_payloads_as_views_of_the_queued_message():
    """A 64 KiB packet's payload is a view of the queued message, not a copy: the bytes
    a ``sendmsg`` hands the kernel without the join's copy (write_through.send_buffers)."""
    a = _open_pair(None, [ChannelDescriptor(0x10, send_queue_capacity=4)])
    a.set_packet_payload(65536)
    message = bytes(range(256)) * 1024  # 256 KiB
    a.queue_message(0x10, message)
    buffers = a.buffers_to_send(1.0, 200000)
    views = [b for b in buffers if type(b) is memoryview]
    assert views and all(v.obj is message and len(v) == 65536 for v in views)
    assert len(views) == 4  # 3 packets are short of the 200,000-byte budget: the 4th crosses it
    assert a.more_to_send
