"""Per-node counters that outlive sessions (``Switch.node_counters``, ``PeerStats``).

``resume_rejections`` (sessions ended by SessionRejected), ``grace_expiries``,
``duplicates_refused``, ``duplicates_replaced``, ``simultaneous_dials``
(specs/resume.md section 7.5). The table is bounded: strangers come and go (a flood of
hellos from made-up node ids), so past ``NODE_COUNTERS_KEPT`` nodes the oldest entries
of nodes the node no longer knows are dropped.
"""

from __future__ import annotations

#: How many nodes' counters are kept; past it the oldest of nodes now unknown are dropped.
NODE_COUNTERS_KEPT = 1024
#: The counters of each node.
NODE_COUNTERS = (
    "resume_rejections",
    "grace_expiries",
    "duplicates_refused",
    "duplicates_replaced",
    "simultaneous_dials",
)


class NodeCounters(dict):
    """node id -> {counter: int}, in the order nodes were first counted."""

    def count(self, node_id: str, counter: str, *, keep) -> None:
        """Add one to ``counter`` of ``node_id``; ``keep(node_id)`` says which nodes must
        not be forgotten when the table is full (those with a session or a dialer)."""
        counters = self.get(node_id)
        if counters is None:
            if len(self) >= NODE_COUNTERS_KEPT:
                self._forget(keep)
            counters = self[node_id] = dict.fromkeys(NODE_COUNTERS, 0)
        counters[counter] += 1

    def _forget(self, keep) -> None:
        for node_id in list(self):
            if len(self) < NODE_COUNTERS_KEPT // 2:
                break
            if not keep(node_id):
                del self[node_id]
