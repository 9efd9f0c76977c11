"""A block-sync reactor: CometBFT's ``blocksync/reactor.go`` request/response pattern
(v1.0), ported to mconn's public API.

Channel 0x40 (CometBFT's BlocksyncChannel) carries five messages (declared with construct
below, one type byte then the fields; trailing bytes are an error):

* ``StatusRequest`` / ``StatusResponse(base, height)``: which blocks a node has. A node
  sends its status to every new peer, answers requests, and every ``status_interval``
  asks every peer for theirs (the LoopingCall runs between ``start_reactor`` and
  ``stop_reactor``, specs/reactor-api.md section 2.1);
* ``BlockRequest(height)`` -> ``BlockResponse(height, block)`` or ``NoBlockResponse(height)``.

Theory of operation (CometBFT's BlockPool, much simplified). The node wants every height
above its own up to the highest a peer reported, but never more than ``max_pending``
heights ahead of its own: the *window* (CometBFT creates at most maxTotalRequesters = 600
requesters above the pool's height, ``blocksync/pool.go``). Each tick, whenever a block
it asked for arrives, a request is refused or its peer goes, and on a peer's first status,
it walks the window once and requests the heights it lacks that are not already
requested, each from a peer that reported it, round robin, with at most ``max_pending``
requests in flight in all (maxPendingRequests, 600) and ``max_pending_per_peer`` to one
peer (maxPendingRequestsPerPeer, 20). A later status only updates the peer's range: the
next tick uses it. So the work of one walk is at most ``max_pending`` heights times the
connected peers, whatever a peer reported, and a received message causes at most one
walk. A request not answered within ``request_timeout`` (or refused with
NoBlockResponse, or whose peer went) is forgotten and asked again of any peer. The
node's height is the top of its contiguous run of blocks from 1, kept as blocks arrive.

Answering: a peer's BlockRequests wait in a queue of at most ``max_pending_per_peer``
(past it, or for a block we lack, NoBlockResponse at once), and are answered one
``peer.send`` at a time, so a block is encoded only once the channel took the one
before: a flood of 9-byte requests costs a queue entry or a 9-byte refusal each, and
the copying of blocks follows what the peer actually reads.

Misbehaviour drops the peer. ``receive`` raises, and mconn's default policy turns that
into ``peer.stop_for_error`` (CometBFT's StopPeerForError), for a message that does not
decode (``MalformedBlocksyncMessage``) and for a status no chain can have
(``ImplausibleStatus``: a base above the height, or a height or base past
``max_height``); the reactor calls ``peer.stop_for_error`` itself for a block nobody
asked that peer for and a block that fails ``check_block``. As in CometBFT: its
``ValidateMsg`` stops a peer for a status with the base above the height, its
MConnection for a message that does not unmarshal, its pool for a block from a peer it
was not requested from (v1.0's ``FilterMsgBytes`` refuses an unsolicited BlockResponse
before decoding), and ``handlePeerResponse`` for a block that fails to convert. Not as
in CometBFT: ``max_height`` is mconn's own bound (CometBFT's heights are int64 and only
its window bounds what it requests).

What is ported: the five messages and their meaning, the status on a new peer, the
periodic status request, the window (``maxTotalRequesters``) and the request bounds
(``maxPendingRequests``, ``maxPendingRequestsPerPeer``), NoBlockResponse for a block
the node lacks and a request asked again of another peer (``RedoRequestFrom``), and a
timeout of an unanswered request. What is not: the block *store* and *execution* (blocks
are opaque bytes kept in ``blocks``; ``check_block`` stands for verifying them against
the previous one's commit), the extended commits of vote extensions, the switch to
consensus once caught up, adaptive sync, the per-peer receive rate check that drops a
slow peer (``minRecvRate``), and the ``bpRequester`` goroutines with their second
request to another peer for the next height. A block request is a plain message here,
so the channel's encoding is mconn's construct layout, not CometBFT's protobuf.

Observability (specs/reactor-api.md section 12): ``status()`` is the reactor's section
of the status page; ``metrics(registry)`` adds ``blocksync_messages_total`` (by
direction and type), ``blocksync_height``, ``blocksync_pending_requests``,
``blocksync_peers`` and ``blocksync_blocks_received_total``.
"""

