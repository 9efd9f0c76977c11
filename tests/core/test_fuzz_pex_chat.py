"""Fuzzing the PEX and chat decoders (reactors/pex_wire.py, reactors/chat_wire.py) with hypothesis.

Messages are built field by field from the modules' construct declarations, each field
valid, wrong or raw, then bytes edited (tests/fuzz/message_target.py), or are any bytes.
For every message (checks: tests/fuzz/message_target.py, ``check_pex`` and
``check_chat``): a failure is the module's own error (PexMisbehaved with a decoding
reason; MalformedChatMessage or ChatMessageTooLarge), never construct's or a bare
ValueError; a success re-encodes to bytes that decode to the same value (chat: to the
very same bytes); each decode takes bounded time and, with tracemalloc tracing here,
allocates memory bounded by the input's size, whatever counts and lengths it declares.

tests/fuzz/fuzz_pex.py and fuzz_chat.py run the same targets under atheris. Neither
decoder imports Twisted, so these tests live with the core ones.
"""

from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from mconn.core import wire
from reactors import chat_wire, pex_wire
from reactors.chat_wire import CHAT, FILE

from tests.fuzz.declared import Reader
from tests.fuzz.message_target import PEX_LIMITS, check_chat, check_pex, draw_chat, draw_pex, fuzz_chat, fuzz_pex
from tests.fuzz.strategies import chat_messages, pex_messages
from tests.helpers_core import expand

VECTORS = json.loads((pathlib.Path(__file__).resolve().parents[2] / "specs" / "vectors" / "pex.json").read_text())


@pytest.fixture(scope="module", autouse=True)
def traced(tracing):
    """Memory is measured only while tracemalloc traces (message_target.bounded)."""


def outcome(result) -> str:
    if isinstance(result, Exception):
        return f"{type(result).__name__} {getattr(result, 'reason', '')}".strip()
    return f"decoded kind {result[0]}"


@settings(max_examples=300, deadline=None)
@given(message=pex_messages(), limit=st.sampled_from(PEX_LIMITS))
def test_any_pex_message_decodes_and_round_trips_or_is_pex_misbehaved(message, limit):
    """Any PEX message, under any limit: PexMisbehaved with a decoding reason, or a value
    that round-trips, in bounded time and memory."""
    event(outcome(check_pex(message, limit)))  # --hypothesis-show-statistics


@settings(max_examples=300, deadline=None)
@given(data=st.data(), channel_id=st.sampled_from([CHAT, FILE]))
def test_any_chat_message_decodes_and_round_trips_or_is_a_chat_protocol_error(data, channel_id):
    """Any message on either chat channel: MalformedChatMessage or ChatMessageTooLarge, or
    fields that encode back to the same bytes, in bounded time and memory."""
    message = data.draw(chat_messages(channel_id))
    event(f"{channel_id:#04x} {outcome(check_chat(channel_id, message))}")


DECLARED_TOO_MUCH = {
    "reply declaring 251 addresses, holding 1": ("pex", b"\x02\x01\xfb" + bytes(20) + b"\x01a\x00\x01"),
    "reply declaring 2**32 addresses, holding 1": (
        "pex",
        b"\x02" + wire.encode_uvarint(2**32) + bytes(20) + b"\x01a\x00\x01",
    ),
    "reply declaring 2**64-1 addresses, holding none": ("pex", b"\x02" + wire.encode_uvarint(2**64 - 1)),
    "request for 2**64-1 addresses": ("pex", b"\x01" + wire.encode_uvarint(2**64 - 1)),
    "address with a 255-byte host, 3 present": ("pex", b"\x02\x01\x01" + bytes(20) + b"\xffabc"),
    "line with a 65535-byte text, 3 present": (CHAT, b"\x02" + bytes(16 + 20 + 1) + b"\x00\xff\xffabc"),
    "name of 255 bytes, 1 present": (CHAT, b"\x01\xffa"),
    "offer of 2**64-1 bytes with a short name": (FILE, b"\x01" + bytes(16) + b"\xff" * 8 + bytes(32) + b"\x09a"),
}


@pytest.mark.parametrize("name", DECLARED_TOO_MUCH)
def test_a_declared_count_or_length_past_the_bytes_fails_fast(name):
    """A count or length far past the bytes that follow (up to 2**64-1) fails with the
    module's error, in bounded time and memory: nothing is sized from it."""
    target, message = DECLARED_TOO_MUCH[name]
    result = check_pex(message) if target == "pex" else check_chat(target, message)
    assert isinstance(result, (pex_wire.PexMisbehaved, chat_wire.ChatProtocolError)), result


def test_the_pex_vectors_pass_the_checks():
    """specs/vectors/pex.json (the seeds of fuzz_pex.py): the valid ones decode and round-trip,
    the invalid ones fail with the reason they name."""
    for vector in VECTORS["valid"]:
        assert not isinstance(check_pex(expand(vector["hex"])), Exception), vector["name"]
    for vector in VECTORS["invalid"]:
        assert check_pex(expand(vector["hex"])).reason == vector["reason"], vector["name"]


def test_a_receipt_ok_byte_other_than_0_or_1_is_malformed():
    """Found by the chat target: RECEIPT's ok byte was read by construct's Flag, so 02
    decoded as true and re-encoded as 01. specs/chat.md says 0 or 1; 02 is malformed."""

    def receipt(ok: bytes) -> bytes:
        return bytes([chat_wire.RECEIPT]) + bytes(range(16)) + ok + b"\x02ok"

    assert check_chat(FILE, receipt(b"\x01"))[1]["ok"] is True
    for byte in (b"\x02", b"\xff"):
        assert type(check_chat(FILE, receipt(byte))) is chat_wire.MalformedChatMessage


def test_an_exhausted_input_builds_valid_messages():
    """The generators' defaults (what a short atheris input gives) are valid messages."""
    assert check_pex(draw_pex(Reader(b""))) == (pex_wire.PexType.ADDRS, ())
    for channel_id in (CHAT, FILE):
        assert not isinstance(check_chat(channel_id, draw_chat(Reader(b""), channel_id)), Exception)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300))
def test_the_atheris_targets_accept_any_bytes(data):
    """tests/fuzz/fuzz_pex.py's and fuzz_chat.py's targets, so that the harnesses cannot rot unnoticed."""
    fuzz_pex(data)
    fuzz_chat(data)
