"""TokenBucket: continuous refill, overdraft by one spend, exact long-run rate."""

import pytest

from mconn.core.rate import TokenBucket


@pytest.mark.parametrize("rate", [0, -1, -0.5])
def test_rate_must_be_positive(rate):
    """A zero or negative rate is a ValueError quoting the value."""
    with pytest.raises(ValueError, match=f"rate must be positive, got {rate!r}"):
        TokenBucket(rate, now=0.0)


@pytest.mark.parametrize("rate, burst", [(1000, 2068), (100_000, 2068), (1_000_000, 10_000.0), (5_120_000, 51_200.0)])
def test_default_burst_is_ten_milliseconds_but_at_least_two_packets(rate, burst):
    """The default burst is 10 ms of the rate, but never under two full packets (2068 bytes)."""
    assert TokenBucket(rate, now=0.0).burst == burst


def test_starts_full_and_refills_continuously_up_to_the_burst():
    """The bucket starts full, refills at the rate in proportion to time, and never beyond the burst."""
    bucket = TokenBucket(1000, now=10.0, burst=500)
    assert bucket.available(10.0) == 500
    bucket.spend(500, 10.0)
    assert bucket.available(10.0) == 0
    assert bucket.available(10.1) == pytest.approx(100)
    assert bucket.available(10.25) == pytest.approx(250)
    assert bucket.available(20.0) == 500  # capped


def test_spend_may_overdraw_and_ready_time_is_when_the_debt_is_repaid():
    """spend may overdraw; ready_time is when the debt is repaid and one whole byte is available."""
    bucket = TokenBucket(1000, now=0.0, burst=500)
    bucket.spend(1500, 0.0)
    assert bucket.available(0.0) == -1000
    assert bucket.ready_time() == pytest.approx(1.001)  # when one whole byte may go
    assert bucket.available(0.5) == pytest.approx(-500)
    assert bucket.available(bucket.ready_time()) > 0


def test_ready_time_is_none_when_tokens_are_left():
    """ready_time is None while a whole byte is left, and a time once less than one byte is."""
    bucket = TokenBucket(1000, now=3.0, burst=500)
    bucket.spend(100, 3.0)
    assert bucket.ready_time() is None
    bucket.spend(399.5, 3.0)  # half a byte left: not a whole one
    assert bucket.ready_time() == pytest.approx(3.0005)


def test_time_going_backwards_neither_refills_nor_breaks():
    """A now earlier than the last one adds no tokens, and refilling resumes from the latest time."""
    bucket = TokenBucket(1000, now=5.0, burst=500)
    bucket.spend(500, 5.0)
    assert bucket.available(4.0) == 0
    assert bucket.available(5.1) == pytest.approx(100)


@pytest.mark.parametrize("rate, packet", [(10_000, 1030), (512_000, 1030), (1_000, 4000)])
def test_long_run_rate_is_exact(rate, packet):
    """Spend a packet whenever the bucket allows, polling every millisecond for 60 s."""
    bucket = TokenBucket(rate, now=0.0)
    sent = 0
    steps = 60_000
    for step in range(steps + 1):
        now = step / 1000
        while bucket.available(now) > 0:
            bucket.spend(packet, now)
            sent += packet
    assert rate * 60 <= sent <= rate * 60 + bucket.burst + packet


def test_set_rate_refills_at_the_old_rate_until_now_then_at_the_new_one():
    """set_rate keeps what the old rate refilled up to now, then refills at the new rate."""
    bucket = TokenBucket(1000, now=0.0, burst=5000)
    bucket.spend(5000, 0.0)
    bucket.set_rate(100, 1.0)  # 1000 tokens at the old rate
    assert bucket.rate == 100
    assert bucket.available(1.0) == pytest.approx(1000)
    assert bucket.available(2.0) == pytest.approx(1100)


def test_set_rate_keeps_a_debt_and_the_default_burst_follows_the_rate():
    """A debt stays owed across set_rate; the default burst becomes the new rate's and
    tokens above it are dropped."""
    bucket = TokenBucket(5_120_000, now=0.0)
    assert bucket.burst == 51_200
    bucket.set_rate(1_000_000, 0.0)
    assert bucket.burst == 10_000 and bucket.available(0.0) == 10_000
    bucket.spend(30_000, 0.0)
    bucket.set_rate(2_000_000, 0.0)
    assert bucket.available(0.0) == -20_000
    assert bucket.ready_time() == pytest.approx(20_001 / 2_000_000)


@pytest.mark.parametrize("rate", [0, -1, float("nan")])
def test_set_rate_must_be_positive(rate):
    """set_rate refuses what the constructor refuses, quoting the value."""
    bucket = TokenBucket(1000, now=0.0)
    with pytest.raises(ValueError, match="rate must be positive, got"):
        bucket.set_rate(rate, 1.0)
    assert bucket.rate == 1000
