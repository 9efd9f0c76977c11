"""The write-ahead: how many bytes the protocol writes into its transport at a time
(specs/connection.md section 7). Pure: time and byte counts come in as arguments.

Theory of operation
-------------------
Bytes written into the transport are beyond the scheduler's reach: a high-priority
message waits behind them. Twisted's TCP transport pauses its producer only past its
``bufferSize`` (64 KiB) and resumes it only once its buffer is empty, so a protocol paused
only by Twisted would leave up to 64 KiB in user space ahead of the next message, on top
of the kernel's unsent queue (``tcp_notsent_lowat``): 33 ms at 20 Mbit/s. Instead the protocol
writes at most ``W`` bytes, ``write_ahead_time`` seconds at the link's drain rate,
between two moments when it knows the transport empty: once its writes since the last
one reach ``W`` it pauses itself, and Twisted resumes it once the kernel has taken them
(which TCP_NOTSENT_LOWAT delays until the kernel's unsent queue is below its bound). A
write short of its budget (nothing more was queued: a round trip, a trickle of small
messages) does not pause; the next write's budget is what is left of ``W``, so the
transport never holds more than ``W`` and one packet, and a message at a time costs
no pause and resume per write.

The rate is measured over windows of at least ``WINDOW`` write-ahead times made only of
write cycles (from one resume to the next) whose every write used its whole budget (a
write that ran out of data says nothing about the link, and restarts the window): the bytes the peer acknowledged meanwhile
(TCP_INFO's ``tcpi_bytes_acked``) over the window's length, or, where the kernel does
not say, the bytes the transport took (an over-estimate while the path's queues fill).
Samples are averaged with weight 1/4. A counter over a window, rather than the kernel's
per-acknowledgement ``tcpi_delivery_rate``, because the latter jumps to several times the
link's rate when acknowledgements bunch up (bench/history/2026-11-24-afternoon.md, "Priority under a shaped
bottleneck"). On loopback the
rate is hundreds of MB/s and a write stays ``write_batch_bytes``; at 20 Mbit/s it is
about 2.5 KB, at 2 Mbit/s one packet.
"""

from __future__ import annotations

#: A rate sample spans at least this many write-ahead times (10 ms by default).
WINDOW = 10


class WriteAhead:
    """Sizes the writes of one connection from the rate its transport drains them at.

    :param ahead_time: ``Config.write_ahead_time``, seconds.
    :param batch: ``Config.write_batch_bytes``, the largest write.
    """

    def __init__(self, ahead_time: float, batch: int) -> None:
        self.ahead_time = ahead_time
        self.batch = batch
        #: Wire bytes of msg packets per write (the last packet may cross it).
        self.size = batch
        #: The measured drain rate, bytes per second (None until measured).
        self.rate: float | None = None
        self._written = 0
        #: Bytes written since the transport last resumed us (all it may still hold).
        self._unconfirmed = 0
        self._full = False
        #: A write of this cycle fell short of its budget.
        self._gap = False
        self._window: tuple[float, int] | None = None

    def budget(self) -> int:
        """Msg bytes the next write may carry: what is left of ``size`` since the
        transport last resumed us (at least 1: one packet)."""
        return max(1, self.size - self._unconfirmed)

    def wrote(self, count: int, full: bool) -> bool:
        """``count`` bytes were written; ``full``: the write used its whole budget.

        Returns whether to pause until the transport has taken everything: the write
        used its budget, or the writes since the last resume add up to ``size``.
        """
        self._written += count
        self._unconfirmed += count
        if full:
            self._full = True
        else:
            self._gap = True
        return full or self._unconfirmed >= self.size

    def resumed(self, now: float, acked) -> bool:
        """The transport took everything written. ``acked()`` is the kernel's count of
        bytes the peer acknowledged on this connection (None: unknown); it is asked only
        when a window starts or ends, not on every write. Returns whether ``rate``
        changed (a window ended)."""
        sampled = False
        if not self._full or self._gap:
            self._window = None
        elif self._window is None:
            self._window = (now, self._counter(acked))
        else:
            start, at_start = self._window
            elapsed = now - start
            if elapsed >= WINDOW * self.ahead_time:
                counter = self._counter(acked)
                sample = (counter - at_start) / elapsed
                rate = sample if self.rate is None else self.rate + (sample - self.rate) / 4
                self.rate = rate
                self.size = max(1, min(self.batch, int(rate * self.ahead_time)))
                self._window = (now, counter)
                sampled = True
        self._full = self._gap = False
        self._unconfirmed = 0
        return sampled

    def _counter(self, acked) -> int:
        count = acked()
        return self._written if count is None else count
