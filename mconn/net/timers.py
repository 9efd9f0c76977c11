"""The keepalive timers of every connection on one clock, on one DelayedCall (``Timers``).

Each ``MConnectionProtocol`` follows its core's next deadline (a ping due, a pong or the
handshake overdue, a send-rate budget). With one Twisted DelayedCall each, a listener
with 10,000 peers kept 10,000 of them in the reactor's heap, each with three bound
methods for the garbage collector to walk, and a connect storm paid for one per
handshake (bench/history/2026-11-25.md, "read at accept, one timer per clock"). ``Timers`` keeps the deadlines in
one heap of entries ``[when, number, protocol]`` and one DelayedCall for the earliest, so
the timing is exactly that of one DelayedCall per connection: a protocol's timer runs
at its deadline, or as late as the event loop is; timers due at the same moment run in
the order they were armed; one armed while they run runs in a later turn of the event
loop.

Each timer is told when the run that runs it began (``_on_timer(fired_at)``): how late
that is after its deadline is how late the event loop was, which the protocol checks
before a keepalive verdict (specs/connection.md section 3). The time the run's earlier
timers took is not the loop's: 10,000 keepalive timers due within a second (a connect
storm's peers, a minute later) take a run of tens of milliseconds, more on a busy
machine (bench/RESULTS.md, "An idle listener of 10,000 peers").

A protocol's ``_timer`` is the entry ``arm`` gave it (``[when, number, protocol]``)
while armed, None otherwise. ``cancel`` empties the entry, so the heap never keeps a
closed connection alive (as Twisted's ``DelayedCall.cancel`` drops its function); an
empty entry is skipped when it comes up, or dropped once such entries outnumber the
live ones.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Any

from twisted.logger import Logger

log = Logger(namespace="mconn")

#: Stale entries are dropped from the heap once there are more than this many and more
#: than live ones.
COMPACT_AFTER = 64


class Timers:
    """The timers of the protocols on ``clock`` (an ``IReactorTime``)."""

    def __init__(self, clock) -> None:
        self._clock: Callable[[], Any]
        try:  # weakly: the connections' protocols hold the clock anyway
            self._clock = weakref.ref(clock)
        except TypeError:
            self._clock = lambda: clock
        self._heap: list = []
        self._next_number = 0
        #: Armed entries neither cancelled nor run.
        self._live = 0
        self._call = None

    def arm(self, when: float, protocol) -> list:
        """Run ``protocol._on_timer(fired_at)`` at ``when`` (seconds on the clock;
        ``fired_at``: when the run began); returns the entry, for ``cancel``."""
        entry = [when, self._next_number, protocol]
        self._next_number += 1
        heappush(self._heap, entry)
        self._live += 1
        if self._call is None or when < self._call.getTime():
            self._schedule(when)
        return entry

    def cancel(self, entry: list) -> None:
        """``entry`` is no longer wanted; with none left the DelayedCall goes too."""
        if entry[2] is None:
            return  # run or cancelled already
        entry[2] = None
        self._live -= 1
        heap = self._heap
        if self._live == 0:
            heap.clear()
            if self._call is not None:
                self._call.cancel()
                self._call = None
        elif len(heap) - self._live > max(COMPACT_AFTER, self._live):
            heap[:] = [e for e in heap if e[2] is not None]
            heapify(heap)

    def __len__(self) -> int:
        return self._live

    @property
    def clock(self):
        return self._clock()

    def _schedule(self, when: float) -> None:
        clock = self._clock()
        delay = max(0.0, when - clock.seconds())
        if self._call is None:
            self._call = clock.callLater(delay, self._run)
        else:
            self._call.reset(delay)

    def _run(self) -> None:
        self._call = None
        now = self._clock().seconds()
        heap, last = self._heap, self._next_number
        while heap and heap[0][0] <= now and heap[0][1] < last:
            entry = heappop(heap)
            protocol = entry[2]
            if protocol is None:
                continue  # cancelled
            entry[2] = protocol._timer = None
            self._live -= 1
            try:
                protocol._on_timer(now)
            except Exception:
                log.failure("the timer of a connection failed")
        while heap and heap[0][2] is None:
            heappop(heap)  # cancelled entries at the top
        if heap and (self._call is None or heap[0][0] < self._call.getTime()):
            self._schedule(heap[0][0])


#: The Timers of each clock by the clock's id, held weakly: a Timers with an entry armed
#: is held by its DelayedCall, in the clock's own calls, so it lives as long as the clock
#: and no longer (a test's task.Clock and the connections on it go together); one with
#: none armed is made again when asked for. And the last clock asked for, with its Timers.
_OF_CLOCK: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_LAST: list = [None, None]


def timers_of(clock) -> Timers:
    """The one ``Timers`` of ``clock``."""
    if _LAST[0] is clock:
        return _LAST[1]
    timers = _OF_CLOCK.get(id(clock))
    if timers is None or timers.clock is not clock:  # none yet, or a gone clock's id
        timers = _OF_CLOCK[id(clock)] = Timers(clock)
    _LAST[0], _LAST[1] = clock, timers
    return timers
