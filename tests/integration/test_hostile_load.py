"""A node under attacks 4 to 7 of issue 12 at once keeps serving its good peers.

For ATTACK_SECONDS (30) another process (attackers.py) opens and resets sessions with
made-up node ids from one address, hoards the node's data with identities that never
acknowledge, keeps 64 silent sockets open from 8 addresses, and announces attacker-chosen
dial targets through made-up PEX identities (the node runs the PEX reactor; its dials are
recorded and refused in the process, so none leaves the machine). Meanwhile two good peers
(real Switches from their own loopback addresses) and the node exchange numbered
messages both ways, and a third good peer from a new address dials in two thirds of the
way through. Afterwards:

* the two good peers are still connected, on the same sessions, never removed, and every
  message either way arrived once, in order;
* the third good peer got in;
* the node never dialed the metadata address, a private host or its own listener, and
  dialed learnt addresses no faster than the PEX dial budget;
* the node's unacknowledged bytes stayed within ``max_unacked_bytes`` plus the channel
  reserves, its suspended sessions within ``max_suspended_bytes``, and the process's RSS
  (after a collection and malloc_trim) grew by less than RSS_BOUND, 96 MiB (17 MiB
  measured): the node pushes 2 MiB to each of the ~190 hoarders and the dormant sessions
  number in the thousands, which without the limits stayed pinned for the whole grace.

Every wait is bounded; the attacker process and every Switch are stopped.
"""

from __future__ import annotations

import ctypes
import gc
import json
import pathlib
import random
import subprocess
import sys
import time

import pytest
import pytest_twisted
from twisted.internet import defer, task

from helpers import bounded, record_dials, sleep, the_reactor, until
from mconn import Config, Reactor, Switch
from reactors.pex import PexReactor

from .attackers import CHANNELS
from .test_loopback import stop

pytestmark = pytest.mark.integration

ATTACK_SECONDS = 30.0
RSS_BOUND = 96 << 20
ATTACKERS = pathlib.Path(__file__).with_name("attackers.py")
ROOT = pathlib.Path(__file__).resolve().parents[2]
VICTIM_CONFIG = Config(
    stats_interval=0,
    handshake_timeout=2.0,
    recovery_buffer_bytes=4 << 20,
    max_unacked_bytes=32 << 20,
    max_suspended_sessions=16,
    max_suspended_bytes=16 << 20,
    send_timeout=20.0,
)
GOOD = ["127.0.0.100", "127.0.0.101", "127.0.0.102"]


class Numbered(Reactor):
    """Counts numbered messages per sender on 0x21 and checks their order as they come;
    pushes 2 MiB on 0x20 to every new peer (what a hoarder would pin)."""

    def __init__(self, push: bool):
        self.push = push
        self.next = {}  # sender node id -> next number expected
        self.disorder = []
        self.removed = []

    def get_channels(self):
        return CHANNELS

    def add_peer(self, peer):
        if self.push:
            for _ in range(8):
                if not peer.try_send(0x20, bytes(256 << 10)):
                    break

    def remove_peer(self, peer, reason):
        self.removed.append((peer.node_id, type(reason).__name__))  # not the Peer: it holds its messages

    def receive(self, channel_id, peer, message):
        if channel_id != 0x21:
            return
        number = int(message)
        expected = self.next.get(peer.node_id, 0)
        if number != expected:
            self.disorder.append((peer.node_id, expected, number))
        self.next[peer.node_id] = number + 1


def rss() -> int:
    """VmRSS after a full collection, with glibc's free heap handed back (malloc_trim)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: RSS keeps what the allocator holds
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def good_node(address: str):
    reactor = Numbered(push=False)
    switch = Switch([reactor], clock=the_reactor(), config=Config(stats_interval=0, local_address=address))
    switch.startService()
    return switch, reactor


class Talk:
    """Numbered messages on 0x21 from ``peer``, one every 5 ms, until stopped; every
    send must fire True. ``receiver`` is the Numbered reactor at the other end and
    ``sender_id`` the sending node's id."""

    def __init__(self, peer, receiver, sender_id):
        self.peer = peer
        self.receiver = receiver
        self.sender_id = sender_id
        self.sent = 0
        self.refused = 0
        self.loop = task.LoopingCall(self.tick)
        self.loop.clock = the_reactor()

    def tick(self):
        d = self.peer.send(0x21, b"%d" % self.sent)
        self.sent += 1
        d.addCallback(lambda ok: None if ok else setattr(self, "refused", self.refused + 1))

    def delivered(self) -> bool:
        return self.receiver.next.get(self.sender_id, 0) == self.sent

    def start(self):
        self.loop.start(0.005)

    def stop(self):
        if self.loop.running:
            self.loop.stop()


