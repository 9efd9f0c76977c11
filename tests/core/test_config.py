"""Config: defaults, and validation messages that name the field and the value."""

import dataclasses
import math

import pytest

from mconn.config import MAX_PACKET_PAYLOAD_LIMIT, MIN_PACKET_PAYLOAD, Config


def test_defaults():
    """Config defaults: the documented timeouts, sizes, peer limits, and no rate limits."""
    c = Config()
    assert (c.ping_interval, c.pong_timeout, c.handshake_timeout, c.send_timeout, c.dial_timeout) == (
        60.0,
        45.0,
        10.0,
        10.0,
        3.0,
    )
    assert (c.max_packet_payload, c.max_hello_size, c.max_control_size) == (65536, 4096, 1024)
    assert (c.max_inbound_peers, c.max_outbound_peers) == (40, 10)
    assert (c.send_rate, c.recv_rate) == (None, None)


def test_fields_are_keyword_only_and_frozen():
    """Config takes keywords only and cannot be changed after it is made."""
    with pytest.raises(TypeError):
        Config(60.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().ping_interval = 1.0


POSITIVE_FLOATS = ["ping_interval", "pong_timeout", "send_timeout", "handshake_timeout", "dial_timeout", "close_linger"]
RATES = ["send_rate", "recv_rate"]

BAD = (
    [(name, value) for name in POSITIVE_FLOATS + RATES for value in (0, -1.5, math.inf, math.nan, True, "1")]
    + [("max_packet_payload", v) for v in (0, -1, 1, 1023, MAX_PACKET_PAYLOAD_LIMIT + 1, 1.5, True, "1024")]
    + [(name, v) for name in ("max_inbound_peers", "max_outbound_peers") for v in (-1, 2.0, False)]
    + [(name, v) for name in ("max_hello_size", "max_control_size") for v in (63, 0, 100.0)]
    + [("write_batch_bytes", v) for v in (0, -5, 1.0)]
    + [("stats_interval", v) for v in (-1, "10", math.nan, True)]
)


@pytest.mark.parametrize("field, value", BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_invalid_value_is_refused_naming_field_and_value(field, value):
    """An out-of-range or wrongly typed value is a ValueError naming Config.<field> and the value."""
    with pytest.raises(ValueError) as info:
        Config(**{field: value})
    message = str(info.value)
    assert f"Config.{field}" in message
    assert repr(value) in message


GOOD = [
    ("ping_interval", 0.001),
    ("pong_timeout", 1),
    ("max_packet_payload", MIN_PACKET_PAYLOAD),
    ("max_packet_payload", MAX_PACKET_PAYLOAD_LIMIT),
    ("max_inbound_peers", 0),
    ("max_outbound_peers", 0),
    ("max_hello_size", 64),
    ("max_control_size", 64),
    ("send_rate", 1),
    ("recv_rate", 5_120_000.0),
    ("stats_interval", 0),
]


@pytest.mark.parametrize("field, value", GOOD, ids=[f"{f}={v!r}" for f, v in GOOD])
def test_boundary_values_are_accepted(field, value):
    """The smallest and largest allowed values of each field are accepted as given."""
    assert getattr(Config(**{field: value}), field) == value


def test_replace_changes_fields_and_validates_again():
    """replace() returns a copy with the new values, keeps the others, and validates again."""
    c = Config().replace(max_packet_payload=2048, send_rate=1000.0)
    assert (c.max_packet_payload, c.send_rate, c.ping_interval) == (2048, 1000.0, 60.0)
    with pytest.raises(ValueError, match="Config.pong_timeout"):
        c.replace(pong_timeout=0)
