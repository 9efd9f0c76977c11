"""A mempool reactor: CometBFT's ``mempool/reactor.go`` ported to mconn's public API.

Transactions gossip on one channel (0x30, CometBFT's MempoolChannel). As in CometBFT:

* every peer has a sender routine that walks the mempool in arrival order and sends each
  transaction the peer does not have yet, one at a time, waiting for room
  (``peer.send``: a slow peer holds only its own routine);
* a transaction is never sent back to a peer that sent it to us, nor twice to one peer
  (the per-peer *seen* set: what it sent us and what we sent it);
* a transaction that fails ``check_tx`` is a misbehaving peer: ``receive`` raises
  ``InvalidTransaction`` and mconn's default policy drops the sender with a
  ``ReactorError`` (CometBFT's ``StopPeerForError``; specs/reactor-api.md section 4);
* a full mempool refuses new transactions without blaming the peer.

Theory of operation. ``_routines`` holds, per connected peer, the index of the next
mempool entry to consider and whether a send is in flight. Adding a transaction (local
``add_tx`` or received) appends to ``_order`` and wakes every idle routine. A routine
sends with ``peer.send``; when that fires it moves on. Sessions survive transport breaks
(specs/resume.md), so nothing is re-sent across a resume; a new session (a new Peer)
starts a new routine from the beginning, skipping what the node is known to have.

A transaction on the wire is the raw bytes; ``check_tx(tx)`` raises ValueError for a bad
one. The default accepts any non-empty transaction up to ``max_tx_bytes``.
"""

from __future__ import annotations

import hashlib

from mconn import ChannelDescriptor, Reactor

MEMPOOL_CHANNEL = 0x30
#: Seconds before a transaction whose send found no room within send_timeout is tried again.
RETRY_DELAY = 0.5


class InvalidTransaction(ValueError):
    """A peer sent a transaction that ``check_tx`` refused; it is dropped for it."""


def tx_key(tx: bytes) -> bytes:
    """The mempool's key of a transaction (CometBFT's TxKey: its SHA-256)."""
    return hashlib.sha256(tx).digest()


class MempoolReactor(Reactor):
    """Gossips transactions to every peer (see the module docstring).

    :param check_tx: ``check_tx(tx)`` raises ValueError for an invalid transaction.
    :param max_txs: transactions the mempool holds; past it new ones are refused.
    :param max_tx_bytes: the largest transaction (also the channel's message capacity).
    """

    name = "mempool"

    def __init__(self, *, check_tx=None, max_txs: int = 5000, max_tx_bytes: int = 64 * 1024) -> None:
        self.check_tx = check_tx
        self.max_txs = max_txs
        self.max_tx_bytes = max_tx_bytes
        #: tx key -> tx, and the keys in arrival order (what the sender routines walk).
        self.txs: dict[bytes, bytes] = {}
        self._order: list[bytes] = []
        #: node id -> tx keys that node has (it sent them to us, or we sent them to it).
        self._seen: dict[str, set] = {}
        #: node id -> [peer, next index into _order, send in flight].
        self._routines: dict[str, list] = {}
        #: Transactions refused because the mempool was full.
        self.refused_full = 0

    def get_channels(self):
        return [ChannelDescriptor(MEMPOOL_CHANNEL, priority=5, send_queue_capacity=100,
                                  recv_message_capacity=self.max_tx_bytes)]

    # -- the mempool -------------------------------------------------------------------

    def add_tx(self, tx: bytes, *, sender=None) -> bool:
        """Add a transaction (CometBFT's CheckTx then AddTx); True if it is new.

        :raises InvalidTransaction: if ``check_tx`` refuses it, naming why.
        """
        self._check(tx)
        key = tx_key(tx)
        if sender is not None:
            self._seen.setdefault(sender.node_id, set()).add(key)
        if key in self.txs:
            return False
        if len(self.txs) >= self.max_txs:
            self.refused_full += 1
            return False
        self.txs[key] = tx
        self._order.append(key)
        for routine in list(self._routines.values()):
            self._pump(routine)
        return True

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
        self._seen.setdefault(peer.node_id, set())
        routine = self._routines[peer.node_id] = [peer, 0, False]
        self._pump(routine)

    def remove_peer(self, peer, reason) -> None:
        routine = self._routines.get(peer.node_id)
        if routine is not None and routine[0] is peer:
            del self._routines[peer.node_id]
            self._seen.pop(peer.node_id, None)  # a later session starts from what it tells us

    def receive(self, channel_id, peer, message) -> None:
        self.add_tx(message, sender=peer)  # InvalidTransaction drops the peer

    # -- the per-peer sender routine (CometBFT's broadcastTxRoutine) -------------------

    def _pump(self, routine: list) -> None:
        """Send the peer's next transaction it lacks, unless a send is in flight."""
        peer, index, busy = routine
        if busy:
            return
        seen = self._seen.setdefault(peer.node_id, set())
        while index < len(self._order) and self._order[index] in seen:
            index += 1
        routine[1] = index
        if index >= len(self._order) or peer.state == "closed":
            return
        key = self._order[index]
        seen.add(key)
        routine[1], routine[2] = index + 1, True
        peer.send(MEMPOOL_CHANNEL, self.txs[key]).addCallback(self._sent, routine, key)

    def _sent(self, accepted: bool, routine: list, key: bytes) -> None:
        routine[2] = False
        peer = routine[0]
        if self._routines.get(peer.node_id) is not routine:
            return  # the session ended
        if accepted:
            self._pump(routine)
            return
        # No room within send_timeout: the peer is slow; try that transaction again later.
        self._seen[peer.node_id].discard(key)
        routine[1] = self._order.index(key)
        self.switch.clock.callLater(RETRY_DELAY, self._pump, routine)
