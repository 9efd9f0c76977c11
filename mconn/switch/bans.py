"""Bans: node ids a local reactor marked bad, refused and not dialed for a while.

``Switch.mark_bad(peer, seconds)`` (specs/reactor-api.md section 6.5) closes the peer and
adds its node id here; ``mconn.switch.authorize.Authorizer`` refuses a banned node's
hello (``PeerRejected("banned")``, inbound and outbound) and the Switch's dial attempts
ask :meth:`BanList.check` before they connect. A ban ends by itself: it is lifted
when its time has passed, read from the Switch's clock.

Only local reactors add entries, never a stranger; still, a reactor that bans every
made-up identity it meets would grow the list without end, so it holds at most
``MAX_BANS``: a full list first forgets the bans that ended, then the ban that ends
first (counted in ``evicted``).
"""

from __future__ import annotations

import math
import types

from mconn.errors import PeerRejected

#: Banned node ids kept at most (specs/security.md, "Bans").
MAX_BANS = 1024


class BanList:
    """Banned node ids, each with the clock time its ban ends.

    :param clock: an ``IReactorTime`` (``seconds()``).
    :param size: bans kept at most.
    """

    def __init__(self, clock, *, size: int = MAX_BANS) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"a ban list size must be an integer >= 1, got {size!r}")
        self.clock = clock
        self.size = size
        #: node id -> (end of the ban, why).
        self._bans: dict[str, tuple[float, str]] = {}
        #: Bans dropped before they ended because the list was full.
        self.evicted = 0

    @property
    def view(self) -> types.MappingProxyType:
        """Node id -> the clock time its ban ends, for the bans in force; read-only."""
        self.lift_ended()
        return types.MappingProxyType({node_id: until for node_id, (until, _) in self._bans.items()})

    def __len__(self) -> int:
        return len(self._bans)

    def ban(self, node_id: str, seconds: float, why: str = "") -> float:
        """Ban ``node_id`` for ``seconds`` (a longer ban in force is kept).

        :returns: the clock time the ban ends.
        :raises ValueError: for a ``seconds`` that is not a positive finite number.
        """
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
            raise ValueError(f"a ban lasts a positive finite number of seconds, got {seconds!r}")
        now = self.clock.seconds()
        until = now + seconds
        old = self._bans.pop(node_id, None)
        if old is not None and old[0] > until:
            until, why = old
        if len(self._bans) >= self.size:
            self.lift_ended()
        while len(self._bans) >= self.size:
            del self._bans[min(self._bans, key=lambda n: self._bans[n][0])]
            self.evicted += 1
        self._bans[node_id] = (until, why)
        return until

    def until(self, node_id: str) -> float | None:
        """The clock time ``node_id``'s ban ends, or None if it is not banned."""
        entry = self._bans.get(node_id)
        if entry is None:
            return None
        if entry[0] <= self.clock.seconds():
            del self._bans[node_id]
            return None
        return entry[0]

    def is_banned(self, node_id: str | None) -> bool:
        return node_id is not None and self.until(node_id) is not None

    def check(self, node_id: str | None) -> None:
        """:raises PeerRejected: ``banned``, naming the node, how long is left and why."""
        if node_id is None:
            return
        until = self.until(node_id)
        if until is not None:
            left = until - self.clock.seconds()
            why = self._bans[node_id][1]
            raise PeerRejected("banned", f"node {node_id} is banned for {left:.1f}s more" + (f": {why}" if why else ""))

    def lift(self, node_id: str) -> bool:
        """End ``node_id``'s ban now. :returns: whether it was banned."""
        return self._bans.pop(node_id, None) is not None

    def lift_ended(self) -> None:
        """Forget the bans that ended."""
        now = self.clock.seconds()
        for node_id in [n for n, (until, _) in self._bans.items() if until <= now]:
            del self._bans[node_id]
