"""The resume scenarios of the fault proxy over ws:// (specs/websocket.md section 5).

Two real Switches on 127.0.0.1; the dialer reaches the listener's ws:// endpoint through
a FaultProxy (mconn/ops/faultproxy.py) that resets the links, black-holes them, or cuts one
after exactly N bytes, in the middle of a WebSocket frame. Sessions resume across the
breaks as over TCP: every message arrives once and in order, one session throughout.
The pair and the scenario bodies are test_resume_scenarios' (``pair_through_proxy`` with
scheme "ws" or "wss", ``a_cut_message_resumes``, ``a_transfer_through_resets``,
``a_black_hole_healed_within_grace``): one scenario, run over TCP there and over ws here.
Every wait is bounded; every Switch and proxy started is stopped.
"""

from __future__ import annotations

import pytest
import pytest_twisted

from helpers import sleep
from mconn import Config
from mconn.net.websocket_endpoints import transport_kind

from .test_resume_scenarios import (
    BULK_CHANNELS,
    CHANNELS,
    HOLE_CONFIG,
    IDS,
    PAYLOAD,
    WIRE,
    a_black_hole_healed_within_grace,
    a_cut_message_resumes,
    a_transfer_through_resets,
    assert_one_session,
    burst,
    eventually,
    pair_through_proxy,
)

pytestmark = pytest.mark.integration


async def ws_pair_through_proxy(config, channels=CHANNELS, scheme="ws"):
    """test_resume_scenarios' pair over ws:// (or wss://, identity-mode TLS): the listener's
    WebSocket endpoint behind the FaultProxy, the dialer's Peer on a WebSocket transport."""
    p = await pair_through_proxy(config, channels, scheme=scheme)
    try:
        assert transport_kind(p.peer._protocol.transport) == scheme
    except BaseException:
        await p.close()
        raise
    return p


# -- a cut in the middle of a WebSocket frame -----------------------------------------------

#: BIG (test_resume_scenarios) is one ws message: the mconn bytes follow a 4-byte (8 masked) frame header.
CUTS = {"inside-the-frame-header": 3, "inside-the-third-packet": 2 * PAYLOAD + 700, "inside-the-last-packet": WIRE - 1}


@pytest.mark.parametrize("direction", ["up", "down"])
@pytest.mark.parametrize("cut", list(CUTS))
@pytest_twisted.ensureDeferred
async def test_a_cut_inside_a_websocket_frame_delivers_the_message_once_and_whole(cut, direction):
    """The link dies after exactly N bytes of a WebSocket frame carrying a 7-packet
    message, from either side: one resume, the message arrives once and whole."""
    config = Config(stats_interval=0, resume_grace=10.0, max_packet_payload=PAYLOAD, max_reconnect_delay=0.05)
    p = await ws_pair_through_proxy(config)
    try:
        await a_cut_message_resumes(p, CUTS[cut], direction)
    finally:
        await p.close()


# -- resets during a transfer -----------------------------------------------------------

PER_CHANNEL = {0x20: 4_000, 0x21: 4_000, 0x30: 4_000}
MIN_RESETS = 20


@pytest_twisted.ensureDeferred
async def test_resets_during_a_transfer_over_ws_lose_duplicate_and_reorder_nothing():
    """Twenty-odd resets during 12,000 messages on three channels over ws: each is
    resumed, every message arrives once and in order, to the same Peers."""
    config = Config(
        stats_interval=0, resume_grace=30.0, ack_every_messages=128, send_timeout=60.0, max_reconnect_delay=0.05
    )
    p = await ws_pair_through_proxy(config, BULK_CHANNELS)
    try:
        await a_transfer_through_resets(p, PER_CHANNEL, MIN_RESETS, timeout=60)
        assert p.peer.stats.messages_resent >= 1, "no reset caught a message in flight"
        assert_one_session(p, p.peer.resumes)
        assert p.peer.resumes >= MIN_RESETS
    finally:
        await p.close()


# -- a black hole healed within grace ------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_black_hole_over_ws_healed_within_grace_resumes_and_delivers_everything_once(telemetry):
    """mconn's keepalive (not WebSocket pings) finds a black hole on both sides; redials
    into the hole give up at ws_handshake_timeout (1 s); healed within grace, one resume
    delivers every message once, in order."""
    config = Config(
        resume_grace=20.0,
        ws_handshake_timeout=1.0,
        retry_initial_dial=True,  # a loaded machine may miss the short timeouts once
        **HOLE_CONFIG,
    )
    p = await ws_pair_through_proxy(config)
    try:
        await a_black_hole_healed_within_grace(p, telemetry)
    finally:
        await p.close()


@pytest_twisted.ensureDeferred
async def test_resets_over_wss_resume_with_every_message_once():
    """Over wss (identity-mode TLS beneath the WebSocket) five resets during a burst
    stream: each is resumed, every message arrives once and in order, one session."""
    config = Config(stats_interval=0, resume_grace=10.0, max_reconnect_delay=0.05)
    p = await ws_pair_through_proxy(config, scheme="wss")
    try:
        sent = {c: [] for c in IDS}
        for round_ in range(5):
            before = p.ra.total
            burst(p.peer, sent, b"r%d" % round_, dict.fromkeys(IDS, 20))
            await eventually(lambda before=before: p.ra.total >= before + 10, "part of the burst")
            assert p.proxy.reset_all()
            await eventually(lambda round_=round_: p.connected() and p.peer.resumes == round_ + 1, "the resume")
        total = sum(len(m) for m in sent.values())
        await eventually(lambda: p.ra.total == total, "every message")
        await sleep(0.05)
        assert p.ra.messages == sent
        assert_one_session(p, 5)
    finally:
        await p.close()
