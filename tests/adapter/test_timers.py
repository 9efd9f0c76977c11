"""The connections' timers on one DelayedCall per clock (mconn/net/timers.py): each runs at
its deadline, in deadline order and then in the order armed, as one DelayedCall each
would; a cancelled or re-armed entry never runs; one armed while timers run waits for a
later turn; a failing timer is logged and the others run; with nothing armed no
DelayedCall is left; stale entries do not pile up; each timer is told when its run
began, however long the timers before it took. And a Switch's connections use it:
a thousand inbound peers leave the clock one DelayedCall, and each is still pinged,
with no stall reported when the run of their timers takes a while."""

import gc
import weakref

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from helpers import RecordingReactor, Telemetry, dialer_hello
from mconn import ChannelDescriptor, Config, Switch
from mconn.net.protocol import MConnectionFactory
from mconn.net.timers import Timers, timers_of
from mconn.core.wire import PacketType, SessionRequest


class Timed:
    """What Timers needs of a protocol: ``_timer`` and ``_on_timer``."""

    def __init__(self, name, ran, clock, then=None):
        self.name, self.ran, self.clock, self.then = name, ran, clock, then
        self._timer = None

    def _on_timer(self, fired_at):
        self.ran.append((self.name, self.clock.seconds()))
        self.fired_at = fired_at
        if self.then is not None:
            self.then(self)


def setup(*names):
    """A clock, the list of timers run, their Timers, and a Timed per name."""
    clock, ran = Clock(), []
    return clock, ran, Timers(clock), [Timed(n, ran, clock) for n in names]


def arm(timers, timed, when):
    timed._timer = timers.arm(when, timed)


def cancel(timers, timed):
    timers.cancel(timed._timer)
    timed._timer = None


def test_timers_run_at_their_deadlines_in_order_on_one_delayed_call():
    clock, ran, timers, (a, b, c, d) = setup(*"abcd")
    arm(timers, a, 5.0)
    arm(timers, b, 2.0)
    arm(timers, c, 5.0)
    arm(timers, d, 3.0)
    assert len(clock.getDelayedCalls()) == 1 and clock.getDelayedCalls()[0].getTime() == 2.0
    clock.advance(1.5)
    assert ran == []
    clock.advance(0.5)
    assert ran == [("b", 2.0)]
    clock.advance(10)  # late: the due ones run at once, in deadline then armed order
    assert ran == [("b", 2.0), ("d", 12.0), ("a", 12.0), ("c", 12.0)]
    assert len(timers) == 0 and clock.getDelayedCalls() == []


def test_a_cancelled_or_rearmed_entry_never_runs_and_nothing_is_left_behind():
    clock, ran, timers, (a, b) = setup("a", "b")
    arm(timers, a, 1.0)
    arm(timers, b, 4.0)
    cancel(timers, a)
    cancel(timers, b)
    arm(timers, b, 3.0)  # re-armed: its entry at 4.0 is stale
    clock.advance(10)
    assert ran == [("b", 10.0)]
    arm(timers, a, 20.0)
    cancel(timers, a)
    assert clock.getDelayedCalls() == []  # nothing armed: no DelayedCall


def test_each_clock_has_one_timers_even_one_without_weak_references():
    class Slotted:
        __slots__ = ("now",)

        def __init__(self):
            self.now = 0.0

    first, second, plain = Clock(), Clock(), Slotted()
    kept = [timers_of(first), timers_of(second), timers_of(plain)]  # none armed: held here
    assert timers_of(first) is kept[0] and kept[0] is not kept[1]
    assert timers_of(plain) is kept[2] and kept[2].clock is plain
    assert timers_of(first) is kept[0] and kept[0].clock is first


def test_a_clock_and_its_timers_go_once_the_clock_is_gone():
    """The table of clocks holds each clock's Timers weakly, and a Timers its clock: a
    test's task.Clock, its Timers and the protocols armed on it are freed together,
    though each protocol refers to the clock."""
    clock = Clock()
    timers = timers_of(clock)
    ran = []
    held = Timed("held", ran, clock)
    arm(timers, held, 5.0)
    timers_of(Clock())  # another clock is the last one asked for
    refs = weakref.ref(clock), weakref.ref(timers), weakref.ref(held)
    del clock, timers, held, ran
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]


def test_a_cancelled_entry_keeps_no_protocol_alive():
    """As DelayedCall.cancel drops its function: a closed connection's cancelled timer,
    still in the heap, does not keep the protocol (and its buffers) from being freed."""
    clock, ran, timers, (keep, gone) = setup("keep", "gone")
    arm(timers, keep, 50.0)
    arm(timers, gone, 10.0)
    cancel(timers, gone)
    ref = weakref.ref(gone)
    del gone
    gc.collect()
    assert ref() is None and len(timers._heap) == 2
    clock.advance(50)
    assert ran == [("keep", 50.0)]


def test_an_earlier_deadline_moves_the_delayed_call_sooner():
    clock, ran, timers, (a, b) = setup("a", "b")
    arm(timers, a, 10.0)
    arm(timers, b, 1.0)
    (call,) = clock.getDelayedCalls()
    assert call.getTime() == 1.0
    clock.advance(1.0)
    assert ran == [("b", 1.0)]
    assert [c.getTime() for c in clock.getDelayedCalls()] == [10.0]


def test_a_timer_armed_while_timers_run_waits_for_a_later_turn():
    """As a callLater(0) made inside a DelayedCall: not in the same run (a protocol that
    re-arms for now cannot loop), but in a later one (task.Clock runs that in the same
    ``advance``; a reactor in its next turn)."""
    clock, ran, runs = Clock(), [], []
    timers = Timers(clock)
    run = timers._run
    timers._run = lambda: (runs.append(len(ran)), run())
    again = Timed("again", ran, clock, then=lambda t: arm(timers, t, clock.seconds()) if len(ran) < 3 else None)
    arm(timers, again, 1.0)
    clock.advance(1.0)
    assert ran == [("again", 1.0)] * 3
    assert runs == [0, 1, 2]  # one timer per run
    assert clock.getDelayedCalls() == []