from __future__ import annotations

import collections
import enum
import itertools

from construct import (
    ConstructError,
    Error,
    GreedyBytes,
    Int8ub,
    Int64ub,
    Struct,
    Switch,
    Terminated,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from twisted.internet.task import LoopingCall

from mconn import ChannelDescriptor, MessageCounter, Reactor

BLOCKSYNC_CHANNEL = 0x40
#: The largest block (also the channel's recv_message_capacity, minus the header).
MAX_BLOCK_BYTES = 1 << 20


class BlocksyncType(enum.IntEnum):
    STATUS_REQUEST = 1
    STATUS_RESPONSE = 2
    BLOCK_REQUEST = 3
    BLOCK_RESPONSE = 4
    NO_BLOCK_RESPONSE = 5


# type (1) | fields by type: status response base (8) height (8); block request /
# no-block response height (8); block response height (8) block (the rest, bounded by
# the channel's recv_message_capacity before a byte is parsed).
MESSAGE = Struct(
    "type" / Int8ub,
    "body"
    / Switch(
        lambda ctx: ctx.type,
        {
            BlocksyncType.STATUS_REQUEST: Struct(),
            BlocksyncType.STATUS_RESPONSE: Struct("base" / Int64ub, "height" / Int64ub),
            BlocksyncType.BLOCK_REQUEST: Struct("height" / Int64ub),
            BlocksyncType.BLOCK_RESPONSE: Struct("height" / Int64ub, "block" / GreedyBytes),
            BlocksyncType.NO_BLOCK_RESPONSE: Struct("height" / Int64ub),
        },
        default=Error,
    ),
    Terminated,
)


#: The ``type`` labels of the messages (``MessageCounter``): the type names, lower case.
MESSAGE_TYPES = tuple(kind.name.lower() for kind in BlocksyncType)


class BlocksyncError(ValueError):
    """A peer broke the blocksync rules; raised from ``receive``, so its sender is dropped."""


class MalformedBlocksyncMessage(BlocksyncError):
    """A message on the blocksync channel that does not decode."""


class ImplausibleStatus(BlocksyncError):
    """A StatusResponse no chain can have: a base above the height, or a base or height
    past the reactor's ``max_height``."""


def encode(kind: BlocksyncType, **fields) -> bytes:
    return MESSAGE.build({"type": kind, "body": fields})


def decode(message: bytes):
    """(type, body) of one message. :raises MalformedBlocksyncMessage: naming the problem."""
    try:
        parsed = MESSAGE.parse(message)
    except ConstructError as error:
        raise MalformedBlocksyncMessage(
            f"blocksync message of {len(message)} bytes (type byte {message[:1].hex() or 'none'}) "
            f"does not decode: {' '.join(str(error).split())}"
        ) from None
    return BlocksyncType(parsed.type), parsed.body


class BlocksyncReactor(Reactor):
    """Fetches every block its peers have (see the module docstring).

    :param blocks: ``{height: block}`` this node starts with (heights from 1).
    :param check_block: ``check_block(height, block)`` raises ValueError for a bad block.
    :param max_pending: block requests in flight at once, and the window: no height more
        than this above our own is requested (default :attr:`MAX_PENDING`).
    :param max_pending_per_peer: block requests in flight to one peer (default
        :attr:`MAX_PENDING_PER_PEER`).
    :param max_height: the largest base or height a status may report; a peer reporting
        more is dropped with :class:`ImplausibleStatus` (default :attr:`MAX_HEIGHT`).
    :param request_timeout: seconds before an unanswered request is asked of another peer.
    :param status_interval: seconds between status requests to every peer.
    """

    name = "blocksync"
    #: CometBFT's maxPendingRequests (= maxTotalRequesters, blocksync/pool.go): requests
    #: in flight in all, and how far above our height the window reaches.
    MAX_PENDING = 600
    #: CometBFT's maxPendingRequestsPerPeer (blocksync/pool.go).
    MAX_PENDING_PER_PEER = 20
    #: A block every millisecond for 139 years is under 2**42 blocks: a status past it is a
    #: lie (CometBFT's heights are int64, and it has no such bound; its window has).
    MAX_HEIGHT = 2**42

    def __init__(
        self,
        blocks=None,
        *,
        check_block=None,
        max_pending: int = MAX_PENDING,
        max_pending_per_peer: int = MAX_PENDING_PER_PEER,
        max_height: int = MAX_HEIGHT,
        request_timeout: float = 2.0,
        status_interval: float = 0.5,
    ) -> None:
        for name, value in (
            ("max_pending", max_pending),
            ("max_pending_per_peer", max_pending_per_peer),
            ("max_height", max_height),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BlocksyncReactor {name} must be a positive integer, got {value!r}")
        self.blocks: dict[int, bytes] = dict(blocks or {})
        self.check_block = check_block
        self.max_pending = max_pending
        self.max_pending_per_peer = max_pending_per_peer
        self.max_height = max_height
        self.request_timeout = request_timeout
        self.status_interval = status_interval
        #: node id -> (peer, base, height) from its last StatusResponse.
        self.peer_status: dict[str, tuple] = {}
        #: height -> (node id asked, when): requests in flight.
        self.pending: dict[int, tuple] = {}
        self._height = 0
        self._round_robin = itertools.count()
        self._loop = None
        #: Blocks received, and misbehaving peers dropped, by this reactor.
        self.received_blocks = 0
        self.dropped = 0
        #: node id -> _Serving: the block requests of that peer waiting to be answered.
        self._serving: dict[str, _Serving] = {}
        #: Block requests answered NoBlockResponse because that peer had too many waiting.
        self.requests_refused = 0
        #: Messages received and sent, by type (one that does not decode: ``other``).
        self.messages = MessageCounter(
            "blocksync_messages", MESSAGE_TYPES, "Blocksync messages, by direction and type."
        )

    @property
    def height(self) -> int:
        """The top of the contiguous run of blocks from height 1 (0: none). Kept as blocks
        arrive: each height is looked at once over the reactor's life."""
        while self._height + 1 in self.blocks:
            self._height += 1
        return self._height

    def get_channels(self):
        return [
            ChannelDescriptor(
                BLOCKSYNC_CHANNEL, priority=3, send_queue_capacity=64, recv_message_capacity=MAX_BLOCK_BYTES + 9
            )
        ]

    # -- lifecycle: the periodic status round and the request timeouts ---------------

    def start_reactor(self) -> None:
        self._loop = LoopingCall(self._tick)
        self._loop.clock = self.switch.clock
        self._loop.start(self.status_interval, now=False)

    def stop_reactor(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def _tick(self) -> None:
        now = self.switch.clock.seconds()
        for height, (_, asked_at) in list(self.pending.items()):
            if now - asked_at > self.request_timeout:
                del self.pending[height]
        accepted = self.switch.try_broadcast(BLOCKSYNC_CHANNEL, encode(BlocksyncType.STATUS_REQUEST))
        self.messages.sent("status_request", sum(accepted.values()))
        self._request_missing()

    # -- the Reactor contract ----------------------------------------------------------

    def add_peer(self, peer) -> None:
        self._serving[peer.node_id] = _Serving(peer)
        self._send_status(peer)

    def remove_peer(self, peer, reason) -> None:
        serving = self._serving.get(peer.node_id)
        if serving is not None and serving.peer is peer:
            del self._serving[peer.node_id]
        entry = self.peer_status.get(peer.node_id)
        if entry is not None and entry[0] is peer:
            del self.peer_status[peer.node_id]
        for height, (node_id, _) in list(self.pending.items()):
            if node_id == peer.node_id:
                del self.pending[height]  # asked again of another peer
        self._request_missing()

    def receive(self, channel_id, peer, message) -> None:
        try:
            kind, body = decode(message)
        except MalformedBlocksyncMessage:
            self.messages.received(MessageCounter.OTHER)
            raise  # drops the peer
        self.messages.received(MESSAGE_TYPES[kind - 1])
        if kind is BlocksyncType.STATUS_REQUEST:
            self._send_status(peer)
        elif kind is BlocksyncType.STATUS_RESPONSE:
            self._status_arrived(peer, body.base, body.height)
        elif kind is BlocksyncType.BLOCK_REQUEST:
            self._block_requested(peer, body.height)
        elif kind is BlocksyncType.BLOCK_RESPONSE:
            self._block_arrived(peer, body.height, body.block)
        elif self.pending.get(body.height, (None,))[0] == peer.node_id:  # NO_BLOCK_RESPONSE
            del self.pending[body.height]  # ask someone else
            self._request_missing()

    # -- observability (specs/reactor-api.md section 12) -------------------------------

    def metrics(self, registry) -> None:
        registry.register(self.messages)
        registry.register(_BlocksyncCollector(self))

    def status(self) -> dict:
        return {
            "height": self.height,
            "peers": len(self.peer_status),
            "best_peer_height": max((top for _, _, top in self.peer_status.values()), default=0),
            "pending_requests": len(self.pending),
            "max_pending": self.max_pending,
            "blocks_received": self.received_blocks,
            "peers_dropped": self.dropped,
            "requests_refused": self.requests_refused,
            "received": self.messages.as_dict()["received"],
            "sent": self.messages.as_dict()["sent"],
        }

    # -- requests and responses --------------------------------------------------------

    def _status(self) -> bytes:
        height = self.height
        return encode(BlocksyncType.STATUS_RESPONSE, base=1 if height else 0, height=height)

    def _send_status(self, peer) -> None:
        if peer.try_send(BLOCKSYNC_CHANNEL, self._status()):
            self.messages.sent("status_response")

    def _block_requested(self, peer, height: int) -> None:
        """Queue the request for ``_serve``, or answer NoBlockResponse at once: for a block
        we lack, or past ``max_pending_per_peer`` requests of that peer waiting (an honest
        node asks no more of one peer; CometBFT's maxPendingRequestsPerPeer)."""
        serving = self._serving.get(peer.node_id)
        if height not in self.blocks or serving is None or len(serving.waiting) >= self.max_pending_per_peer:
            if height in self.blocks:
                self.requests_refused += 1
            if peer.try_send(BLOCKSYNC_CHANNEL, encode(BlocksyncType.NO_BLOCK_RESPONSE, height=height)):
                self.messages.sent("no_block_response")
            return
        serving.waiting.append(height)
        self._serve(serving)

    def _serve(self, serving: _Serving) -> None:
        """Send the peer its requested blocks, one ``peer.send`` waiting at a time: a block
        is encoded (a copy of up to MAX_BLOCK_BYTES) only once the channel took the one
        before, so the work follows the bytes the peer reads, not the requests it sends.
        A send accepted at once fires inside ``peer.send``; ``_served`` then leaves the
        loop here to go on (no recursion)."""
        if serving.busy or serving.looping:
            return
        serving.looping = True
        try:
            while serving.waiting and not serving.busy:
                height = serving.waiting.popleft()
                serving.busy = True
                message = encode(BlocksyncType.BLOCK_RESPONSE, height=height, block=self.blocks[height])
                serving.peer.send(BLOCKSYNC_CHANNEL, message).addCallback(self._served, serving)
        finally:
            serving.looping = False

    def _served(self, accepted: bool, serving: _Serving) -> None:
        if accepted:
            self.messages.sent("block_response")
        serving.busy = False  # accepted or not (send_timeout, the session ended): the next
        if self._serving.get(serving.peer.node_id) is serving:
            self._serve(serving)

    def _status_arrived(self, peer, base: int, height: int) -> None:
        """Keep a peer's range; walk the window only on its first status (later ones wait
        for the tick, so a stream of statuses costs no walks).

        :raises ImplausibleStatus: for a range no chain can have, naming it.
        """
        if base > height or height > self.max_height:
            self.dropped += 1
            raise ImplausibleStatus(
                f"status of base {base}, height {height}: "
                + ("the base is above the height" if base > height else f"past the largest height {self.max_height}")
            )
        known = self.peer_status.get(peer.node_id)
        self.peer_status[peer.node_id] = (peer, base, height)
        if known is None or known[0] is not peer:
            self._request_missing()

    def _block_arrived(self, peer, height: int, block: bytes) -> None:
        asked = self.pending.get(height)
        if asked is None or asked[0] != peer.node_id:
            self.dropped += 1
            peer.stop_for_error(f"sent block {height}, which we did not ask it for")
            return
        if self.check_block is not None:
            try:
                self.check_block(height, block)
            except ValueError as error:
                self.dropped += 1
                peer.stop_for_error(f"block {height} is invalid: {error}")
                return
        del self.pending[height]
        self.blocks[height] = block
        self.received_blocks += 1
        self._request_missing()

    def _request_missing(self) -> None:
        """Ask peers for the heights we lack in the window, within the request bounds.

        One pass over at most ``max_pending`` heights, each looking at the peers that may
        still be asked: no loop is sized by a number a peer sent.
        """
        free = self.max_pending - len(self.pending)
        if free <= 0 or not self.peer_status:
            return
        low = self.height + 1
        high = low + self.max_pending - 1
        asked = collections.Counter(node_id for node_id, _ in self.pending.values())
        # (peer, base, height, requests it may still take) of each peer that overlaps the window
        askable = [
            [peer, base, top, self.max_pending_per_peer - asked[node_id]]
            for node_id, (peer, base, top) in self.peer_status.items()
            if top >= low and base <= high and asked[node_id] < self.max_pending_per_peer
        ]
        if not askable:
            return
        high = min(high, max(top for _, _, top, _ in askable))
        now = self.switch.clock.seconds()
        for height in range(max(low, min(base for _, base, _, _ in askable)), high + 1):
            if free <= 0 or not askable:
                return
            if height in self.blocks or height in self.pending:
                continue
            holders = [entry for entry in askable if entry[1] <= height <= entry[2]]
            if not holders:
                continue
            entry = holders[next(self._round_robin) % len(holders)]
            peer = entry[0]
            if peer.try_send(BLOCKSYNC_CHANNEL, encode(BlocksyncType.BLOCK_REQUEST, height=height)):
                self.messages.sent("block_request")
                self.pending[height] = (peer.node_id, now)
                free -= 1
                entry[3] -= 1
            else:
                entry[3] = 0  # its send queue is full: ask it again on a later walk
            if entry[3] <= 0:
                askable.remove(entry)


class _Serving:
    """The block requests of one peer that wait for an answer (at most
    ``max_pending_per_peer``), and whether a ``peer.send`` of one is waiting."""

    __slots__ = ("peer", "waiting", "busy", "looping")

    def __init__(self, peer) -> None:
        self.peer = peer
        self.waiting: collections.deque = collections.deque()
        self.busy = False
        self.looping = False


class _BlocksyncCollector:
    """The reactor's height, requests in flight, peers and blocks, read at each scrape."""

    def __init__(self, reactor: BlocksyncReactor) -> None:
        self.reactor = reactor

    def collect(self):
        reactor = self.reactor
        yield GaugeMetricFamily("blocksync_height", "The top of the contiguous run of blocks.", value=reactor.height)
        yield GaugeMetricFamily("blocksync_pending_requests", "Block requests in flight.", value=len(reactor.pending))
        yield GaugeMetricFamily("blocksync_peers", "Peers that reported a status.", value=len(reactor.peer_status))
        yield CounterMetricFamily(
            "blocksync_blocks_received", "Blocks received and kept.", value=reactor.received_blocks
        )
