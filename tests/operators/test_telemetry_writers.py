"""A telemetry line written by its shape's compiled writer (``lean_text``,
mconn/ops/telemetry_record.py) against the record built first and json.dumps: the same
text, or the same kind of error, for events of one shape whose values change type from
one event to the next (the writer is made for the first one's types), and for keys that
would be code if they were pasted into the writer's source."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.logger import LogLevel

from mconn.ops.telemetry_file import format_record, lean_record, lean_text
from operators.test_fast_line import KEYS, _outcome, _reference_line
from operators.test_fast_record import values

#: Keys that would break or change the writer's source if they were written into it.
HOSTILE_KEYS = st.sampled_from(["'", '"', "\\", "{", "}", "{t0}", "'] + __import__('os').getcwd() + event['", "\n"])


class Number(int):
    """An int that is not exactly one (json.dumps writes it as one, by int.__repr__)."""


class Text(str):
    """A str that is not exactly one."""


#: Values of each type a writer checks, with their neighbours it must tell apart (bool
#: and int, finite and non-finite floats, a str and its subclass, lists of anything...).
CROSSED = [
    None,
    False,
    True,
    0,
    2**70,
    Number(7),
    -1.5,
    -0.0,
    math.inf,
    math.nan,
    "",
    "inbound",
    'caf\u00e9 "q"',
    Text("sub"),
    [],
    [32],
    [1, 2.5, None],
    [math.inf],
    [object()],
    (),
    {"a": 1},
    object(),
]

#: A value of the types an mconn event's fields have, and of others.
FIELD_VALUES = st.one_of(values, st.sampled_from(CROSSED), st.builds(tuple, st.lists(st.integers(), max_size=2)))


@st.composite
def shapes(draw) -> list[str]:
    """The field keys of one event shape, in order (the envelope is added around them)."""
    return draw(st.lists(st.one_of(KEYS, HOSTILE_KEYS), unique=True, max_size=8))


def _event(draw, keys: list[str], level, node_id) -> dict:
    event = {key: draw(FIELD_VALUES) for key in keys}
    event.update(
        {
            "event": "session_started",
            "log_logger": object(),
            "log_level": level,
            "log_namespace": "mconn",
            "log_source": None,
            "log_format": "{node_id} x",
            "log_time": draw(st.one_of(st.floats(min_value=0, max_value=2e9), st.just(float("inf")), st.integers())),
        }
    )
    if node_id is not None:
        event["node_id"] = node_id
    return event


def _json_of_lean_record(event: dict):
    return _outcome(lambda: json.dumps(lean_record(event), separators=(",", ":"), allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(shapes(), st.data())
def test_a_shapes_writer_writes_the_lean_records_json_whatever_the_types(keys, data):
    """Several events of one shape (the same keys in the same order, as publish builds
    them), their values' types changing: each line is the lean record's json.dumps (or
    the same kind of error), the first one's (which made the writer) and every later one's."""
    level = data.draw(st.sampled_from([LogLevel.info, LogLevel.warn, "info"]))
    node_id = data.draw(st.sampled_from(["n1", "a" * 40, None]))
    events = [_event(data.draw, keys, level, node_id) for _ in range(4)]
    for event in [events[0], *events]:  # the first twice: its head is kept after it
        assert _outcome(lambda event=event: lean_text(event)) == _json_of_lean_record(event)
        assert format_record(event) == _reference_line(event)


@pytest.mark.parametrize("key", ["peer_id", "message"])
@pytest.mark.parametrize("first", range(len(CROSSED)), ids=lambda i: repr(CROSSED[i]))
def test_a_writer_made_for_one_type_writes_any_other_as_the_record(first, key):
    """A shape's writer made for an event whose field held ``CROSSED[first]``, then given
    the same field holding each other value: every line is the lean record's json.dumps,
    or the same kind of error (``message`` is a field only when it is a str). The shape
    is this case's own (a writer is kept for the shape made first)."""
    envelope = {"event": "e", "node_id": "n1", "log_level": LogLevel.info, "log_time": 1.25}
    shape = f"case {first}"
    made = {shape: "x", key: CROSSED[first], **envelope}
    for later in [CROSSED[first], CROSSED[first], *CROSSED]:
        event = {shape: "x", key: later, **envelope}
        assert _outcome(lambda event=event: lean_text(event)) == _json_of_lean_record(event), (first, later)
    assert _outcome(lambda: lean_text(made)) == _json_of_lean_record(made)


