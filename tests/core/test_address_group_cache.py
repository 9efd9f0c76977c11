"""admission.address_group's cache: the same answers as the plain function, and bounded."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from mconn.core.admission import ADDRESS_GROUP_CACHE, address_group

hosts = st.one_of(
    st.ip_addresses().map(str),
    st.ip_addresses(v=4).map(lambda a: f"::ffff:{a}"),
    st.text(max_size=12),
    st.none(),
)


@settings(max_examples=300, deadline=None)
@given(hosts, st.integers(0, 32), st.integers(0, 128))
def test_cached_groups_are_the_plain_ones(host, prefix_v4, prefix_v6):
    """A remembered group is the one the uncached function computes, asked once or twice,
    for IPv4, IPv6, IPv4-mapped, loopback and non-IP hosts and any prefixes."""
    plain = address_group.__wrapped__(host, prefix_v4, prefix_v6)
    assert address_group(host, prefix_v4, prefix_v6) == plain
    assert address_group(host, prefix_v4, prefix_v6) == plain


def test_the_cache_is_bounded():
    """More distinct hosts than ADDRESS_GROUP_CACHE keep at most that many answers: a
    stranger connecting from many addresses cannot grow it."""
    base = int(ipaddress.ip_address("10.0.0.0"))
    for i in range(ADDRESS_GROUP_CACHE + 100):
        address_group(str(ipaddress.ip_address(base + i)))
    info = address_group.cache_info()
    assert info.maxsize == ADDRESS_GROUP_CACHE
    assert info.currsize == ADDRESS_GROUP_CACHE
