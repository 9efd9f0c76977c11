"""A token bucket for send_rate and recv_rate, with time passed in (no clock reads).

Tokens refill continuously at ``rate`` bytes per second up to ``burst``. Spending may
overdraw the bucket; the next spend waits until the debt is repaid, so the long-run rate
is exact while single packets are never split. ``burst`` defaults to 10 ms of traffic
(at least two full packets), so the rate holds at a fine grain instead of in 100 ms
lumps as in the reference implementation.
"""

from __future__ import annotations

import math


#: Refilled tokens this close below one whole byte count as one (see ``_refill``).
ROUNDING = 1e-6
#: The default burst, in seconds of the rate (at least ``min_burst`` bytes).
BURST_TIME = 0.01


class TokenBucket:
    """Rate limiter: ``available(now)`` bytes may go out now; ``spend(n)`` records them."""

    def __init__(self, rate: float, now: float, *, burst: float | None = None, min_burst: int = 2068) -> None:
        self._fixed_burst = burst
        self._min_burst = min_burst
        self._set(rate)
        self._tokens = self.burst
        self._stamp = now

    def _set(self, rate: float) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        self.rate = float(rate)
        burst = self._fixed_burst
        self.burst = float(burst if burst is not None else max(rate * BURST_TIME, self._min_burst))

    def set_rate(self, rate: float, now: float) -> None:
        """Refill at ``rate`` from ``now`` on (the tokens until ``now`` at the old one);
        the default burst follows the rate, and tokens above the new burst are dropped
        (a debt is kept: it was spent)."""
        self._refill(now)
        self._set(rate)
        self._tokens = min(self._tokens, self.burst)

    def _refill(self, now: float) -> None:
        if now > self._stamp:
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
        if 1 - ROUNDING < self._tokens < 1:
            self._tokens = 1.0  # woken at ready_time(): float rounding must not leave 0.99999...

    def available(self, now: float) -> float:
        """Bytes that may be spent at ``now`` (<= 0 means wait until ``ready_time()``)."""
        self._refill(now)
        return self._tokens

    def spend(self, nbytes: int, now: float) -> None:
        self._refill(now)
        self._tokens -= nbytes

    def ready_time(self) -> float | None:
        """When at least one whole byte may be spent; None if it may be already."""
        if self._tokens > 1 - ROUNDING:
            return None
        # Never the same instant again: a time that rounds to the stamp would refill nothing.
        return max(self._stamp + (1 - self._tokens) / self.rate, math.nextafter(self._stamp, math.inf))
