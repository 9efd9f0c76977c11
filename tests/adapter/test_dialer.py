"""The Dialer, its AddressPool and its backoff, on a task.Clock with a hand-fired connect.

Covers the delay schedule and its jitter, pool ordering (fewest failures, shuffling,
discovered addresses, replace), max_reconnects, addresses banned for authentication
failures, choose_address, stop() while waiting and while an attempt is in flight, and
the fields given to on_attempt (mconn/switch/dialer.py).
"""

import random

import pytest
from twisted.internet import defer
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock

from mconn.core.address import PeerAddress, parse_address
from mconn.switch.dialer import (
    AddressPool,
    AddressState,
    AuthenticationError,
    Dialer,
    default_reconnect_delay,
    is_not_retried,
)
from mconn.errors import ConnectionLost, PeerClosed, PeerIdMismatch, PeerRejected

ID_A = "a" * 40
ID_B = "b" * 40
A = f"{ID_A}@10.0.0.1:26656"
B = f"{ID_B}@10.0.0.2:26656"
C = "10.0.0.3:26656"


def no_jitter(attempt):
    return default_reconnect_delay(attempt, jitter=0)


class FakeConnect:
    """``connect(address)``: records each call and returns a Deferred the test fires."""

    def __init__(self):
        self.calls = []  # (PeerAddress, Deferred)

    def __call__(self, address):
        d = defer.Deferred()
        self.calls.append((address, d))
        return d

    @property
    def addresses(self):
        return [str(a) for a, _ in self.calls]

    def fail(self, error=None):
        self.calls[-1][1].errback(error or ConnectionRefusedError("refused"))

    def succeed(self, result="peer"):
        self.calls[-1][1].callback(result)


class Harness:
    """A Dialer over a retain_order pool, recording every callback."""

    def __init__(self, addresses=(A, B, C), **kwargs):
        self.clock = Clock()
        self.connect = FakeConnect()
        self.pool = kwargs.pop("pool", None) or AddressPool(addresses, retain_order=True)
        self.infos, self.connected, self.gave_up = [], [], []
        kwargs.setdefault("reconnect_delay", no_jitter)
        self.dialer = Dialer(
            clock=self.clock,
            connect=self.connect,
            pool=self.pool,
            on_attempt=self.infos.append,
            on_connected=lambda result, state: self.connected.append((result, state)),
            on_give_up=self.gave_up.append,
            **kwargs,
        )

    def fail_next(self, error=None):
        """Let the pending wait run out and fail the attempt it starts."""
        self.clock.advance(self.clock.getDelayedCalls()[0].getTime() - self.clock.seconds())
        self.connect.fail(error)

    def assert_idle(self):
        assert not self.dialer.running
        assert self.clock.getDelayedCalls() == []


# -- default_reconnect_delay ---------------------------------------------------------


def test_the_schedule_without_jitter_is_0_0_then_doubling_milliseconds_up_to_the_cap():
    """Without jitter the delays are 0, 0, then 4 ms doubling each attempt up to the 4 s cap."""
    delays = [default_reconnect_delay(n, jitter=0) for n in range(1, 16)]
    assert delays == [
        0,
        0,
        0.004,
        0.008,
        0.016,
        0.032,
        0.064,
        0.128,
        0.256,
        0.512,
        1.024,
        2.048,
        4.0,
        4.0,
        4.0,
    ]


def test_max_delay_caps_the_schedule_and_huge_attempts_do_not_overflow():
    """max_delay caps the delay, and an attempt number of a million still gives the cap."""
    assert default_reconnect_delay(8, max_delay=0.1, jitter=0) == 0.1
    assert default_reconnect_delay(10**6, jitter=0) == 4.0


def test_jitter_stays_within_its_bounds_and_spreads_the_delays():
    """Jittered delays stay within 25% of the base, cap included, and spread over the whole range."""
    rng = random.Random(1234)
    for attempt in (3, 7, 12, 13, 40):
        base = default_reconnect_delay(attempt, jitter=0)
        samples = [default_reconnect_delay(attempt, rng=rng.random) for _ in range(2000)]
        assert all(0.75 * base <= s <= 1.25 * base for s in samples)
        assert all(s <= 4.0 * 1.25 for s in samples)
        assert min(samples) < 0.78 * base and max(samples) > 1.22 * base
        assert len(set(samples)) > 1900


