"""The error family (mconn/errors.py): per-instance ``unconfirmed``, AckError's place."""

import pickle

import mconn
from mconn import errors
from mconn.core.session import AckError as SessionAckError


def test_each_error_has_its_own_unconfirmed():
    """Filling in one reason's counts must not fill in another's (a dict on the class
    would be one dict shared by every error)."""
    first = errors.ConnectionLost("reset")
    second = errors.PongTimeout("no pong")
    first.unconfirmed[0x20] = 3
    assert second.unconfirmed == {}
    assert errors.MConnError().unconfirmed == {}
    assert first.unconfirmed is not second.unconfirmed


def test_unconfirmed_can_be_replaced_and_is_kept():
    """unconfirmed starts empty, may be assigned a new dict and keeps it; other errors stay empty."""
    reason = errors.ConnectionClosed("closed")
    assert reason.unconfirmed == {}
    reason.unconfirmed = {0x21: 1}
    assert reason.unconfirmed == {0x21: 1}
    assert errors.ConnectionClosed("closed").unconfirmed == {}


def test_session_errors_copy_their_unconfirmed():
    """SessionExpired and SessionRejected keep their own copy of the counts given, and the message names them."""
    counts = {0x20: 2}
    expired = errors.SessionExpired(30.0, counts)
    rejected = errors.SessionRejected("new session", counts)
    assert expired.unconfirmed == rejected.unconfirmed == {0x20: 2}
    expired.unconfirmed[0x20] = 5
    assert counts == {0x20: 2} and rejected.unconfirmed == {0x20: 2}
    assert "0x20=2" in str(rejected)


def test_unconfirmed_survives_pickling():
    """An error's unconfirmed counts survive a pickle round trip."""
    reason = errors.ConnectionLost("reset")
    reason.unconfirmed = {0x20: 1}
    assert pickle.loads(pickle.dumps(reason)).unconfirmed == {0x20: 1}


def test_ack_error_is_a_remote_protocol_error_exported_from_mconn():
    """AckError is one class in mconn, mconn.errors and mconn.core.session: documented and a RemoteProtocolError."""
    assert mconn.AckError is errors.AckError is SessionAckError
    assert "AckError" in mconn.__all__
    assert issubclass(errors.AckError, errors.RemoteProtocolError)
    assert errors.AckError.__doc__
