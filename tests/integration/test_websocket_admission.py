"""Admission of WebSocket connections from TCP accept, on real loopback sockets
(specs/websocket.md sections 4 and 6.1, specs/connection.md section 6).

A ws or wss connection counts in its address group from accept, as a pending handshake,
until its mconn handshake ends: silent sockets that never send an upgrade fill at most
``max_pending_per_group`` of ``max_pending_handshakes``, give way like stalled
handshakes, and a peer from another group gets in every time. Behind a trusted proxy
the count moves from the proxy to the client its X-Forwarded-For names, which is taken
only as the proxy wrote it; an upgrade with an Origin is refused unless allowed.

Attackers are raw non-blocking sockets from other loopback addresses (on Linux every
127/8 address is a distinct source, and a group of its own); every wait is bounded,
every socket closed and every Switch stopped.
"""

from __future__ import annotations

import socket

import pytest
import pytest_twisted

from helpers import the_reactor, until
from mconn import Config, NodeKey, Switch
from mconn.net.tls import TLSOptions

from .test_attack_handshake_stall import read_until_closed, send
from .test_loopback import CHANNELS, Collector, bounded, stop
from .test_websocket import PATH, upgrade_request

pytestmark = pytest.mark.integration

#: Silent sockets must outlive the test: none may leave by timing out.
CONFIG = Config(stats_interval=0, handshake_timeout=60.0, ws_handshake_timeout=60.0)
HONEST = "127.0.0.3"
#: What one address may hold of silent sockets: its per-address limit (8) binds before
#: its group's pending limit (16).
HELD_FROM_ONE_ADDRESS = min(CONFIG.max_connections_per_ip, CONFIG.max_pending_per_group)


def node(tls=None, config=CONFIG):
    switch = Switch([Collector(CHANNELS)], tls=tls, clock=the_reactor(), config=config)
    switch.startService()
    return switch


async def listen(switch, scheme="ws", interface="127.0.0.1") -> int:
    escaped = interface.replace(":", "\\:")
    port = await switch.listen(f"{scheme}:tcp:0:interface={escaped}:backlog=256:path={PATH}")
    return port.getHost().port