def test_jitter_leaves_the_first_two_attempts_immediate_and_is_exact_at_its_extremes():
    """The first two attempts stay immediate whatever the jitter; its extremes give exact bounds, never below 0."""
    assert default_reconnect_delay(1, rng=lambda: 0.9) == 0
    assert default_reconnect_delay(2, rng=lambda: 0.9) == 0
    assert default_reconnect_delay(13, jitter=0.5, rng=lambda: 0.0) == 2.0
    assert default_reconnect_delay(13, jitter=0.5, rng=lambda: 1.0) == 6.0
    assert default_reconnect_delay(13, jitter=1, rng=lambda: -3.0) == 0.0  # never negative


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"attempt": 0}, "attempt"),
        ({"attempt": True}, "attempt"),
        ({"attempt": 3, "jitter": 1.5}, "jitter"),
        ({"attempt": 3, "max_delay": -1}, "max_delay"),
    ],
)
def test_out_of_range_arguments_are_refused_by_name(kwargs, word):
    """An attempt below 1 or a bool, jitter over 1 or a negative max_delay is a ValueError naming it."""
    attempt = kwargs.pop("attempt")
    with pytest.raises(ValueError, match=word):
        default_reconnect_delay(attempt, **kwargs)


# -- AddressPool -----------------------------------------------------------------------


def test_a_pool_parses_text_drops_duplicates_and_keeps_the_order_when_asked():
    """AddressPool parses text or takes PeerAddress, drops duplicates, and keeps the order with retain_order."""
    pool = AddressPool([A, parse_address(B), A, C], retain_order=True)
    assert [str(s.address) for s in pool] == [A, B, C]
    assert len(pool) == 3 and pool.states[0] == AddressState(parse_address(A))
    assert A in pool and "10.9.9.9:1" not in pool and "garbage" not in pool


def test_a_pool_is_shuffled_by_its_rng_unless_retain_order():
    """Without retain_order the pool is shuffled by its rng: the same seed gives the same order."""
    addresses = [f"10.0.0.{i}:26656" for i in range(1, 21)]
    first = [str(s.address) for s in AddressPool(addresses, rng=random.Random(5))]
    again = [str(s.address) for s in AddressPool(addresses, rng=random.Random(5))]
    other = [str(s.address) for s in AddressPool(addresses, rng=random.Random(6))]
    assert first == again and sorted(first) == sorted(addresses)
    assert first != addresses and first != other


def test_a_bad_address_is_refused_when_the_pool_is_built():
    """A malformed address is a ValueError when the pool is built, not when it is dialed."""
    with pytest.raises(ValueError, match="missing ':<port>'"):
        AddressPool(["nohost"])


def test_candidates_are_the_unbanned_ordered_by_fewest_failures_stable_on_pool_order():
    """candidates() leaves out banned addresses and orders the rest by failures, ties in pool order."""
    pool = AddressPool([A, B, C], retain_order=True)
    a, b, c = pool.states
    a.failed_attempts, b.failed_attempts, c.failed_attempts = 2, 1, 1
    assert pool.candidates() == [b, c, a]
    b.banned = True
    assert pool.candidates() == [c, a]


def test_discovered_addresses_are_added_once_and_ignored_when_asked():
    """A discovered address is added once, marked discovered; with ignore_discovered nothing is added."""
    pool = AddressPool([A], retain_order=True)
    assert pool.add_discovered(B) is True
    assert pool.add_discovered(parse_address(B)) is False
    assert pool.add_discovered(A) is False
    assert [(str(s.address), s.discovered) for s in pool] == [(A, False), (B, True)]
    ignoring = AddressPool([A], ignore_discovered=True)
    assert ignoring.add_discovered(B) is False and len(ignoring) == 1


def test_replace_keeps_the_state_of_addresses_in_both_pools():
    """replace() keeps the state of addresses still present, adds fresh ones and drops the rest."""
    pool = AddressPool([A, B], retain_order=True)
    pool.add_discovered(C)
    a, b, c = pool.states
    a.failed_attempts, a.did_connect, c.failed_attempts = 3, True, 1
    pool.replace([C, A, "10.0.0.9:1"])
    assert [str(s.address) for s in pool] == [C, A, "10.0.0.9:1"]
    assert pool.states[0] is c and c.failed_attempts == 1 and not c.discovered
    assert pool.states[1] is a and a.failed_attempts == 3 and a.did_connect
    assert pool.states[2] == AddressState(parse_address("10.0.0.9:1"))
    assert pool.get(B) is None and pool.get(b) is None


