"""A gossip chat with file transfer: two channels of very different priorities.

Chat lines travel on CHAT (priority 10) and files on FILE (priority 1), so a line typed
while a file is moving overtakes the file's chunks (specs/connection.md section 4). The
messages of both channels are declared in reactors/chat_wire.py and specs/chat.md.

Theory of operation:

* **Gossip.** ``say`` gives a line a random 16-byte id and sends it to every peer. A node
  that receives a line it has not seen shows it and forwards it to every peer except the
  one it came from, its origin and any peer that already sent us that id. Ids are kept in
  an LRU of ``seen_capacity`` entries; a line whose id is in it is a duplicate and is
  dropped. ``hops`` bounds how far a line travels should an id fall out of the LRU.
* **Files.** ``send_file`` sends an OFFER (name, size, sha256) and then the file in
  CHUNK_SIZE chunks to each connected peer, one transfer at a time per peer, waiting on
  ``peer.send`` when the channel's queue is full (backpressure: nothing is read ahead).
  The receiver writes to a private ``.part`` file in ``downloads``, checks size and
  sha256, renames it to a free, safe name and answers with a RECEIPT. A refused offer
  (too large) is answered at once; the sender then sends CANCEL and stops.
* **Bad input.** Every message is checked against its size limit before it is parsed
  (reactors/chat_wire.py, which declares the messages); a message that breaks
  specs/chat.md raises a ChatProtocolError subclass and the peer is closed with the
  error's name and message. The other peers carry on.
* **Breaks.** mconn sessions resume after a transport break with nothing lost, so
  transfers and gossip simply continue; ``on_status`` reports ``suspended``, ``resumed``
  and, for a node whose session ended and came back, ``reconnected``.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os

from twisted.internet import defer

from mconn import ChannelDescriptor, Reactor
from reactors.chat_wire import (
    CANCEL,
    CHAT,
    CHUNK,
    CHUNK_SIZE,
    FILE,
    ID_SIZE,
    LINE,
    MAX_CHAT_MESSAGE,
    MAX_FILE_MESSAGE,
    MAX_FILE_NAME,
    MAX_HOPS,
    MAX_NAME,
    MAX_TEXT,
    NAME,
    OFFER,
    RECEIPT,
    ChatMessageTooLarge,
    ChatProtocolError,
    MalformedChatMessage,
    UnexpectedFileMessage,
    UnsafeFileName,
    check_length,
    clip_utf8,
    decode,
    encode,
    safe_file_name,
)

#: The reactor, what its observers get, and the wire names it re-exports from chat_wire.
__all__ = [
    "ChatReactor", "ChatLine", "ReceivedFile", "FileReceipt", "CHAT", "FILE", "NAME", "LINE",
    "OFFER", "CHUNK", "CANCEL", "RECEIPT", "MAX_CHAT_MESSAGE", "MAX_FILE_MESSAGE",
    "ChatProtocolError", "MalformedChatMessage", "ChatMessageTooLarge", "UnsafeFileName",
    "UnexpectedFileMessage", "encode", "decode", "safe_file_name"
]


# -- what observers get ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatLine:
    """A line received for the first time (``on_line``)."""

    id: str
    origin: str  # node id of the author
    name: str  # the author's name
    text: str
    hops: int
    via: str  # node id of the peer it came from


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReceivedFile:
    """A file received whole, verified and stored (``on_file``)."""

    path: str
    name: str  # as offered
    size: int
    sha256: str
    sender: str  # node id


@dataclasses.dataclass(frozen=True)
class FileReceipt:
    """One peer's answer to ``send_file``; true if it stored the file intact."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclasses.dataclass
class _Incoming:
    transfer: bytes
    name: str
    size: int
    sha256: bytes
    received: int = 0
    discard: bool = False  # refused: count the chunks, store nothing
    fd: int | None = None
    part: str | None = None
    digest: object = None


# -- the reactor -----------------------------------------------------------------------


