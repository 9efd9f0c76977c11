"""The telemetry file's hand-joined JSON (encode_record) against json.dumps, and the
Logger-free telemetry.emit against Twisted's Logger: the fast paths of a connect storm."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.logger import Logger, LogLevel, LogPublisher

from mconn.switch import telemetry
from mconn.ops.telemetry_file import encode_record, format_record

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=12,
)
keys = st.one_of(st.text(max_size=12), st.integers(), st.none(), st.floats(allow_nan=False))


def _dumps(record):
    try:
        return json.dumps(record, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        return type(error)


def _fast(record):
    try:
        return encode_record(record)
    except (TypeError, ValueError) as error:
        return type(error)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(keys, values, max_size=8))
def test_encode_record_is_json_dumps(record):
    """encode_record gives json.dumps' compact strict text, or raises the same kind of
    error (a non-finite float: ValueError), for any record: str and other keys, nested
    lists and dicts, unicode, bools, huge ints."""
    assert _fast(record) == _dumps(record)


def test_encode_record_other_types_fall_back():
    """Values the fast path does not know (an int subclass, a tuple, a non-finite float)
    go through the encoder: the text of json.dumps, or its error."""
    record = {"level": LogLevel.levelWithName("info").name, "n": True, "t": (1, 2.5, None), "z": -0.0}
    assert encode_record(record) == json.dumps(record, separators=(",", ":"), allow_nan=False)
    assert _fast({"x": math.inf}) is ValueError
    assert _fast({"x": [math.nan]}) is ValueError
    assert _fast({"x": object()}) is TypeError


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(sorted(telemetry.FORMATS)),
    st.one_of(st.none(), st.text(max_size=8)),
    st.one_of(st.none(), st.just(""), st.text(min_size=1, max_size=8)),
    st.integers(),
)
def test_emit_is_the_loggers_event(event, peer_id, error, number):
    """telemetry.emit builds the event Logger.info/warn would: the same keys and values
    (log_time aside), the same log_format (the cached format_for), the same level; and
    its record is the same line."""
    seen = []
    fields = {"node_id": "n1", "peer_id": peer_id, "error": error, "count": number}
    old = telemetry.log
    publisher = LogPublisher(seen.append)
    telemetry.log = Logger(namespace="mconn", observer=publisher)
    try:
        telemetry.emit(event, **fields)
        level = "warn" if event in telemetry._LEVELS else "info"
        getattr(telemetry.log, level)(telemetry.format_for(event, fields), event=event, **fields)
    finally:
        telemetry.log = old
    fast, plain = seen
    assert fast.pop("log_time") <= plain.pop("log_time")
    assert fast == plain
    assert fast["log_level"] is LogLevel.levelWithName(level)
    fast["log_time"] = plain["log_time"] = 1.5
    assert format_record(fast) == format_record(plain)


def test_the_file_keeps_only_this_nodes_mconn_events(tmp_path):
    """The service's one-function observer writes exactly what its filter promises: mconn
    and mconn.* events with an event name and this node's id; not another node's, not
    another namespace's (``mconnx`` included), not an mconn message without an event."""
    from mconn.ops.telemetry_file import TelemetryFileService, read_events

    publisher = LogPublisher()
    service = TelemetryFileService(tmp_path / "t.jsonl", "n1", publisher=publisher)
    service.startService()
    try:
        for namespace, fields in [
            ("mconn", {"event": "listening", "node_id": "n1", "address": "a"}),
            ("mconn.switch.dialer", {"event": "dial_attempt", "node_id": "n1", "attempt": 1}),
            ("mconn", {"event": "listening", "node_id": "n2", "address": "b"}),
            ("mconnx", {"event": "listening", "node_id": "n1", "address": "c"}),
            ("other", {"event": "listening", "node_id": "n1", "address": "d"}),
            ("mconn", {"node_id": "n1", "note": "no event name"}),
        ]:
            Logger(namespace=namespace, observer=publisher).info("x", **fields)
    finally:
        service.stopService()
    assert [(e["event"], e.get("address")) for e in read_events(tmp_path / "t.jsonl")] == [
        ("listening", "a"),
        ("dial_attempt", None),
    ]