# -- not retried -------------------------------------------------------------------


@pytest.mark.parametrize(
    "error, banned",
    [
        (PeerIdMismatch(ID_A, ID_B), True),
        (AuthenticationError("bad certificate"), True),
        (PeerRejected("unauthorized", "no"), True),
        (PeerClosed("unauthorized", ""), True),
        (PeerClosed("id_mismatch", "wrong id"), True),
        (PeerRejected("self", "connected to ourselves"), True),
        (PeerClosed("self", "connected to ourselves"), True),
        (PeerRejected("duplicate", "already connected"), False),
        (PeerClosed("shutdown", ""), False),
        (ConnectionLost("gone"), False),
        (ConnectionRefusedError("refused"), False),
    ],
)
def test_which_failures_are_not_retried(error, banned):
    """Id mismatches, authentication failures, unauthorized refusals and an address that led back to this
    node are not retried; other failures are."""
    assert is_not_retried(error) is banned


# -- Dialer: order and backoff ---------------------------------------------------------


def test_the_first_attempt_is_on_the_next_turn_and_attempts_follow_the_schedule():
    """start() dials on the next reactor turn, and each failure waits the scheduled delay before the next."""
    h = Harness(addresses=(A,))
    h.dialer.start()
    assert h.connect.calls == [] and h.dialer.running
    h.clock.advance(0)
    assert len(h.connect.calls) == 1
    waits = []
    for _ in range(5):
        h.connect.fail()
        (pending,) = h.clock.getDelayedCalls()
        waits.append(pending.getTime() - h.clock.seconds())
        h.clock.advance(waits[-1])
    assert waits == pytest.approx([0, 0.004, 0.008, 0.016, 0.032])
    assert [i["delay"] for i in h.infos] == [0, 0, 0.004, 0.008, 0.016]
    assert [i["attempt"] for i in h.infos] == [1, 2, 3, 4, 5]
    assert h.dialer.attempts == 6


def test_the_dialer_goes_round_robin_over_the_addresses_with_fewest_failures():
    """With equal failures the dialer goes round the pool in order."""
    h = Harness()
    h.dialer.start()
    for _ in range(7):
        h.fail_next()
    assert h.connect.addresses == [A, B, C, A, B, C, A]
    assert [s.failed_attempts for s in h.pool] == [3, 2, 2]


def test_an_address_with_fewer_failures_is_preferred():
    """The dialer picks the address with the fewest failures first."""
    h = Harness()
    h.pool.states[0].failed_attempts = 5
    h.pool.states[1].failed_attempts = 1
    h.dialer.start()
    for _ in range(3):
        h.fail_next()
    assert h.connect.addresses == [C, B, C]  # C then ties with B, so they alternate


def test_a_success_marks_the_address_resets_the_counter_and_stops():
    """A success marks the address connected, clears its failures and the attempt counter, and stops dialing."""
    h = Harness()
    h.dialer.start()
    h.fail_next()
    h.clock.advance(0)
    h.connect.succeed("the peer")
    b = h.pool.states[1]
    assert h.connected == [("the peer", b)]
    assert b.did_connect and b.failed_attempts == 0 and b.last_attempt == 0
    assert h.dialer.attempts == 0 and h.infos[-1]["result"] == "connected"
    h.assert_idle()


def test_after_a_break_the_restarted_dialer_begins_again_on_the_address_that_last_worked():
    """A dialer restarted after a success dials the address that connected last first, not the next one
    in the pool (the address the user gave, say through a proxy, stays the one used)."""
    h = Harness()
    h.dialer.start()
    h.fail_next()  # A fails
    h.clock.advance(0)
    h.connect.succeed()  # B connects
    for _ in range(3):  # three breaks, each re-dialed at once on B
        h.dialer.start()
        h.clock.advance(0)
        h.connect.succeed()
    assert h.connect.addresses == [A, B, B, B, B] and h.dialer.attempts == 0


def test_the_address_that_last_worked_loses_its_turn_once_it_fails():
    """After a break the address that last worked is tried first; once it fails, the usual order
    (fewest failures, configured first, round-robin) goes on from it."""
    h = Harness()
    h.dialer.start()
    h.fail_next()  # A
    h.clock.advance(0)
    h.connect.succeed()  # B
    h.dialer.start()
    for _ in range(3):
        h.fail_next()
    assert h.connect.addresses == [A, B, B, C, A]


