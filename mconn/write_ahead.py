"""The write-ahead: how many bytes the protocol writes into its transport at a time
(specs/connection.md section 7). Pure: time and byte counts come in as arguments.

Theory of operation
-------------------
Bytes written into the transport are beyond the scheduler's reach: a high-priority
message waits behind them. Twisted's TCP transport pauses its producer only past its
``bufferSize`` (64 KiB) and resumes it only once its buffer is empty, so the protocol
used to leave up to 64 KiB in user space ahead of the next message, on top of the
kernel's unsent queue (``tcp_notsent_lowat``): 33 ms at 20 Mbit/s. Instead the protocol
pauses itself after every write (Twisted resumes it once the kernel has taken the
write, which TCP_NOTSENT_LOWAT delays until the kernel's unsent queue is below its
bound) and sizes each write to ``write_ahead_time`` seconds at the link's drain rate.

The rate is measured over windows of at least ``WINDOW`` write-ahead times made only of
write cycles that used their whole budget (a cycle that ran out of data says nothing
about the link, and restarts the window): the bytes the peer acknowledged meanwhile
(TCP_INFO's ``tcpi_bytes_acked``) over the window's length, or, where the kernel does
not say, the bytes the transport took (an over-estimate while the path's queues fill).
Samples are averaged with weight 1/4. A counter over a window, rather than the kernel's
per-acknowledgement ``tcpi_delivery_rate``, because the latter jumps to several times the
link's rate when acknowledgements bunch up (bench/RESULTS.md, issue 13). On loopback the
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
        self._full = False
        self._window: tuple[float, int] | None = None

    def wrote(self, count: int, full: bool) -> None:
        """``count`` bytes were written; ``full``: the write used its whole budget."""
        self._written += count
        self._full = self._full or full

    def resumed(self, now: float, acked) -> None:
        """The transport took everything written. ``acked()`` is the kernel's count of
        bytes the peer acknowledged on this connection (None: unknown); it is asked only
        when a window starts or ends, not on every write."""
        if not self._full:
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
        self._full = False

    def _counter(self, acked) -> int:
        count = acked()
        return self._written if count is None else count
