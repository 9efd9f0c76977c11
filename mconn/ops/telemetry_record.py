"""A telemetry record's text: one mconn event as a version 2 JSON line (specs/telemetry.md section 2).

``format_record`` is what ``mconn.ops.telemetry_file`` writes for each event: ``lean_text``
writes the line straight from the event, with a function compiled for the event's shape
(its keys in order, its values' types: ``_compile_writer``) or in one pass over its
shape's plan (its head kept per event name and node either way), and anything it leaves
goes through ``lean_record`` and ``encode_record``, which are ``json.dumps`` of the lean
record. Hypothesis tests prove them equal (tests/operators/test_fast_record.py,
test_fast_line.py, test_telemetry_writers.py). Moved out of
``mconn.ops.telemetry_file``, which re-exports these names.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, cast

from twisted.logger import LogLevel

#: The version of the records this module writes (specs/telemetry.md section 2). Version 1
#: is Twisted's ``jsonFileLogObserver`` output, which older nodes wrote; it has no ``v``.
RECORD_VERSION = 2
#: The keys every version 2 record starts with, in this order (specs/telemetry.md 2).
ENVELOPE = ("v", "event", "node_id", "log_time", "level")
#: Keys that the legacy ``twisted.python.log`` bridge adds to an event it forwards (in
#: place, so later observers see them too): not fields of the event, never written.
#: ``message`` is one only when it is not a string (mconn's own ``message`` fields are).
_LEGACY_KEYS = frozenset({"time", "system", "format", "isError", "failure", "why"})
#: Keys that are never a record's own fields: the envelope's, the legacy bridge's, and
#: the ``log_*`` keys Twisted's Logger sets (others starting ``log_`` are skipped too).
_NOT_FIELDS = (
    frozenset(ENVELOPE)
    | _LEGACY_KEYS
    | {
        "log_logger",
        "log_level",
        "log_namespace",
        "log_source",
        "log_format",
        "log_time",
        "log_failure",
    }
)


def lean_record(event: dict) -> dict:
    """The version 2 record of one mconn event: the ``ENVELOPE`` keys, then the event's
    own fields in the order they were logged, then ``failure`` (the traceback text) when
    the event was logged with one (``reactor_error``)."""
    level = event.get("log_level")
    record = {
        "v": RECORD_VERSION,
        "event": event.get("event"),
        "node_id": event.get("node_id"),
        "log_time": event.get("log_time"),
        "level": getattr(level, "name", level),
    }
    for key, value in event.items():
        if key in _NOT_FIELDS or key.startswith("log_"):
            continue
        if key == "message" and not isinstance(value, str):
            continue
        record[key] = value
    failure = event.get("log_failure")
    if failure is not None:
        record["failure"] = failure.getTraceback()
    return record


#: json.dumps(record, separators=(",", ":"), allow_nan=False), without building an encoder
#: per call (a connection storm writes three records per connection).
_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
_INT = int.__repr__
_FLOAT = float.__repr__


def _float(value: float) -> str | None:
    return _FLOAT(value) if value - value == 0 else None  # None: not finite


#: The JSON of a value of exactly these types, by type (a subclass goes to the encoder).
_SCALARS: dict[type, Callable[[Any], str | None]] = {
    str: _quote,
    int: _INT,
    float: _float,
    type(None): lambda value: "null",
    bool: lambda value: "true" if value else "false",
}
_SCALAR_OF = _SCALARS.get


def _scalar(value) -> str | None:
    """The JSON of a str, int, finite float, bool or None; None for anything else."""
    encode = _SCALAR_OF(type(value))
    return None if encode is None else encode(value)


def _encode_value(value) -> str:
    text = _scalar(value)
    return _encode_compound(value) if text is None else text


def _encode_compound(value) -> str:
    """The JSON of a value ``_scalar`` does not write (a list, a dict, a subclass...)."""
    if type(value) is list:  # a list of scalars (handshake_done's channels), else the encoder
        items = [_scalar(item) for item in value]
        if None not in items:
            return "[" + ",".join(cast("list[str]", items)) + "]"
    return _ENCODE(value)


def encode_record(record: dict) -> str:
    """``json.dumps(record, separators=(",", ":"), allow_nan=False)``, the same text and
    the same errors, about twice as fast for a flat record of strings and numbers: the
    top level is joined here, and only what is not a str, int, float, bool or None goes
    through the encoder (tests/operators/test_fast_record.py proves them equal)."""
    for key in record:
        if type(key) is not str:
            return _ENCODE(record)
    return "{" + ",".join([_quote(key) + ":" + _encode_value(value) for key, value in record.items()]) + "}"


def format_record(event: dict) -> bytes:
    """One line of a telemetry file: the event's lean record as compact JSON and a newline.

    Strict JSON: a non-finite float is written as null, a value JSON has no type for as
    its ``str``, so that a record is never lost to its values. ``lean_text`` writes the
    line straight from the event; an event it leaves (a key that is not a str) and one
    with values JSON cannot hold go through ``lean_record``.
    """
    try:
        writer = _WRITERS.get(tuple(event))  # lean_text's first step, without its call
        text = writer(event) if writer else None
        if text is None:
            text = lean_text(event)
            if text is None:
                text = encode_record(lean_record(event))
    except (TypeError, ValueError):
        text = json.dumps(_strict(lean_record(event)), separators=(",", ":"), allow_nan=False, default=str)
    return text.encode("ascii") + b"\n"


#: key -> the text before its value in a record (``,"key":``), or "" for a key that is
#: not a field (lean_record's rule); at most _FIELD_TEXTS_MAX keys are remembered.
_FIELD_TEXTS: dict = {}
_FIELD_TEXTS_MAX = 4096


def _field_text(key: str) -> str:
    text = _FIELD_TEXTS.get(key)
    if text is None:
        text = "" if key in _NOT_FIELDS or key.startswith("log_") else "," + _quote(key) + ":"
        if len(_FIELD_TEXTS) < _FIELD_TEXTS_MAX:
            _FIELD_TEXTS[key] = text
    return text


#: The event's keys, in order -> its fields' (key, the text before the value), the plan
#: of ``lean_text``: one lookup per event instead of one per key. The events of a Switch
#: come in a few dozen shapes; at most _PLANS_MAX shapes are remembered.
_PLANS: dict = {}
_PLANS_MAX = 1024


#: (event, node_id, level) -> the text of a record before its log_time and that of its
#: level (``_head``); at most _PLANS_MAX of them.
_HEADS: dict = {}


#: The type of Twisted's LogLevels (a NamedConstant): ``lean_text`` keeps each head under
#: (event, node_id, the LogLevel) in _HEADS too, and finds it there without ``_head``.
_NAMED = type(LogLevel.info)


def _head(name, node_id, level) -> tuple[str, str]:
    """A record's text up to its ``log_time``, and its ``level`` part: the same for
    every event of one name from one node, so kept when all three are str."""
    if type(name) is str and type(node_id) is str and type(level) is str:
        key = (name, node_id, level)
        head = _HEADS.get(key)
        if head is None:
            head = _head_text(name, node_id, level)
            if len(_HEADS) < _PLANS_MAX:
                _HEADS[key] = head
        return head
    return _head_text(name, node_id, level)


def _head_text(name, node_id, level) -> tuple[str, str]:
    return (
        '{"v":2,"event":' + _encode_value(name) + ',"node_id":' + _encode_value(node_id) + ',"log_time":',
        ',"level":' + _encode_value(level),
    )


def _plan(keys: tuple) -> tuple | None:
    """The fields of an event with ``keys``, each with its ``_field_text``; None if a key
    is not a str (``lean_text`` leaves those to ``lean_record``)."""
    if not all(type(key) is str for key in keys):
        return None
    plan = tuple((key, text) for key in keys for text in (_field_text(key),) if text)
    if len(_PLANS) < _PLANS_MAX:
        _PLANS[keys] = plan
    return plan


def lean_text(event: dict) -> str | None:
    """``encode_record(lean_record(event))`` in one pass over the event's fields, without
    the record dict (a connect storm writes three records per connection); None for an
    event with a key that is not a str. tests/operators/test_fast_line.py proves it
    equal, text and errors, on any event.

    An event of a shape seen before (its keys, in order) is written by that shape's
    writer (``_compile_writer``) when its values have the types the writer was made for;
    anything else, by ``_lean_text_by_plan``."""
    keys = tuple(event)
    writer = _WRITERS.get(keys)
    if writer is None:
        if len(_WRITERS) >= _PLANS_MAX:  # full: a shape not kept is never compiled
            return _lean_text_by_plan(keys, event)
        writer = _WRITERS[keys] = _compile_writer(keys, event)
    if writer:
        text = writer(event)
        if text is not None:
            return text
    return _lean_text_by_plan(keys, event)


#: The event's keys, in order -> its shape's writer (``_compile_writer``), or False for a
#: shape that has none; at most _PLANS_MAX shapes are remembered.
_WRITERS: dict = {}

#: The keys a shape needs for a writer: the envelope's values come from them.
_WRITER_NEEDS = ("event", "node_id", "log_level", "log_time")

#: How a writer checks a value of this type ("" for no check) and writes it (``{v}`` is
#: the value's name). A str is not checked: ``_quote`` raises TypeError for anything but
#: a str (and the writer returns None), and writes a str's subclass as json.dumps does;
#: ``_encode_compound`` writes any value as ``_lean_text_by_plan`` would, unchecked. An
#: int, float, None or bool is checked for its exact type (a bool is an int; a float
#: must be finite), so the text is the one ``_SCALARS`` gives.
_SLOTS: dict[type, tuple[str, str]] = {
    str: ("", "{{_quote({v})}}"),
    int: ("type({v}) is int", "{{_INT({v})}}"),
    float: ("type({v}) is float and {v} - {v} == 0", "{{_FLOAT({v})}}"),
    type(None): ("{v} is None", "null"),
    bool: ("type({v}) is bool", "{{_BOOLS[{v}]}}"),
}
_BOOLS = ("false", "true")


def _compile_writer(keys: tuple, event: dict):
    """A function writing ``lean_text`` of an event with ``keys`` whose values have the
    types ``event``'s have, in one f-string (a third of the plan loop's bytecodes); it
    returns None for an event whose values' types differ, or whose head is not in
    _HEADS yet, and ``lean_text`` goes the general way. False for a shape it does not
    write: a key that is not a str, no ``event``, ``node_id``, ``log_level`` or
    ``log_time``, a ``log_failure``, a ``message`` that is not a str."""
    if not all(type(key) is str for key in keys) or "log_failure" in keys:
        return False
    if not all(key in event for key in _WRITER_NEEDS):
        return False
    plan = _PLANS.get(keys)
    if plan is None:
        plan = _plan(keys)
    source = _writer_source(cast("tuple", plan), event)
    if source is None:
        return False
    namespace: dict[str, Any] = {
        "_HEADS_get": _HEADS.get,
        "_quote": _quote,
        "_INT": _INT,
        "_FLOAT": _FLOAT,
        "_BOOLS": _BOOLS,
        "_encode_compound": _encode_compound,
    }
    exec(compile(source, f"<telemetry writer {len(_WRITERS)}>", "exec"), namespace)
    return namespace["write"]


def _writer_source(plan: tuple, event: dict) -> str | None:
    """The source of ``_compile_writer``'s function for the fields of ``plan`` with the
    types of ``event``'s values (None: a ``message`` that is not a str).

    The keys appear in it only as ``repr`` literals, and the texts around the values in
    one f-string literal with its braces doubled, so no key can change the code. The
    head is found in _HEADS by the event's name, node and level, unchecked: its keys are
    all str names and nodes (a str's subclass equal to one writes the same text), and an
    unhashable one raises TypeError, which returns None."""
    reads, checks, template = [], ["type(when) is float and when - when == 0"], []
    for i, (key, text) in enumerate(plan):
        value, name = event[key], f"v{i}"
        if key == "message" and type(value) is not str:
            return None
        check, write = _SLOTS.get(type(value), ("", "{{_encode_compound({v})}}"))
        reads.append(f"        {name} = event[{key!r}]")
        if check:
            checks.append(check.format(v=name))
        template.append(text.replace("{", "{{").replace("}", "}}") + write.format(v=name))
    line = "{first}{_FLOAT(when)}{level_text}" + "".join(template) + "}}"
    return "\n".join(
        [
            "def write(event):",
            "    try:",
            '        head = _HEADS_get((event["event"], event["node_id"], event["log_level"]))',
            "        if head is None:",
            "            return None",
            '        when = event["log_time"]',
            *reads,
            f"        if not ({' and '.join(checks)}):",
            "            return None",
            "        first, level_text = head",
            f"        return f{line!r}",
            "    except TypeError:",
            "        return None",
        ]
    )


def _lean_text_by_plan(keys: tuple, event: dict) -> str | None:
    """``lean_text`` of any event, by its shape's plan (``_plan``), one field at a time."""
    plan = _PLANS.get(keys)
    if plan is None:
        plan = _plan(keys)
        if plan is None:
            return None
    name, node_id, level = event.get("event"), event.get("node_id"), event.get("log_level")
    kept = type(level) is _NAMED and type(name) is str and type(node_id) is str
    head = _HEADS.get((name, node_id, level)) if kept else None
    if head is None:
        head = _head(name, node_id, getattr(level, "name", level))
        if kept and len(_HEADS) < _PLANS_MAX:
            _HEADS[(name, node_id, level)] = head
    when = event.get("log_time")
    # A finite float (time.time()) as _scalar writes it; anything else the general way.
    parts = [head[0], _FLOAT(when) if type(when) is float and when - when == 0 else _encode_value(when), head[1]]
    append = parts.append
    for key, text in plan:
        value = event[key]
        if key == "message" and not isinstance(value, str):
            continue
        encode = _SCALAR_OF(type(value))
        value_text = None if encode is None else encode(value)
        append(text)
        append(_encode_compound(value) if value_text is None else value_text)
    failure = event.get("log_failure")
    if failure is not None:
        append(',"failure":')
        append(_encode_value(failure.getTraceback()))
    append("}")
    return "".join(parts)


def _strict(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value