def test_a_discovered_address_is_tried_only_after_the_configured_ones_failed():
    """An address learnt from the peer (discovered) comes after every configured address with as few
    failures, wherever it sits in the pool; once it failed as often, the configured ones go first again."""
    pool = AddressPool([A], retain_order=True)
    pool.add_discovered(C)
    pool.add_configured(B)  # the pool order is A, C (discovered), B
    h = Harness(pool=pool)
    h.dialer.start()
    for _ in range(6):
        h.fail_next()
    assert h.connect.addresses == [A, B, C, B, A, C]


def test_a_proxy_address_keeps_its_place_after_a_break_though_the_peer_announced_another():
    """The configured proxy address connected; the peer's announced (discovered) address joined the pool.
    After a break the proxy is dialed again; the announced address only once the proxy fails."""
    pool = AddressPool([A], retain_order=True)
    h = Harness(pool=pool)
    h.dialer.start()
    h.clock.advance(0)
    h.connect.succeed()
    pool.add_discovered(f"{ID_A}@10.0.0.9:26656")
    h.dialer.start()
    h.fail_next()  # the proxy is down
    h.fail_next()
    assert h.connect.addresses == [A, A, f"{ID_A}@10.0.0.9:26656"]


def test_a_callback_that_raises_is_logged_and_does_not_stop_the_dialer():
    """An on_attempt callback that raises does not stop the dialer: the next attempt still happens."""
    h = Harness()
    h.dialer.on_attempt = lambda info: 1 / 0
    h.dialer.start()
    h.fail_next()
    h.clock.advance(0)
    assert len(h.connect.calls) == 2
    h.connect.fail()


# -- Dialer: max_reconnects ------------------------------------------------------------


def test_max_reconnects_gives_up_after_that_many_failures():
    """After max_reconnects failures the dialer gives up, naming the count and the last error, and goes idle."""
    h = Harness(max_reconnects=3)
    h.dialer.start()
    for _ in range(3):
        h.fail_next()
    assert len(h.connect.calls) == 3 and len(h.gave_up) == 1
    assert "gave up after 3 failed attempts (max_reconnects=3)" in h.gave_up[0]
    assert f"the last, to {C}, failed with ConnectionRefusedError" in h.gave_up[0]
    h.assert_idle()


def test_start_at_least_once_owes_one_attempt_even_with_max_reconnects_0():
    """max_reconnects 0: start() gives up before any attempt (no re-dial after a break),
    start(at_least_once=True) makes one attempt first (a first dial), then gives up."""
    h = Harness(max_reconnects=0)
    h.dialer.start()
    assert h.connect.calls == [] and len(h.gave_up) == 1
    h.assert_idle()
    h = Harness(max_reconnects=0)
    h.dialer.start(at_least_once=True)
    assert h.gave_up == []
    h.fail_next()
    assert len(h.connect.calls) == 1 and len(h.gave_up) == 1
    assert "gave up after 1 failed attempts (max_reconnects=0)" in h.gave_up[0]
    h.assert_idle()


def test_max_reconnects_counts_again_from_zero_after_a_success():
    """A success resets the count toward max_reconnects."""
    h = Harness(max_reconnects=3)
    h.dialer.start()
    h.fail_next()
    h.fail_next()
    h.clock.advance(0.004)
    h.connect.succeed()
    h.dialer.start()
    for _ in range(2):
        h.fail_next()
    assert h.gave_up == [] and h.dialer.running and h.dialer.attempts == 2
    h.fail_next()
    assert len(h.gave_up) == 1 and len(h.connect.calls) == 6


def test_max_reconnects_counts_again_from_zero_after_the_pool_is_replaced():
    """set_address_pool resets the count toward max_reconnects and dials only the new pool's addresses."""
    h = Harness(max_reconnects=2)
    h.dialer.start()
    h.fail_next()
    h.dialer.set_address_pool([C, "10.0.0.4:26656"])
    h.fail_next()
    h.fail_next()
    assert len(h.gave_up) == 1 and h.dialer.attempts == 2
    # B, chosen before the pool changed, is no longer in it: C and the new one are dialed.
    assert h.connect.addresses == [A, C, "10.0.0.4:26656"]


