"""Admission: may an inbound connection start its handshake, may a session start? Pure.

The connection filter of specs/connection.md section 6 (CometBFT's transport does the
same job with its ``ConnFilterFunc``): per-address connection counts (``limit_key``: an
IPv4 address, every address of an IPv6 /64 as one), the inbound handshakes under way,
and the peer limits per direction. Every refusal is a
``PeerRejected`` whose reason is the close code and whose message names the limit and
the values; ``refusals`` counts them by close code (``Switch.refusals``, the status page).

Theory of operation (pending handshakes). A stranger can open sockets and say nothing
until ``handshake_timeout``; without more, a few addresses fill
``max_pending_handshakes`` and renew their sockets as they time out, and nobody else
gets in. So pending handshakes are counted per *address group* (``address_group``: an
IPv4 /24, an IPv6 /64, the usual unit of one owner's addresses), and

* one group holds at most ``max_pending_per_group`` of them (``pending_group_limit``);
* when all ``max_pending_handshakes`` are taken, a newcomer whose group holds fewer than
  the largest group is still admitted: the oldest pending handshake of the largest group
  (of those tied, the one admitted first) gives way (``pending_evicted``). A newcomer of
  a largest group is refused (``pending_limit``): evicting its own kind gains nothing.

An attacker that renews its sockets therefore evicts its own oldest ones, never a
handshake of a smaller group, and a newcomer from a new group (it holds none) always
gets in. Oldest means admitted first: a handshake that has taken longest is the likeliest
to be stalled, and has had the most time to finish.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
from collections.abc import Iterable

from mconn.config import Config
from mconn.errors import PeerRejected


#: How many hosts' groups ``address_group`` remembers: parsing an address costs tens of
#: microseconds, and a connect storm asks for the same few hosts again and again.
ADDRESS_GROUP_CACHE = 4096


@functools.lru_cache(maxsize=ADDRESS_GROUP_CACHE)
def address_group(host: str | None, prefix_v4: int = 24, prefix_v6: int = 64) -> str | None:
    """The address group of ``host``, as a network (``"198.51.100.0/24"``).

    An IPv4 address is grouped by its first ``prefix_v4`` bits, an IPv6 one by its first
    ``prefix_v6`` (an IPv4-mapped IPv6 address, ``::ffff:a.b.c.d``, as its IPv4 address;
    a scope id is dropped). A loopback address is a group of its own (a /32, ``::1/128``):
    only processes of this machine can connect from one, and they can harm the node in
    cheaper ways than address farming; the addresses of 127.0.0.0/8 then keep standing
    for distinct hosts, as local tests and demos use them. A host that is not an IP
    address is its own group; None (a transport without a host) is the group None.
    The last ``ADDRESS_GROUP_CACHE`` answers are remembered (a bounded LRU cache).
    """
    if host is None:
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    prefix = prefix_v4 if address.version == 4 else prefix_v6
    if address.is_loopback:
        prefix = address.max_prefixlen
    return str(ipaddress.ip_network((int(address), prefix), strict=False))


@functools.lru_cache(maxsize=ADDRESS_GROUP_CACHE)
def limit_key(host: str | None, prefix_v4: int = 32, prefix_v6: int = 64) -> str | None:
    """The key ``max_connections_per_ip`` counts ``host`` under (specs/connection.md
    section 6): its ``address_group`` with the limit's prefixes, an IPv4 /32 and an IPv6
    /64 by default, written as the bare address where the group is one address
    (``"198.51.100.7"``, ``"::1"``) and as the network otherwise (``"2001:db8:1:2::/64"``).

    Every address of one IPv6 /64 is one key: whoever has one address of a /64 has them
    all, so counting each alone would let one host take every inbound slot. An
    IPv4-mapped IPv6 address is its IPv4 address; a loopback address stands alone.
    Remembered as ``address_group`` is (a bounded LRU cache): an accepted connection
    asks for its host's key twice (``Admission.admit``, the protocol's ``ip_key``).
    """
    group = address_group(host, prefix_v4, prefix_v6)
    if group is None or "/" not in group:
        return group
    network, _, bits = group.partition("/")
    return network if int(bits) == (32 if "." in network else 128) else group


@dataclasses.dataclass(frozen=True)
class Evicted:
    """A pending handshake that gave way to a newcomer, and why (``pending_evicted``)."""

    handshake: object
    rejection: PeerRejected


class Admission:
    """The admission counters of one Switch.

    :param config: the limits (``max_pending_handshakes``, ``max_pending_per_group``,
        ``pending_group_prefix_v4`` / ``_v6``, ``max_connections_per_ip`` counted per
        ``ip_limit_prefix_v4`` / ``_v6``, ``max_inbound_peers``, ``max_outbound_peers``).
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        #: ``limit_key`` of the remote host (an IPv4 address, an IPv6 /64) -> inbound
        #: connections admitted from it and not yet gone.
        self.per_ip: dict[str, int] = {}
        #: address group -> its pending handshakes (a dict used as an ordered set),
        #: oldest first. A group with none is absent.
        self.pending_groups: dict[str | None, dict[object, None]] = {}
        #: Every pending handshake -> its group, oldest first.
        self._pending: dict[object, str | None] = {}
        #: Connections refused, by close code.
        self.refusals: dict[str, int] = {}

    @property
    def pending(self) -> int:
        """Inbound connections admitted whose handshake has not ended yet."""
        return len(self._pending)

    def group_of(self, host: str | None) -> str | None:
        """``host``'s address group under the current Config."""
        return address_group(host, self.config.pending_group_prefix_v4, self.config.pending_group_prefix_v6)

    def key_of(self, host: str | None) -> str | None:
        """``host``'s ``limit_key`` under the current Config: what ``admit`` counts it
        under and ``release`` takes back. A key is its own key."""
        return limit_key(host, self.config.ip_limit_prefix_v4, self.config.ip_limit_prefix_v6)

    def admit(self, host: str | None, handshake: object) -> tuple[PeerRejected | None, Evicted | None]:
        """Admit an inbound connection from ``host``, or say why not.

        ``handshake`` stands for the connection (any hashable object, the same one for
        ``handshake_over``). An admitted connection counts against ``key_of(host)``
        until ``release(host)`` and as pending until ``handshake_over(handshake)``.

        :returns: ``(refusal, evicted)``: a refusal, or None and the pending handshake
            that gave way to this one (already no longer counted), or None.
        """
        config = self.config
        group = self.group_of(host)
        in_group = len(self.pending_groups.get(group, ()))
        full = self.pending >= config.max_pending_handshakes
        largest = self._largest_group() if full else None
        if full and in_group >= len(self.pending_groups[largest]):
            return PeerRejected(
                "pending_limit",
                f"{self.pending} inbound connections are handshaking "
                f"(max_pending_handshakes {config.max_pending_handshakes})",
            ), None
        key = self.key_of(host)
        from_host = self.per_ip.get(key, 0) if key is not None else 0
        if key is not None and from_host >= config.max_connections_per_ip:
            return PeerRejected(
                "ip_limit",
                f"{from_host} connections from {key} (max_connections_per_ip {config.max_connections_per_ip})",
            ), None
        if in_group >= config.max_pending_per_group:
            return PeerRejected(
                "pending_group_limit",
                f"{in_group} inbound connections from {group} are handshaking "
                f"(max_pending_per_group {config.max_pending_per_group})",
            ), None
        evicted = self._evict(largest, group) if full else None
        if key is not None:
            self.per_ip[key] = from_host + 1
        self._pending[handshake] = group
        self.pending_groups.setdefault(group, {})[handshake] = None
        return None, evicted

    def _largest_group(self) -> str | None:
        """The group holding the most pending handshakes; of those tied, the one whose
        oldest handshake was admitted first."""
        largest = max(len(members) for members in self.pending_groups.values())
        for group in self._pending.values():  # oldest first
            if len(self.pending_groups[group]) == largest:
                return group
        raise AssertionError("no pending handshake")  # pragma: no cover (admit checks `full`)

    def _evict(self, group: str | None, newcomer_group: str | None) -> Evicted:
        """The oldest pending handshake of ``group`` gives way to one from ``newcomer_group``."""
        count, total = len(self.pending_groups[group]), self.pending
        handshake = next(iter(self.pending_groups[group]))
        self.handshake_over(handshake)
        return Evicted(
            handshake,
            PeerRejected(
                "pending_evicted",
                f"{total} inbound connections are handshaking (max_pending_handshakes "
                f"{self.config.max_pending_handshakes}); the oldest of the {count} from {group} "
                f"gave way to one from {newcomer_group}",
            ),
        )

    def handshake_over(self, handshake: object) -> None:
        """An admitted connection's handshake ended (a session, the connection lost, or
        evicted); again for the same handshake does nothing."""
        if handshake not in self._pending:
            return
        group = self._pending.pop(handshake)
        members = self.pending_groups[group]
        del members[handshake]
        if not members:
            del self.pending_groups[group]

    def release(self, host: str | None) -> None:
        """An admitted connection from ``host`` is gone. ``host`` may be its key already
        (``key_of`` its host, as ``MConnectionProtocol.ip_key``): a key is its own key."""
        key = self.key_of(host)
        if key is None:
            return
        left = self.per_ip[key] - 1
        if left:
            self.per_ip[key] = left
        else:
            del self.per_ip[key]

    def check_peer_limit(self, outbound: bool, count: int) -> None:
        """May one more session start in this direction, with ``count`` already there?

        :raises PeerRejected: ``inbound_limit`` or ``outbound_limit``.
        """
        limit = self.config.max_outbound_peers if outbound else self.config.max_inbound_peers
        if count >= limit:
            kind = "outbound" if outbound else "inbound"
            raise PeerRejected(f"{kind}_limit", f"already {count} {kind} peers (max_{kind}_peers {limit})")

    def refused(self, rejection: PeerRejected) -> None:
        """Count a refusal by its reason."""
        self.refusals[rejection.reason] = self.refusals.get(rejection.reason, 0) + 1

    def check_invariants(self, live_hosts: Iterable[str | None], live_pending: int) -> None:
        """The counts agree with the live connections: ``live_hosts`` has the host (or
        its key, ``key_of`` the host) of every admitted connection still open,
        ``live_pending`` how many still handshake; the groups hold exactly the pending
        handshakes, and no group is empty."""
        per_ip: dict[str | None, int] = {}
        for host in live_hosts:
            key = self.key_of(host)
            per_ip[key] = per_ip.get(key, 0) + 1
        assert per_ip == self.per_ip, f"per-IP counts {self.per_ip} != live {per_ip}"
        assert live_pending == self.pending, f"{self.pending} pending handshakes counted, {live_pending} live"
        grouped = {h: g for g, members in self.pending_groups.items() for h in members}
        assert grouped == self._pending, f"pending by group {self.pending_groups} != pending {self._pending}"
        assert all(self.pending_groups.values()), f"an empty group in {self.pending_groups}"
