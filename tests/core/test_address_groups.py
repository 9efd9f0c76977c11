"""The unit of the per-address limits and the group of a peer, without sockets
(specs/connection.md section 6, specs/pex.md section 3.4).

``max_connections_per_ip`` counts an IPv6 /64 as one address (``limit_key``), live
connections in ``Admission`` and sessions, suspended ones included, in ``SessionLimits``;
an IPv4-mapped IPv6 address counts as its IPv4 address. A peer's host is read from the
transport's ``host:port`` text however the transport writes it (an IPv6 host without
brackets, port 0 for a proxied client), and a peer without a host is one group, never a
group of its claimed node id.
"""

import types

import pytest

from mconn.core.address import PeerAddress, announced_address, host_of, transport_host
from mconn.core.admission import Admission, limit_key
from mconn.config import Config
from mconn.errors import PeerRejected
from mconn.switch.session_limits import SessionLimits
from mconn.core.session_table import PeerState
from reactors.addrbook import NO_HOST_GROUP, network_group

#: Five addresses of one /64, as an attacker given that /64 binds them; and one of another.
ONE_64 = [f"2001:db8:7:1::{i:x}" for i in (1, 2, 0xBEEF, 0xFFFF, 0xABCD)]
OTHER_64 = "2001:db8:7:2::1"


# -- limit_key ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host, key",
    [
        ("198.51.100.7", "198.51.100.7"),  # IPv4: each address (many users share one behind NAT)
        ("198.51.100.8", "198.51.100.8"),
        ("::ffff:198.51.100.7", "198.51.100.7"),  # IPv4-mapped: its IPv4 address
        ("2001:db8:7:1::1", "2001:db8:7:1::/64"),
        ("2001:db8:7:1:ffff:ffff:ffff:ffff", "2001:db8:7:1::/64"),
        ("2001:db8:7:2::1", "2001:db8:7:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        ("::1", "::1"),  # loopback stands alone
        ("127.0.0.2", "127.0.0.2"),
        ("node.example", "node.example"),  # not an IP: itself
        (None, None),
    ],
)
def test_the_limit_key_is_an_ipv4_address_or_an_ipv6_64(host, key):
    assert limit_key(host) == key
    assert limit_key(key) == key  # a key is its own key (Admission.release takes either)


def test_the_limit_prefixes_are_config_fields():
    admission = Admission(Config(ip_limit_prefix_v4=24, ip_limit_prefix_v6=48))
    assert admission.key_of("198.51.100.7") == admission.key_of("198.51.100.200") == "198.51.100.0/24"
    assert admission.key_of("2001:db8:7:1::1") == admission.key_of("2001:db8:7:ffff::1") == "2001:db8:7::/48"
    assert Admission(Config(ip_limit_prefix_v6=128)).key_of("2001:db8:7:1::1") == "2001:db8:7:1::1"
    for field, value in [("ip_limit_prefix_v4", 33), ("ip_limit_prefix_v6", 129), ("ip_limit_prefix_v6", -1)]:
        with pytest.raises(ValueError, match=f"Config.{field} must be an integer in 0..(32|128), got {value}"):
            Config(**{field: value})


# -- Admission: live connections ---------------------------------------------------------


def test_the_addresses_of_one_ipv6_64_share_max_connections_per_ip():
    """Five addresses of one /64 hold max_connections_per_ip connections together, the next
    from any of them is refused naming the /64; another /64, ::1 and an IPv4 peer get in."""
    admission = Admission(Config(max_connections_per_ip=4))
    admitted = 0
    for i in range(20):
        refusal, _ = admission.admit(ONE_64[i % 5], object())
        if refusal is None:
            admitted += 1
        else:
            assert (refusal.reason, str(refusal)) == (
                "ip_limit",
                "4 connections from 2001:db8:7:1::/64 (max_connections_per_ip 4)",
            )
    assert admitted == 4 and admission.per_ip == {"2001:db8:7:1::/64": 4}
    for honest in (OTHER_64, "::1", "198.51.100.7"):
        assert admission.admit(honest, object()) == (None, None)
    admission.release("2001:db8:7:1::beef")  # by any address of the /64, or by its key
    admission.release("2001:db8:7:1::/64")
    assert admission.per_ip["2001:db8:7:1::/64"] == 2
    assert admission.admit(ONE_64[0], object())[0] is None


def test_an_ipv4_mapped_address_counts_as_its_ipv4_address():
    admission = Admission(Config(max_connections_per_ip=2))
    assert admission.admit("198.51.100.7", object())[0] is None
    assert admission.admit("::ffff:198.51.100.7", object())[0] is None
    refusal, _ = admission.admit("::ffff:c633:6407", object())  # the same address, in hex
    assert refusal.reason == "ip_limit" and "from 198.51.100.7 " in str(refusal)


# -- SessionLimits: sessions, suspended ones included ------------------------------------