def test_reset_sets_the_attempt_counter_back_to_zero():
    """reset() sets the attempt counter back to zero, so max_reconnects counts afresh."""
    h = Harness(max_reconnects=2)
    h.dialer.start()
    h.fail_next()
    h.dialer.reset()
    h.fail_next()
    assert h.gave_up == [] and h.infos[-1]["attempt"] == 1


def test_max_reconnects_zero_gives_up_at_once():
    """max_reconnects=0 gives up on start without dialing."""
    h = Harness(max_reconnects=0)
    h.dialer.start()
    assert h.gave_up == ["gave up after 0 failed attempts (max_reconnects=0)"]
    h.assert_idle()


# -- Dialer: not-retried errors -------------------------------------------------------


def test_an_authentication_failure_bans_the_address_and_the_dialer_moves_on():
    """An authentication failure bans the address (result not_retried); the dialer keeps to the others."""
    h = Harness()
    h.dialer.start()
    h.fail_next(PeerIdMismatch(ID_A, ID_B))
    for _ in range(4):
        h.fail_next()
    a = h.pool.states[0]
    assert a.banned and isinstance(a.last_error, PeerIdMismatch)
    assert h.connect.addresses == [A, B, C, B, C]
    assert h.infos[0]["result"] == "not_retried"
    assert [i["result"] for i in h.infos[1:]] == ["failed"] * 4


def test_the_dialer_gives_up_naming_the_addresses_when_all_are_banned():
    """Once every address is banned the dialer gives up, naming each address and its error."""
    h = Harness(addresses=(A, B))
    h.dialer.start()
    h.fail_next(PeerClosed("unauthorized", ""))
    h.fail_next(PeerIdMismatch(ID_B, ID_A))
    assert len(h.gave_up) == 1
    reason = h.gave_up[0]
    assert "all are banned" in reason and A in reason and B in reason
    assert "PeerIdMismatch" in reason and "PeerClosed" in reason
    h.assert_idle()


def test_an_empty_pool_gives_up_at_once():
    """An empty pool gives up on start, saying the pool is empty."""
    h = Harness(addresses=())
    h.dialer.start()
    assert h.gave_up == ["the address pool is empty"]
    h.assert_idle()


# -- Dialer: choose_address ------------------------------------------------------------


def test_choose_address_picks_the_address_and_its_delay():
    """choose_address picks the address and the delay, and gets the previous attempt's info (None first)."""
    seen = []

    def choose(pool, last_info):
        seen.append(last_info)
        return pool.get(C), 7.5

    h = Harness(choose_address=choose)
    h.dialer.start()
    h.clock.advance(7.4)
    assert h.connect.calls == []
    h.clock.advance(0.1)
    h.connect.fail()
    assert h.connect.addresses == [C] and h.infos[0]["delay"] == 7.5
    assert seen[0] is None and seen[1] == h.infos[0]


def test_choose_address_may_name_a_peer_address_and_leave_the_delay_to_the_default():
    """choose_address may return a PeerAddress and a None delay; the default schedule then applies."""
    h = Harness(choose_address=lambda pool, info: (parse_address(B), None))
    h.dialer.start()
    h.fail_next()
    h.fail_next()
    h.fail_next()
    assert h.connect.addresses == [B, B, B]
    assert [i["delay"] for i in h.infos] == [0, 0, 0.004]


@pytest.mark.parametrize(
    "answer",
    [
        (PeerAddress(None, "192.0.2.1", 1), 0.5),
        (None, None),
        None,
        "not a tuple",
    ],
)
def test_an_answer_outside_the_pool_falls_back_to_the_default_order(answer):
    """An address outside the pool or a malformed answer from choose_address falls back to the default order."""
    h = Harness(choose_address=lambda pool, info: answer)
    h.dialer.start()
    h.fail_next()
    h.fail_next()
    assert h.connect.addresses == [A, B]


def test_choose_address_naming_a_banned_address_falls_back():
    """A banned address or a negative delay from choose_address falls back to the default choice."""
    h = Harness(choose_address=lambda pool, info: (A, -1))
    h.pool.states[0].banned = True
    h.dialer.start()
    h.fail_next()
    assert h.connect.addresses == [B] and h.infos[0]["delay"] == 0


def test_choose_address_that_raises_falls_back():
    """A choose_address that raises falls back to the default order."""
    h = Harness(choose_address=lambda pool, info: 1 / 0)
    h.dialer.start()
    h.fail_next()
    assert h.connect.addresses == [A]


