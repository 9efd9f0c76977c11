"""The compiled twin of the session's per-message counters (``admit`` and
``record_delivered`` in mconn/core/_speedups.pyx) does what ``Session.admit`` and
``Session.record_delivered`` do (``session.reference_admit``,
``session.reference_record_delivered``).

Two copies of the same session, with the same node budget, take the same random run of
operations: admits of messages of random sizes on known and unknown channels (the
recovery buffer, the channel reserve and the node budget all bound them, the budget
finite or not), acks in between that free room, deliveries of random sizes that count
down to the next ack. Every call must return the same value or raise the same error, and
the two sessions (streams, buffers, counts, budget) must stay equal. Both are called
directly, so this runs whatever MCONN_PURE says; skipped only when the extension is not
built.
"""

from __future__ import annotations

import importlib
import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mconn.core import session, speedups
from mconn.core.session import Budget, Session

try:
    compiled = importlib.import_module("mconn.core._speedups")
except ImportError as e:  # pragma: no cover - the build skipped it
    pytest.skip(f"the compiled twin mconn.core._speedups is not built ({e}); `make` builds it", allow_module_level=True)

TWIN = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CHANNELS = (0x10, 0x11)

operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("admit"),
            st.sampled_from([*CHANNELS, 0x12]),
            # 36 bytes are 100 with the overhead: bounds of 200, 300 and 1500 are met exactly.
            st.sampled_from([0, 36, 36, 136]) | st.integers(0, 3000),
        ),
        st.tuples(st.just("deliver"), st.sampled_from([*CHANNELS, 0x12]), st.integers(0, 5000)),
        st.tuples(st.just("ack"), st.sampled_from(CHANNELS), st.integers(0, 4)),
    ),
    max_size=40,
)
#: The session's bounds: around the sizes the operations add up to.
SHAPES = {
    "recovery_buffer_bytes": [0, 100, 300, 2000, 10000, 1 << 40],
    "channel_reserve_bytes": [0, 64, 200, 500, 65536],
    "ack_every_messages": [1, 3, 100],
    "ack_every_bytes": [1, 1000, 1 << 20],
    "budget": [None, 0, 1500, 8000, math.inf],
}
shapes = st.fixed_dictionaries({name: st.sampled_from(values) for name, values in SHAPES.items()})


def _session(shape):
    fields = dict(shape)
    limit = fields.pop("budget")
    return Session(b"s" * 16, CHANNELS, budget=None if limit is None else Budget(limit), **fields)


def _state(s):
    streams = {c: (st.acked, list(st.unacked), st.unacked_bytes, st.delivered) for c, st in s._streams.items()}
    return (
        streams,
        s.unacked_bytes,
        s._budget.used,
        s._budget.limit,
        s._ack_messages_left,
        s._ack_bytes_left,
        type(s._streams).__name__,
    )


def _run(admit, record_delivered, shape, ops):
    s = _session(shape)
    said = []
    for n, (op, channel_id, value) in enumerate(ops):
        try:
            if op == "admit":
                result = admit(s, channel_id, bytes([n % 256]) * value)
            elif op == "deliver":
                result = record_delivered(s, channel_id, value)
            else:  # the peer acknowledges up to ``value`` more of what is outstanding
                acked = s.acked(channel_id)
                result = s.on_ack({channel_id: min(acked + value, s.accepted(channel_id))})
            said.append(("ok", result))
        except Exception as e:
            said.append(("error", type(e).__name__, str(e)))
    return said, _state(s)


@TWIN
@given(shapes, operations)
def test_admit_and_record_delivered_twins_keep_the_same_session(shape, ops):
    pure = _run(session.reference_admit, session.reference_record_delivered, shape, ops)
    twin = _run(compiled.admit, compiled.record_delivered, shape, ops)
    assert twin == pure


def test_the_bounds_are_met_exactly_alike():
    """Every shape above against runs of 100-byte admits (36 bytes and the overhead):
    each bound (reserve, recovery buffer, budget) is reached exactly, where ``>`` and
    ``>=`` part; acks and deliveries in between."""
    ops = [("admit", 0x10, 36)] * 16 + [("ack", 0x10, 2), ("deliver", 0x11, 36)] + [("admit", 0x10, 36)] * 4
    ops += [("admit", 0x11, 36), ("admit", 0x11, 36), ("deliver", 0x10, 1000)]
    for values in itertools.product(*(SHAPES[name] for name in SHAPES)):
        shape = dict(zip(SHAPES, values, strict=True))
        pure = _run(session.reference_admit, session.reference_record_delivered, shape, ops)
        twin = _run(compiled.admit, compiled.record_delivered, shape, ops)
        assert twin == pure, shape


def test_a_message_without_a_length_fails_alike():
    errors = []
    for admit in (session.reference_admit, compiled.admit):
        with pytest.raises(TypeError) as raised:
            admit(
                _session(
                    {**dict.fromkeys(["recovery_buffer_bytes", "channel_reserve_bytes"], 100)}
                    | {"ack_every_messages": 1, "ack_every_bytes": 1, "budget": None}
                ),
                0x10,
                7,
            )
        errors.append(str(raised.value))
    assert errors[0] == errors[1]


def test_a_session_subclass_is_counted_by_the_reference():
    class Traced(Session):
        __slots__ = ()

    s = Traced(b"s" * 16, CHANNELS, recovery_buffer_bytes=1000, ack_every_messages=2, ack_every_bytes=1000)
    assert compiled.admit(s, 0x10, b"abc") == 0 and s.unacked_bytes == 3 + session.MESSAGE_OVERHEAD
    assert compiled.record_delivered(s, 0x11, 10) is False and s.delivered(0x11) == 1


def test_the_twins_are_the_session_methods_unless_mconn_pure():
    """With the extension built and MCONN_PURE unset, Session's methods are the twin's
    functions (bound like methods); with MCONN_PURE=1, the reference."""
    if speedups.SPEEDUPS is None:
        assert Session.admit is session.reference_admit
        assert Session.record_delivered is session.reference_record_delivered
    else:
        assert Session.admit is compiled.admit
        assert Session.record_delivered is compiled.record_delivered
        s = _session(
            {"recovery_buffer_bytes": 1000, "channel_reserve_bytes": 0, "ack_every_messages": 1}
            | {"ack_every_bytes": 1 << 20, "budget": None}
        )
        assert s.admit(0x10, b"x") == 0 and s.record_delivered(0x10, 1) is True
