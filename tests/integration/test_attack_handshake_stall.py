"""The handshake stall attack, on real loopback sockets (specs/connection.md section 6).

An attacker opens silent sockets from 8 source addresses (127.0.0.2 to 127.0.0.9: on
Linux every 127/8 address is a distinct source, and each loopback address is an address
group of its own) until they fill ``max_pending_handshakes``, and reopens every one the
node closes. A peer from another address must still get in: the oldest pending handshake
of the largest group gives way to it (``pending_evicted``), never the newcomer, and one
group holds at most ``max_pending_per_group`` handshakes.

The clients are raw non-blocking sockets polled from the test's own reactor turns, so
the Switch under test runs in the same reactor, undisturbed.
"""

import random
import select
import socket
import time

import pytest
import pytest_twisted

from helpers import close_packets_in, sleep, the_reactor
from mconn import Config, Switch

from .hostile_clients import CHANNELS, hello
from .test_loopback import Collector, stop

pytestmark = pytest.mark.integration

ATTACKERS = [f"127.0.0.{i}" for i in range(2, 10)]
#: Stalled sockets must outlive the test: none may leave by timing out.
CONFIG = Config(stats_interval=0, handshake_timeout=60.0)


async def wait_until(condition, what, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {seconds}s waiting for {what}"
        await sleep(0.02)


class Clients:
    """Raw sockets to 127.0.0.1:``port``, by local address; all closed by ``close``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.by_address: dict[str, socket.socket] = {}

    def open(self, source: str) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.bind((source, 0))
        sock.connect_ex(("127.0.0.1", self.port))  # EINPROGRESS; loopback completes at once
        host, port = sock.getsockname()
        self.by_address[f"{host}:{port}"] = sock
        return sock

    def close(self) -> None:
        for sock in self.by_address.values():
            sock.close()


def read_now(sock: socket.socket) -> tuple[bytes, bool]:
    """What ``sock`` has received so far, and whether the other end closed it."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return data, False
        except ConnectionError:
            return data, True
        if not chunk:
            return data, True
        data += chunk


async def send(sock: socket.socket, data: bytes) -> None:
    """Send ``data`` once ``sock`` is connected."""
    await wait_until(lambda: select.select([], [sock], [], 0)[1], f"{sock.getsockname()} to connect")
    sock.sendall(data)


async def read_until_closed(sock: socket.socket, seconds: float = 5.0) -> bytes:
    received = b""
    deadline = time.monotonic() + seconds
    while True:
        data, closed = read_now(sock)
        received += data
        if closed:
            return received
        assert time.monotonic() < deadline, f"the node did not close {sock.getsockname()} within {seconds}s"
        await sleep(0.02)


async def start_node(config=CONFIG):
    node = Switch([Collector(CHANNELS)], clock=the_reactor(), config=config)
    node.startService()
    port = await node.listen("tcp:0:interface=127.0.0.1:backlog=256")
    return node, Clients(port.getHost().port)


async def stall(node, clients, count=64):
    """``count`` silent sockets from the 8 attacking addresses, all admitted as pending."""
    for n in range(count):
        clients.open(ATTACKERS[n % len(ATTACKERS)])
    await wait_until(lambda: node._admission.pending == count, f"{count} pending handshakes")


def evicted_addresses(telemetry) -> list[str]:
    return [e["remote_address"] for e in telemetry.named("peer_rejected") if e["reason"] == "pending_evicted"]


@pytest_twisted.ensureDeferred
async def test_newcomers_complete_their_handshakes_while_eight_addresses_renew_64_stalled_sockets(telemetry):
    """64 silent sockets from 8 addresses fill max_pending_handshakes; a peer from a new address still
    completes its handshake, the oldest stalled socket gets a pending_evicted close packet instead, and
    however often the attacker reopens it, each next newcomer gets in too."""
    node, clients = await start_node()
    rng = random.Random(6)
    try:
        await stall(node, clients)
        for round_, newcomer_address in enumerate(["127.0.0.10", "127.0.0.11", "127.0.0.12"]):
            newcomer = clients.open(newcomer_address)
            await send(newcomer, hello(rng))
            await wait_until(
                lambda round_=round_: len(node.peers) == round_ + 1, f"newcomer {newcomer_address}'s session"
            )
            assert not read_now(newcomer)[1], "the newcomer was closed"
            await wait_until(lambda round_=round_: len(evicted_addresses(telemetry)) == round_ + 1, "an eviction")
            evicted = evicted_addresses(telemetry)[-1]
            source = evicted.split(":")[0]
            assert source in ATTACKERS
            [(code, text)] = close_packets_in(await read_until_closed(clients.by_address[evicted]))
            assert code == "pending_evicted" and f"gave way to one from {newcomer_address}/32" in text
            clients.open(source)  # the attacker renews its socket: the budget is full again
            await wait_until(lambda: node._admission.pending == 64, "the renewed socket")
        assert node.refusals == {"pending_evicted": 3}
        node._check_invariants()
    finally:
        clients.close()
        await stop(node)


@pytest_twisted.ensureDeferred
async def test_a_silent_newcomer_is_never_the_one_that_gives_way(telemetry):
    """A newcomer that waits before its hello, while the 8 attacking addresses reopen every socket the
    node closes 20 times over, is never evicted: the largest group's oldest handshake always goes first."""
    node, clients = await start_node()
    try:
        await stall(node, clients)
        newcomer = clients.open("127.0.0.10")
        for renewals in range(1, 21):
            await wait_until(
                lambda renewals=renewals: len(evicted_addresses(telemetry)) == renewals, f"eviction {renewals}"
            )
            evicted = evicted_addresses(telemetry)[-1]
            assert evicted.split(":")[0] in ATTACKERS
            clients.open(evicted.split(":")[0])
        assert not read_now(newcomer)[1], "the newcomer was closed"
        await send(newcomer, hello(random.Random(7)))
        await wait_until(lambda: len(node.peers) == 1, "the newcomer's session")
        node._check_invariants()
    finally:
        clients.close()
        await stop(node)


@pytest_twisted.ensureDeferred
async def test_one_address_holds_at_most_max_pending_per_group_handshakes():
    """Past max_pending_per_group silent sockets from one loopback address, its next one gets a
    pending_group_limit close packet at once; another address is still admitted."""
    node, clients = await start_node(CONFIG.replace(max_pending_per_group=3))
    try:
        await stall(node, clients, count=1)
        for _ in range(2):
            clients.open(ATTACKERS[0])
        await wait_until(lambda: node._admission.pending == 3, "3 pending handshakes")
        [(code, text)] = close_packets_in(await read_until_closed(clients.open(ATTACKERS[0])))
        assert (code, text) == (
            "pending_group_limit",
            "3 inbound connections from 127.0.0.2/32 are handshaking (max_pending_per_group 3)",
        )
        clients.open(ATTACKERS[1])
        await wait_until(lambda: node._admission.pending == 4, "the other address's handshake")
        assert node.refusals == {"pending_group_limit": 1}
        node._check_invariants()
    finally:
        clients.close()
        await stop(node)
