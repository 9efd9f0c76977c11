"""Metrics an operator can alert on (mconn/ops/metrics.py, specs/status.md section 4).

Real Switches and raw peers on 127.0.0.1 in this process; each test reads a Switch's own
registry (rendered in the text format and parsed back, as Prometheus reads ``/metrics``):

* every series of a known label value is there at 0 before its first event, so that
  ``increase()`` sees the first one (tests/operators/test_prometheus.py asks a real
  Prometheus);
* a silent peer, a handshake that never comes and a reset are link failures, a packet on
  an unknown channel the peer's protocol error, and neither is counted as the other;
* the node's and the build's names, and the channels' names, are info series;
* a channel's sent bytes on one node are its received bytes on the other.

Every wait is bounded; every Switch and raw connection started is stopped.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform

import pytest
import pytest_twisted
import twisted
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

from helpers import RawPeer, dialer_hello, msg_packet, the_reactor, until as poll
from mconn import ChannelDescriptor, Config, NodeInfo, Reactor, Switch
from mconn.ops.metrics import SwitchMetrics
from operators.prometheus import by_label, scrape

pytestmark = pytest.mark.integration

TIMEOUT = 15.0
until = functools.partial(poll, seconds=TIMEOUT)
LOOPBACK = "tcp:0:interface=127.0.0.1"
CHANNELS = (
    ChannelDescriptor(0x20, priority=1, send_queue_capacity=8, name="votes"),
    ChannelDescriptor(0x30, priority=7, send_queue_capacity=64),
)


class Sink(Reactor):
    def get_channels(self):
        return list(CHANNELS)

    def receive(self, channel_id, peer, message):
        pass


@pytest.fixture
def switches(metered_switches):
    """Started Switches of a Sink, each with its started SwitchMetrics (operators/conftest.py)."""
    return functools.partial(metered_switches, Sink)


def test_every_known_label_value_has_its_series_at_zero_before_any_event():
    """A node that saw nothing has a 0 series for every error class of each kind, the reasons a session
    ends with, the close codes of refusals, dial results, duplicate outcomes and reactor methods: the first
    event makes a series go from 0 to 1, which increase() and rate() see."""
    switch = Switch([Sink()], config=Config(stats_interval=0), clock=the_reactor())
    samples = scrape(SwitchMetrics(switch))
    protocol = by_label(samples, "mconn_protocol_errors_total", "error")
    link = by_label(samples, "mconn_link_failures_total", "error")
    assert {"MalformedPacket", "UnknownChannel", "MessageTooLarge", "ControlFlood", "AckError"} <= set(protocol)
    assert {"PongTimeout", "HandshakeTimeout", "ConnectionLost", "TLSError"} <= set(link)
    assert not set(protocol) & set(link)  # one kind each
    ended = by_label(samples, "mconn_sessions_ended_total", "reason")
    assert {"SessionExpired", "SessionRejected", "PeerClosed", "ConnectionClosed", "PongTimeout"} <= set(ended)
    refusals = by_label(samples, "mconn_refusals_total", "reason")
    assert {"ip_limit", "pending_limit", "unauthorized", "duplicate", "banned"} <= set(refusals)
    assert set(by_label(samples, "mconn_dial_attempts_total", "result")) == {"connected", "failed", "not_retried"}
    assert set(by_label(samples, "mconn_duplicate_connections_total", "outcome")) == {"refused", "replaced"}
    assert {"add_peer", "receive", "routine"} <= set(by_label(samples, "mconn_reactor_errors_total", "method"))
    for name in ("mconn_protocol_errors_total", "mconn_link_failures_total", "mconn_sessions_ended_total"):
        assert set(by_label(samples, name, "error" if "ended" not in name else "reason").values()) == {0.0}
    assert set(refusals.values()) == {0.0}


async def raw(port: int, greeting: bytes) -> RawPeer:
    """A raw peer connected to 127.0.0.1:``port`` that sends ``greeting`` and then nothing."""
    return await connectProtocol(TCP4ClientEndpoint(the_reactor(), "127.0.0.1", port), RawPeer(greeting))


@pytest_twisted.ensureDeferred
async def test_a_silent_peer_a_missing_hello_and_a_reset_are_link_failures_not_protocol_errors(switches):
    """A peer that says hello and then nothing (PongTimeout), one that never says hello (HandshakeTimeout)
    and one that resets its connection (ConnectionLost) count in mconn_link_failures_total; a msg packet
    on a channel a does not have counts in mconn_protocol_errors_total; neither in the other."""
    config = Config(stats_interval=0, ping_interval=0.2, pong_timeout=0.3, handshake_timeout=0.5, resume_grace=0)
    a, ma = switches(config)
    port = (await a.listen(LOOPBACK)).getHost().port
    silent = await raw(port, dialer_hello(channels=list(CHANNELS)))
    mute = await raw(port, b"")
    await until(lambda: silent.lost is not None and mute.lost is not None, "a to drop the silent and the mute peer")
    rude = await raw(port, dialer_hello(channels=list(CHANNELS)) + msg_packet(0x99, b"?"))
    await until(lambda: rude.lost is not None, "a to drop the peer that sent on channel 0x99")
    resetting = await raw(port, dialer_hello(channels=list(CHANNELS)))
    await until(lambda: len(a.peers) == 1, "a session with the peer about to reset")
    resetting.transport.abortConnection()
    await until(lambda: not a.peers, "a to see the reset")
    samples = scrape(ma)
    link = by_label(samples, "mconn_link_failures_total", "error")
    protocol = by_label(samples, "mconn_protocol_errors_total", "error")
    assert {k: v for k, v in link.items() if v} == {"PongTimeout": 1, "HandshakeTimeout": 1, "ConnectionLost": 1}
    assert {k: v for k, v in protocol.items() if v} == {"UnknownChannel": 1}
    assert "PongTimeout" not in protocol and "UnknownChannel" not in link


@pytest_twisted.ensureDeferred
async def test_the_node_the_build_and_the_channels_are_named_in_info_series(switches):
    """mconn_node_info names the node's moniker, network and version beside its id; mconn_build_info the
    versions of mconn, Python and Twisted; mconn_channel_info each channel with its name (empty without)."""
    a, ma = switches(node_info=NodeInfo(network="testnet-1", moniker="alice", version="1.2.3"))
    samples = scrape(ma)
    info = [dict(labels) for (name, labels), v in samples.items() if name == "mconn_node_info" and v == 1]
    assert info == [
        {"node_id": a.node_id, "tls": "off", "moniker": "alice", "network": "testnet-1", "version": "1.2.3"}
    ]
    build = [dict(labels) for (name, labels), v in samples.items() if name == "mconn_build_info" and v == 1]
    assert build == [
        {
            "version": importlib.metadata.version("mconn"),
            "python": platform.python_version(),
            "twisted": twisted.__version__,
        }
    ]
    assert by_label(samples, "mconn_channel_info", "channel") == {"0x20": 1, "0x30": 1}
    names = {dict(labels)["channel"]: dict(labels)["name"] for (n, labels) in samples if n == "mconn_channel_info"}
    assert names == {"0x20": "votes", "0x30": ""}


@pytest_twisted.ensureDeferred
async def test_a_channels_sent_bytes_on_one_node_are_its_received_bytes_on_the_other(switches):
    """After traffic both ways on two channels (empty, small, chunked and large messages), for each channel
    mconn_channel_sent_bytes_total on one node equals mconn_channel_received_bytes_total on the other: both
    count message bytes, so a sent-versus-received panel matches across the two nodes."""
    a, ma = switches()
    b, mb = switches()
    port = (await a.listen(LOOPBACK)).getHost().port
    to_a = await b.dial(f"{a.node_id}@127.0.0.1:{port}")
    await until(lambda: b.node_id in a.peers, "a to have the session")
    to_b = a.peers[b.node_id]
    sizes = (0, 1, 1000, 5000, 70_000)
    for size in sizes:
        assert await to_a.send(0x30, b"m" * size)
        assert await to_a.send(0x20, b"v" * (size // 2))
        assert await to_b.send(0x20, b"w" * size)
    await until(
        lambda: (
            a.peers[b.node_id].stats.channels[1].messages_received == len(sizes)
            and a.peers[b.node_id].stats.channels[0].messages_received == len(sizes)
            and b.peers[a.node_id].stats.channels[0].messages_received == len(sizes)
        ),
        "every message to arrive",
    )
    sa, sb = scrape(ma), scrape(mb)
    for channel in ("0x20", "0x30"):
        sent_by_b = by_label(sb, "mconn_channel_sent_bytes_total", "channel")[channel]
        received_by_a = by_label(sa, "mconn_channel_received_bytes_total", "channel")[channel]
        assert sent_by_b == received_by_a, channel
        sent_by_a = by_label(sa, "mconn_channel_sent_bytes_total", "channel")[channel]
        received_by_b = by_label(sb, "mconn_channel_received_bytes_total", "channel")[channel]
        assert sent_by_a == received_by_b, channel
    assert by_label(sb, "mconn_channel_sent_bytes_total", "channel")["0x30"] == sum(sizes)
    assert by_label(sa, "mconn_channel_sent_bytes_total", "channel")["0x20"] == sum(sizes)