# -- Dialer: stop ----------------------------------------------------------------------


def test_stop_during_a_wait_cancels_it():
    """stop() while waiting cancels the wait: no more attempts, however long the clock runs."""
    h = Harness()
    h.dialer.start()
    h.fail_next()
    h.fail_next()
    assert h.clock.getDelayedCalls() != []
    h.dialer.stop()
    h.assert_idle()
    h.clock.advance(100)
    assert len(h.connect.calls) == 2


def test_stop_during_an_attempt_ignores_its_failure():
    """A failure of the attempt in flight at stop() is swallowed: not counted, not reported, not retried."""
    h = Harness()
    h.dialer.start()
    h.clock.advance(0)
    h.dialer.stop()
    h.connect.fail()  # swallowed: no unhandled error in Deferred, no next attempt
    h.assert_idle()
    assert h.infos == [] and h.pool.states[0].failed_attempts == 0


def test_stop_during_an_attempt_ignores_its_success():
    """A success of the attempt in flight at stop() is ignored: no on_connected, address not marked."""
    h = Harness()
    h.dialer.start()
    h.clock.advance(0)
    h.dialer.stop()
    h.connect.succeed()
    h.assert_idle()
    assert h.connected == [] and not h.pool.states[0].did_connect


def test_a_restart_after_stop_ignores_the_old_attempt():
    """After stop() and start(), the old attempt's result is ignored and only the new one counts."""
    h = Harness()
    h.dialer.start()
    h.clock.advance(0)
    old = h.connect.calls[0][1]
    h.dialer.stop()
    h.dialer.start()
    h.clock.advance(0)
    old.errback(ConnectionRefusedError())
    assert len(h.infos) == 0 and len(h.connect.calls) == 2
    h.connect.succeed()
    assert len(h.connected) == 1
    h.assert_idle()


def test_on_attempt_may_stop_the_dialer():
    """on_attempt may call stop(); the dialer then goes idle."""
    h = Harness()
    h.dialer.on_attempt = lambda info: h.dialer.stop()
    h.dialer.start()
    h.fail_next()
    h.assert_idle()


def test_start_twice_makes_one_attempt():
    """A second start() while running makes no extra attempt."""
    h = Harness()
    h.dialer.start()
    h.dialer.start()
    h.clock.advance(0)
    assert len(h.connect.calls) == 1


def test_a_synchronous_failure_waits_for_the_clock():
    """A connect that fails synchronously still waits for the clock between attempts; no recursion."""
    h = Harness(max_reconnects=4)
    h.dialer.connect = lambda address: defer.fail(ConnectionRefusedError())
    h.dialer.start()
    h.clock.advance(0)  # attempts 1 and 2: each failure schedules the next on the clock
    assert h.dialer.attempts == 2 and h.gave_up == []
    h.clock.advance(0.004)
    h.clock.advance(0.008)
    assert len(h.gave_up) == 1
    h.assert_idle()


def test_connect_that_raises_counts_as_a_failure():
    """A connect that raises is a failed attempt whose error is reported."""
    h = Harness()

    def connect(address):
        raise ValueError("no route")

    h.dialer.connect = connect
    h.dialer.start()
    h.clock.advance(0)
    assert h.infos[0]["error"] == "ValueError: no route"


# -- Dialer: on_attempt ---------------------------------------------------------------


def test_on_attempt_reports_every_field():
    """on_attempt gets address, attempt, delay, result and error for each attempt; last_info is the last."""
    h = Harness()
    h.dialer.start()
    h.fail_next()
    h.fail_next(AuthenticationError("bad token"))
    h.clock.advance(0.004)
    h.connect.succeed()
    assert h.infos == [
        {
            "address": A,
            "attempt": 1,
            "delay": 0.0,
            "result": "failed",
            "error": "ConnectionRefusedError: Connection was refused by other side: refused.",
        },
        {"address": B, "attempt": 2, "delay": 0.0, "result": "not_retried", "error": "AuthenticationError: bad token"},
        {"address": C, "attempt": 3, "delay": 0.004, "result": "connected", "error": None},
    ]
    assert h.dialer.last_info == h.infos[-1]
    assert h.pool.states[0].last_attempt == 0 and h.pool.states[2].last_attempt == 0.004
