"""A node under many attacks at once keeps serving its good peers, over tcp, ws and IPv6.

For ATTACK_SECONDS (30) another process (attackers.py) opens and resets sessions with
made-up node ids from one address, hoards the node's data with identities that never
acknowledge, keeps 64 silent sockets open from 8 addresses, and announces attacker-chosen
dial targets through made-up PEX identities (the node runs the PEX reactor; its dials are
recorded and refused in the process, so none leaves the machine). With them run the
attacks on the transport itself: 64 sockets from one address that say almost nothing (on
a ws listener, the start of an upgrade that never ends), a flood of empty messages to a
channel whose reactor is busy (the reactor backlog), hellos announcing a
``max_packet_payload`` of 1 (every message cut into 1-byte packets), and on ws upgrades
carrying an ``Origin`` header, as a web page's would. Meanwhile two good peers (real
Switches from addresses of their own) and the node exchange numbered messages both ways,
and a third good peer from a new address dials in 18 s into the attack. Afterwards:

* the two good peers are still connected, on the same sessions, never removed, and every
  message either way arrived once, in order;
* the third good peer got in;
* the node never dialed the metadata address, a private host or its own listener, and
  dialed learnt addresses no faster than the PEX dial budget;
* the node's unacknowledged bytes stayed within ``max_unacked_bytes`` plus the channel
  reserves, its suspended sessions within ``max_suspended_bytes``, and the process's RSS
  (after a collection and malloc_trim) grew by less than RSS_BOUND, 96 MiB (17 MiB
  measured): the node pushes 2 MiB to each of the ~190 hoarders and the dormant sessions
  number in the thousands, which without the limits stayed pinned for the whole grace;
* no address held more inbound sessions, live or suspended, than
  ``max_connections_per_ip`` (sampled every 0.25 s), the addresses of one IPv6 /64
  counting as one;
* the busy channel never had more than FLOOD_HELD_BOUND messages of one peer waiting for
  it (a bound on payload bytes alone never stops reading empty messages);
* the node never cut a message into packets under 1024 bytes for a peer that asked for 1;
* a ws listener took no upgrade that carried an ``Origin`` (a web page's).

Each variant runs the same attacks and asserts the same:

* ``tcp``: a TCP listener on 127.0.0.1; every attacker and good peer has a loopback
  address of its own (each is its own address group: specs/connection.md section 6);
* ``ws``: a ws:// listener on 127.0.0.1; the attackers speak WebSocket (an upgrade, then
  masked binary frames), the silent sockets stall before the upgrade;
* ``ipv6``: a TCP listener on an IPv6 address, in a network namespace the test makes
  (the loopback interface has only ::1 otherwise, one address for everyone, where no
  per-address limit can tell a good peer from an attacker): each attacking role comes
  from several addresses of one /64 of its own, as one IPv6 host can, and each good peer
  from a /64 of its own. Skipped where the process may not make a network namespace.

Every wait is bounded; the attacker process and every Switch are stopped.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import ipaddress
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import time

import pytest
import pytest_twisted
from twisted.internet import defer, task

from helpers import bounded, record_dials, sleep, the_reactor, until
from mconn import Config, Reactor, Switch
from reactors.pex import PexReactor

from .attackers import BUSY, CHANNELS, all_sources
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
    # Sessions that carried traffic hold inbound slots: up to 16 suspended, 10 hoarders,
    # 10 sybils, a dormant one and the 2 good peers (39), and the flood's 2, which last
    # the whole attack: 2 more than the default 40 leave the newcomer its one slot.
    max_inbound_peers=42,
)
#: Seconds the busy channel's reactor takes over each message it is handed alone.
HOLD = 2.0
#: The most messages of one peer the busy channel may have waiting: reactor_backlog_bytes
#: at 16 bytes a message (what a held message costs at least: a CPython bytes object
#: alone is 33), plus what one 64 KiB read completes (4-byte empty messages). Reading on,
#: the node would have held hundreds of thousands within HOLD.
FLOOD_HELD_BOUND = VICTIM_CONFIG.reactor_backlog_bytes // 16 + (64 << 10) // 4
#: Where the node must never dial, whatever the sybils announce.
FORBIDDEN_HOSTS = ("169.254.169.254", "10.0.0.1", "fd00:ec2::254")
PATH = "/mconn"
#: When the third good peer dials, as a part of the attack: 18 s in, between two
#: expiries of the silent sockets (every ws_handshake_timeout, 10 s, they time out
#: together and are renewed within 0.1 s), so that it meets the sockets' slots full.
NEWCOMER_AT = 0.6
CLONE_NEWNET = 0x40000000


class Variant:
    """One transport the attacks run over: the victim's listen endpoint and address, the
    good peers' addresses, and the attackers' options (attackers.py)."""

    def __init__(self, name, host, listen, dial, goods, attacker_options):
        self.name, self.host, self.listen, self.goods = name, host, listen, goods
        self.dial = dial  # (node id, port) -> the address a good peer dials
        self.attacker_options = attacker_options


V6 = "fd00:0:0:1::1"
VARIANTS = {
    "tcp": Variant(
        "tcp",
        "127.0.0.1",
        "tcp:0:interface=127.0.0.1",
        lambda node, port: f"{node}@127.0.0.1:{port}",
        ["127.0.0.100", "127.0.0.101", "127.0.0.102"],
        [],
    ),
    "ws": Variant(
        "ws",
        "127.0.0.1",
        f"ws:tcp:0:interface=127.0.0.1:path={PATH}",
        lambda node, port: f"{node}@ws://127.0.0.1:{port}{PATH}",
        ["127.0.0.100", "127.0.0.101", "127.0.0.102"],
        ["--ws", PATH],
    ),
    "ipv6": Variant(
        "ipv6",
        V6,
        "tcp6:0:interface=" + V6.replace(":", "\\:"),
        lambda node, port: f"{node}@[{V6}]:{port}",
        ["fd00:0:0:100::1", "fd00:0:0:101::1", "fd00:0:0:102::1"],
        ["--host", V6, "--ipv6"],
    ),
}


@contextlib.contextmanager
def network_of(variant: Variant):
    """For ``ipv6``: this thread (the event loop's: every socket the test makes, and the
    processes it starts) in a new network namespace whose loopback interface has the
    victim's, the good peers' and the attackers' addresses; back home at the end, when
    the namespace goes with its last socket. Nothing for the others."""
    if variant.name != "ipv6":
        yield
        return
    if shutil.which("ip") is None:
        pytest.skip("no ip command (iproute2) to give the namespace its addresses")
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            pytest.skip(f"cannot make a network namespace: {os.strerror(ctypes.get_errno())}")
        try:
            addresses = [variant.host, *variant.goods, *all_sources(ipv6=True)]
            commands = "link set lo up\n" + "".join(f"addr add {a}/64 dev lo nodad\n" for a in addresses)
            subprocess.run(["ip", "-batch", "-"], input=commands, text=True, check=True, timeout=20)
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "cannot return to the test's own network namespace")
    finally:
        os.close(home)


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


class Busy(Reactor):
    """The busy channel 0x22: a message handed over alone keeps it busy for HOLD seconds
    (``receive`` returns a Deferred), so the peer's later messages wait at mconn (the
    reactor backlog, specs/reactor-api.md section 4.1); when it fires they are handed
    over at once, and ``largest`` is the most of them handed over together: the most one
    peer had waiting."""

    def __init__(self):
        self.received = 0
        self.largest = 0
        self._batch = None  # messages handed over since a hold ended, while it is ending
        self._calls = []

    def get_channels(self):
        return [BUSY]

    def receive(self, channel_id, peer, message):
        self.received += 1
        if self._batch is not None:
            self._batch += 1
            return None
        held = defer.Deferred()
        self._calls = [c for c in self._calls if c.active()]
        self._calls.append(the_reactor().callLater(HOLD, self._release, held))
        return held

    def _release(self, held):
        self._batch = 0
        try:
            held.callback(None)  # the waiting messages come to receive before this returns
        finally:
            self.largest, self._batch = max(self.largest, self._batch), None

    def stop(self):
        for call in self._calls:
            if call.active():
                call.cancel()


class SessionsPerAddress:
    """The most inbound sessions, live or suspended, the node held at once from one
    address, an IPv6 /64 counting as one (the unit of ``max_connections_per_ip``),
    sampled every 0.25 s: ``most`` is (how many, the address)."""

    def __init__(self, switch):
        self.switch = switch
        self.most = (0, None)
        self.loop = task.LoopingCall(self.sample)
        self.loop.clock = the_reactor()

    def sample(self):
        held = collections.Counter(
            limit_unit(p.remote_address) for p in self.switch.peers.values() if not p.is_outbound
        )
        for unit, count in held.items():
            if count > self.most[0]:
                self.most = (count, unit)

    def start(self):
        self.loop.start(0.25)

    def stop(self):
        if self.loop.running:
            self.loop.stop()


def limit_unit(remote_address: str) -> str:
    """The address ``max_connections_per_ip`` counts a ``host:port`` in: an IPv4 address,
    or the /64 of an IPv6 one."""
    host = ipaddress.ip_address(remote_address.rsplit(":", 1)[0].strip("[]"))
    return str(ipaddress.ip_network((int(host), 64), strict=False)) if host.version == 6 else str(host)


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


@pytest.mark.parametrize("transport", list(VARIANTS))
@pytest_twisted.ensureDeferred
async def test_a_node_under_attack_keeps_its_good_peers_and_lets_a_new_one_in(transport):
    """See the module docstring: good peers stay connected and lose nothing, a new good
    peer gets in, and memory, the busy channel's backlog and packet sizes stay bounded
    while the attacks run for 30 s, over ``transport``."""
    variant = VARIANTS[transport]
    with network_of(variant):
        await under_attack(variant)


async def under_attack(variant: Variant):
    victim_log, busy = Numbered(push=True), Busy()
    pex = PexReactor(rng=random.Random(7))
    victim = Switch([victim_log, pex, busy], clock=the_reactor(), config=VICTIM_CONFIG)
    dialed = record_dials(victim, passthrough=False)
    per_address = SessionsPerAddress(victim)
    victim.startService()
    goods, attackers, talks = [], None, []
    try:
        port = (await victim.listen(variant.listen)).getHost().port
        address = variant.dial(victim.node_id, port)
        for good in variant.goods[:2]:
            switch, log = good_node(good)
            goods.append((switch, log, await bounded(switch.dial(address))))
        await until(lambda: len(victim.peers) == 2, "both good peers at the node")
        held = dict(victim.peers)
        talks = [Talk(peer, victim_log, switch.node_id) for switch, _, peer in goods]
        talks += [Talk(held[switch.node_id], log, victim.node_id) for switch, log, _ in goods]
        rss_before = rss()
        attackers = subprocess.Popen(
            [
                sys.executable,
                str(ATTACKERS),
                str(port),
                str(ATTACK_SECONDS),
                "--transport-attacks",
                *variant.attacker_options,
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT)},
        )
        started = time.monotonic()
        for talk in talks:
            talk.start()
        per_address.start()
        await sleep(ATTACK_SECONDS * NEWCOMER_AT)
        third, third_log = good_node(variant.goods[2])
        goods.append((third, third_log, None))
        newcomer = await bounded(third.dial(address), 15)
        assert newcomer.state == "connected"
        await sleep(ATTACK_SECONDS * (1 - NEWCOMER_AT))
        for talk in talks:
            talk.stop()
        per_address.stop()
        counts = json.loads((await bounded(defer.maybeDeferred(_wait, attackers), ATTACK_SECONDS)) or "{}")
        print(
            f"\n{variant.name} attackers: {counts}; refusals at the node: {victim.refusals}; "
            f"busy channel: {busy.received} messages, at most {busy.largest} waiting; "
            f"most sessions from one address: {per_address.most}"
        )
        elapsed = time.monotonic() - started
        assert counts.get("dormant", 0) > 100 and counts.get("hoard", 0) > 50 and counts.get("stall", 0) >= 64
        assert counts.get("sybil", 0) > 50
        assert counts.get("slowloris", 0) >= 64 and counts.get("flood", 0) > 0 and counts.get("tiny", 0) > 5
        forbidden = [d for d in dialed if d[0] in FORBIDDEN_HOSTS or d == (variant.host, port)]
        assert forbidden == [], forbidden
        assert len(dialed) <= pex.dial_burst + pex.dial_rate * elapsed + 1, (len(dialed), elapsed)
        used, suspended = victim._sessions.budget.used, [p for p in victim.peers.values() if p.state == "suspended"]
        assert used <= VICTIM_CONFIG.max_unacked_bytes + len(victim.peers) * len(CHANNELS) * (2 << 20)
        assert sum(p.session.unacked_bytes for p in suspended) <= VICTIM_CONFIG.max_suspended_bytes
        growth = rss() - rss_before
        print(f"RSS grew by {growth / (1 << 20):.1f} MiB (bound {RSS_BOUND >> 20} MiB)")
        assert growth < RSS_BOUND
        # One address (an IPv6 /64) held no more sessions than its share.
        assert per_address.most[0] <= VICTIM_CONFIG.max_connections_per_ip, per_address.most
        # The transport attacks: the backlog of empty messages and the packet floor.
        assert busy.largest <= FLOOD_HELD_BOUND, (busy.largest, FLOOD_HELD_BOUND)
        assert counts.get("browser_open", 0) == 0, f"{counts['browser_open']} upgrades with an Origin taken"
        cut = counts["tiny_cut"]
        assert cut == 0, f"{cut} of {counts['tiny']} peers that asked for 1-byte packets got them"
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
        per_address.stop()
        busy.stop()
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
