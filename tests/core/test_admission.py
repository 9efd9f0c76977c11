"""Admission (pure): address groups, the per-group cap on pending handshakes, and which
pending handshake gives way when all are taken (specs/connection.md section 6)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mconn.core.admission import Admission, address_group
from mconn.config import Config


# -- address_group -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "host, group",
    [
        ("198.51.100.7", "198.51.100.0/24"),
        ("198.51.100.250", "198.51.100.0/24"),
        ("198.51.101.7", "198.51.101.0/24"),
        ("2001:db8:0:1::7", "2001:db8:0:1::/64"),
        ("2001:db8:0:1:ffff:ffff:ffff:ffff", "2001:db8:0:1::/64"),
        ("2001:db8:0:2::7", "2001:db8:0:2::/64"),
        ("::ffff:198.51.100.7", "198.51.100.0/24"),  # IPv4-mapped: grouped as IPv4
        ("fe80::1%eth0", "fe80::/64"),  # the scope id is dropped
        ("127.0.0.1", "127.0.0.1/32"),  # loopback: each address is its own group
        ("127.0.0.9", "127.0.0.9/32"),
        ("127.5.6.7", "127.5.6.7/32"),
        ("::1", "::1/128"),
        ("::ffff:127.0.0.2", "127.0.0.2/32"),
        ("node.example", "node.example"),  # not an IP address: its own group
        (None, None),
    ],
)
def test_address_group_is_the_ipv4_24_or_ipv6_64_loopback_addresses_alone(host, group):
    """An IPv4 address groups by /24, an IPv6 one by /64 (IPv4-mapped as IPv4, scope dropped);
    a loopback address is a group of its own; a non-IP host is itself; None stays None."""
    assert address_group(host) == group


def test_address_group_prefixes_are_parameters():
    """The prefix lengths are parameters: /32 and /128 make every address its own group, 0 one group."""
    assert address_group("198.51.100.7", prefix_v4=32) == "198.51.100.7/32"
    assert address_group("198.51.100.7", prefix_v4=16) == "198.51.0.0/16"
    assert address_group("198.51.100.7", prefix_v4=0) == "0.0.0.0/0"
    assert address_group("2001:db8::7", prefix_v6=128) == "2001:db8::7/128"
    assert address_group("2001:db8:1:2:3::7", prefix_v6=48) == "2001:db8:1::/48"
    assert address_group("127.0.0.3", prefix_v4=8) == "127.0.0.3/32"  # loopback stays alone


def test_admission_groups_by_the_config_prefixes():
    """Admission.group_of follows Config.pending_group_prefix_v4 / _v6."""
    admission = Admission(Config(pending_group_prefix_v4=16, pending_group_prefix_v6=32))
    assert admission.group_of("198.51.100.7") == "198.51.0.0/16"
    assert admission.group_of("2001:db8:1::7") == "2001:db8::/32"


# -- pending handshakes ------------------------------------------------------------------


def admit_all(admission, hosts):
    """Admit one handshake per host (named ``host#n``); returns the results in order."""
    return [admission.admit(host, f"{host}#{n}") for n, host in enumerate(hosts)]


def test_one_group_holds_at_most_max_pending_per_group():
    """Past max_pending_per_group pending handshakes from one /24, another from it is pending_group_limit;
    a handshake of the group that ends makes room again."""
    admission = Admission(Config(max_pending_per_group=2))
    assert admit_all(admission, ["198.51.100.1", "198.51.100.2"]) == [(None, None)] * 2
    refusal, evicted = admission.admit("198.51.100.3", "third")
    assert evicted is None
    assert (refusal.reason, str(refusal)) == (
        "pending_group_limit",
        "2 inbound connections from 198.51.100.0/24 are handshaking (max_pending_per_group 2)",
    )
    assert admission.admit("198.51.101.1", "other /24") == (None, None)
    admission.handshake_over("198.51.100.1#0")
    assert admission.admit("198.51.100.3", "third") == (None, None)
    assert admission.per_ip == {"198.51.100.1": 1, "198.51.100.2": 1, "198.51.101.1": 1, "198.51.100.3": 1}


def test_when_full_the_oldest_of_the_largest_group_gives_way_to_a_smaller_group():
    """All max_pending_handshakes taken: a newcomer of a smaller group is admitted, and the oldest pending
    handshake of the largest group is evicted (no longer counted), with a pending_evicted rejection."""
    admission = Admission(Config(max_pending_handshakes=4))
    admission.admit("203.0.113.1", "small")
    admit_all(admission, ["198.51.100.1", "198.51.100.2", "198.51.100.3"])
    refusal, evicted = admission.admit("203.0.113.2", "newcomer")
    assert refusal is None
    assert evicted.handshake == "198.51.100.1#0"
    assert evicted.rejection.reason == "pending_evicted"
    assert str(evicted.rejection) == (
        "4 inbound connections are handshaking (max_pending_handshakes 4); the oldest of the 3 from "
        "198.51.100.0/24 gave way to one from 203.0.113.0/24"
    )
    assert admission.pending == 4
    assert list(admission.pending_groups["198.51.100.0/24"]) == ["198.51.100.2#1", "198.51.100.3#2"]
    assert list(admission.pending_groups["203.0.113.0/24"]) == ["small", "newcomer"]
    admission.handshake_over("198.51.100.1#0")  # its connection ends later: nothing more happens
    assert admission.pending == 4


def test_of_tied_largest_groups_the_one_with_the_oldest_handshake_gives_way():
    """Two groups tied for largest: the handshake admitted first of the two gives way."""
    admission = Admission(Config(max_pending_handshakes=4))
    admit_all(admission, ["198.51.100.1", "203.0.113.1", "203.0.113.2", "198.51.100.2"])
    _, evicted = admission.admit("192.0.2.1", "newcomer")
    assert evicted.handshake == "198.51.100.1#0"


def test_when_full_a_newcomer_of_a_largest_group_is_refused_with_pending_limit():
    """A newcomer whose group holds as many pending handshakes as the largest is refused (pending_limit);
    nothing is evicted: renewing its own sockets gains an attacker nothing."""
    admission = Admission(Config(max_pending_handshakes=4))
    admit_all(admission, ["198.51.100.1", "198.51.100.2", "203.0.113.1", "203.0.113.2"])
    refusal, evicted = admission.admit("203.0.113.3", "third of its group")
    assert evicted is None
    assert (refusal.reason, str(refusal)) == (
        "pending_limit",
        "4 inbound connections are handshaking (max_pending_handshakes 4)",
    )
    assert admission.pending == 4 and "third of its group" not in admission._pending


def test_when_full_the_ip_limit_is_checked_before_anything_is_evicted():
    """A newcomer that the per-IP limit refuses evicts nobody."""
    admission = Admission(Config(max_pending_handshakes=2, max_connections_per_ip=1))
    admit_all(admission, ["198.51.100.1", "198.51.100.2"])
    admission.per_ip["203.0.113.1"] = 1  # an established connection from there
    refusal, evicted = admission.admit("203.0.113.1", "newcomer")
    assert (refusal.reason, evicted, admission.pending) == ("ip_limit", None, 2)


def test_check_invariants_checks_the_groups_against_the_pending_handshakes():
    """check_invariants fails when a group and the pending handshakes disagree."""
    admission = Admission(Config())
    admit_all(admission, ["198.51.100.1", "2001:db8::1"])
    admission.check_invariants(["198.51.100.1", "2001:db8::1"], 2)
    admission.pending_groups["2001:db8::/64"] = {}
    with pytest.raises(AssertionError, match="pending by group"):
        admission.check_invariants(["198.51.100.1", "2001:db8::1"], 2)


# -- the attack: a few groups renew their stalled sockets forever ------------------------


@settings(max_examples=60, deadline=None)
@given(
    attackers=st.integers(min_value=1, max_value=8),
    renewals=st.lists(st.integers(min_value=0, max_value=7), max_size=80),
)
def test_renewing_attackers_never_evict_a_newcomer_of_a_new_group(attackers, renewals):
    """Up to 8 attacking /24s fill the budget and renew an evicted socket as often as they like: a
    newcomer from a new group is admitted, never evicted, and no group passes its cap."""
    admission = Admission(Config(max_pending_handshakes=64, max_pending_per_group=8))
    for n in range(64):
        admission.admit(f"198.51.{n % attackers}.{n}", n)
    assert admission.admit("203.0.113.9", "newcomer")[0] is None
    for step, group in enumerate(renewals):
        _, evicted = admission.admit(f"198.51.{group % attackers}.{200 + step % 50}", ("renewal", step))
        assert evicted is None or evicted.handshake != "newcomer"
        assert admission.pending <= 64
        assert max(len(m) for m in admission.pending_groups.values()) <= 8
    assert "newcomer" in admission._pending
