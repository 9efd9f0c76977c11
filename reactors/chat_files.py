"""The chat reactor's file transfer: the FILE channel of specs/chat.md section 3.

Theory of operation:

* **Sending.** ``send_file`` sends an OFFER (name, size, sha256) and then the file in
  CHUNK_SIZE chunks to each connected peer, one transfer at a time per peer, waiting on
  ``peer.send`` when the channel's queue is full (backpressure: nothing is read ahead).
  A RECEIPT ends the transfer; so does a REFUSE, after which the sender sends CANCEL
  (if chunks remain) and stops. The Deferred of ``send_file`` fires with a FileReceipt
  per peer, and each refusal is also told to ``on_refused``.
* **Receiving.** An offer is checked against the limits (reactors/chat_quota.py): the
  file size, the sender's quota, the downloads quota and the free-space floor, in that
  order. An accepted file is written to a private ``.part`` file in ``downloads``, each
  chunk only if the floor still holds; after the last chunk the size and sha256 are
  checked and the file is renamed to a free, safe name, answered with a RECEIPT. A
  refusal, at the offer or half-way, is answered at once with a REFUSE (code, reason,
  retry_after); the chunks still in flight are counted and not stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil

from twisted.internet import defer

from reactors.chat_quota import Charge, FileLimits, Quotas, Refusal, footprint
from reactors.chat_wire import (
    CANCEL,
    CANNOT_STORE,
    CHUNK,
    CHUNK_SIZE,
    FILE,
    ID_SIZE,
    MAX_FILE_NAME,
    OFFER,
    RECEIPT,
    REFUSALS,
    REFUSE,
    UnexpectedFileMessage,
    check_length,
    clip_utf8,
    encode,
    safe_file_name,
)

# -- what observers get ----------------------------------------------------------------


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
    """One peer's answer to ``send_file``; true if it stored the file intact.

    ``refused`` names the REFUSE code (``peer_quota``...) when the peer refused the file.
    """

    ok: bool
    reason: str = ""
    refused: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclasses.dataclass(frozen=True, kw_only=True)
class FileRefused:
    """A file refused (``on_refused``): by the peer we offered it to, or by us (``by_us``).

    ``code`` is the name of the REFUSE code (specs/chat.md section 3.1), ``reason`` the
    receiver's text, ``retry_after`` the seconds after which the same offer may be
    accepted (0: waiting will not help).
    """

    transfer: str
    name: str
    size: int
    peer: str  # node id of the other side
    by_us: bool
    code: str
    reason: str
    retry_after: int


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
    charge: Charge | None = None


@dataclasses.dataclass
class _Outgoing:
    receipt: defer.Deferred
    name: str
    size: int


def free_bytes(path: str) -> int:
    """Bytes free for us on the file system of ``path``."""
    return shutil.disk_usage(path).free


# -- the transfers ---------------------------------------------------------------------


class FileTransfers:
    """The files a ChatReactor sends and receives.

    :param chat: the ChatReactor: its ``switch``, ``downloads``, ``now()``, ``on_file``
        and ``on_refused`` are used.
    """

    def __init__(self, chat, limits: FileLimits) -> None:
        self.chat = chat
        self.limits = limits
        self.quotas = Quotas(limits)
        self.files_received = 0
        self.files_refused = 0
        self._incoming: dict[str, _Incoming] = {}
        self._outgoing: dict[tuple[str, bytes], _Outgoing] = {}
        self._locks: dict[str, defer.DeferredLock] = {}

    def peer_gone(self, node_id: str, reason) -> None:
        self._abandon_incoming(node_id)
        for key in [k for k in self._outgoing if k[0] == node_id]:
            self._outgoing.pop(key).receipt.callback(FileReceipt(False, f"the session ended: {reason}"))

    def receive(self, peer, kind: int, fields) -> None:
        if kind == RECEIPT:
            return self._receive_answer(peer, fields, "receipt")
        if kind == REFUSE:
            return self._receive_answer(peer, fields, "refusal")
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
        self._receive_chunk(peer, incoming, fields.data)

    # -- sending -----------------------------------------------------------------------

    def send_file(self, path, on_progress=None) -> defer.Deferred:
        """ChatReactor.send_file."""
        path = os.fspath(path)
        size, digest = _size_and_sha256(path)
        name = clip_utf8(os.path.basename(path).replace("\\", "_"), MAX_FILE_NAME) or "file"
        peers = list(self.chat.switch.peers.values())
        progress = _Progress(size, [p.node_id for p in peers], on_progress)
        sends = [defer.ensureDeferred(self._send_file_to(peer, path, name, size, digest, progress)) for peer in peers]
        d = defer.gatherResults(sends)
        return d.addCallback(lambda receipts: {p.node_id: r for p, r in zip(peers, receipts, strict=True)})

    async def _send_file_to(self, peer, path, name, size, digest, progress) -> FileReceipt:
        lock = self._locks.setdefault(peer.node_id, defer.DeferredLock())
        await lock.acquire()
        try:
            return await self._transfer(peer, path, name, size, digest, progress)
        finally:
            progress.done(peer.node_id)
            lock.release()
            if not lock.locked and not lock.waiting:
                self._locks.pop(peer.node_id, None)

    async def _transfer(self, peer, path, name, size, digest, progress) -> FileReceipt:
        transfer = os.urandom(ID_SIZE)
        key = (peer.node_id, transfer)
        receipt = defer.Deferred()
        self._outgoing[key] = _Outgoing(receipt, name, size)
        offer = encode(FILE, OFFER, transfer=transfer, size=size, sha256=digest, name=name)
        if not await _send_while_open(peer, FILE, offer):
            self._outgoing.pop(key, None)
            return FileReceipt(False, "the session ended before the offer was sent")
        with open(path, "rb") as f:
            sent = 0
            while sent < size and not receipt.called:  # an answer this early is a refusal
                data = f.read(min(CHUNK_SIZE, size - sent))
                if not data:
                    self._outgoing.pop(key, None)
                    cancel = encode(FILE, CANCEL, transfer=transfer, reason="the file shrank")
                    await _send_while_open(peer, FILE, cancel)
                    return FileReceipt(False, f"{path} shrank to {sent} bytes while being sent")
                if not await _send_while_open(peer, FILE, encode(FILE, CHUNK, transfer=transfer, data=data)):
                    break  # the session ended: peer_gone has fired the receipt
                sent += len(data)
                progress.add(peer.node_id, len(data))
            progress.done(peer.node_id)  # a refusal stops this peer's share here: the others' bar moves on
            if sent < size and peer.state != "closed":
                await _send_while_open(peer, FILE, encode(FILE, CANCEL, transfer=transfer, reason="refused"))
        return await receipt

    def _receive_answer(self, peer, fields, what: str) -> None:
        outgoing = self._outgoing.pop((peer.node_id, fields.transfer), None)
        if outgoing is None:
            raise UnexpectedFileMessage(f"a {what} for transfer {fields.transfer.hex()}, which we are not sending")
        if what == "receipt":
            outgoing.receipt.callback(FileReceipt(bool(fields.ok), fields.reason))
            return
        code = REFUSALS[fields.code]
        self.chat.on_refused(
            FileRefused(
                transfer=fields.transfer.hex(), name=outgoing.name, size=outgoing.size, peer=peer.node_id,
                by_us=False, code=code, reason=fields.reason, retry_after=fields.retry_after,
            )
        )  # fmt: skip
        outgoing.receipt.callback(FileReceipt(False, fields.reason, refused=code))

    # -- receiving ---------------------------------------------------------------------

    def _receive_offer(self, peer, fields) -> None:
        check_length("file name", fields.name, MAX_FILE_NAME)
        incoming = _Incoming(fields.transfer, safe_file_name(fields.name), fields.size, fields.sha256)
        refusal = self._admit(peer.node_id, incoming)
        self._incoming[peer.node_id] = incoming
        if refusal is not None:
            self._refuse(peer, incoming, refusal)
        if fields.size == 0:
            self._finish(peer, incoming)

    def _admit(self, node_id: str, incoming: _Incoming) -> Refusal | None:
        """Check an offer against the limits and open its .part file; the refusal, or None."""
        now = self.chat.now()
        refusal = self.quotas.refuse_sender(node_id, incoming.size, now)
        if refusal is not None:
            return refusal
        downloads = self.chat.downloads
        try:
            os.makedirs(downloads, exist_ok=True)
            receiving = [i for i in self._incoming.values() if not i.discard]
            refusal = self.quotas.refuse_disk(
                incoming.size,
                stored=self._stored_bytes(downloads, {i.part for i in receiving}),
                in_flight=sum(footprint(i.size) for i in receiving),
                free=free_bytes(downloads),
                remaining=sum(i.size - i.received for i in receiving),
            )
            if refusal is not None:
                return refusal
            part = os.path.join(downloads, f".{incoming.transfer.hex()}.part")
            incoming.fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            return Refusal(CANNOT_STORE, f"refused: cannot store {incoming.name} in {downloads}: {e.strerror or e}")
        incoming.part = part
        incoming.digest = hashlib.sha256()
        incoming.charge = self.quotas.charge(node_id, incoming.size, now)
        return None

    @staticmethod
    def _stored_bytes(downloads: str, parts: set) -> int:
        """Footprints of the files in ``downloads`` (not below it), but for ``parts``."""
        with os.scandir(downloads) as entries:
            return sum(
                footprint(e.stat(follow_symlinks=False).st_size)
                for e in entries
                if e.is_file(follow_symlinks=False) and e.path not in parts
            )

    def _receive_chunk(self, peer, incoming: _Incoming, data: bytes) -> None:
        if not data or incoming.received + len(data) > incoming.size:
            raise UnexpectedFileMessage(
                f"a chunk of {len(data)} bytes at {incoming.received} of a {incoming.size}-byte file"
            )
        if not incoming.discard:
            try:
                refusal = self.quotas.refuse_write(len(data), free_bytes(self.chat.downloads))
                if refusal is None:
                    _write_all(incoming.fd, data)
                    incoming.digest.update(data)
            except OSError as e:  # a full disk, a removed folder: refuse the rest
                refusal = Refusal(CANNOT_STORE, f"refused: cannot write {incoming.name}: {e.strerror or e}")
            if refusal is not None:
                self._refuse(peer, incoming, refusal)
        incoming.received += len(data)
        if incoming.received == incoming.size:
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
            path = _claim_free_name(self.chat.downloads, incoming.name)
            os.replace(incoming.part, path)
        except OSError as e:
            os.unlink(incoming.part)
            self._answer(peer, incoming.transfer, False, f"cannot store {incoming.name}: {e.strerror or e}")
            return
        self.files_received += 1
        self._answer(peer, incoming.transfer, True, "")
        self.chat.on_file(
            ReceivedFile(
                path=path, name=incoming.name, size=incoming.size, sha256=incoming.sha256.hex(), sender=peer.node_id
            )
        )

    def _refuse(self, peer, incoming: _Incoming, refusal: Refusal) -> None:
        """Send REFUSE now, tell on_refused, and count the rest of the transfer's chunks unstored."""
        self._close_part(incoming)
        incoming.discard = True
        self.files_refused += 1
        reason = clip_utf8(refusal.reason, 255)
        message = encode(
            FILE, REFUSE, transfer=incoming.transfer, code=refusal.code, retry_after=refusal.retry_after, reason=reason
        )
        defer.ensureDeferred(_send_while_open(peer, FILE, message))
        self.chat.on_refused(
            FileRefused(
                transfer=incoming.transfer.hex(), name=incoming.name, size=incoming.size, peer=peer.node_id,
                by_us=True, code=REFUSALS[refusal.code], reason=reason, retry_after=refusal.retry_after,
            )
        )  # fmt: skip

    def _answer(self, peer, transfer: bytes, ok: bool, reason: str) -> None:
        message = encode(FILE, RECEIPT, transfer=transfer, ok=ok, reason=clip_utf8(reason, 255))
        defer.ensureDeferred(_send_while_open(peer, FILE, message))

    def _abandon_incoming(self, node_id: str) -> None:
        incoming = self._incoming.pop(node_id, None)
        if incoming is not None:
            self._close_part(incoming)

    def _close_part(self, incoming: _Incoming) -> None:
        """Delete a transfer's .part file and charge its sender only what arrived."""
        if incoming.fd is not None:
            os.close(incoming.fd)
            os.unlink(incoming.part)
            incoming.fd = incoming.part = None
        if incoming.charge is not None:
            self.quotas.settle(incoming.charge, incoming.received)
            incoming.charge = None


class _Progress:
    """The progress of one file sent to several peers, its bytes counted once.

    ``callback(sent, size)``: ``sent`` is what every peer still being sent the file has
    been given, the slowest one's count; a peer whose share stopped (it refused, it left)
    no longer holds it back. Once every share has stopped it is the most any peer got: the
    file size when one took it all. Called when that count changes.
    """

    def __init__(self, size: int, peers: list[str], callback) -> None:
        self.size = size
        self.sent = dict.fromkeys(peers, 0)
        self.active = set(peers)
        self.callback = callback
        self.reported = 0

    def add(self, node_id: str, n: int) -> None:
        self.sent[node_id] += n
        self._report()

    def done(self, node_id: str) -> None:
        if node_id in self.active:
            self.active.discard(node_id)
            self._report()

    def count(self) -> int:
        if self.active:
            return min(self.sent[p] for p in self.active)
        return max(self.sent.values(), default=0)

    def _report(self) -> None:
        count = self.count()
        if count != self.reported:
            self.reported = count
            if self.callback is not None:
                self.callback(count, self.size)


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
