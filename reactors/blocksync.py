"""A block-sync reactor: CometBFT's ``blocksync/reactor.go`` request/response pattern,
ported to mconn's public API.

Channel 0x40 (CometBFT's BlocksyncChannel) carries five messages (declared with construct
below, one type byte then the fields; trailing bytes are an error):

* ``StatusRequest`` / ``StatusResponse(base, height)``: which blocks a node has. A node
  sends its status to every new peer, answers requests, and every ``status_interval``
  asks every peer for theirs (the LoopingCall runs between ``start_reactor`` and
  ``stop_reactor``, specs/reactor-api.md section 2.1);
* ``BlockRequest(height)`` -> ``BlockResponse(height, block)`` or ``NoBlockResponse(height)``.

Theory of operation (CometBFT's BlockPool, much simplified). The node wants every height
above its own up to the highest a peer reported. Each tick, and whenever a response or
status arrives, it requests missing heights not already requested, each from a peer that
reported it, round robin, with at most ``max_pending`` requests in flight. A request
not answered within ``request_timeout`` (or refused with NoBlockResponse, or whose peer
went) is forgotten and asked again of any peer. The node's height is the top of its
contiguous run of blocks from 1.

Misbehaviour drops the peer with ``peer.stop_for_error`` (CometBFT's StopPeerForError):
a block nobody asked that peer for, a block that fails ``check_block``; a message that
does not decode raises ``MalformedBlocksyncMessage`` from ``receive``, which mconn's
default policy turns into the same drop.
"""

from __future__ import annotations

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
from twisted.internet.task import LoopingCall

from mconn import ChannelDescriptor, Reactor

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
    "body" / Switch(
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


class MalformedBlocksyncMessage(ValueError):
    """A message on the blocksync channel that does not decode; its sender is dropped."""


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
    :param max_pending: block requests in flight at once.
    :param request_timeout: seconds before an unanswered request is asked of another peer.
    :param status_interval: seconds between status requests to every peer.
    """

    name = "blocksync"

    def __init__(self, blocks=None, *, check_block=None, max_pending: int = 16, request_timeout: float = 2.0,
                 status_interval: float = 0.5) -> None:
        self.blocks: dict[int, bytes] = dict(blocks or {})
        self.check_block = check_block
        self.max_pending = max_pending
        self.request_timeout = request_timeout
        self.status_interval = status_interval
        #: node id -> (peer, base, height) from its last StatusResponse.
        self.peer_status: dict[str, tuple] = {}
        #: height -> (node id asked, when): requests in flight.
        self.pending: dict[int, tuple] = {}
        self._round_robin = itertools.count()
        self._loop = None
        #: Blocks received, and misbehaving peers dropped, by this reactor.
        self.received_blocks = 0
        self.dropped = 0

    @property
    def height(self) -> int:
        """The top of the contiguous run of blocks from height 1 (0: none)."""
        height = 0
        while height + 1 in self.blocks:
            height += 1
        return height

    def get_channels(self):
        return [ChannelDescriptor(BLOCKSYNC_CHANNEL, priority=3, send_queue_capacity=64,
                                  recv_message_capacity=MAX_BLOCK_BYTES + 9)]

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
        self.switch.try_broadcast(BLOCKSYNC_CHANNEL, encode(BlocksyncType.STATUS_REQUEST))
        self._request_missing()

    # -- the Reactor contract ----------------------------------------------------------

    def add_peer(self, peer) -> None:
        peer.try_send(BLOCKSYNC_CHANNEL, self._status())

    def remove_peer(self, peer, reason) -> None:
        entry = self.peer_status.get(peer.node_id)
        if entry is not None and entry[0] is peer:
            del self.peer_status[peer.node_id]
        for height, (node_id, _) in list(self.pending.items()):
            if node_id == peer.node_id:
                del self.pending[height]  # asked again of another peer
        self._request_missing()

    def receive(self, channel_id, peer, message) -> None:
        kind, body = decode(message)  # MalformedBlocksyncMessage drops the peer
        if kind is BlocksyncType.STATUS_REQUEST:
            peer.try_send(BLOCKSYNC_CHANNEL, self._status())
        elif kind is BlocksyncType.STATUS_RESPONSE:
            self.peer_status[peer.node_id] = (peer, body.base, body.height)
            self._request_missing()
        elif kind is BlocksyncType.BLOCK_REQUEST:
            block = self.blocks.get(body.height)
            if block is None:
                peer.try_send(BLOCKSYNC_CHANNEL, encode(BlocksyncType.NO_BLOCK_RESPONSE, height=body.height))
            else:
                peer.try_send(BLOCKSYNC_CHANNEL, encode(BlocksyncType.BLOCK_RESPONSE, height=body.height, block=block))
        elif kind is BlocksyncType.BLOCK_RESPONSE:
            self._block_arrived(peer, body.height, body.block)
        else:  # NO_BLOCK_RESPONSE: ask someone else
            if self.pending.get(body.height, (None,))[0] == peer.node_id:
                del self.pending[body.height]
            self._request_missing()

    # -- requests and responses --------------------------------------------------------

    def _status(self) -> bytes:
        return encode(BlocksyncType.STATUS_RESPONSE, base=1 if self.blocks else 0, height=self.height)

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
        """Ask peers for the heights we lack, up to max_pending in flight."""
        if not self.peer_status:
            return
        top = max(height for _, _, height in self.peer_status.values())
        height = self.height
        now = self.switch.clock.seconds()
        while len(self.pending) < self.max_pending and height < top:
            height += 1
            if height in self.blocks or height in self.pending:
                continue
            holders = [peer for peer, base, h in self.peer_status.values() if base <= height <= h]
            if not holders:
                continue
            peer = holders[next(self._round_robin) % len(holders)]
            if peer.try_send(BLOCKSYNC_CHANNEL, encode(BlocksyncType.BLOCK_REQUEST, height=height)):
                self.pending[height] = (peer.node_id, now)