@pytest_twisted.ensureDeferred
async def test_a_node_under_attacks_four_to_six_keeps_its_good_peers_and_lets_a_new_one_in():
    """See the module docstring: good peers stay connected and lose nothing, a new good
    peer gets in, and memory stays bounded while attacks 4-6 run for 30 s."""
    victim_log = Numbered(push=True)
    pex = PexReactor(rng=random.Random(7))
    victim = Switch([victim_log, pex], clock=the_reactor(), config=VICTIM_CONFIG)
    dialed = record_dials(victim, passthrough=False)
    victim.startService()
    goods, attackers, talks = [], None, []
    try:
        port = (await victim.listen("tcp:0:interface=127.0.0.1")).getHost().port
        for address in GOOD[:2]:
            switch, log = good_node(address)
            goods.append((switch, log, await bounded(switch.dial(f"{victim.node_id}@127.0.0.1:{port}"))))
        await until(lambda: len(victim.peers) == 2, "both good peers at the node")
        held = dict(victim.peers)
        talks = [Talk(peer, victim_log, switch.node_id) for switch, _, peer in goods]
        talks += [Talk(held[switch.node_id], log, victim.node_id) for switch, log, _ in goods]
        rss_before = rss()
        attackers = subprocess.Popen(
            [sys.executable, str(ATTACKERS), str(port), str(ATTACK_SECONDS)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT)},
        )
        started = time.monotonic()
        for talk in talks:
            talk.start()
        await sleep(ATTACK_SECONDS * 2 / 3)
        third, third_log = good_node(GOOD[2])
        goods.append((third, third_log, None))
        newcomer = await bounded(third.dial(f"{victim.node_id}@127.0.0.1:{port}"), 15)
        assert newcomer.state == "connected"
        await sleep(ATTACK_SECONDS / 3)
        for talk in talks:
            talk.stop()
        counts = json.loads((await bounded(defer.maybeDeferred(_wait, attackers), ATTACK_SECONDS)) or "{}")
        print(f"\nattackers: {counts}; refusals at the node: {victim.refusals}")
        elapsed = time.monotonic() - started
        assert counts.get("dormant", 0) > 100 and counts.get("hoard", 0) > 50 and counts.get("stall", 0) >= 64
        assert counts.get("sybil", 0) > 50
        forbidden = [d for d in dialed if d[0] in ("169.254.169.254", "10.0.0.1") or d == ("127.0.0.1", port)]
        assert forbidden == [], forbidden
        assert len(dialed) <= pex.dial_burst + pex.dial_rate * elapsed + 1, (len(dialed), elapsed)
        used, suspended = victim._sessions.budget.used, [p for p in victim.peers.values() if p.state == "suspended"]
        assert used <= VICTIM_CONFIG.max_unacked_bytes + len(victim.peers) * len(CHANNELS) * (2 << 20)
        assert sum(p.session.unacked_bytes for p in suspended) <= VICTIM_CONFIG.max_suspended_bytes
        growth = rss() - rss_before
        print(f"RSS grew by {growth / (1 << 20):.1f} MiB (bound {RSS_BOUND >> 20} MiB)")
        assert growth < RSS_BOUND
        # The good peers: same sessions, never removed, everything once and in order.
        for node_id, peer in held.items():
            assert victim.peers.get(node_id) is peer and peer.state == "connected"
        good_ids = {s.node_id for s, _, _ in goods}
        assert [r for r in victim_log.removed if r[0] in good_ids] == []
        assert all(t.refused == 0 for t in talks)
        await until(lambda: all(t.delivered() for t in talks), "every good message", 20)
        assert victim_log.disorder == [] and all(log.disorder == [] for _, log, _ in goods)
        victim._check_invariants()
    finally:
        for talk in talks:
            talk.stop()
        if attackers is not None and attackers.poll() is None:
            attackers.kill()
            attackers.wait(10)
        await stop(victim, *[s for s, _, _ in goods])


def _wait(process) -> defer.Deferred:
    """The attackers' JSON line, read in a thread once the process ends."""
    from twisted.internet import threads

    return threads.deferToThread(lambda: process.communicate(timeout=ATTACK_SECONDS + 20)[0])
