"""The prebuilt-frames raw baseline: the fastest a Python program moves these bytes here.

The raw baseline of links.py (``RawLink``) does per-message Python work on its sending
side: it offers each message, packs its length and collects the frames into batches.
This one does none: its sender builds the length-prefixed frame once, and a block of
``FRAMES_PER_WRITE`` copies of it once (1,000 100-byte frames; one 1 MiB frame), and
hands the block to ``transport.write`` whole, as long as the transport does not pause it
(it is the transport's IPushProducer, as RawLink is). Its receiver is RawLink's: every
message's length prefix is parsed and its payload sliced out in Python, and each is
handed to the scenario's Sink, as mconn hands each to the Sink through its reactor.

In the ``small_each`` scenario it writes one frame per ``transport.write`` instead: the
per-message baseline of mconn's one ``try_send`` per message. A round-trip request or
echo (``send_now``) is one write of a frame built for it (its bytes change each time).

bench/run.py runs this beside RawLink as the ``prebuilt`` implementation and reports
mconn/prebuilt next to mconn/raw.
"""

from __future__ import annotations

import struct
import time

from twisted.internet.protocol import Factory

from links import RawLink
from scenarios import END

#: RawLink's length prefix: 4 bytes, big-endian.
LENGTH = struct.Struct(">I")

#: A batched write carries at most this many frames, and at most WRITE_BYTES of them.
FRAMES_PER_WRITE = 1000
WRITE_BYTES = 1 << 20
#: The frame of the E message that ends a measurement.
END_FRAME = LENGTH.pack(1) + bytes([END])


def frame(msg: bytes) -> bytes:
    """``msg`` with its 4-byte big-endian length in front."""
    return LENGTH.pack(len(msg)) + msg


class PrebuiltFiller:
    """Writes copies of one prebuilt frame until ``until`` (monotonic seconds), a block of
    them a write (``batched``) or one a write, pausing while the transport asks it to.

    Same constructor as scenarios.Filler (``channel`` is ignored: raw has none).
    """

    def __init__(self, link, channel: int, msg: bytes, until: float, on_done, batched: bool | None = None) -> None:
        one = frame(msg)
        per_write = max(1, min(FRAMES_PER_WRITE, WRITE_BYTES // len(one)))
        self.link = link
        self.until = until
        self.sent = 0
        self._on_done = on_done
        if batched is False:  # small_each: one frame a write, as many writes as a block has frames
            self._block, self._writes, self._frames = one, per_write, 1
        else:
            self._block, self._writes, self._frames = one * per_write, 1, per_write

    def run(self) -> None:
        link, write, block, writes = self.link, self.link.transport.write, self._block, self._writes
        per_turn = writes * self._frames
        while time.monotonic() < self.until:
            if not link.writable:
                link.when_writable(self.run)
                return
            for _ in range(writes):
                write(block)
            self.sent += per_turn
        write(END_FRAME)
        self._on_done()


class PrebuiltLink(RawLink):
    """RawLink's receiver; a sender that writes prebuilt frames (PrebuiltFiller)."""

    filler = PrebuiltFiller

    def __init__(self, on_link) -> None:
        super().__init__(on_link)
        #: False while the transport has paused us (its buffer is over its size).
        self.writable = True
        self._on_writable = None

    def when_writable(self, callback) -> None:
        """Call ``callback()`` once the transport resumes us."""
        self._on_writable = callback

    def send_now(self, channel: int, msg: bytes) -> bool:
        self.transport.write(frame(msg))
        return True

    def pauseProducing(self) -> None:
        super().pauseProducing()
        self.writable = False

    def resumeProducing(self) -> None:
        super().resumeProducing()
        self.writable = True
        callback, self._on_writable = self._on_writable, None
        if callback is not None:
            callback()

    def stopProducing(self) -> None:
        super().stopProducing()
        self.writable = False
        self._on_writable = None


def prebuilt_factory(on_link) -> Factory:
    return Factory.forProtocol(lambda: PrebuiltLink(on_link))
