"""Authorization: may a node whose id is proven join? (specs/tls.md section 6)

``allowed_peers`` first (a set of node ids; empty lets anyone in who proves a key), then
the ``authorize(node_id, address, certificate)`` hook, which may answer at once (a bool)
or later (a Deferred, bounded by ``handshake_timeout``). Anything but True refuses the
peer with ``AuthenticationError``; a hook that does not answer in time refuses it with
``PeerRejected("authorize_timeout")``.
"""

from __future__ import annotations

from twisted.internet import defer

from mconn.errors import AuthenticationError, PeerRejected


class Authorizer:
    """The allow list and the hook of one Switch.

    :param allowed_peers: node ids that may join (empty: anyone); changed in place by
        ``Switch.allowed_peers``.
    :param hook: ``authorize(node_id, address, certificate) -> bool | Deferred[bool]``, or None.
    :param tls: whether node ids are proven by certificates (then an allow list also
        needs a certificate).
    """

    def __init__(self, allowed_peers, hook, *, tls: bool, clock, timeout: float) -> None:
        self.allowed_peers = set(allowed_peers)
        self.hook = hook
        self.tls = tls
        self.clock = clock
        self.timeout = timeout

    def check(self, node_id: str, address: str, certificate):
        """Decide whether ``node_id`` may join.

        :returns: None if it may join now, or a Deferred that fires once it may.
        :raises AuthenticationError: if it may not (the Deferred fails with it likewise).
        """
        if self.allowed_peers and node_id not in self.allowed_peers:
            raise AuthenticationError(f"node {node_id} is not in allowed_peers")
        if self.allowed_peers and self.tls and certificate is None:
            raise AuthenticationError(
                f"node {node_id} presented no certificate, so it is not proven to be in allowed_peers"
            )
        if self.hook is None:
            return None
        try:
            verdict = self.hook(node_id, address, certificate)
        except Exception as e:
            raise AuthenticationError(f"authorize({node_id}) raised {type(e).__name__}: {e}") from e
        if not isinstance(verdict, defer.Deferred):
            _check_verdict(node_id, verdict)
            return None
        return verdict.addTimeout(self.timeout, self.clock).addCallbacks(
            lambda answer: _check_verdict(node_id, answer), _failed, errbackArgs=(node_id, self.timeout)
        )


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
