"""``Switch.mark_bad(peer, seconds)`` (specs/reactor-api.md section 6.5), on a MemoryNetwork
with its ``task.Clock``: the peer's session ends with a clear reason, the node id is
refused inbound and outbound and not dialed while the ban lasts, and the ban ends by
itself; the ban list is bounded (mconn/switch/bans.py)."""

from __future__ import annotations

import pytest
from twisted.internet import task

from helpers import RecordingReactor
from mconn import ChannelDescriptor, Config, PeerRejected
from mconn.switch.bans import MAX_BANS, BanList
from mconn.testing import MemoryNetwork

CHANNELS = [ChannelDescriptor(0x20, priority=1)]
CONFIG = Config(stats_interval=0)


def outcome(d):
    """What a Deferred fired with: ('ok', value) or ('failed', exception); None if not yet."""
    box = []
    d.addCallbacks(lambda v: box.append(("ok", v)), lambda f: box.append(("failed", f.value)))
    return box[0] if box else None


def nodes():
    network = MemoryNetwork()
    ra, rb = RecordingReactor(CHANNELS), RecordingReactor(CHANNELS)
    a = network.switch([ra], config=CONFIG)
    b = network.switch([rb], config=CONFIG)
    a.listen("tcp:26656")
    b.listen("tcp:26656")
    return network, a, ra, b, rb


def test_mark_bad_closes_the_peer_refuses_it_both_ways_and_the_ban_ends():
    """The banned peer's session ends naming the ban; while it lasts the node's hello is refused
    (``banned``) and it is not dialed; once ``seconds`` have passed it may connect again."""
    network, a, ra, b, rb = nodes()
    d = b.dial(network.dial_address(a))
    network.run(1.0)
    assert outcome(d)[0] == "ok" and b.node_id in a.peers
    until = a.mark_bad(a.peers[b.node_id], 60.0, "sent an invalid block")
    network.run(1.0)
    assert until == pytest.approx(network.clock.seconds() - 1.0 + 60.0)
    assert a.peers == {} and b.peers == {}
    [(_, _, reason)] = [c for c in rb.calls if c[0] == "remove_peer"]
    assert "banned for 60.0s: sent an invalid block" in str(reason)

    inbound = b.dial(network.dial_address(a))  # the banned node dials us: its hello is refused
    network.run(1.0)
    kind, error = outcome(inbound)
    assert kind == "failed" and "banned" in str(error), error
    assert a.refusals.get("banned") == 1 and a.peers == {}

    connections_before = len(network.links)
    outbound = a.dial(network.dial_address(b))  # we do not dial it: it fails before connecting
    kind, error = outcome(outbound)
    assert kind == "failed" and isinstance(error, PeerRejected) and error.reason == "banned"
    assert "banned for" in str(error) and "sent an invalid block" in str(error)
    assert len(network.links) == connections_before

    network.run(58.5)  # the ban ends 60 s after mark_bad
    again = b.dial(network.dial_address(a))
    network.run(1.0)
    assert outcome(again)[0] == "ok" and b.node_id in a.peers and not a.bans.is_banned(b.node_id)
    a._check_invariants()


def test_a_banned_persistent_peer_is_dialed_again_once_its_ban_ends():
    """A persistent peer marked bad is not dialed while its ban lasts (its attempts fail
    locally with ``banned``); after the ban it is connected again."""
    network, a, ra, b, rb = nodes()
    a.dial(network.dial_address(b), persistent=True)
    network.run(1.0)
    assert b.node_id in a.peers
    a.mark_bad(b.node_id, 30.0)
    network.run(20.0)
    assert b.node_id not in a.peers and a.node_id not in b.peers
    network.run(15.0)
    assert b.node_id in a.peers


def test_a_ban_must_last_a_positive_finite_time():
    """``mark_bad`` refuses a duration that is not a positive finite number, naming it."""
    network, a, ra, b, rb = nodes()
    for bad in (0, -1.0, float("inf"), "10", True):
        with pytest.raises(ValueError, match=r"positive finite number of seconds, got"):
            a.mark_bad("ab" * 20, bad)


def test_the_ban_list_is_bounded_and_forgets_the_ban_that_ends_first():
    """Past its size the list drops ended bans, then the ban that ends first (``evicted``)."""
    clock = task.Clock()
    bans = BanList(clock, size=3)
    for i, seconds in enumerate((10.0, 5.0, 20.0, 30.0)):
        bans.ban(f"{i:040x}", seconds)
    assert len(bans) == 3 and bans.evicted == 1 and not bans.is_banned(f"{1:040x}")
    clock.advance(10.0)
    assert set(bans.view) == {f"{2:040x}", f"{3:040x}"}
    assert MAX_BANS == BanList(clock).size == 1024
