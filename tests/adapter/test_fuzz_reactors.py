"""Fuzzing the blocksync, mempool and bulk reactors (reactors/blocksync.py, reactors/mempool.py,
reactors/bulk.py) with hypothesis, for a bounded number of examples.

Blocksync messages are built field by field from ``blocksync.MESSAGE``'s declaration
(heights at every boundary, those of pending requests included), or are any bytes; the
reactors are fed whole sessions of them from three FakePeers on a task.Clock. The checks
are tests/fuzz/reactor_target.py's: a decoder fails only with its module's own error and
a success round-trips; ``receive`` raises only the reactor's own errors; requests in
flight, the mempool, each peer's share and seen set stay within the reactor's bounds
after every step; each decode and receive takes bounded time and, with tracemalloc
tracing here, memory bounded by the input, whatever numbers it carries.

tests/fuzz/fuzz_blocksync.py, fuzz_mempool.py and fuzz_bulk.py run the same targets
under atheris; the PEX and chat decoders are tests/core/test_fuzz_pex_chat.py's.
"""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from reactors import bulk
from reactors.blocksync import BlocksyncType, ImplausibleStatus, encode

from tests.fuzz.declared import Reader
from tests.fuzz.reactor_target import (
    MAX_STEPS,
    BlocksyncSession,
    MempoolSession,
    check_blocksync,
    check_bulk,
    draw_blocksync,
    draw_bulk,
    fuzz_blocksync,
    fuzz_bulk,
    fuzz_mempool,
)
from tests.fuzz.strategies import Drawn

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def traced(tracing):
    """Memory is measured only while tracemalloc traces (message_target.bounded)."""


def outcome(result) -> str:
    return type(result).__name__ if isinstance(result, Exception) else f"decoded {result[0]!r}"


@st.composite
def blocksync_messages(draw) -> bytes:
    """Built from the declaration four times in five, else any bytes."""
    return draw_blocksync(Drawn(draw)) if draw(st.integers(0, 4)) else draw(st.binary(max_size=60))


@FUZZ
@given(message=blocksync_messages())
def test_any_blocksync_message_decodes_and_round_trips_or_is_malformed(message):
    event(outcome(check_blocksync(message)))


@FUZZ
@given(data=st.data())
def test_a_blocksync_reactor_fed_any_session_stays_within_its_bounds(data):
    """Three peers send any messages (statuses up to 2**64-1, blocks asked for or not,
    garbage); receive raises only BlocksyncError, and the requests in flight stay within
    max_pending, max_pending_per_peer and the window after every step."""
    session = BlocksyncSession()
    chooser = Drawn(data.draw)
    raw = data.draw(st.integers(0, 9)) == 0
    for _ in range(data.draw(st.integers(1, MAX_STEPS))):
        session.step(chooser, raw)
    for name in session.errors:
        event(name)
    event(f"height {session.reactor.height}")


@FUZZ
@given(data=st.data())
def test_a_mempool_reactor_fed_any_session_stays_within_its_bounds(data):
    """Peers send transactions (duplicates, invalid, too large), the node adds and
    removes some, peers come and go; receive raises nothing (an invalid transaction is
    counted and its peer stays), and the
    mempool, each share, each seen set and the order stay within their bounds."""
    session = MempoolSession()
    chooser = Drawn(data.draw)
    for _ in range(data.draw(st.integers(1, MAX_STEPS * 2))):
        session.step(chooser)
    event(f"{len(session.reactor.txs)} txs, {session.reactor.refused_share} refused for the share")


@FUZZ
@given(data=st.data())
def test_any_bulk_message_is_the_expected_one_or_a_bulk_stream_error(data):
    if data.draw(st.integers(0, 4)):
        message, expected = draw_bulk(Drawn(data.draw))
    else:
        message, expected = data.draw(st.binary(max_size=60)), 0
    result = check_bulk(message, expected)
    event(type(result).__name__ if isinstance(result, Exception) else "in order")


DECLARED_TOO_MUCH = {
    "status of base 2**62, height 2**63-1": encode(BlocksyncType.STATUS_RESPONSE, base=2**62, height=2**63 - 1),
    "status of 2**64-1": encode(BlocksyncType.STATUS_RESPONSE, base=2**64 - 1, height=2**64 - 1),
    "block request for 2**64-1": encode(BlocksyncType.BLOCK_REQUEST, height=2**64 - 1),
    "block response for 2**64-1, no block": encode(BlocksyncType.BLOCK_RESPONSE, height=2**64 - 1, block=b""),
}


@pytest.mark.timeout(30)  # a walk sized by the status's numbers would never end
@pytest.mark.parametrize("name", DECLARED_TOO_MUCH)
def test_a_number_past_anything_is_handled_in_bounded_work(name):
    """Each message decodes; sent by every peer, after an honest status that left
    requests pending, it costs bounded work and the bounds hold (a status past
    max_height is refused with ImplausibleStatus and its peer goes)."""
    message = DECLARED_TOO_MUCH[name]
    assert not isinstance(check_blocksync(message), Exception)
    session = BlocksyncSession()
    for index, peer in enumerate(list(session.peers)):
        session.reactor.receive(0x40, peer, encode(BlocksyncType.STATUS_RESPONSE, base=1, height=40))
        assert peer.node_id in {node_id for node_id, _ in session.reactor.pending.values()}
        try:
            session.reactor.receive(0x40, peer, message)
        except ImplausibleStatus as error:
            session._drop(index, error)
        if peer.state == "closed":  # a block it was not asked for
            session._drop(index, peer.close_reason)
        session.check()


def test_an_exhausted_input_is_a_valid_message_and_a_quiet_session():
    assert check_blocksync(draw_blocksync(Reader(b""))) == (BlocksyncType.STATUS_REQUEST, {})
    assert check_bulk(*draw_bulk(Reader(b""))) == 0
    assert check_bulk(bulk.encode(7, 100), 7) == 7


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=200))
def test_the_atheris_targets_accept_any_bytes(data):
    """tests/fuzz/fuzz_blocksync.py's, fuzz_mempool.py's and fuzz_bulk.py's targets, so that
    the harnesses cannot rot unnoticed."""
    fuzz_blocksync(data)
    fuzz_mempool(data)
    fuzz_bulk(data)