class ChatReactor(Reactor):
    """Gossip chat on CHAT and file transfer on FILE.

    :param name: shown to others; defaults to ``node-`` and the first 8 characters of
        the node id.
    :param downloads: directory received files go to (created when the first file
        arrives); ``downloads`` under the working directory if None.
    :param max_file_size: the largest file accepted; larger offers are refused.
    :param seen_capacity: line ids remembered for deduplication.

    Observers (set them as attributes): ``on_line(ChatLine)``, ``on_file(ReceivedFile)``,
    ``on_peers_changed()``, ``on_status(node_id, status, detail)`` with status one of
    ``joined``, ``left``, ``suspended``, ``resumed``, ``reconnected``, ``dropped``.
    """

    CHAT = CHAT
    FILE = FILE

    def __init__(
        self,
        name: str | None = None,
        downloads: str | None = None,
        *,
        max_file_size: int = 1 << 30,
        seen_capacity: int = 4096,
    ) -> None:
        if name is not None:
            check_length("name", name, MAX_NAME)
        self._name = name
        self.downloads = downloads if downloads is not None else os.path.join(os.getcwd(), "downloads")
        self.max_file_size = max_file_size
        self.seen_capacity = seen_capacity
        self.on_line = lambda line: None
        self.on_file = lambda received: None
        self.on_peers_changed = lambda: None
        self.on_status = lambda node_id, status, detail: None
        #: node id -> the name it told us.
        self.names: dict[str, str] = {}
        self.lines_seen = 0
        self.duplicates_dropped = 0
        self.files_received = 0
        self.peers_dropped = 0
        self._seen: collections.OrderedDict[bytes, set] = collections.OrderedDict()
        self._gone: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._incoming: dict[str, _Incoming] = {}
        self._receipts: dict[tuple[str, bytes], defer.Deferred] = {}
        self._outgoing_locks: dict[str, defer.DeferredLock] = {}

    @property
    def name(self) -> str:
        if self._name is None:
            return f"node-{self.switch.node_id[:8]}" if self.switch is not None else "node"
        return self._name

    def get_channels(self):
        return [
            ChannelDescriptor(CHAT, priority=10, send_queue_capacity=64, recv_message_capacity=MAX_CHAT_MESSAGE),
            ChannelDescriptor(FILE, priority=1, send_queue_capacity=4, recv_message_capacity=MAX_FILE_MESSAGE),
        ]

    def peer_name(self, node_id: str) -> str:
        return self.names.get(node_id, node_id[:8])

    # -- peers --------------------------------------------------------------------------

    def add_peer(self, peer) -> None:
        peer.try_send(CHAT, encode(CHAT, NAME, name=self.name))
        back = self._gone.pop(peer.node_id, False) is None
        self.on_status(peer.node_id, "reconnected" if back else "joined", "")
        self.on_peers_changed()

    def remove_peer(self, peer, reason) -> None:
        self._abandon_incoming(peer.node_id)
        for key in [k for k in self._receipts if k[0] == peer.node_id]:
            self._receipts.pop(key).callback(FileReceipt(False, f"the session ended: {reason}"))
        self._gone[peer.node_id] = None
        while len(self._gone) > 1024:
            forgotten, _ = self._gone.popitem(last=False)
            self.names.pop(forgotten, None)
        self.on_status(peer.node_id, "left", str(reason))
        self.on_peers_changed()

    def peer_suspended(self, peer) -> None:
        self.on_status(peer.node_id, "suspended", "")
        self.on_peers_changed()

    def peer_resumed(self, peer) -> None:
        self.on_status(peer.node_id, "resumed", "")
        self.on_peers_changed()

    def receive(self, channel_id: int, peer, message: bytes) -> None:
        try:
            kind, fields = decode(channel_id, message)
            if channel_id == CHAT:
                self._receive_chat(peer, kind, fields)
            else:
                self._receive_file(peer, kind, fields)
        except ChatProtocolError as e:
            self.peers_dropped += 1
            self.on_status(peer.node_id, "dropped", f"{type(e).__name__}: {e}")
            peer.close(f"{type(e).__name__}: {e}")

    # -- chat ---------------------------------------------------------------------------

    def say(self, text: str) -> str:
        """Send a line to every peer; returns its id (hex)."""
        if len(text.encode("utf8")) > MAX_TEXT:
            raise ValueError(f"a line of {len(text.encode('utf8'))} bytes; the largest is {MAX_TEXT}")
        line_id = os.urandom(ID_SIZE)
        self._remember(line_id, {self.switch.node_id})
        message = encode(
            CHAT, LINE, id=line_id, origin=bytes.fromhex(self.switch.node_id), hops=0, name=self.name, text=text
        )
        for peer in list(self.switch.peers.values()):
            peer.send(CHAT, message)
        return line_id.hex()

    def _receive_chat(self, peer, kind: int, fields) -> None:
        check_length("name", fields.name, MAX_NAME)
        if kind == NAME:
            self.names[peer.node_id] = fields.name
            self.on_peers_changed()
            return
        check_length("text", fields.text, MAX_TEXT)
        senders = self._seen.get(fields.id)
        if senders is not None:
            self.duplicates_dropped += 1
            senders.add(peer.node_id)
            self._seen.move_to_end(fields.id)
            return
        origin = fields.origin.hex()
        senders = self._remember(fields.id, {peer.node_id, origin})
        self.lines_seen += 1
        name, text, hops = fields.name, fields.text, fields.hops
        self.on_line(ChatLine(id=fields.id.hex(), origin=origin, name=name, text=text, hops=hops, via=peer.node_id))
        if hops + 1 >= MAX_HOPS:
            return
        forward = encode(CHAT, LINE, id=fields.id, origin=fields.origin, hops=hops + 1, name=name, text=text)
        for other in list(self.switch.peers.values()):
            if other.node_id not in senders:
                other.send(CHAT, forward)

    def _remember(self, line_id: bytes, senders: set) -> set:
        self._seen[line_id] = senders
        while len(self._seen) > self.seen_capacity:
            self._seen.popitem(last=False)
        return senders

    # -- sending files ------------------------------------------------------------------

    def send_file(self, path, on_progress=None) -> defer.Deferred:
        """Send a file to every connected peer.

        :param on_progress: called as ``on_progress(sent_bytes, total_bytes)``, summed over
            the peers, as chunks are accepted by the channel queues.
        :returns: a Deferred firing with ``{node_id: FileReceipt}`` once every peer has
            answered (stored and verified, refused) or gone.
        :raises OSError: if the file cannot be read.
        """
        path = os.fspath(path)
        size, digest = _size_and_sha256(path)
        name = clip_utf8(os.path.basename(path).replace("\\", "_"), MAX_FILE_NAME) or "file"
        peers = list(self.switch.peers.values())
        progress = _Progress(size * len(peers), on_progress)
        sends = [defer.ensureDeferred(self._send_file_to(peer, path, name, size, digest, progress)) for peer in peers]
        d = defer.gatherResults(sends)
        return d.addCallback(lambda receipts: {p.node_id: r for p, r in zip(peers, receipts)})

    async def _send_file_to(self, peer, path, name, size, digest, progress) -> FileReceipt:
        lock = self._outgoing_locks.setdefault(peer.node_id, defer.DeferredLock())
        await lock.acquire()
        try:
            return await self._transfer(peer, path, name, size, digest, progress)
        finally:
            lock.release()
            if not lock.locked and not lock.waiting:
                self._outgoing_locks.pop(peer.node_id, None)

    async def _transfer(self, peer, path, name, size, digest, progress) -> FileReceipt:
        transfer = os.urandom(ID_SIZE)
        key = (peer.node_id, transfer)
        receipt = self._receipts[key] = defer.Deferred()
        offer = encode(FILE, OFFER, transfer=transfer, size=size, sha256=digest, name=name)
        if not await _send_while_open(peer, FILE, offer):
            self._receipts.pop(key, None)
            return FileReceipt(False, "the session ended before the offer was sent")
        with open(path, "rb") as f:
            sent = 0
            while sent < size and not receipt.called:  # a receipt this early is a refusal
                data = f.read(min(CHUNK_SIZE, size - sent))
                if not data:
                    self._receipts.pop(key, None)
                    cancel = encode(FILE, CANCEL, transfer=transfer, reason="the file shrank")
                    await _send_while_open(peer, FILE, cancel)
                    return FileReceipt(False, f"{path} shrank to {sent} bytes while being sent")
                if not await _send_while_open(peer, FILE, encode(FILE, CHUNK, transfer=transfer, data=data)):
                    break  # the session ended: remove_peer has fired the receipt
                sent += len(data)
                progress.add(len(data))
            if sent < size and peer.state != "closed":
                await _send_while_open(peer, FILE, encode(FILE, CANCEL, transfer=transfer, reason="refused"))
        return await receipt

    def _receive_receipt(self, peer, fields) -> None:
        d = self._receipts.pop((peer.node_id, fields.transfer), None)
        if d is None:
            raise UnexpectedFileMessage(f"a receipt for transfer {fields.transfer.hex()}, which we are not sending")
        d.callback(FileReceipt(bool(fields.ok), fields.reason))

    # -- receiving files ----------------------------------------------------------------

    def _receive_file(self, peer, kind: int, fields) -> None:
        if kind == RECEIPT:
            return self._receive_receipt(peer, fields)
        incoming = self._incoming.get(peer.node_id)
        if kind == OFFER:
            if incoming is not None:
                raise UnexpectedFileMessage(
                    f"an offer for transfer {fields.transfer.hex()} while transfer {incoming.transfer.hex()} is "
                    f"at {incoming.received} of {incoming.size} bytes"
                )
            return self._receive_offer(peer, fields)
        if incoming is None or incoming.transfer != fields.transfer:
            what = "chunk" if kind == CHUNK else "cancel"
            raise UnexpectedFileMessage(f"a {what} for transfer {fields.transfer.hex()}, which is not in progress")
        if kind == CANCEL:
            self._abandon_incoming(peer.node_id)
            return
        if not fields.data or incoming.received + len(fields.data) > incoming.size:
            raise UnexpectedFileMessage(
                f"a chunk of {len(fields.data)} bytes at {incoming.received} of a {incoming.size}-byte file"
            )
        incoming.received += len(fields.data)
        if not incoming.discard:
            incoming.digest.update(fields.data)
            try:
                _write_all(incoming.fd, fields.data)
            except OSError as e:  # a full disk: refuse the rest
                self._refuse(peer, incoming, f"refused: cannot write {incoming.name}: {e.strerror or e}")
        if incoming.received == incoming.size:
            self._finish(peer, incoming)

    def _receive_offer(self, peer, fields) -> None:
        check_length("file name", fields.name, MAX_FILE_NAME)
        name = safe_file_name(fields.name)
        incoming = _Incoming(fields.transfer, name, fields.size, fields.sha256)
        self._incoming[peer.node_id] = incoming
        if fields.size > self.max_file_size:
            reason = f"refused: a file of {fields.size} bytes is larger than max_file_size {self.max_file_size}"
            self._refuse(peer, incoming, reason)
        else:
            try:
                os.makedirs(self.downloads, exist_ok=True)
                part = os.path.join(self.downloads, f".{fields.transfer.hex()}.part")
                incoming.fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                incoming.part = part
                incoming.digest = hashlib.sha256()
            except OSError as e:
                self._refuse(peer, incoming, f"refused: cannot store {name} in {self.downloads}: {e.strerror or e}")
        if fields.size == 0:
            self._finish(peer, incoming)

    def _finish(self, peer, incoming: _Incoming) -> None:
        del self._incoming[peer.node_id]
        if incoming.discard:
            return
        os.close(incoming.fd)
        if incoming.digest.digest() != incoming.sha256:
            os.unlink(incoming.part)
            reason = f"sha256 mismatch: offered {incoming.sha256.hex()}, received {incoming.digest.hexdigest()}"
            self._answer(peer, incoming.transfer, False, reason)
            return
        try:
            path = _claim_free_name(self.downloads, incoming.name)
            os.replace(incoming.part, path)
        except OSError as e:
            os.unlink(incoming.part)
            self._answer(peer, incoming.transfer, False, f"cannot store {incoming.name}: {e.strerror or e}")
            return
        self.files_received += 1
        self._answer(peer, incoming.transfer, True, "")
        self.on_file(
            ReceivedFile(
                path=path, name=incoming.name, size=incoming.size, sha256=incoming.sha256.hex(), sender=peer.node_id
            )
        )

    def _refuse(self, peer, incoming: _Incoming, reason: str) -> None:
        """Answer a refusal now and count the rest of the transfer's chunks unstored."""
        self._close_part(incoming)
        incoming.discard = True
        self._answer(peer, incoming.transfer, False, reason)

    def _answer(self, peer, transfer: bytes, ok: bool, reason: str) -> None:
        message = encode(FILE, RECEIPT, transfer=transfer, ok=ok, reason=clip_utf8(reason, 255))
        defer.ensureDeferred(_send_while_open(peer, FILE, message))

    def _abandon_incoming(self, node_id: str) -> None:
        incoming = self._incoming.pop(node_id, None)
        if incoming is not None:
            self._close_part(incoming)

    @staticmethod
    def _close_part(incoming: _Incoming) -> None:
        if incoming.fd is not None:
            os.close(incoming.fd)
            os.unlink(incoming.part)
            incoming.fd = incoming.part = None


