"""The reactors of the fleet demo (examples/fleet.py), set up from the environment.

twistd builds each ``--reactor MODULE:CLASS`` with no arguments, so the demo's
orchestrator passes the settings of each node in environment variables:

==============================  ==========================================================
``MCONN_DEMO_NAME``             the node's chat name (default: ``node-`` + id prefix)
``MCONN_DEMO_CHAT_INTERVAL``    seconds between two chat lines of this node (default 2;
                                0: silent)
``MCONN_DEMO_SEND_FILE``        a file this node sends to every connected peer
``MCONN_DEMO_FILE_AFTER``       seconds after the first peer joined before it is sent
                                (default 5)
``MCONN_DEMO_FILE_EVERY``       send it again this many seconds later, and so on (default
                                0: once)
``MCONN_DEMO_BULK_RATE``        bytes per second per peer of :class:`FleetBulk` (default
                                reactors.bulk.DEFAULT_RATE)
``MCONN_DEMO_BULK_CHUNK``       bytes per bulk message (default reactors.bulk.DEFAULT_CHUNK)
==============================  ==========================================================

A bad value stops the node at startup with an error naming the variable (twistd's
``--reactor`` error path). What the reactors do is logged with twisted.logger, so it
ends up in the node's twistd log.
"""

from __future__ import annotations

import os

from twisted.internet import task
from twisted.logger import Logger

from reactors.bulk import DEFAULT_CHUNK, DEFAULT_RATE, BulkReactor
from reactors.chat import ChatReactor

log = Logger()


def _number(name: str, default: float, kind=float, low: float = 0.0):
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not value >= low:
        raise ValueError(f"{name}={text!r} must be at least {low}")
    return value


class FleetChat(ChatReactor):
    """A ChatReactor that talks by itself: a line every few seconds, maybe a file."""

    def __init__(self) -> None:
        name = os.environ.get("MCONN_DEMO_NAME") or None
        super().__init__(name=name)
        self.chat_interval = _number("MCONN_DEMO_CHAT_INTERVAL", 2.0)
        self.file_after = _number("MCONN_DEMO_FILE_AFTER", 5.0)
        self.file_every = _number("MCONN_DEMO_FILE_EVERY", 0.0)
        self.file_path = os.environ.get("MCONN_DEMO_SEND_FILE") or None
        if self.file_path is not None and not os.path.isfile(self.file_path):
            raise ValueError(f"MCONN_DEMO_SEND_FILE={self.file_path!r} is not a file")
        self.lines_said = 0
        self.files_sent = 0
        self._talking = None
        self._file_timer = None
        self.on_line = self._show_line
        self.on_file = self._show_file

    def add_peer(self, peer) -> None:
        super().add_peer(peer)
        if self._talking is None:
            self._start()

    def _start(self) -> None:
        clock = self.switch.clock
        self._talking = task.LoopingCall(self._talk)
        self._talking.clock = clock
        if self.chat_interval > 0:
            self._talking.start(self.chat_interval, now=False).addErrback(lambda f: log.failure("chat loop failed", f))
        if self.file_path is not None:
            self._file_timer = clock.callLater(self.file_after, self._send_file)

    def _talk(self) -> None:
        if not self.switch.running or not self.switch.peers:
            return
        self.lines_said += 1
        self.say(f"line {self.lines_said} from {self.name}")

    def _send_file(self) -> None:
        self._file_timer = None
        if self.file_every > 0:
            self._file_timer = self.switch.clock.callLater(self.file_every, self._send_file)
        if not self.switch.running or not self.switch.peers:
            return
        number = self.files_sent = self.files_sent + 1
        log.info(
            "fleet: sending {path} (transfer {number}) to {count} peers",
            path=self.file_path,
            number=number,
            count=len(self.switch.peers),
        )
        d = self.send_file(self.file_path)
        d.addCallback(self._file_done, number)
        d.addErrback(lambda f: log.failure("fleet: sending {path} failed", f, path=self.file_path))

    def _file_done(self, receipts: dict, number: int) -> None:
        stored = sum(1 for receipt in receipts.values() if receipt)
        log.info(
            "fleet: transfer {number} stored intact by {stored} of {count} peers",
            number=number,
            stored=stored,
            count=len(receipts),
        )

    def _show_line(self, line) -> None:
        log.info("fleet: chat <{name}> {text} (hops {hops})", name=line.name, text=line.text, hops=line.hops)

    def _show_file(self, received) -> None:
        log.info(
            "fleet: received {name} ({size} bytes, sha256 {sha256}) from {sender}",
            name=received.name,
            size=received.size,
            sha256=received.sha256,
            sender=received.sender,
        )


class FleetBulk(BulkReactor):
    """A BulkReactor whose rate and chunk size come from the environment."""

    def __init__(self) -> None:
        super().__init__(
            rate=_number("MCONN_DEMO_BULK_RATE", DEFAULT_RATE, float, 1.0),
            chunk_size=_number("MCONN_DEMO_BULK_CHUNK", DEFAULT_CHUNK, int, 1),
        )
