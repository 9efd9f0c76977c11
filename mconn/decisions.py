"""The owner's decisions about a connection, and the events held while one is pending
(``Decisions``, a part of ``mconn.protocol.MConnectionProtocol``).

A decision (the hello's: who the peer is, whether it may join; the session answer's)
is the owner's (``IConnectionOwner``). One that returns a Deferred, an asynchronous
``authorize``, is pending: reading stops and the events that follow are held, then go
on in order once it is made, or are dropped if it refuses the peer (specs/connection.md).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from mconn.errors import PeerRejected, RemoteProtocolError
from mconn.events import ConnectionFailed

log = Logger(namespace="mconn")


class Decisions:
    """What ``MConnectionProtocol`` does with its owner's decisions. It provides
    ``owner``, ``transport``, ``hello``, ``remote_address``, ``end_reason``, ``_held``,
    ``_backlogged``, ``close``, ``fail``, ``pump``, ``_rearm`` and ``_handle``."""

    __slots__ = ()

    def decide(self, decision, argument) -> None:
        """Run ``decision(self, argument)``, a decision of the owner; a refusal closes it.

        A decision that returns a Deferred (an asynchronous ``authorize``) is pending: the
        events that follow are held, and reading stops, until it fires.
        """
        try:
            pending = decision(self, argument)
        except (PeerRejected, RemoteProtocolError) as error:
            self._refuse(error)
            return
        if isinstance(pending, Deferred):
            self._held = []
            self.transport.pauseProducing()
            pending.addCallbacks(self._decided, self._decision_failed)

    def _refuse(self, error) -> None:
        if isinstance(error, PeerRejected):
            self.owner.peer_rejected(self, self.hello, error)
            self.close(error)
        else:
            self.fail(error)

    def _decision_failed(self, failure) -> None:
        """The pending decision refused the peer: the held events are dropped."""
        self._held = None
        if not failure.check(PeerRejected, RemoteProtocolError):
            log.failure("a decision about {address} failed", failure, address=self.remote_address)
            failure = Failure(PeerRejected("internal_error", f"deciding failed: {failure.getErrorMessage()}"))
        if self.end_reason is None and self.transport is not None:
            self._refuse(failure.value)

    def _decided(self, _) -> None:
        """The pending decision is made: the held events go on, in order."""
        held, self._held = self._held or [], None
        if self.end_reason is not None or self.transport is None:
            return
        if not self._backlogged:
            self.transport.resumeProducing()
        for index, event in enumerate(held):
            if self._held is not None:  # an event started another pending decision
                self._held.extend(held[index:])
                break
            if self.end_reason is None or type(event) is ConnectionFailed:
                self._handle(event)
        self.pump()
        self._rearm()
