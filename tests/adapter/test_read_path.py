"""The per-read and per-write work of the protocol (specs/connection.md section 7): a read
that queues nothing to send does not pump, and a resume that does not end a rate window
does not recompute the packet size. Behaviour stays the same: a ping read is answered,
a close read disconnects, and the packet size follows the rate once it is measured.

StringTransport and a Clock (tests/helpers.py); the write-ahead with a fake clock.
"""

from helpers import open_switch_connection
from mconn import ChannelDescriptor, Config
from mconn.net.write_ahead import WINDOW, WriteAhead
from tests.helpers_core import msg

CH = 0x10
CHANNELS = [ChannelDescriptor(CH, send_queue_capacity=8)]


def counting_data_to_send(h) -> list:
    """Count the core's ``buffers_to_send`` calls (``data_to_send`` unjoined, what the
    pump asks for: each one is a pump's work)."""
    calls = []
    original = h.proto.core.buffers_to_send

    def buffers_to_send(now, budget=None):
        calls.append(now)
        return original(now, budget)

    h.proto.core.buffers_to_send = buffers_to_send
    return calls


def test_a_read_of_messages_only_does_not_pump():
    """Bulk reads deliver messages and queue nothing: no data_to_send per read (it was a
    pump, a budget and a scan of every channel per 64 KiB read); the messages arrive."""
    h = open_switch_connection(channels=CHANNELS)
    calls = counting_data_to_send(h)
    for i in range(5):
        h.feed(msg(CH, bytes([i]) * 1000))
    assert calls == []
    received = [call[3] for call in h.reactor.calls if call[0] == "receive"]
    assert received == [bytes([i]) * 1000 for i in range(5)]


def test_a_read_that_queues_a_pong_still_writes_it():
    """A ping in a read queues a pong: that read pumps, and the pong is written at once."""
    h = open_switch_connection(channels=CHANNELS)
    calls = counting_data_to_send(h)
    h.feed(msg(CH, b"x") + b"\x01")  # a message, then a ping
    assert calls and h.take() == b"\x02"


def test_a_read_that_closes_still_disconnects():
    """A close packet read ends the connection (the core is no longer open, so that
    read pumps, and the pump disconnects): the transport is told to disconnect."""
    from mconn.core.connection import close_packet

    h = open_switch_connection(channels=CHANNELS)
    h.feed(close_packet("done", "bye"))
    assert h.transport.disconnecting


def test_resumed_says_when_the_rate_changed():
    """``WriteAhead.resumed`` returns True only when a window ends and ``rate`` is
    updated (the protocol then sets the packet size), False on every other resume."""
    ahead = WriteAhead(0.001, 65536)
    now, acked, changes = 0.0, 0, []
    for i in range(4 * WINDOW):
        ahead.wrote(ahead.budget(), True)
        now += 0.001
        acked += 1000 * (1 + i % 3)  # a rate that moves, so every sample changes it
        before = ahead.rate
        changed = ahead.resumed(now, lambda acked=acked: acked)
        assert changed == (ahead.rate != before)
        changes.append(changed)
    assert 2 <= sum(changes) <= 4  # one per WINDOW write-ahead times
    assert 1_000_000 < ahead.rate < 3_000_000


def test_a_short_write_cycle_is_not_a_sample():
    """A cycle whose write ran out of data says nothing about the link: no change."""
    ahead = WriteAhead(0.001, 65536)
    ahead.wrote(100, False)
    assert ahead.resumed(1.0, lambda: 100) is False and ahead.rate is None