def test_a_failing_timer_is_logged_and_the_others_run():
    clock, ran = Clock(), []
    timers = Timers(clock)

    def fail(_):
        raise RuntimeError("a bug in a timer")

    telemetry = Telemetry().start()
    try:
        bad, good = Timed("bad", ran, clock, then=fail), Timed("good", ran, clock)
        arm(timers, bad, 1.0)
        arm(timers, good, 1.0)
        clock.advance(1.0)
    finally:
        telemetry.stop()
    assert ran == [("bad", 1.0), ("good", 1.0)]
    failures = [e for e in telemetry.observer if e.get("log_failure") is not None]
    assert failures and failures[0]["log_failure"].check(RuntimeError)


def test_each_timer_is_told_when_its_run_began():
    """Timers due together run in one run; each gets the run's start as ``fired_at``,
    also when the ones before it took time (the clock moved meanwhile)."""
    clock, ran = Clock(), []
    timers = Timers(clock)

    def slow(_):
        clock.rightNow += 0.2  # 200 ms of work, as a task.Clock can show it

    first, second = Timed("first", ran, clock, then=slow), Timed("second", ran, clock)
    arm(timers, first, 1.0)
    arm(timers, second, 1.0)
    clock.advance(1.5)
    assert ran == [("first", 1.5), ("second", 1.7)]
    assert first.fired_at == second.fired_at == 1.5


def test_stale_entries_do_not_pile_up():
    clock, ran = Clock(), []
    timers = Timers(clock)
    keep = Timed("keep", ran, clock)
    arm(timers, keep, 100.0)
    churn = [Timed(i, ran, clock) for i in range(50)]
    for _ in range(40):  # every one re-armed, later, many times: 2,000 entries made
        for t in churn:
            if t._timer is not None:
                cancel(timers, t)
            arm(timers, t, 50.0)
    assert len(timers) == 51
    assert len(timers._heap) <= 51 + max(64, 51) + 1
    assert sum(1 for e in timers._heap if e[2] is not None) == 51  # the others hold no protocol
    clock.advance(100)
    assert sorted(name for name, _ in ran if name != "keep") == list(range(50)) and ran[-1][0] == "keep"


def test_one_switchs_connections_share_one_delayed_call_and_are_each_pinged():
    """A thousand inbound peers on a Switch leave the clock one DelayedCall for their
    keepalive (one each before), and after ping_interval every one of them is pinged."""
    clock = Clock()
    config = Config(
        stats_interval=0,
        max_inbound_peers=2000,
        max_connections_per_ip=2000,
        max_pending_handshakes=2000,
        max_pending_per_group=2000,
    )
    switch = Switch([RecordingReactor([ChannelDescriptor(0x20)])], clock=clock, config=config)
    factory = MConnectionFactory(switch, is_outbound=False)
    before = len(clock.getDelayedCalls())
    transports = []
    for i in range(1000):
        transport = StringTransport(peerAddress=IPv4Address("TCP", "198.51.100.7", 10000 + i))
        proto = factory.buildProtocol(None)
        proto.makeConnection(transport)
        proto.dataReceived(dialer_hello(SessionRequest(session_id=i.to_bytes(16, "big"), resume=False)))
        assert proto.peer is not None
        transport.clear()
        transports.append(transport)
    assert len(clock.getDelayedCalls()) - before == 1
    assert len(timers_of(clock)) == 1000
    clock.advance(config.ping_interval)
    assert all(t.value() == bytes([PacketType.PING]) for t in transports)


def test_a_long_run_of_keepalive_timers_is_not_a_loop_stall():
    """Many connections' keepalive timers due together run in one run that takes a
    while: the later ones are not called late (no loop_stalled, no detour through one
    more turn), and every connection is pinged in that run. Each connection's timer
    here takes 1 ms, so the run of 100 takes 100 ms, past the 50 ms stall threshold."""
    clock = Clock()
    config = Config(
        stats_interval=0,
        max_inbound_peers=200,
        max_connections_per_ip=200,
        max_pending_handshakes=200,
        max_pending_per_group=200,
    )
    switch = Switch([RecordingReactor([ChannelDescriptor(0x20)])], clock=clock, config=config)
    factory = MConnectionFactory(switch, is_outbound=False)
    transports = []
    for i in range(100):
        transport = StringTransport(peerAddress=IPv4Address("TCP", "198.51.100.7", 10000 + i))
        proto = factory.buildProtocol(None)
        proto.makeConnection(transport)
        proto.dataReceived(dialer_hello(SessionRequest(session_id=i.to_bytes(16, "big"), resume=False)))
        transport.clear()
        transports.append(transport)
    clock.advance(config.ping_interval - 1)  # the handshake deadlines' runs are past
    assert all(t.value() == b"" for t in transports)
    for proto in switch.connections:
        core, handle_timeout = proto.core, proto.core.handle_timeout

        def slow(now, handle_timeout=handle_timeout):
            clock.rightNow += 0.001
            return handle_timeout(now)

        core.handle_timeout = slow
    telemetry = Telemetry().start()
    try:
        clock.advance(1)
    finally:
        telemetry.stop()
    assert telemetry.named("loop_stalled") == []
    assert all(t.value() == bytes([PacketType.PING]) for t in transports)
    assert clock.seconds() > config.ping_interval + 0.09  # the timers took 100 ms