def test_a_writer_writes_each_event_of_its_shape_with_its_own_values():
    """Events of one shape with other values, of other types: each line has its own
    (a writer keeps no value of the event it was made for)."""
    base = {"node_id": "n1", "peer_id": "p1", "channels": [32], "n": 1, "event": "handshake_done"}
    envelope = {"log_level": LogLevel.info, "log_namespace": "mconn", "log_time": 1.5}
    lines = [
        lean_text({**base, **envelope}),
        lean_text({**base, **envelope}),
        lean_text({**base, "peer_id": None, "channels": [33, 34], "n": 2.5, **envelope, "log_time": 2.0}),
        lean_text({**base, "peer_id": "p\u00e9", "channels": (), "n": True, **envelope, "log_level": LogLevel.warn}),
    ]
    assert [json.loads(line) for line in lines] == [
        {"v": 2, "event": "handshake_done", "node_id": "n1", "log_time": 1.5, "level": "info", **base},
        {"v": 2, "event": "handshake_done", "node_id": "n1", "log_time": 1.5, "level": "info", **base},
        {
            "v": 2,
            "event": "handshake_done",
            "node_id": "n1",
            "log_time": 2.0,
            "level": "info",
            **base,
            "peer_id": None,
            "channels": [33, 34],
            "n": 2.5,
        },
        {
            "v": 2,
            "event": "handshake_done",
            "node_id": "n1",
            "log_time": 1.5,
            "level": "warn",
            **base,
            "peer_id": "p\u00e9",
            "channels": [],
            "n": True,
        },
    ]


@pytest.mark.parametrize("clocked", [False, True], ids=["at once", "at the turn's end"])
def test_a_json_lines_observers_observer_writes_one_nodes_mconn_events_only(tmp_path, clocked):
    """``JsonLinesObserver.observer(node_id)``, the telemetry service's observer: the
    events of that node in the mconn namespace (or mconn.*) with an event name are
    written, one line each, in order; another node's, another namespace's (``mconnx``
    too), one without an event name or without a node are not."""
    from twisted.internet.task import Clock

    from mconn.ops.telemetry_file import JsonLinesObserver, open_log_file, read_events

    clock = Clock() if clocked else None
    log_file = open_log_file(tmp_path / "t.jsonl")
    observe = JsonLinesObserver(log_file, clock).observer("n1")
    envelope = {"log_level": LogLevel.info, "log_time": 1.5}
    for namespace, fields in [
        ("mconn", {"event": "listening", "node_id": "n1", "address": "a"}),
        ("mconn.switch.dialer", {"event": "dial_attempt", "node_id": "n1", "attempt": 1}),
        ("mconn", {"event": "listening", "node_id": "n2", "address": "b"}),
        ("mconnx", {"event": "listening", "node_id": "n1", "address": "c"}),
        (None, {"event": "listening", "node_id": "n1", "address": "d"}),
        ("mconn", {"node_id": "n1", "note": "no event name"}),
        ("mconn", {"event": "listening", "address": "e"}),
        ("mconn", {"event": "listening", "node_id": "n1", "address": "f"}),
    ]:
        observe({**fields, "log_namespace": namespace, **envelope})
    if clock is not None:
        assert read_events(tmp_path / "t.jsonl") == []  # written when the turn ends
        clock.advance(0)
    log_file.close()
    assert [(e["event"], e.get("address")) for e in read_events(tmp_path / "t.jsonl")] == [
        ("listening", "a"),
        ("dial_attempt", None),
        ("listening", "f"),
    ]


def test_once_the_shapes_kept_are_full_a_new_shape_is_written_without_a_writer(monkeypatch):
    """At most _PLANS_MAX shapes get a writer; an event of any other shape is written
    by the plan, as right, and no writer is compiled for it (not one per event)."""
    from mconn.ops import telemetry_record

    compiled = []
    compile_writer = telemetry_record._compile_writer
    monkeypatch.setattr(telemetry_record, "_compile_writer", lambda *a: compiled.append(a) or compile_writer(*a))
    monkeypatch.setattr(telemetry_record, "_PLANS_MAX", len(telemetry_record._WRITERS))
    envelope = {"event": "e", "node_id": "n1", "log_level": LogLevel.info, "log_time": 1.25}
    for i in range(20):
        event = {f"full {i}": i, **envelope}
        for _ in range(2):
            assert lean_text(event) == _json_of_lean_record(event)
    assert compiled == []
    monkeypatch.setattr(telemetry_record, "_PLANS_MAX", len(telemetry_record._WRITERS) + 1)
    event = {"room for one": 1, **envelope}
    assert lean_text(event) == lean_text(event) == _json_of_lean_record(event)
    assert len(compiled) == 1
