"""Fuzzing the handshake and session-answer paths of a real Switch with hypothesis.

A listening Switch gets structure-aware hellos (every field of mconn/core/wire.py's HelloBody
valid, wrong or raw, the session request of field 01 likewise, then bytes edited) or raw
streams, while it holds nothing, a connected session or a suspended one that the hello
may prove, claim or miss; a dialing Switch gets structure-aware session answers (packet
07) after a valid hello, on a first dial, a re-dial resuming a session, or a simultaneous
dial. Packets follow, cut and timed arbitrarily, from a peer that may stop reading. The
target and its checks are tests/fuzz/switch_target.py: nothing escapes, invariants and
the reactor contract hold after every step, buffers stay within the limits, and the
connection ends for a specific reason named by our one last close packet.

tests/fuzz/fuzz_switch.py runs the same target under atheris. Bugs the target found
and that are not fixed yet are listed in ``switch_target.KNOWN_BUGS``: the property tests
discard inputs that hit one, and a strict xfail below reproduces each.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from mconn import PeerRejected
from mconn.core.wire import PacketType

from tests.fuzz.declared import Reader
from tests.fuzz.handshake_inputs import ASKED, OTHER, CountsSpec, RequestSpec, draw_answer, draw_hello
from tests.fuzz.strategies import handshake_scenarios
from tests.fuzz.switch_target import Scenario, fuzz_one, known_bug, run, scenario_from_bytes

FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def play(scenario: Scenario):
    """``run(scenario)``, with an input that hits a known bug discarded."""
    try:
        world = run(scenario)
    except Exception as error:
        what = known_bug(error)
        if what is None:
            raise
        event(f"known bug: {what[:60]}")
        reject()
    reason = world.target.end_reason
    name = type(reason).__name__ + (f" {reason.reason}" if isinstance(reason, PeerRejected) else "")
    event(f"{scenario.held}: {'session, then ' if world.opened else ''}{name}")  # --hypothesis-show-statistics
    return world


@FUZZ
@given(scenario=handshake_scenarios(dialer=False))
def test_a_listener_fed_any_hello_opens_a_session_or_closes_for_a_specific_reason(scenario):
    """Any hello (any session request) and what follows, to a listener holding nothing, a
    connected or a suspended session: the checks of switch_target hold throughout."""
    play(scenario)


@FUZZ
@given(scenario=handshake_scenarios(dialer=True))
def test_a_dialer_fed_any_session_answer_opens_a_session_or_closes_for_a_specific_reason(scenario):
    """Any session answer and what follows, after a valid hello, on a first dial, a resuming
    re-dial or a simultaneous dial: the checks of switch_target hold throughout."""
    play(scenario)


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=120))
def test_the_atheris_target_accepts_any_bytes(data):
    """tests/fuzz/fuzz_switch.py's target, so that the harness cannot rot unnoticed."""
    fuzz_one(data)


# -- the generator reaches the decisions (so the fuzzing above is not shallow) ----------------


def hello(**changes) -> Scenario:
    """A listener holding a suspended session, given the default hello (it proves the
    session and resumes it with nothing delivered) with ``changes``."""
    held = changes.pop("held", "suspended")
    spec = dataclasses.replace(draw_hello(Reader(b"")), **changes)
    return Scenario(False, held, False, spec, b"", ())


def answer(held: str, low: bool = False, **changes) -> Scenario:
    spec = dataclasses.replace(draw_answer(Reader(b"")), **changes)
    return Scenario(True, held, low, spec, b"", ())


def calls(world, index: int = 0) -> list[str]:
    return [c[0] for c in world.reactors[index][1].calls if c[0] != "receive"]


def resumed(world) -> bool:
    return "peer_resumed" in calls(world)


REACHED = {
    "resume of a suspended session": (hello(), resumed),
    "takeover of a connected session": (hello(held="connected"), resumed),
    "impossible resume counts": (
        hello(request=RequestSpec("held", True, CountsSpec("exact", ((0x20, 5),)))),
        lambda w: w.target.end_reason.__class__.__name__ == "AckError",
    ),
    "a duplicate of a connected node": (
        hello(held="connected", request="absent"),
        lambda w: getattr(w.target.end_reason, "reason", None) == "duplicate",
    ),
    "ourselves": (hello(node="self"), lambda w: getattr(w.target.end_reason, "reason", None) == "self"),
    "another protocol version": (
        hello(version=2),
        lambda w: w.target.end_reason.__class__.__name__ == "IncompatiblePeer",
    ),
    "a payload below the floor": (
        hello(max_packet_payload=1023),
        lambda w: w.target.end_reason.__class__.__name__ == "PacketPayloadTooSmall",
    ),
    "a hello listing 257 channels": (
        hello(channels="257 channels"),
        lambda w: "at most 256" in str(w.target.end_reason),
    ),
    "a session request that does not parse": (
        hello(request=RequestSpec("held", True, CountsSpec(2**32, ()))),
        lambda w: w.target.end_reason.__class__.__name__ == "MalformedPacket",
    ),
    "a first dial answered": (answer("none"), lambda w: calls(w)[:1] == ["add_peer"] and w.opened),
    "a re-dial resumed": (answer("suspended"), resumed),
    "a re-dial answered with a fresh session": (
        answer("suspended", resumed=False),
        lambda w: calls(w)[:4] == ["add_peer", "peer_suspended", "remove_peer", "add_peer"],
    ),
    "a resume answered with impossible counts": (
        answer("suspended", delivered=CountsSpec("exact", ((0x21, 9),))),
        lambda w: w.target.end_reason.__class__.__name__ == "AckError",
    ),
    "an answer naming another session": (
        answer("none", session=OTHER),
        lambda w: w.target.end_reason.__class__.__name__ == "UnexpectedPacket",
    ),
    "a simultaneous dial lost": (
        answer("connected", low=True, session=ASKED),
        lambda w: getattr(w.target.end_reason, "reason", None) == "simultaneous_dial",
    ),
}


@pytest.mark.parametrize("name", REACHED)
def test_the_generator_reaches_the_session_decisions(name):
    """Hand-picked inputs of the generators (defaults with one field changed) reach each
    decision of the handshake and the session answer, with every check of switch_target."""
    scenario, reached = REACHED[name]
    world = run(scenario)
    assert reached(world), (calls(world), world.target.end_reason)


def test_the_default_inputs_are_the_seeds_of_an_exhausted_input():
    """An input that runs out gives valid defaults: the atheris seed of two bytes is the
    resuming hello, or the answer our request expects (tests/fuzz/make_corpus.py)."""
    assert scenario_from_bytes(bytes([0b0100, 0])).first == draw_hello(Reader(b""))
    assert scenario_from_bytes(bytes([0b0101, 0])).first == draw_answer(Reader(b""))
    assert scenario_from_bytes(bytes([0b1000, 0]) + b"\x01").first is None


def test_a_resuming_hello_followed_by_refused_bytes_in_the_same_read():
    """A hello that proves a suspended session, followed in the same read by a msg packet
    on channel 0x00 (which the node does not have): the core fails the connection
    (UnknownChannel) before the adapter handles the hello. The events are handled in
    order, so the session resumes and then ends with the error; nothing is requeued on the
    failed core, and every check of the target holds (nothing escapes dataReceived, the
    reactor calls follow the contract, one close packet names the error). This was a bug
    the fuzz target found: requeueing on the failed core raised LocalProtocolError."""
    run(dataclasses.replace(hello(), rest=bytes([PacketType.MSG, 0x00, 1, 0])))
