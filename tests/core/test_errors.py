"""The error family (mconn/errors.py): per-instance ``undelivered``, AckError's place."""

import pickle

import mconn
from mconn import errors
from mconn.session import AckError as SessionAckError


def test_each_error_has_its_own_undelivered():
    """Filling in one reason's counts must not fill in another's (a dict on the class
    would be one dict shared by every error)."""
    first = errors.ConnectionLost("reset")
    second = errors.PongTimeout("no pong")
    first.undelivered[0x20] = 3
    assert second.undelivered == {}
    assert errors.MConnError().undelivered == {}
    assert first.undelivered is not second.undelivered


def test_undelivered_can_be_replaced_and_is_kept():
    """undelivered starts empty, may be assigned a new dict and keeps it; other errors stay empty."""
    reason = errors.ConnectionClosed("closed")
    assert reason.undelivered == {}
    reason.undelivered = {0x21: 1}
    assert reason.undelivered == {0x21: 1}
    assert errors.ConnectionClosed("closed").undelivered == {}


def test_session_errors_copy_their_undelivered():
    """SessionExpired and SessionRejected keep their own copy of the counts given, and the message names them."""
    counts = {0x20: 2}
    expired = errors.SessionExpired(30.0, counts)
    rejected = errors.SessionRejected("new session", counts)
    assert expired.undelivered == rejected.undelivered == {0x20: 2}
    expired.undelivered[0x20] = 5
    assert counts == {0x20: 2} and rejected.undelivered == {0x20: 2}
    assert "0x20=2" in str(rejected)


def test_undelivered_survives_pickling():
    """An error's undelivered counts survive a pickle round trip."""
    reason = errors.ConnectionLost("reset")
    reason.undelivered = {0x20: 1}
    assert pickle.loads(pickle.dumps(reason)).undelivered == {0x20: 1}


def test_ack_error_is_a_remote_protocol_error_exported_from_mconn():
    """AckError is one class in mconn, mconn.errors and mconn.session: documented and a RemoteProtocolError."""
    assert mconn.AckError is errors.AckError is SessionAckError
    assert "AckError" in mconn.__all__
    assert issubclass(errors.AckError, errors.RemoteProtocolError)
    assert errors.AckError.__doc__
