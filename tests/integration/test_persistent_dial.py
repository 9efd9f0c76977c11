"""Persistent dials between real Switches on 127.0.0.1 (specs/resume.md sections 6.4, 7.1).

A persistent peer comes back whatever happened first: it was not listening yet when it
was dialed, or it is this node that restarted with the same key while the peer still
holds its old session suspended. In plaintext the restarted node is refused
(``session_held``) until that session's grace ends at the peer, and then gets in; with
TLS it proves its key and gets in at once. Every wait is bounded and every Switch and
proxy started is stopped.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import protocol

from faultproxy import FaultProxy
from helpers import RecordingReactor, bounded, sleep, the_reactor, until
from mconn import ChannelDescriptor, Config, NodeKey, SessionExpired, SessionRejected, Switch, TLSOptions

from .test_loopback import stop

pytestmark = pytest.mark.integration

CHANNELS = [ChannelDescriptor(0x20, priority=1, send_queue_capacity=16)]
#: A short grace and backoff, so that waiting one out takes about a second.
GRACE = 1.5
CONFIG = Config(stats_interval=0, resume_grace=GRACE, max_reconnect_delay=0.1)


def node(config=CONFIG, **kwargs):
    log = RecordingReactor(CHANNELS)
    switch = Switch([log], clock=the_reactor(), config=config, **kwargs)
    switch.startService()
    return switch, log


async def listen(switch, port=0) -> int:
    listening = await switch.listen(f"tcp:{port}:interface=127.0.0.1")
    return listening.getHost().port


async def a_free_port() -> int:
    """A loopback port that was free a moment ago, and nobody listens on now."""
    port = the_reactor().listenTCP(0, protocol.Factory(), interface="127.0.0.1")
    number = port.getHost().port
    await port.stopListening()
    return number


def attempts(telemetry, node_id, peer_id, *, since=0):
    """The dial_attempt events of ``node_id`` to ``peer_id``, from the ``since``-th on (a
    restarted node has the node id of its previous process)."""
    made = [e for e in telemetry.named("dial_attempt") if e["node_id"] == node_id and e["peer_id"] == peer_id]
    return made[since:]


@pytest_twisted.ensureDeferred
async def test_a_persistent_dial_of_a_port_nobody_listens_on_yet_connects_once_the_node_listens(telemetry):
    """Default Config (retry_initial_dial False): the persistent dial of a node that is not
    listening yet keeps trying through refused connections, and fires with the Peer once
    the node listens on that port."""
    a, _ = node(Config(stats_interval=0, max_reconnect_delay=0.1))
    b, b_log = node()
    try:
        port = await a_free_port()
        dialing = a.dial(f"{b.node_id}@127.0.0.1:{port}", persistent=True)
        await until(lambda: len(attempts(telemetry, a.node_id, b.node_id)) >= 3, "three refused attempts")
        assert not dialing.called, "the persistent dial failed at a refused connection"
        assert all(e["result"] == "failed" for e in attempts(telemetry, a.node_id, b.node_id))
        await listen(b, port)
        peer = await bounded(dialing)
        assert peer.node_id == b.node_id and peer.state == "connected" and peer.is_persistent
        await until(lambda: a.node_id in b.peers, "b's side of the session")
        a._check_invariants()
        b._check_invariants()
    finally:
        await stop(a, b)


async def held_by_listener(config, tls_key=None, tls_listener=None):
    """Listener L and a dialer D (key ``tls_key`` if TLS) that dialed L persistently
    through a proxy; the proxy then cuts D off, L suspends the session, and D's process
    stops (its session goes with it, L is told nothing). Returns (L, L's log, L's port,
    the proxy, the held Peer, D's key)."""
    key = tls_key or NodeKey.generate()
    listener, listener_log = node(config, tls=tls_listener)
    # Only the proxy's address in its pool: not the listen address the listener announces.
    only_proxy = config.replace(ignore_discovered_addresses=True)
    dialer, _ = node(only_proxy, node_key=key, tls=TLSOptions.identity(key) if tls_key else None)
    port = await listen(listener)
    proxy = FaultProxy("127.0.0.1", port)
    proxy_port = await proxy.start()
    await bounded(dialer.dial(f"{listener.node_id}@127.0.0.1:{proxy_port}", persistent=True))
    await until(lambda: dialer.node_id in listener.peers, "the listener's side of the session")
    held = listener.peers[dialer.node_id]
    proxy.refuse(True)
    proxy.reset_all()
    await until(lambda: held.state == "suspended", "the suspension")
    await stop(dialer)  # the process is gone, and its session with it
    return listener, listener_log, port, proxy, held, key


@pytest_twisted.ensureDeferred
async def test_a_restarted_plaintext_node_is_refused_until_the_held_session_expires_then_connects(telemetry):
    """Plaintext: the restarted node (same key) cannot prove it is the node of the
    session the listener holds suspended, so it is refused with session_held; its
    persistent dial keeps trying and connects once the grace has ended there (a fresh
    session; the old one expired)."""
    listener, log, port, proxy, held, key = await held_by_listener(CONFIG)
    restarted = None
    try:
        before = len(attempts(telemetry, key.node_id, listener.node_id))
        restarted, _ = node(node_key=key)
        dialing = restarted.dial(f"{listener.node_id}@127.0.0.1:{port}", persistent=True)
        await until(lambda: listener.refusals.get("session_held", 0) >= 2, "two session_held refusals")
        assert not dialing.called, "the persistent dial gave up at session_held"
        assert listener.peers[key.node_id] is held and held.state == "suspended"
        peer = await bounded(dialing, GRACE + 10)
        assert peer.state == "connected" and held.state == "closed"
        [(old, reason)] = log.removed()
        assert old is held and isinstance(reason, SessionExpired)
        fresh = listener.peers[key.node_id]
        assert fresh is not held and fresh.state == "connected" and not fresh.proven
        tried = attempts(telemetry, key.node_id, listener.node_id, since=before)
        assert tried[-1]["result"] == "connected"
        assert all("session_held" in e["error"] for e in tried[:-1]) and len(tried) >= 3
        listener._check_invariants()
    finally:
        await proxy.stop()
        await stop(listener, *([restarted] if restarted is not None else []))


@pytest_twisted.ensureDeferred
async def test_with_tls_a_restarted_node_dialing_persistently_gets_in_at_its_first_attempt(telemetry):
    """Identity-mode TLS: the restarted node proves its key, so its hello ends the held
    session ("new session") and its persistent dial connects at the first attempt, well
    within the grace, with no session_held refusal."""
    config = CONFIG.replace(resume_grace=30.0)
    key = NodeKey.generate()
    listener, log, port, proxy, held, _ = await held_by_listener(
        config, tls_key=key, tls_listener=TLSOptions.identity(NodeKey.generate())
    )
    restarted = None
    try:
        before = len(attempts(telemetry, key.node_id, listener.node_id))
        restarted, _ = node(config, tls=TLSOptions.identity(key))
        peer = await bounded(restarted.dial(f"{listener.node_id}@127.0.0.1:{port}", persistent=True))
        assert peer.state == "connected"
        [(old, reason)] = log.removed()
        assert old is held and isinstance(reason, SessionRejected) and reason.reason == "new session"
        assert listener.peers[key.node_id].proven and "session_held" not in listener.refusals
        assert [e["result"] for e in attempts(telemetry, key.node_id, listener.node_id, since=before)] == ["connected"]
        await sleep(0.2)  # nothing more: the persistent dialer rests while the session lives
        assert [e["result"] for e in attempts(telemetry, key.node_id, listener.node_id, since=before)] == ["connected"]
        listener._check_invariants()
    finally:
        await proxy.stop()
        await stop(listener, *([restarted] if restarted is not None else []))
