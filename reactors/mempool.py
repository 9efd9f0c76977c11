"""A mempool reactor: CometBFT's ``mempool/reactor.go`` (v1.0) ported to mconn's public API.

Transactions gossip on one channel (0x30, CometBFT's MempoolChannel). As in CometBFT:

* every peer has a sender routine that walks the mempool in arrival order and sends each
  transaction the peer does not have yet, one at a time, waiting for room
  (``peer.send``: a slow peer holds only its own routine);
* a transaction is never sent back to a peer that sent it to us, nor twice to one peer
  (the per-peer *seen* set: what it sent us and what we sent it);
* a transaction from a peer that fails ``check_tx`` is not the peer's fault: it is
  counted (``invalid_txs``) and logged, and the peer stays (CometBFT's Receive logs
  "Could not check tx" and carries on: a transaction valid at its sender may have
  become invalid here, after a block). Only a message the channel cannot carry is the
  peer's fault: one over ``max_tx_bytes`` ends the connection in mconn itself
  (``MessageTooLarge``, as CometBFT's MConnection does past ``RecvMessageCapacity``);
* a full mempool refuses new transactions without blaming the peer.

What is not ported: CometBFT's wire message is a protobuf ``Txs`` (a list of
transactions; an empty list is logged) and an unknown message type stops the peer; here
a message is one raw transaction, so there is no other type to refuse. Its
``broadcast`` switch and the wait for a lagging peer's height (``PeerState``, set by the
consensus reactor, which mconn does not have) are left out, and so are ``CheckTx``'s
ABCI round trip (``check_tx`` is a local call), rechecks after a block, and the cache of
invalid transactions (``keep-invalid-txs-in-cache``). Senders are remembered per peer
in a bounded seen set, not per transaction (CometBFT's ``txSenders``).

Bounds (what a peer can make this reactor hold): the mempool holds ``max_txs``
transactions (CometBFT's ``mempool.size``, 5000); of those, at most ``max_peer_txs``
(default a tenth of ``max_txs``) are charged to any one peer, the one that sent it first,
for as long as they sit in the mempool: past its share a peer's new transactions are
refused (``refused_share``, not an error), so one flooding peer cannot fill the mempool
and the others' transactions are still admitted. Each connected peer's *seen* set is an
:class:`~reactors.lru.LRUSet` of ``seen_capacity`` keys (CometBFT's ``mempool.cache_size``,
10000), and only keys of transactions in the mempool go into it, so a flood of new keys
neither grows it nor pushes out what matters. Forgetting a key costs at most one
duplicate send. ``remove_txs`` (CometBFT's ``Update`` after a block) takes transactions
out and gives their senders' share back.

Theory of operation. ``_routines`` holds, per connected peer, the index of the next
mempool entry to consider and whether a send is in flight. Adding a transaction (local
``add_tx`` or received) appends to ``_order`` and wakes every idle routine. A routine
sends with ``peer.send``; when that fires it moves on. Sessions survive transport breaks
(specs/resume.md), so nothing is re-sent across a resume; a new session (a new Peer)
starts a new routine from the beginning, skipping what the node is known to have.
A removed transaction leaves a hole in ``_order``; once holes are half of it, ``_order``
is compacted and every routine's index moved with it, so ``_order`` stays within twice
the mempool.

A transaction on the wire is the raw bytes; ``check_tx(tx)`` raises ValueError for a bad
one. The default accepts any non-empty transaction up to ``max_tx_bytes``.

Observability (specs/reactor-api.md section 12): ``status()`` is the mempool's section
of the status page; ``metrics(registry)`` adds ``mempool_messages_total`` (by direction,
type ``tx``), ``mempool_size`` and ``mempool_txs_refused_total`` (by reason: ``full``,
``share``, ``invalid``) to the node's ``/metrics``.
"""

from __future__ import annotations

import hashlib

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from twisted.logger import Logger

from mconn import ChannelDescriptor, MessageCounter, Reactor
from reactors.lru import LRUSet

log = Logger(namespace="reactors.mempool")

MEMPOOL_CHANNEL = 0x30
#: Seconds before a transaction whose send found no room within send_timeout is tried again.
RETRY_DELAY = 0.5


class InvalidTransaction(ValueError):
    """A transaction ``check_tx`` refused (raised by ``add_tx``; from a peer it is only
    counted and logged)."""


def tx_key(tx: bytes) -> bytes:
    """The mempool's key of a transaction (CometBFT's TxKey: its SHA-256)."""
    return hashlib.sha256(tx).digest()


