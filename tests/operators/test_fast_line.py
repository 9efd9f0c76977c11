"""A telemetry line written straight from the event (``lean_text``, mconn/ops/telemetry_file.py)
against the record built first (``lean_record``) and json.dumps: the same text, or the
same kind of error, for any event; and ``format_record``'s line the same either way."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.logger import LogLevel
from twisted.python.failure import Failure

from mconn.ops.telemetry_file import _strict, format_record, lean_record, lean_text
from operators.test_fast_record import values

#: Keys a real event has (envelope, Twisted's, the legacy bridge's, mconn's ``message``), and others.
NAMED_KEYS = st.sampled_from(
    [
        "event",
        "node_id",
        "log_time",
        "log_level",
        "v",
        "level",
        "message",
        "failure",
        "log_format",
        "log_logger",
        "log_namespace",
        "log_source",
        "log_other",
        "time",
        "system",
        "format",
        "isError",
        "why",
        "peer_id",
        "channels",
        "remote_address",
    ]
)
KEYS = st.one_of(NAMED_KEYS, st.text(max_size=10))  # a Logger's keywords: str (lean_record needs them so)


def _failure() -> Failure:
    try:
        raise ValueError("reactor bug \u00e9")
    except ValueError:
        return Failure()


@st.composite
def events(draw) -> dict:
    event = draw(st.dictionaries(KEYS, values, max_size=10))
    if draw(st.booleans()):
        event["log_level"] = draw(st.sampled_from([LogLevel.info, LogLevel.warn, LogLevel.critical, "info", None]))
    if draw(st.booleans()):
        event["log_failure"] = _failure()
    return event


def _outcome(make):
    try:
        return make()
    except (TypeError, ValueError) as error:
        return type(error)


def _reference_line(event: dict) -> bytes:
    """format_record as it was: the record first, then json.dumps (strict, else _strict and str)."""
    record = lean_record(event)
    try:
        text = json.dumps(record, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        text = json.dumps(_strict(record), separators=(",", ":"), allow_nan=False, default=str)
    return text.encode("ascii") + b"\n"


@settings(max_examples=200, deadline=None)
@given(events())
def test_lean_text_is_the_lean_records_json(event):
    """For any event (Twisted's keys, the legacy bridge's, a non-str message, a failure, nested and non-finite
    values, unicode), lean_text is json.dumps of lean_record, or raises the same kind of error."""
    fast = _outcome(lambda: lean_text(event))
    assert fast == _outcome(lambda: json.dumps(lean_record(event), separators=(",", ":"), allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(events())
def test_format_record_writes_the_line_of_the_record_built_first(event):
    """format_record's line equals the line of the record built first, for any event, whatever path it takes."""
    assert format_record(event) == _reference_line(event)
