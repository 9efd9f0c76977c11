"""HeapClock: a ``task.Clock`` whose pending calls sit in a heap, for networks of many nodes.

``task.Clock`` keeps its calls in a list that it sorts again at every ``callLater`` and
after every call it runs, and cancels by ``list.remove``: each costs a pass over every
pending call. A MemoryNetwork of a thousand Switches holds tens of thousands of timers
(keepalives, acknowledgements, PEX rounds, byte deliveries), so those passes make the
run quadratic. HeapClock keeps them in a binary heap instead: scheduling, cancelling and
running a call cost O(log n).

It is a drop-in ``task.Clock``: ``advance`` runs every call due by the new time, in time
order (calls at one time in the order they were scheduled), with ``seconds()`` already at
the new time, as ``task.Clock.advance`` does; ``run`` instead stops at each call's time,
so every timer fires on time (``MemoryNetwork.run`` does this for a ``task.Clock``, at the
cost of a pass over the pending calls per event). ``DelayedCall.reset``, ``delay`` and
``cancel`` work as on ``task.Clock``; ``calls`` is not kept (``getDelayedCalls`` builds the
list of pending calls when asked).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from twisted.internet.base import DelayedCall
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.task import Clock

__all__ = ["HeapClock"]


class HeapClock(Clock):
    """A ``task.Clock`` with its pending calls in a heap (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[float, int, DelayedCall]] = []
        self._order = itertools.count()
        self._cancelled = 0

    def callLater(self, delay: float, callable: Callable[..., object], *args: object, **kw: object) -> IDelayedCall:
        # The parameters are named as IReactorTime.callLater names them.
        call = DelayedCall(self.seconds() + delay, callable, args, kw, self._cancel, self._push, self.seconds)
        self._push(call)
        return call

    @property
    def queued(self) -> int:
        """Entries in the heap: the pending calls, and cancelled ones not yet dropped."""
        return len(self._heap)

    def getDelayedCalls(self):
        pending = {id(c): c for _, _, c in sorted(self._heap) if not c.cancelled and not c.called}
        return sorted(pending.values(), key=lambda c: c.getTime())

    def advance(self, amount: float) -> None:
        self.rightNow += amount
        self._run_due(self.rightNow, on_time=False)

    def run(self, seconds: float) -> None:
        """Let ``seconds`` pass, each call running with ``seconds()`` at its own time."""
        end = self.rightNow + seconds
        self._run_due(end, on_time=True)
        self.rightNow = max(self.rightNow, end)

    def _run_due(self, until: float, *, on_time: bool) -> None:
        heap = self._heap
        while heap and heap[0][0] <= until:
            when, _, call = heapq.heappop(heap)
            if call.cancelled:
                self._cancelled = max(0, self._cancelled - 1)
                continue
            if call.called or when > call.getTime():
                continue  # an earlier reset pushed it again; that entry ran it
            if call.getTime() > when:  # reset or delayed to later: wait for then
                # Its time becomes the later one (as task.Clock does), so a reset to an
                # earlier time after this compares with it and pushes the call again;
                # left at the old time, that reset only shortened the delay, and the one
                # entry, at the later time, skipped the call as run by an earlier entry.
                call.activate_delay()
                heapq.heappush(heap, (call.getTime(), next(self._order), call))
                continue
            if on_time and when > self.rightNow:
                self.rightNow = when
            call.called = 1
            call.func(*call.args, **call.kw)

    def _push(self, call: DelayedCall) -> None:
        heapq.heappush(self._heap, (call.getTime(), next(self._order), call))

    def _cancel(self, call: DelayedCall) -> None:
        # Left in the heap (skipped when popped); compacted once most of it is cancelled.
        self._cancelled += 1
        if self._cancelled > 1024 and self._cancelled * 2 > len(self._heap):
            # In place: a cancel from a running call compacts the very list _run_due is
            # popping from. A new list left that loop on the old one, which never saw a
            # call scheduled after it, so they all ran only at the next run or advance
            # (a run of 60 s skipped a minute of timers once a network cancelled enough).
            self._heap[:] = [e for e in self._heap if not e[2].cancelled and e[2] is not call]
            heapq.heapify(self._heap)
            self._cancelled = 0