class _Sessions:
    """The part of a SessionManager that SessionLimits uses: its config, and evict."""

    def __init__(self, config):
        self.config = config
        self.evicted = []
        self.limits = SessionLimits(self, Admission(config))
        self.peers = []

    def evict(self, peer, why):
        self.evicted.append((peer.node_id, why))
        self.remove(peer)

    def start(self, host, node_id):
        """A session from ``host`` passed the limits and joined the table."""
        key = self.limits._admission.key_of(host)
        proto = types.SimpleNamespace(context=types.SimpleNamespace(is_outbound=False), ip_key=key, hello=None)
        self.limits.check(proto)
        session = types.SimpleNamespace(carried_traffic=lambda: True, unacked_bytes=0)
        peer = types.SimpleNamespace(
            node_id=node_id, state=PeerState.CONNECTED, is_outbound=False, ip_key=key, session=session
        )
        self.peers.append(peer)
        self.limits.counted(peer, 1)
        return peer

    def suspend(self, peer):
        peer.state = PeerState.SUSPENDED
        self.limits.state_changed(peer)

    def remove(self, peer):
        self.peers.remove(peer)
        peer.state = PeerState.CLOSED
        self.limits.state_changed(peer)
        self.limits.counted(peer, -1)


def test_sessions_of_one_ipv6_64_live_and_suspended_share_one_address_share():
    """Five addresses of one /64 open sessions and suspend them: together they hold at most
    max_connections_per_ip sessions, live and suspended; each new one makes its oldest suspended
    session give way, and with all of them live the next is refused. Another /64 is not touched."""
    sessions = _Sessions(Config(max_connections_per_ip=8, max_inbound_peers=40))
    honest = sessions.start(OTHER_64, "honest")
    for i in range(40):
        peer = sessions.start(ONE_64[i % 5], f"sybil{i}")
        sessions.suspend(peer)
        held = [p for p in sessions.peers if p.ip_key == "2001:db8:7:1::/64"]
        assert len(held) <= 8
    assert len(sessions.evicted) == 40 - 8
    assert all("8 sessions from 2001:db8:7:1::/64 (max_connections_per_ip 8)" in why for _, why in sessions.evicted)
    assert honest in sessions.peers and sessions.limits.inbound_per_host["2001:db8:7:2::/64"] == 1
    for peer in [p for p in sessions.peers if p.state is PeerState.SUSPENDED]:
        sessions.remove(peer)
    for i in range(8):
        sessions.start(ONE_64[i % 5], f"live{i}")
    with pytest.raises(PeerRejected, match=r"8 sessions from 2001:db8:7:1::/64 \(max_connections_per_ip 8\)"):
        sessions.start(ONE_64[4], "one more")
    sessions.start("2001:db8:7:3::1", "another honest")
    sessions.limits.check_invariants(sessions.peers)


# -- the host and group of a peer ----------------------------------------------------------


@pytest.mark.parametrize(
    "text, host",
    [
        ("198.51.100.7:40000", "198.51.100.7"),
        ("::1:40000", "::1"),  # Twisted's IPv6Address host:port, no brackets
        ("2001:db8::7:26656", "2001:db8::7"),
        ("[2001:db8::7]:26656", "2001:db8::7"),
        ("203.0.113.7:0", "203.0.113.7"),  # a client a trusted proxy names: port 0
        ("node.example:26656", "node.example"),
        ("", None),
        ("no port", None),
        ("1.2.3.4:x", None),
        ("a b:1", None),
        ("zz::1:80", None),
    ],
)
def test_host_of_reads_the_transports_host_port_text(text, host):
    assert host_of(text) == host


def test_transport_host_is_the_transports_peer_host():
    class Transport:
        def __init__(self, peer):
            self.peer = peer

        def getPeer(self):
            return self.peer

    assert transport_host(Transport(types.SimpleNamespace(host="::1", port=4242))) == "::1"
    assert transport_host(Transport(types.SimpleNamespace(host="203.0.113.7", port=0))) == "203.0.113.7"
    assert transport_host(Transport(types.SimpleNamespace(name="/tmp/sock"))) is None  # a UNIX socket
    assert transport_host(None) is None


def test_an_unspecified_announced_host_becomes_the_remote_host_ipv6_and_proxied_included():
    node = "ab" * 20
    assert announced_address(node, "[::]:7", remote_host="2001:db8::5") == PeerAddress(node, "2001:db8::5", 7)
    assert announced_address(node, "0.0.0.0:7", "::1:4242") == PeerAddress(node, "::1", 7)
    assert announced_address(node, "0.0.0.0:7", "203.0.113.7:0") == PeerAddress(node, "203.0.113.7", 7)
    assert announced_address(node, "0.0.0.0:7", remote_host=None) is None


def test_the_network_group_of_no_host_is_one_group_never_a_node_id():
    assert network_group(None) == NO_HOST_GROUP == "no-host"
    assert network_group("::1") == network_group("127.0.0.1") == "loopback"
    assert network_group("2001:db8:7:1::1") == network_group("2001:db8:ffff::1") == "2001:db8::/32"
    assert network_group("::ffff:203.0.113.7") == network_group("203.0.9.9") == "203.0.0.0/16"