class MempoolReactor(Reactor):
    """Gossips transactions to every peer (see the module docstring).

    :param check_tx: ``check_tx(tx)`` raises ValueError for an invalid transaction.
    :param max_txs: transactions the mempool holds; past it new ones are refused
        (default :attr:`MAX_TXS`).
    :param max_tx_bytes: the largest transaction (also the channel's message capacity).
    :param max_peer_txs: transactions in the mempool charged to one peer; past it that
        peer's new ones are refused (default: a tenth of ``max_txs``, at least 1).
    :param seen_capacity: keys in one peer's seen set (default :attr:`SEEN_CAPACITY`).
    """

    name = "mempool"
    #: CometBFT's mempool.size default.
    MAX_TXS = 5000
    #: CometBFT's mempool.cache_size default: twice the mempool, so the key of a
    #: transaction still in it is not forgotten first.
    SEEN_CAPACITY = 10000

    def __init__(
        self,
        *,
        check_tx=None,
        max_txs: int = MAX_TXS,
        max_tx_bytes: int = 64 * 1024,
        max_peer_txs: int | None = None,
        seen_capacity: int = SEEN_CAPACITY,
    ) -> None:
        if max_peer_txs is None:
            max_peer_txs = max(1, max_txs // 10)
        for name, value in (
            ("max_txs", max_txs),
            ("max_tx_bytes", max_tx_bytes),
            ("max_peer_txs", max_peer_txs),
            ("seen_capacity", seen_capacity),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MempoolReactor {name} must be a positive integer, got {value!r}")
        self.check_tx = check_tx
        self.max_txs = max_txs
        self.max_tx_bytes = max_tx_bytes
        self.max_peer_txs = max_peer_txs
        self.seen_capacity = seen_capacity
        #: tx key -> tx, and the keys in arrival order (what the sender routines walk;
        #: None where a transaction was removed), and each key's index in it.
        self.txs: dict[bytes, bytes] = {}
        self._order: list = []
        self._position: dict[bytes, int] = {}
        #: tx key -> the node id it is charged to, and node id -> how many it is charged.
        self._charged_to: dict[bytes, str] = {}
        self._charged: dict[str, int] = {}
        #: connected node id -> LRUSet of tx keys that node has (it sent them to us, or we
        #: sent them to it).
        self._seen: dict[str, LRUSet] = {}
        #: node id -> [peer, next index into _order, send in flight, _pump running].
        self._routines: dict[str, list] = {}
        #: Transactions refused because the mempool was full, or their sender's share was.
        self.refused_full = 0
        self.refused_share = 0
        #: Transactions from peers that ``check_tx`` (or the size check) refused.
        self.invalid_txs = 0
        #: Messages received and sent, by type (one type: a transaction).
        self.messages = MessageCounter("mempool_messages", ["tx"], "Mempool messages, by direction and type.")

    def get_channels(self):
        return [
            ChannelDescriptor(
                MEMPOOL_CHANNEL, priority=5, send_queue_capacity=100, recv_message_capacity=self.max_tx_bytes
            )
        ]

    def footprint(self) -> dict[str, int]:
        """What the reactor holds: transactions, ``_order`` entries (holes included), seen
        sets and the keys in them, peers charged, and the largest share in use."""
        return {
            "txs": len(self.txs),
            "order": len(self._order),
            "seen_sets": len(self._seen),
            "seen_keys": sum(len(seen) for seen in self._seen.values()),
            "largest_seen": max((len(seen) for seen in self._seen.values()), default=0),
            "charged_peers": len(self._charged),
            "largest_share": max(self._charged.values(), default=0),
        }

    def charged(self, node_id: str) -> int:
        """Transactions in the mempool charged to ``node_id``."""
        return self._charged.get(node_id, 0)

    # -- the mempool -------------------------------------------------------------------

    def add_tx(self, tx: bytes, *, sender=None) -> bool:
        """Add a transaction (CometBFT's CheckTx then AddTx); True if it is new.

        A transaction from ``sender`` (a Peer) is charged to it; past its share
        (``max_peer_txs``) it is refused, as past ``max_txs``: False, counted, no error.

        :raises InvalidTransaction: if ``check_tx`` refuses it, naming why.
        """
        self._check(tx)
        key = tx_key(tx)
        seen = self._seen.get(sender.node_id) if sender is not None else None
        if key in self.txs:
            if seen is not None:
                seen.add(key)
            return False
        if len(self.txs) >= self.max_txs:
            self.refused_full += 1
            return False
        if sender is not None:
            charged = self._charged.get(sender.node_id, 0)
            if charged >= self.max_peer_txs:
                self.refused_share += 1
                return False
            self._charged[sender.node_id] = charged + 1
            self._charged_to[key] = sender.node_id
            if seen is not None:
                seen.add(key)
        self.txs[key] = tx
        self._position[key] = len(self._order)
        self._order.append(key)
        for routine in list(self._routines.values()):
            self._pump(routine)
        return True

    def remove_txs(self, txs) -> int:
        """Take transactions out of the mempool (CometBFT's Update, after a block commits
        them); each one's sender gets that part of its share back. Returns how many were in."""
        removed = 0
        for tx in txs:
            key = tx_key(tx)
            if self.txs.pop(key, None) is None:
                continue
            removed += 1
            self._order[self._position.pop(key)] = None
            node_id = self._charged_to.pop(key, None)
            if node_id is not None:
                self._charged[node_id] -= 1
                if not self._charged[node_id]:
                    del self._charged[node_id]
        if len(self._order) - len(self.txs) > len(self._order) // 2:
            self._compact()
        return removed

    def _compact(self) -> None:
        """Drop the holes of ``_order``, moving every routine's index with its entry."""
        live_before = []
        order = []
        for key in self._order:
            live_before.append(len(order))
            if key is not None:
                self._position[key] = len(order)
                order.append(key)
        live_before.append(len(order))
        self._order = order
        for routine in self._routines.values():
            routine[1] = live_before[routine[1]]

    def _check(self, tx: bytes) -> None:
        if not tx or len(tx) > self.max_tx_bytes:
            raise InvalidTransaction(f"transaction of {len(tx)} bytes (allowed 1..{self.max_tx_bytes})")
        if self.check_tx is not None:
            try:
                self.check_tx(tx)
            except ValueError as error:
                raise InvalidTransaction(f"transaction {tx_key(tx).hex()[:16]} refused: {error}") from error

    # -- the Reactor contract ----------------------------------------------------------

    def add_peer(self, peer) -> None:
        self._seen[peer.node_id] = LRUSet(self.seen_capacity)
        routine = self._routines[peer.node_id] = [peer, 0, False, False]
        self._pump(routine)

    def remove_peer(self, peer, reason) -> None:
        routine = self._routines.get(peer.node_id)
        if routine is not None and routine[0] is peer:
            del self._routines[peer.node_id]
            self._seen.pop(peer.node_id, None)  # a later session starts from what it tells us

    def receive(self, channel_id, peer, message) -> None:
        self.messages.received("tx")
        try:
            self.add_tx(message, sender=peer)
        except InvalidTransaction as error:
            # CometBFT logs "Could not check tx" and keeps the peer: a transaction can turn
            # invalid between its sender's check and ours. Debug level: a flood of them
            # would otherwise fill the log; invalid_txs counts them.
            self.invalid_txs += 1
            log.debug("could not check a transaction from {peer}: {error}", peer=peer.node_id, error=str(error))

    # -- observability (specs/reactor-api.md section 12) -------------------------------

    def metrics(self, registry) -> None:
        registry.register(self.messages)
        registry.register(_MempoolCollector(self))

    def status(self) -> dict:
        return {
            "txs": len(self.txs),
            "max_txs": self.max_txs,
            "peers": len(self._routines),
            "largest_share": max(self._charged.values(), default=0),
            "max_peer_txs": self.max_peer_txs,
            "refused_full": self.refused_full,
            "refused_share": self.refused_share,
            "invalid_txs": self.invalid_txs,
            "received": self.messages.counts["received"]["tx"],
            "sent": self.messages.counts["sent"]["tx"],
        }

    # -- the per-peer sender routine (CometBFT's broadcastTxRoutine) -------------------

    def _pump(self, routine: list) -> None:
        """Send the peer's next transactions it lacks, one send in flight at a time.

        A send that is accepted at once fires its Deferred inside ``peer.send``; that
        ``_sent`` does not call back in here (``routine[3]``, pumping): this loop goes on,
        so a peer joining a full mempool costs no recursion.
        """
        peer = routine[0]
        if routine[2] or routine[3] or self._routines.get(peer.node_id) is not routine:
            return
        routine[3] = True
        try:
            while not routine[2]:
                key = self._next_key(routine)
                if key is None:
                    return
                routine[2] = True
                peer.send(MEMPOOL_CHANNEL, self.txs[key]).addCallback(self._sent, routine, key)
        finally:
            routine[3] = False

    def _next_key(self, routine: list):
        """The key of the routine's next transaction to send (marked seen), or None."""
        peer, index = routine[0], routine[1]
        seen = self._seen[peer.node_id]
        order = self._order
        while index < len(order) and (order[index] is None or order[index] in seen):
            index += 1
        routine[1] = index
        if index >= len(order) or peer.state == "closed":
            return None
        seen.add(order[index])
        routine[1] = index + 1
        return order[index]

    def _sent(self, accepted: bool, routine: list, key: bytes) -> None:
        routine[2] = False
        peer = routine[0]
        if self._routines.get(peer.node_id) is not routine:
            return  # the session ended
        if accepted:
            self.messages.sent("tx")
            self._pump(routine)  # does nothing while _pump's own loop runs
            return
        # No room within send_timeout: the peer is slow; try that transaction again later
        # (unless it left the mempool meanwhile).
        position = self._position.get(key)
        if position is not None:
            self._seen[peer.node_id].discard(key)
            routine[1] = min(routine[1], position)
        routine[2] = True  # nothing more until the retry
        self.switch.clock.callLater(RETRY_DELAY, self._retry, routine)

    def _retry(self, routine: list) -> None:
        routine[2] = False
        self._pump(routine)


class _MempoolCollector:
    """The mempool's size and refusals, read at each scrape."""

    def __init__(self, reactor: MempoolReactor) -> None:
        self.reactor = reactor

    def collect(self):
        reactor = self.reactor
        yield GaugeMetricFamily("mempool_size", "Transactions in the mempool.", value=len(reactor.txs))
        refused = CounterMetricFamily(
            "mempool_txs_refused", "Transactions not admitted, by reason.", labels=("reason",)
        )
        refused.add_metric(("full",), reactor.refused_full)
        refused.add_metric(("share",), reactor.refused_share)
        refused.add_metric(("invalid",), reactor.invalid_txs)
        yield refused
