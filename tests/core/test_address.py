"""PeerAddress and parse_address: every accepted form and every refusal."""

import dataclasses

import pytest

from mconn.core.address import PeerAddress, is_valid_node_id, parse_address

NODE_ID = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    "text, expected",
    [
        (f"{NODE_ID}@1.2.3.4:26656", PeerAddress(NODE_ID, "1.2.3.4", 26656)),
        (f"{NODE_ID.upper()}@1.2.3.4:26656", PeerAddress(NODE_ID, "1.2.3.4", 26656)),
        ("1.2.3.4:26656", PeerAddress(None, "1.2.3.4", 26656)),
        ("example.com:1", PeerAddress(None, "example.com", 1)),
        ("localhost:65535", PeerAddress(None, "localhost", 65535)),
        ("[::1]:26656", PeerAddress(None, "::1", 26656)),
        (f"{NODE_ID}@[::1]:26656", PeerAddress(NODE_ID, "::1", 26656)),
        ("[2001:db8::7]:80", PeerAddress(None, "2001:db8::7", 80)),
        ("[fe80::1%eth0]:80", PeerAddress(None, "fe80::1%eth0", 80)),
        (f"tcp://{NODE_ID}@1.2.3.4:26656", PeerAddress(NODE_ID, "1.2.3.4", 26656)),
        (f"TCP://{NODE_ID}@[::1]:26656", PeerAddress(NODE_ID, "::1", 26656)),
        ("tcp://host:9", PeerAddress(None, "host", 9)),
    ],
)
def test_parse_accepts(text, expected):
    """Every accepted form parses: optional tcp:// scheme and node id, IPv6 in brackets, node id lowercased."""
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        f"{NODE_ID}@1.2.3.4:26656",
        "1.2.3.4:26656",
        "[::1]:26656",
        f"{NODE_ID}@[::1]:26656",
        f"{NODE_ID}@example.com:1",
    ],
)
def test_str_round_trips(text):
    """str() of a parsed address gives back the canonical text it was parsed from."""
    assert str(parse_address(text)) == text


def test_str_brackets_ipv6_and_drops_scheme():
    """str() puts an IPv6 host in brackets, drops the scheme and lowercases the node id."""
    assert str(PeerAddress(NODE_ID, "::1", 26656)) == f"{NODE_ID}@[::1]:26656"
    assert str(parse_address(f"tcp://{NODE_ID.upper()}@h:1")) == f"{NODE_ID}@h:1"


def test_peer_address_is_frozen_and_hashable():
    """A PeerAddress cannot be changed and equal addresses hash alike."""
    address = PeerAddress(None, "h", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        address.port = 2
    assert {address, PeerAddress(None, "h", 1)} == {address}


def test_peer_address_lowercases_node_id():
    """A node id given in upper case is stored lowercased."""
    assert PeerAddress(NODE_ID.upper(), "h", 1).node_id == NODE_ID


@pytest.mark.parametrize(
    "fields, problem",
    [
        (("abc", "h", 1), "node id 'abc' must be 40 hex characters"),
        ((None, "", 1), "host '' must be a non-empty string"),
        ((None, "a b", 1), "host 'a b' contains"),
        ((None, "1:2", 1), "not a valid IPv6 address"),
        ((None, "h", 0), "port 0 must be a number from 1 to 65535"),
        ((None, "h", 65536), "port 65536"),
        ((None, "h", True), "port True"),
        ((None, "h", "80"), "port '80'"),
    ],
)
def test_peer_address_validates_fields(fields, problem):
    """A bad node id, host or port is a ValueError naming the field and its value."""
    with pytest.raises(ValueError) as info:
        PeerAddress(*fields)
    assert problem in str(info.value)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("abc@1.2.3.4:5", "node id 'abc' must be 40 hex characters"),
        (f"{NODE_ID}0@1.2.3.4:5", f"node id '{NODE_ID}0' must be 40 hex characters"),
        (f"{NODE_ID[:-1]}g@1.2.3.4:5", "must be 40 hex characters"),
        ("@1.2.3.4:5", "node id '' must be 40 hex characters"),
        (f"{NODE_ID}@{NODE_ID}@h:5", "host "),
        ("", "missing ':<port>'"),
        ("1.2.3.4", "missing ':<port>'"),
        (f"{NODE_ID}@1.2.3.4", "missing ':<port>'"),
        (":26656", "host '' must be a non-empty string"),
        (f"{NODE_ID}@:26656", "host '' must be a non-empty string"),
        ("h:", "port '' must be a number from 1 to 65535"),
        ("h:0", "port 0 must be a number from 1 to 65535"),
        ("h:65536", "port 65536 must be a number from 1 to 65535"),
        ("h:-1", "port '-1'"),
        ("h:+1", "port '+1'"),
        ("h:1x", "port '1x'"),
        ("h: 1", "port ' 1'"),
        ("h:\u0661", "port '\u0661'"),  # ARABIC-INDIC DIGIT ONE is a digit, not an ASCII one
        ("tcp://h:1/path", "port '1/path'"),
        (" h:1", "host ' h' contains"),
        ("a b:1", "host 'a b' contains"),
        ("::1:26656", "IPv6 host '::1' must be in brackets"),
        ("[::1:26656", "IPv6 host has no closing ']'"),
        ("[::1]26656", "expected ':<port>' after '[::1]'"),
        ("[::1]", "expected ':<port>' after '[::1]'"),
        ("[::1]]:1", "expected ':<port>' after '[::1]'"),
        ("[1.2.3.4]:5", "brackets are only for IPv6 hosts"),
        ("[]:5", "brackets are only for IPv6 hosts"),
        ("[::g]:5", "host '::g' is not a valid IPv6 address"),
        ("udp://h:1", "scheme 'udp://' is not supported"),
        ("tcp://tcp://h:1", "scheme 'tcp://' is not supported"),
    ],
)
def test_parse_refuses(text, problem):
    """Each malformed address is a ValueError quoting the text and saying what is wrong with it."""
    with pytest.raises(ValueError) as info:
        parse_address(text)
    message = str(info.value)
    assert message.startswith(f"peer address {text!r}: ")
    assert problem in message


def test_parse_refuses_non_str():
    """Bytes are a TypeError, not decoded."""
    with pytest.raises(TypeError, match="bytes"):
        parse_address(b"h:1")


@pytest.mark.parametrize(
    "text, valid",
    [
        (NODE_ID, True),
        (NODE_ID.upper(), True),
        (NODE_ID[:-1], False),
        (NODE_ID + "0", False),
        (NODE_ID[:-1] + "g", False),
        ("", False),
        (" " + NODE_ID[1:], False),
        (None, False),
        (bytes.fromhex(NODE_ID), False),
    ],
)
def test_is_valid_node_id(text, valid):
    """Only a str of exactly 40 hex digits, in either case, is a valid node id."""
    assert is_valid_node_id(text) is valid