def silent(source: str, port: int, family=socket.AF_INET, target="127.0.0.1") -> socket.socket:
    """A socket from ``source`` that connects and never says a word."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.bind((source, 0))
    sock.connect_ex((target, port))  # EINPROGRESS; loopback completes at once
    return sock


async def settled(switch, count: int) -> None:
    """Wait (bounded) until the listener has taken ``count`` connections, admitted or
    refused; a tree that does not count them at accept goes on after the bound."""
    admission = switch._admission
    try:
        await until(lambda: admission.pending + sum(admission.refusals.values()) >= count, "accepts", seconds=3)
    except AssertionError:
        pass


async def honest_tries(address: str, tls_of, tries: int = 5, local=HONEST) -> int:
    """How many of ``tries`` fresh honest nodes from ``local`` get a session over ``address``."""
    got = 0
    for _ in range(tries):
        key = NodeKey.generate()
        dialer = Switch(
            [Collector(CHANNELS)],
            tls=tls_of(key),
            node_key=key,
            clock=the_reactor(),
            config=Config(stats_interval=0, local_address=local, max_reconnect_delay=0.05),
        )
        dialer.startService()
        try:
            await bounded(dialer.dial(address), 5)
            got += 1
        except Exception:
            pass
        finally:
            await stop(dialer)
    return got


def identity(key):
    return TLSOptions.identity(key)


def plain(key):
    return None


@pytest.mark.parametrize("scheme", ["ws", "wss"])
@pytest_twisted.ensureDeferred
async def test_64_silent_sockets_from_one_address_do_not_shut_out_a_ws_peer_from_another(scheme):
    """64 sockets from 127.0.0.2 that never send an upgrade: the address holds at most
    max_connections_per_ip of them (the rest refused at accept, ip_limit), and an
    honest node from 127.0.0.3 gets a session 5 times of 5, over ws and over wss."""
    tls_of = identity if scheme == "wss" else plain
    a = node(tls=tls_of(NodeKey.generate()))
    sockets = []
    try:
        port = await listen(a, scheme)
        sockets += [silent("127.0.0.2", port) for _ in range(64)]
        await settled(a, 64)
        assert await honest_tries(f"{a.node_id}@{scheme}://127.0.0.1:{port}{PATH}", tls_of) == 5
        held = len(a._admission.pending_groups.get("127.0.0.2/32", {}))
        assert held == HELD_FROM_ONE_ADDRESS
        assert a.refusals.get("ip_limit", 0) == 64 - held
        a._check_invariants()
    finally:
        for sock in sockets:
            sock.close()
        await stop(a)


@pytest.mark.parametrize("scheme", ["ws", "wss"])
@pytest_twisted.ensureDeferred
async def test_silent_sockets_filling_every_pending_slot_give_way_to_an_honest_ws_peer(scheme, telemetry):
    """8 silent sockets from each of 8 addresses fill max_pending_handshakes (64); each honest
    node from 127.0.0.3 gets in (5 of 5): the first finds the budget full, and the oldest pending
    upgrade of the largest group gives way
    (pending_evicted, answered 503 naming it), as a stalled mconn handshake does."""
    tls_of = identity if scheme == "wss" else plain
    a = node(tls=tls_of(NodeKey.generate()))
    sockets = []
    try:
        port = await listen(a, scheme)
        attackers = [f"127.0.0.{10 + n}" for n in range(8)]
        sockets += [silent(attackers[n % 8], port) for n in range(64)]
        await until(lambda: a._admission.pending == 64, "64 pending upgrades", seconds=5)
        assert await honest_tries(f"{a.node_id}@{scheme}://127.0.0.1:{port}{PATH}", tls_of) == 5
        assert a.refusals == {"pending_evicted": 1}  # the first newcomer found the budget full
        [evicted] = [e for e in telemetry.named("peer_rejected") if e["reason"] == "pending_evicted"]
        assert evicted["remote_address"].rpartition(":")[0] in attackers, evicted
        a._check_invariants()
        if scheme == "ws":  # the evicted socket is answered in HTTP, naming why
            answers = [sock for sock in sockets if _answered(sock)]
            assert answers, "no evicted socket was closed"
            answer = await read_until_closed(answers[0])
            assert answer.startswith(b"HTTP/1.1 503 pending_evicted: "), answer[:200]
    finally:
        for sock in sockets:
            sock.close()
        await stop(a)


def _answered(sock: socket.socket) -> bool:
    """Whether the listener wrote to ``sock`` or closed it."""
    try:
        sock.recv(1, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        pass
    return True


@pytest_twisted.ensureDeferred
async def test_silent_ipv4_sockets_do_not_shut_out_an_ipv6_ws_peer_on_a_dual_stack_listener():
    """A ws listener on :: takes IPv4 too (IPv4-mapped, grouped as IPv4): 64 silent sockets
    from 127.0.0.2 hold at most max_connections_per_ip, and honest nodes from ::1 get in (5 of 5)."""
    a = node()
    sockets = []
    try:
        port = await listen(a, "ws", interface="::")
        sockets += [silent("127.0.0.2", port) for _ in range(64)]
        await settled(a, 64)
        got = await honest_tries(f"{a.node_id}@ws://[::1]:{port}{PATH}", plain, local="::1")
        assert got == 5
        assert len(a._admission.pending_groups.get("127.0.0.2/32", {})) == HELD_FROM_ONE_ADDRESS
        a._check_invariants()
    finally:
        for sock in sockets:
            sock.close()
        await stop(a)


@pytest_twisted.ensureDeferred
async def test_a_pending_upgrade_counts_from_accept_until_the_mconn_handshake_ends_once():
    """An upgraded connection is counted once (per address and as pending) from accept through
    the upgrade to its hello; once the session is up it is pending no more, and when it is gone
    every count is back to zero."""
    a = node()
    sock = None
    try:
        port = await listen(a)
        sock = silent(HONEST, port)
        await until(lambda: a._admission.pending == 1, "the pending upgrade")
        assert a._admission.per_ip == {HONEST: 1}
        a._check_invariants()
        await send(sock, upgrade_request(port))
        await until(lambda: len(a.connections) == 1, "the upgraded connection")
        assert a._admission.pending == 1 and a._admission.per_ip == {HONEST: 1}
        a._check_invariants()
        sock.close()
        sock = None
        await until(lambda: not a.connections, "the connection to go")
        assert a._admission.pending == 0 and a._admission.per_ip == {}
        a._check_invariants()
        assert await honest_tries(f"{a.node_id}@ws://127.0.0.1:{port}{PATH}", plain, tries=1) == 1
        await until(lambda: not a.connections and not a._admission.per_ip, "the dialer to go")
        assert a._admission.pending == 0
        a._check_invariants()
    finally:
        if sock is not None:
            sock.close()
        await stop(a)


@pytest.mark.parametrize("scheme", ["ws", "wss"])
@pytest_twisted.ensureDeferred
async def test_a_stopping_switch_drops_the_upgrades_under_way(scheme):
    """A Switch that stops answers a connection still upgrading and drops it, as it closes its
    connections: nothing is left waiting for ws_handshake_timeout, nothing stays counted."""
    tls_of = identity if scheme == "wss" else plain
    a = node(tls=tls_of(NodeKey.generate()))
    sock = None
    try:
        port = await listen(a, scheme)
        sock = silent(HONEST, port)
        await until(lambda: a._admission.pending == 1, "the pending upgrade")
        await stop(a)
        await until(lambda: _answered(sock), "the listener to close the upgrade", seconds=5)
        if scheme == "ws":
            answer = await read_until_closed(sock)
            assert answer.startswith(b"HTTP/1.1 503 shutdown: closed by this node: shutdown"), answer[:200]
        await until(lambda: a._admission.pending == 0, "nothing pending")
        assert a._admission.per_ip == {}
        a._check_invariants()
    finally:
        if sock is not None:
            sock.close()
        await stop(a)
