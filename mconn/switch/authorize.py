"""Authorization: may a node whose id is proven join? (specs/tls.md section 6)

The bans first (``mconn.switch.bans``: a node a local reactor marked bad with
``Switch.mark_bad`` is refused with ``PeerRejected("banned")`` until its ban ends), then
``allowed_peers`` (a set of node ids; empty lets anyone in who proves a key), then one
session per IP address when ``Config.allow_duplicate_ip`` is False
(``PeerRejected("duplicate_ip")``), then the ``authorize(node_id, address, certificate)``
hook, which may answer at once (a bool) or later (a Deferred, bounded by
``handshake_timeout``; the bans and the IP rule are asked again once it answers).
Anything but True refuses the peer with ``AuthenticationError``; a hook that does not
answer in time refuses it with ``PeerRejected("authorize_timeout")``. Every hello is
asked, inbound and outbound; a dial attempt asks :meth:`Authorizer.check_dial` before
it connects, so a banned node, or an IP address that has a session, is not dialed.
"""

from __future__ import annotations

import ipaddress

from twisted.internet import defer

from mconn.core.address import PeerAddress, host_of
from mconn.errors import AuthenticationError, PeerRejected
from mconn.switch.bans import BanList


class Authorizer:
    """The allow list and the hook of one Switch.

    :param allowed_peers: node ids that may join (empty: anyone); changed in place by
        ``Switch.allowed_peers``.
    :param hook: ``authorize(node_id, address, certificate) -> bool | Deferred[bool]``, or None.
    :param tls: whether node ids are proven by certificates (then an allow list also
        needs a certificate).
    :param bans: the Switch's BanList (an empty one of its own if None).
    :param peers: returns the Switch's sessions by node id (for ``allow_duplicate_ip``).
    :param config: returns the Switch's Config in force.
    """

    def __init__(
        self,
        allowed_peers,
        hook,
        *,
        tls: bool,
        clock,
        timeout: float,
        bans: BanList | None = None,
        peers=dict,
        config=None,
    ) -> None:
        self.allowed_peers = set(allowed_peers)
        self.hook = hook
        self.tls = tls
        self.clock = clock
        self.timeout = timeout
        self.bans = bans if bans is not None else BanList(clock)
        self.peers = peers
        self.config = config

    def _duplicate_ips_allowed(self) -> bool:
        config = self.config() if self.config is not None else None
        return config is None or config.allow_duplicate_ip

    def check_ip(self, node_id: str | None, host: str | None) -> None:
        """With ``Config.allow_duplicate_ip`` False, a node may not start a session from
        (or be dialed at) an IP address where another node has one, in any state.

        :raises PeerRejected: ``duplicate_ip``, naming the address and the other node.
        """
        if self._duplicate_ips_allowed():
            return
        ip = _ip(host)
        if ip is None:
            return
        for other_id, peer in list(self.peers().items()):
            if other_id != node_id and _ip(getattr(peer, "remote_host", None)) == ip:
                raise PeerRejected(
                    "duplicate_ip",
                    f"node {node_id} at {ip}: node {other_id} has a session from that IP address "
                    "(Config.allow_duplicate_ip is False)",
                )

    def check_dial(self, target: PeerAddress, node_id: str | None) -> None:
        """May the Switch dial ``target`` (of node ``node_id``, if known) now?

        :raises PeerRejected: ``banned`` for a banned node, ``duplicate_ip`` for an IP
            address that has another node's session (``allow_duplicate_ip`` False).
        """
        self.bans.check(node_id)
        self.check_ip(node_id, target.host)

    def check(self, node_id: str, address: str, certificate):
        """Decide whether ``node_id`` may join.

        :returns: None if it may join now, or a Deferred that fires once it may.
        :raises AuthenticationError: if it may not (the Deferred fails with it likewise).
        :raises PeerRejected: ``banned`` or ``duplicate_ip`` (likewise).
        """
        self.bans.check(node_id)
        if self.allowed_peers and node_id not in self.allowed_peers:
            raise AuthenticationError(f"node {node_id} is not in allowed_peers")
        if self.allowed_peers and self.tls and certificate is None:
            raise AuthenticationError(
                f"node {node_id} presented no certificate, so it is not proven to be in allowed_peers"
            )
        if not self._duplicate_ips_allowed():  # the host is parsed only when asked for
            self.check_ip(node_id, host_of(address))
        if self.hook is None:
            return None
        host = host_of(address)
        try:
            verdict = self.hook(node_id, address, certificate)
        except Exception as e:
            raise AuthenticationError(f"authorize({node_id}) raised {type(e).__name__}: {e}") from e
        if not isinstance(verdict, defer.Deferred):
            _check_verdict(node_id, verdict)
            return None
        return verdict.addTimeout(self.timeout, self.clock).addCallbacks(
            lambda answer: self._still_allowed(node_id, host, answer), _failed, errbackArgs=(node_id, self.timeout)
        )

    def _still_allowed(self, node_id: str, host: str | None, verdict) -> None:
        """The hook said ``verdict``; the node may have been banned, or another node may
        have taken its IP address, while the hook was deciding."""
        _check_verdict(node_id, verdict)
        self.bans.check(node_id)
        self.check_ip(node_id, host)


def _ip(host: str | None):
    """``host`` as an IP address (an IPv4-mapped IPv6 address as its IPv4 one), or None."""
    if not host:
        return None
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def _check_verdict(node_id: str, verdict) -> None:
    """``authorize`` must say True to let a peer in; anything else refuses it."""
    if verdict is not True:
        why = "refused it" if verdict is False else f"returned {verdict!r}, not True or False"
        raise AuthenticationError(f"authorize({node_id}) {why}")


def _failed(failure, node_id: str, timeout: float):
    if failure.check(PeerRejected):
        return failure
    if failure.check(defer.TimeoutError):
        raise PeerRejected("authorize_timeout", f"authorize({node_id}) did not answer within {timeout}s")
    error = failure.value
    raise AuthenticationError(f"authorize({node_id}) failed with {type(error).__name__}: {error}")