def test_a_resume_that_takes_nothing_off_a_queue_offers_no_room_but_waiting_sends_still_go(monkeypatch):
    """A bulk channel full of 256 KiB messages (four 64 KiB writes each) and a send
    waiting for room: only the resumes whose write took a message off the queue offer
    room to waiting sends (``room_made``), not the three in four that carry on a
    message already started; the waiting send is accepted, and every message arrives
    whole and in order."""
    from tests.adapter.test_write_ahead import BULK, CHANNELS as BULK_CHANNELS, SocketLikeTransport

    transport = SocketLikeTransport()
    h = open_switch_connection(channels=BULK_CHANNELS, transport=transport)
    transport.drain(len(transport.value()))
    messages = [bytes([i]) * 262144 for i in range(9)]
    for m in messages[:8]:
        assert h.peer.try_send(BULK, m)
    accepted = []
    h.peer.send(BULK, messages[8]).addCallback(accepted.append)
    drains = []
    original = type(h.peer).room_made

    def drain(peer):
        drains.append(h.proto.core.messages_taken)
        return original(peer)

    monkeypatch.setattr(type(h.peer), "room_made", drain)
    resumes = 0
    while transport.value() and resumes < 1000:
        transport.drain(len(transport.value()))  # the link takes the write: a resume
        resumes += 1
    assert accepted == [True]
    assert resumes >= 32 and 0 < len(drains) <= 12  # one per message taken, not per resume
    wire = transport.taken
    positions = [wire.index(m[:1] * 10000) for m in messages]
    assert positions == sorted(positions)


def test_reads_do_not_rearm_the_keepalive_timer_but_the_ping_still_follows_the_last_read():
    """Reads while the keepalive timer is due before ``now + ping_interval`` leave it
    alone (no ``next_deadline``, no new DelayedCall per read); the timer then fires
    early, finds nothing due, and re-arms: the ping goes out ping_interval after the
    last read, not before."""
    h = open_switch_connection(channels=CHANNELS, config=Config(ack_interval=1000.0))  # no ack in the way
    interval = h.switch.config.ping_interval
    deadlines = []
    original = h.proto.core.next_deadline

    def next_deadline(sending=True):
        deadlines.append(sending)
        return original(sending)

    h.proto.core.next_deadline = next_deadline
    for _ in range(30):
        h.clock.advance(1.0)
        h.feed(msg(CH, b"x"))
    # Once, when the handshake's timer (10 s) fired early and re-armed; not per read.
    assert len(deadlines) == 1
    last_read = h.clock.seconds()
    h.take()
    h.clock.advance(interval - 30.0)  # the old deadline: the timer fires, nothing is due
    assert h.take() == b""
    h.clock.advance(last_read + interval - h.clock.seconds() - 0.01)
    assert h.take() == b""
    h.clock.advance(0.02)
    assert h.take() == b"\x01"  # a ping, ping_interval after the last read


def chains_to_receive(h, read: bytes) -> list[list[tuple[str, str]]]:
    """For each message of ``read``, the calls from ``dataReceived`` to Reactor.receive."""
    import traceback

    stacks = []
    h.reactor.on_receive = lambda channel_id, peer, message: stacks.append(traceback.extract_stack())
    h.feed(read)
    chains = []
    for stack in stacks:
        frames = [(frame.filename.split("mconn/")[-1], frame.name) for frame in stack]
        assert frames[-2][1] == "receive"  # RecordingReactor.receive, then its on_receive
        chains.append(frames[frames.index(("net/protocol.py", "dataReceived")) : -2])
    return chains


def test_the_route_of_a_message_from_read_to_receive_is_one_chain_of_named_calls():
    """A message read reaches Reactor.receive through these calls, each a method of the
    module that owns its step (specs/reactor-api.md section 4.1): the protocol's read, the
    core's events, the Peer (ICarriedSession), its receiving side, the reactor set's route.
    No rebound attribute and no callable handed through constructors stands in between,
    so the chain can be followed by reading (and a new detour shows up here). A message
    alone in its read goes through ``deliver``; a run of them, through one loop of
    ``deliver_run`` (one call less per message, and no ``_hand``)."""
    h = open_switch_connection(channels=CHANNELS)
    alone = chains_to_receive(h, msg(CH, b"first")) + chains_to_receive(h, msg(CH, b"second"))
    assert alone == 2 * [
        [
            ("net/protocol.py", "dataReceived"),
            ("switch/peer.py", "deliver"),
            ("switch/peer_delivery.py", "deliver"),
            ("switch/peer_delivery.py", "_hand"),
            ("switch/routing.py", "route"),
        ]
    ]
    run = chains_to_receive(h, msg(CH, b"third") + msg(CH, b"fourth") + msg(CH, b"fifth"))
    assert run == 3 * [
        [
            ("net/protocol.py", "dataReceived"),
            ("switch/peer.py", "deliver_run"),
            ("switch/peer_delivery.py", "deliver_run"),
            ("switch/routing.py", "route"),
        ]
    ]


