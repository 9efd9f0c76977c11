"""One node of tests/integration/test_crash_resume.py: a sender or a receiver of numbered
streams, keeping its sessions in a session store (specs/resume.md section 9).

    durable_node.py receiver KEY STORE PORT OUT
    durable_node.py sender KEY STORE PEER_ADDRESS COUNT RATE

The receiver listens on 127.0.0.1:PORT. Its reactor appends, for each message delivered,
one line ``session_hex channel seq payload`` to OUT in one ``os.write`` (so a SIGKILL
leaves whole lines): that file is the reactor's own transaction log, the effect and the
delivery sequence committed together, and ``committed_deliveries`` reads it back at a
restart (the hook of specs/reactor-api.md section 5.9).

The sender dials PEER_ADDRESS persistently and sends, on each of two channels, the
messages ``0 .. COUNT-1`` at RATE messages a second per channel: on one channel with
``try_send``, on the other with ``send``, up to WINDOW of them not fired yet. After a
restart it goes on from what its restored session accepted (``peer.stats``): every
message up to there is in the store, so the stream has no gap and no repeat.

Both print ``ready`` once started. Run by the test with the venv's Python; stopped by PID.
"""

from __future__ import annotations

import os
import sys

from twisted.internet import reactor as twisted_reactor
from twisted.internet.task import LoopingCall

from mconn import ChannelDescriptor, Config, Reactor, Switch
from mconn.core.node_key import NodeKey

TRY_SEND, SEND = 0x20, 0x21
CHANNELS = [
    ChannelDescriptor(TRY_SEND, priority=1, send_queue_capacity=64),
    ChannelDescriptor(SEND, priority=1, send_queue_capacity=64),
]
CONFIG = dict(
    max_reconnect_delay=0.05,
    resume_grace=60.0,
    send_timeout=60.0,  # a send waits out any restart of the receiver: no gap in the stream
    ack_interval=0.01,
    ping_interval=5.0,
    pong_timeout=5.0,
    stats_interval=0,
    ignore_discovered_addresses=True,  # through the fault proxy only
)
TICK = 0.01
#: Sends not fired yet, at most, on the ``send`` channel.
WINDOW = 16


class Ledger(Reactor):
    """The receiver's reactor: each delivery appended with its sequence, in one write."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def get_channels(self):
        return CHANNELS

    def receive(self, channel_id, peer, message):
        session_id, seq = peer.delivery_seq(channel_id)
        os.write(self.fd, b"%s %d %d %s\n" % (session_id.hex().encode(), channel_id, seq, message))

    def committed_deliveries(self, peer_id, session_id):
        counts: dict[int, int] = {}
        with open(self.path, "rb") as f:
            for line in f:
                sid, channel, seq, _ = line.split(b" ", 3)
                if sid.decode() == session_id.hex():
                    counts[int(channel)] = max(counts.get(int(channel), 0), int(seq))
        return counts


class Streams(Reactor):
    """The sender's reactor: owns the channels; receives nothing."""

    def get_channels(self):
        return CHANNELS


class Sender:
    """Sends ``0 .. count-1`` on both channels at ``rate`` a second each, from where the
    session's accepted counts say."""

    def __init__(self, switch: Switch, count: int, rate: float) -> None:
        self.switch, self.count, self.per_tick = switch, count, max(1, round(rate * TICK))
        self.peer = None
        self.outstanding = 0  # sends not fired yet
        self.next_send: int | None = None  # the number the next send carries
        self.said_acked = False

    def start(self, peer) -> None:
        self.peer = peer
        LoopingCall(self.tick).start(TICK).addErrback(self.failed)

    def failed(self, failure) -> None:
        print(f"sender failed: {failure.getTraceback()}", flush=True)
        twisted_reactor.stop()

    def accepted(self, channel_id: int) -> int:
        return next(c.accepted for c in self.peer.stats.channels if c.channel_id == channel_id)

    def tick(self) -> None:
        peer = self.peer
        if self.switch.peers.get(peer.node_id) is not peer:
            print("session lost: a fresh session would restart the numbering", flush=True)
            twisted_reactor.stop()
            return
        if not self.said_acked and any(c.acked for c in peer.stats.channels):
            self.said_acked = True  # the receiver acks after its commit: its session is on disk
            print("acked", flush=True)
        sent = self.accepted(TRY_SEND)
        for n in range(sent, min(self.count, sent + self.per_tick)):
            if not peer.try_send(TRY_SEND, b"%d" % n):
                break
        if self.next_send is None and not self.outstanding:
            self.next_send = self.accepted(SEND)
        while self.next_send is not None and self.outstanding < WINDOW and self.next_send < self.count:
            self.outstanding += 1
            self.next_send += 1
            peer.send(SEND, b"%d" % (self.next_send - 1)).addBoth(self.sent)

    def sent(self, ok) -> None:
        self.outstanding -= 1
        if ok is not True:  # not accepted (the session ended): go on from what it accepted
            self.next_send = None


def main(argv: list[str]) -> None:
    role, key_path, store = argv[1], argv[2], argv[3]
    key = NodeKey.load(key_path)
    if role == "receiver":
        port, out = int(argv[4]), argv[5]
        switch = Switch([Ledger(out)], node_key=key, config=Config(session_store=store, **CONFIG))
        switch.startService()
        switch.listen(f"tcp:{port}:interface=127.0.0.1").addCallback(lambda _: print("ready", flush=True))
    else:
        address, count, rate = argv[4], int(argv[5]), float(argv[6])
        switch = Switch([Streams()], node_key=key, config=Config(session_store=store, **CONFIG))
        switch.startService()
        sender = Sender(switch, count, rate)
        switch.dial(address, persistent=True).addCallback(sender.start)
        print("ready", flush=True)
    twisted_reactor.run()


if __name__ == "__main__":
    main(sys.argv)
