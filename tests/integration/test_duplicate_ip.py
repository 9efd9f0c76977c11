"""``Config.allow_duplicate_ip = False`` over real sockets on loopback: one node per IP
address, inbound and outbound (127.0.0.1 and 127.0.0.2 are distinct addresses on Linux).

Every wait is bounded; every Switch started is stopped.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import defer

from helpers import RecordingReactor, bounded, the_reactor
from mconn import ChannelDescriptor, Config, PeerClosed, PeerRejected, Switch

pytestmark = pytest.mark.integration

TIMEOUT = 10.0
CHANNELS = [ChannelDescriptor(0x20, priority=1)]


def config(**changes) -> Config:
    return Config(stats_interval=0, **changes)


async def node(switches, interface: str, **changes):
    """A started Switch listening on ``interface``; returns (switch, its ID@host:port)."""
    switch = Switch([RecordingReactor(CHANNELS)], config=config(**changes), clock=the_reactor())
    switch.startService()
    switches.append(switch)
    port = await switch.listen(f"tcp:0:interface={interface}")
    return switch, f"{switch.node_id}@{interface}:{port.getHost().port}"


async def failure_of(d):
    try:
        result = await bounded(d, TIMEOUT)
    except Exception as e:  # the refusal is what the test looks at
        return e
    raise AssertionError(f"the dial succeeded with {result!r}")


def refusal_word(error) -> str | None:
    if isinstance(error, PeerRejected):
        return error.reason
    if isinstance(error, PeerClosed):
        return error.code
    return None


@pytest_twisted.ensureDeferred
async def test_one_session_per_ip_address_inbound_and_outbound():
    """With allow_duplicate_ip False, a second node connecting from 127.0.0.1 is refused
    ``duplicate_ip`` while a node from 127.0.0.2 gets in; and the node does not dial a
    third node at 127.0.0.1 (refused before connecting), nor keeps one it reached by
    name (refused at its hello), while it dials one at 127.0.0.3."""
    switches = []
    try:
        hub, hub_address = await node(switches, "127.0.0.1", allow_duplicate_ip=False)
        first, _ = await node(switches, "127.0.0.1")
        second, _ = await node(switches, "127.0.0.1")
        other, _ = await node(switches, "127.0.0.1", local_address="127.0.0.2")

        await bounded(first.dial(hub_address), TIMEOUT)
        error = await failure_of(second.dial(hub_address))
        assert refusal_word(error) == "duplicate_ip", error
        assert "127.0.0.1" in str(error) and first.node_id in str(error), error
        assert hub.refusals.get("duplicate_ip") == 1
        await bounded(other.dial(hub_address), TIMEOUT)
        assert set(hub.peers) == {first.node_id, other.node_id}

        third, third_address = await node(switches, "127.0.0.1")
        error = await failure_of(hub.dial(third_address))
        assert isinstance(error, PeerRejected) and error.reason == "duplicate_ip", error
        assert third.connections == set(), "the dial was refused before it connected"
        by_name = third_address.replace("@127.0.0.1:", "@localhost:")
        error = await failure_of(hub.dial(by_name))
        assert refusal_word(error) == "duplicate_ip", error
        assert hub.refusals.get("duplicate_ip") == 2

        fourth, fourth_address = await node(switches, "127.0.0.3")
        await bounded(hub.dial(fourth_address), TIMEOUT)
        assert set(hub.peers) == {first.node_id, other.node_id, fourth.node_id}
        hub._check_invariants()
    finally:
        await bounded(defer.gatherResults([defer.maybeDeferred(s.stopService) for s in switches]), TIMEOUT)


@pytest_twisted.ensureDeferred
async def test_by_default_nodes_may_share_an_ip_address():
    """allow_duplicate_ip is True by default (fleets on one host): two nodes from 127.0.0.1 both get in."""
    switches = []
    try:
        hub, hub_address = await node(switches, "127.0.0.1")
        first, _ = await node(switches, "127.0.0.1")
        second, _ = await node(switches, "127.0.0.1")
        await bounded(first.dial(hub_address), TIMEOUT)
        await bounded(second.dial(hub_address), TIMEOUT)
        assert set(hub.peers) == {first.node_id, second.node_id}
    finally:
        await bounded(defer.gatherResults([defer.maybeDeferred(s.stopService) for s in switches]), TIMEOUT)
