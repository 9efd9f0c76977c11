"""A gossip chat with file transfer: two channels of very different priorities.

Chat lines travel on CHAT (priority 10) and files on FILE (priority 1), so a line typed
while a file is moving overtakes the file's chunks (specs/connection.md section 4). The
messages of both channels are declared in reactors/chat_wire.py and specs/chat.md; the
file transfer is reactors/chat_files.py and the limits on received files
reactors/chat_quota.py.

Theory of operation:

* **Gossip.** ``say`` gives a line a random 16-byte id and sends it to every peer. A node
  that receives a line it has not seen shows it and forwards it to every peer except the
  one it came from, its origin and any peer that already sent us that id. Ids are kept in
  an LRU of ``seen_capacity`` entries; a line whose id is in it is a duplicate and is
  dropped. ``hops`` bounds how far a line travels should an id fall out of the LRU.
* **Files.** ``send_file`` offers a file to every connected peer and sends it in
  chunks (reactors/chat_files.py). A receiver stores only what its limits allow: the file
  size, a quota per peer and time window, a quota for the downloads folder and a
  free-space floor (specs/chat.md section 3.1); anything else is refused with a REFUSE
  message that the sender sees as a FileReceipt and an ``on_refused`` call.
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
import os

from mconn import ChannelDescriptor, Reactor
from reactors.chat_display import printable
from reactors.chat_files import FileReceipt, FileRefused, FileTransfers, ReceivedFile
from reactors.chat_quota import FileLimits
from reactors.chat_wire import (
    CANCEL,
    CHAT,
    CHUNK,
    FILE,
    ID_SIZE,
    LINE,
    MAX_CHAT_MESSAGE,
    MAX_FILE_MESSAGE,
    MAX_HOPS,
    MAX_NAME,
    MAX_TEXT,
    NAME,
    OFFER,
    RECEIPT,
    REFUSALS,
    REFUSE,
    ChatMessageTooLarge,
    ChatProtocolError,
    MalformedChatMessage,
    UnexpectedFileMessage,
    UnsafeFileName,
    check_length,
    decode,
    encode,
    safe_file_name,
)

#: The reactor, what its observers get, and the names it re-exports from its modules.
__all__ = [
    "ChatReactor",
    "ChatLine",
    "ReceivedFile",
    "FileReceipt",
    "FileRefused",
    "FileLimits",
    "CHAT",
    "FILE",
    "NAME",
    "LINE",
    "OFFER",
    "CHUNK",
    "CANCEL",
    "RECEIPT",
    "REFUSE",
    "REFUSALS",
    "MAX_CHAT_MESSAGE",
    "MAX_FILE_MESSAGE",
    "ChatProtocolError",
    "MalformedChatMessage",
    "ChatMessageTooLarge",
    "UnsafeFileName",
    "UnexpectedFileMessage",
    "encode",
    "decode",
    "safe_file_name",
    "printable",
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


# -- the reactor -----------------------------------------------------------------------


class ChatReactor(Reactor):
    """Gossip chat on CHAT and file transfer on FILE.

    :param name: shown to others; defaults to ``node-`` and the first 8 characters of
        the node id.
    :param downloads: directory received files go to (created when the first file
        arrives); ``downloads`` under the working directory if None.
    :param max_file_size: the largest file accepted; larger offers are refused.
    :param peer_quota_bytes: bytes accepted from one peer per ``peer_quota_window``
        seconds (files count at least 4096 bytes each).
    :param downloads_quota_bytes: bytes the downloads folder may hold, counting the
        files being received.
    :param min_free_bytes: bytes the downloads folder's file system keeps free.
    :param seen_capacity: line ids remembered for deduplication.
    :param clock: an ``IReactorTime`` for the quota window; the Switch's if None.

    The file limits' defaults are FileLimits' (specs/chat.md section 3.1).

    Observers (set them as attributes): ``on_line(ChatLine)``, ``on_file(ReceivedFile)``,
    ``on_refused(FileRefused)``, ``on_peers_changed()``, ``on_status(node_id, status,
    detail)`` with status one of ``joined``, ``left``, ``suspended``, ``resumed``,
    ``reconnected``, ``dropped``. Names, lines and file names come from peers: pass them
    through ``printable`` before they reach a terminal.
    """

    CHAT = CHAT
    FILE = FILE

    def __init__(
        self,
        name: str | None = None,
        downloads: str | None = None,
        *,
        max_file_size: int = FileLimits.max_file_size,
        peer_quota_bytes: int = FileLimits.peer_quota_bytes,
        peer_quota_window: float = FileLimits.peer_quota_window,
        downloads_quota_bytes: int = FileLimits.downloads_quota_bytes,
        min_free_bytes: int = FileLimits.min_free_bytes,
        seen_capacity: int = 4096,
        clock=None,
    ) -> None:
        if name is not None:
            check_length("name", name, MAX_NAME)
        self._name = name
        self.downloads = downloads if downloads is not None else os.path.join(os.getcwd(), "downloads")
        limits = FileLimits(
            max_file_size=max_file_size,
            peer_quota_bytes=peer_quota_bytes,
            peer_quota_window=peer_quota_window,
            downloads_quota_bytes=downloads_quota_bytes,
            min_free_bytes=min_free_bytes,
        )
        self.files = FileTransfers(self, limits)
        self.seen_capacity = seen_capacity
        self._clock = clock
        self.on_line = lambda line: None
        self.on_file = lambda received: None
        self.on_refused = lambda refused: None
        self.on_peers_changed = lambda: None
        self.on_status = lambda node_id, status, detail: None
        #: node id -> the name it told us.
        self.names: dict[str, str] = {}
        self.lines_seen = 0
        self.duplicates_dropped = 0
        self.peers_dropped = 0
        self._seen: collections.OrderedDict[bytes, set] = collections.OrderedDict()
        self._gone: collections.OrderedDict[str, None] = collections.OrderedDict()

    @property
    def name(self) -> str:
        if self._name is None:
            return f"node-{self.switch.node_id[:8]}" if self.switch is not None else "node"
        return self._name

    @property
    def limits(self) -> FileLimits:
        return self.files.limits

    @property
    def max_file_size(self) -> int:
        return self.files.limits.max_file_size

    @property
    def files_received(self) -> int:
        return self.files.files_received

    @property
    def files_refused(self) -> int:
        """Offers and transfers this node refused."""
        return self.files.files_refused

    def now(self) -> float:
        """Seconds since the epoch, from the clock given or the Switch's."""
        return (self._clock if self._clock is not None else self.switch.clock).seconds()

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
        self.files.peer_gone(peer.node_id, reason)
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
                self.files.receive(peer, kind, fields)
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

    # -- files --------------------------------------------------------------------------

    def send_file(self, path, on_progress=None):
        """Send a file to every connected peer.

        :param on_progress: called as ``on_progress(sent_bytes, file_size)`` as chunks are
            accepted by the channel queues, the file's bytes counted once: ``sent_bytes``
            is what every peer still being sent the file has been given (the slowest one's
            count; a peer that refused or left no longer holds it back).
        :returns: a Deferred firing with ``{node_id: FileReceipt}`` once every peer has
            answered (stored and verified, refused) or gone.
        :raises OSError: if the file cannot be read.
        """
        return self.files.send_file(path, on_progress)