RUN_CHANNELS = [ChannelDescriptor(CH, send_queue_capacity=8), ChannelDescriptor(CH + 1, send_queue_capacity=8)]


def test_a_run_of_messages_in_one_read_keeps_each_message_s_accounting(monkeypatch):
    """Five messages in one read go through one loop of the receiving side
    (``PeerDelivery.deliver_run``) and each is still handled alone: a receive that
    returns an unfired Deferred makes its channel busy for the messages after it in the
    same read (held, in order, not counted delivered) while the other channel goes on;
    an ack goes out each time one is due (``ack_every_messages`` 2), with the counts up to
    that message, not once per read."""
    from helpers import RecordingReactor
    from twisted.internet import defer

    slow = defer.Deferred()
    record = RecordingReactor.receive

    def receive(reactor, channel_id, peer, message):
        record(reactor, channel_id, peer, message)
        return slow if message == b"m2" else None

    monkeypatch.setattr(RecordingReactor, "receive", receive)
    h = open_switch_connection(channels=RUN_CHANNELS, config=Config(ack_every_messages=2))
    acks = []
    original_send_ack = h.proto.send_ack
    h.proto.send_ack = lambda delivered: (acks.append(dict(delivered)), original_send_ack(delivered))
    read = [(CH, b"m1"), (CH, b"m2"), (CH, b"m3"), (CH + 1, b"m4"), (CH, b"m5"), (CH + 1, b"m6")]
    h.feed(b"".join(msg(ch, m) for ch, m in read))
    assert h.reactor.received() == [b"m1", b"m2", b"m4", b"m6"]
    assert h.peer.session.delivered_counts() == {CH: 2, CH + 1: 2}
    assert acks == [{CH: 2}, {CH: 2, CH + 1: 2}]
    slow.callback(None)
    assert h.reactor.received() == [b"m1", b"m2", b"m4", b"m6", b"m3", b"m5"]
    assert h.peer.session.delivered_counts() == {CH: 4, CH + 1: 2}


def test_a_receive_that_closes_the_peer_ends_the_run_of_its_read():
    """A reactor that closes the peer inside a receive: the messages after it in the same
    read reach no reactor, on either channel, as when each message was handed on alone."""
    h = open_switch_connection(channels=RUN_CHANNELS)
    h.reactor.on_receive = lambda channel_id, peer, message: message == b"m2" and peer.close()
    h.feed(b"".join(msg(CH, m) for m in (b"m1", b"m2", b"m3")) + msg(CH + 1, b"m4"))
    assert h.reactor.received() == [b"m1", b"m2"]
    assert h.peer.session.delivered_counts() == {CH: 2}


def test_an_ack_read_while_the_transport_is_paused_still_lets_a_waiting_send_in():
    """While the transport is paused, ``pump`` writes nothing and returns early; an ack
    read then (room in the recovery buffer, not in the queues) still offers the room to
    a send waiting for it: the send is accepted at once, and its message goes out on the
    transport's resume. A send made while paused is queued and goes out then too."""
    from helpers import messages_in
    from tests.adapter.test_recovery_buffer_full import CH as FULL, CHANNELS as FULL_CHANNELS, MESSAGE, ack_packet, fill

    h = open_switch_connection(channels=FULL_CHANNELS, config=Config(recovery_buffer_bytes=10_000))
    accepted = fill(h)
    h.take()
    after = b"a" * MESSAGE  # as large as those the full buffer refused
    waiting = h.peer.send(FULL, after)
    assert not waiting.called
    h.proto.pauseProducing()
    h.feed(ack_packet({FULL: 2}))
    assert waiting.result is True
    assert h.peer.session.accepted(FULL) == len(accepted) + 1
    assert h.take() == b""  # paused: nothing written yet
    h.proto.resumeProducing()
    assert messages_in(h.take()) == [(FULL, after)]