class _Progress:
    def __init__(self, total: int, callback) -> None:
        self.total = total
        self.sent = 0
        self.callback = callback

    def add(self, n: int) -> None:
        self.sent += n
        if self.callback is not None:
            self.callback(self.sent, self.total)


async def _send_while_open(peer, channel_id: int, message: bytes) -> bool:
    """``peer.send``, tried again after each send_timeout while the session lasts.

    A suspended session holds only a few messages, and resume_grace outlasts
    send_timeout, so one timed-out send is no reason to give up. False once the session
    has ended.
    """
    while peer.state != "closed":
        d = peer.send(channel_id, message)
        refused_at_once = d.called  # closing, or a channel the peer lacks: waiting won't help
        if await d:
            return True
        if refused_at_once:
            return False
    return False


def _size_and_sha256(path: str) -> tuple[int, bytes]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return size, digest.digest()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _claim_free_name(directory: str, name: str) -> str:
    """Create an empty file under ``name`` or ``name (n)`` that did not exist; its path."""
    stem, ext = os.path.splitext(name)
    for n in range(10000):
        path = os.path.join(directory, name if n == 0 else f"{stem} ({n}){ext}")
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            return path
        except FileExistsError:
            continue
    raise OSError(f"no free name for {name!r} in {directory} after 10000 tries")
