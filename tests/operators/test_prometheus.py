"""A real Prometheus server scrapes two ``twistd mconn`` nodes (specs/status.md section 4).

Two nodes run as processes (tests/operators/twistd_nodes.py) with ``--status tcp:0``; the
dialer sends a known burst on channel 0x40 (``Burst`` below, loaded by twistd as
``operators.test_prometheus:Burst``). Debian's ``/usr/bin/prometheus`` (``make``
installs it) is started on 127.0.0.1 with a free port, its TSDB in the test's temporary
directory and a 1 s scrape interval over both nodes' ``/metrics``; PromQL queries through
its HTTP API (``/api/v1/query``) must return what the nodes did. Every wait is bounded;
Prometheus and the nodes are stopped by their PIDs whatever the outcome.

The second test is the alert an operator writes: ``increase(...[1m]) > 0`` must see the
first error. A frozen peer (its process stopped with SIGSTOP) is a link failure,
``mconn_link_failures_total{error="PongTimeout"}``, and not a protocol error; a raw peer
that sends on a channel the node does not have is one, ``UnknownChannel``.
"""

from __future__ import annotations

import signal
import socket
import urllib.parse
import urllib.request

import pytest

from helpers import dialer_hello, msg_packet
from mconn import ChannelDescriptor, Reactor
from operators.prometheus import PROMETHEUS, Prometheus

BURST = 0x40
COUNT = 50
SIZE = 1000


class Burst(Reactor):
    """Channel 0x40; the dialing side sends COUNT messages of SIZE bytes to each new peer."""

    def get_channels(self):
        return [ChannelDescriptor(BURST, priority=3, send_queue_capacity=COUNT)]

    def add_peer(self, peer) -> None:
        if peer.is_outbound:
            assert peer.try_send_many(BURST, [b"p" * SIZE] * COUNT) == COUNT

    def receive(self, channel_id, peer, message) -> None:
        pass


@pytest.mark.integration
def test_prometheus_scrapes_two_nodes_and_promql_returns_what_they_did(nodes, tmp_path):
    """Prometheus scrapes both nodes' /metrics: both are up, each has one connected peer, the
    dialer sent COUNT messages on 0x40 and the listener received COUNT and COUNT*SIZE payload
    bytes, each node's peer is in the round-trip histogram (histogram_quantile works on it),
    mconn_node_info names each node's id on its own target, and only a (metrics_per_peer in its
    TOML) has a series labelled by b's id."""
    assert PROMETHEUS.exists(), "make installs Debian's prometheus package"
    # --stats-interval 1: the stats tick pings each new link within a second (a round trip)
    args = ("--reactor", "operators.test_prometheus:Burst", "--status", "tcp:0", "--stats-interval", "1")
    (tmp_path / "a.toml").write_text("metrics_per_peer = true\n")  # a's peers by node id; b keeps the default
    a = nodes("a").start("--listen", "tcp:0:interface=127.0.0.1", "--config", str(tmp_path / "a.toml"), *args)
    b = nodes("b").start("--listen", "tcp:0:interface=127.0.0.1", "--peer", a.address, *args)
    targets = {node.name: urllib.parse.urlsplit(node.status_url).netloc for node in (a, b)}
    ids = {node.name: node.address.split("@")[0] for node in (a, b)}
    prometheus = Prometheus(tmp_path, sorted(targets.values()))
    try:
        prometheus.wait_ready()
        both = {targets["a"], targets["b"]}
        prometheus.until_equal('up{job="mconn"}', dict.fromkeys(both, 1.0), "both targets up")
        prometheus.until_equal(
            'sum by (instance) (mconn_peers{state="connected"})',
            dict.fromkeys(both, 1.0),
            "one connected peer on each node",
        )
        prometheus.until_equal(
            'sum by (instance) (mconn_peers{direction="outbound"})',
            {targets["a"]: 0.0, targets["b"]: 1.0},
            "b dialed a",
        )
        prometheus.until_equal(
            'mconn_channel_sent_messages_total{channel="0x40"}',
            {targets["a"]: 0.0, targets["b"]: float(COUNT)},
            "b's burst sent",
        )
        prometheus.until_equal(
            'mconn_channel_received_messages_total{channel="0x40"}',
            {targets["a"]: float(COUNT), targets["b"]: 0.0},
            "a's burst received",
        )
        prometheus.until_equal(
            'sum(mconn_channel_received_bytes_total{channel="0x40"})',
            [float(COUNT * SIZE)],
            "the burst's payload bytes",
            by=lambda q: [float(r["value"][1]) for r in prometheus.query(q)],
        )
        prometheus.until_equal(
            'mconn_peer_round_trip_seconds_bucket{le="+Inf"}',
            dict.fromkeys(both, 1.0),
            "each node's peer in the round-trip histogram",
        )
        median = prometheus.by_instance("histogram_quantile(0.5, mconn_peer_round_trip_seconds_bucket)")
        assert set(median) == both and all(0 < v <= 5.0 for v in median.values()), median  # a loopback round trip
        names = prometheus.query("mconn_node_info")
        assert {r["metric"]["instance"]: r["metric"]["node_id"] for r in names} == {
            targets["a"]: ids["a"],
            targets["b"]: ids["b"],
        }
        assert all(r["metric"]["tls"] == "off" for r in names)
        peers = prometheus.query("mconn_peer_up")
        assert [(r["metric"]["instance"], r["metric"]["peer"], r["metric"]["state"]) for r in peers] == [
            (targets["a"], ids["b"], "connected")
        ]
    finally:
        prometheus.stop()


def increased(prometheus: Prometheus, promql: str) -> dict[str, float]:
    """{instance: value} of ``promql`` where it is above 0."""
    return {k: v for k, v in prometheus.by_instance(promql).items() if v > 0}


@pytest.mark.integration
def test_the_first_link_failure_and_the_first_protocol_error_each_trip_an_increase_alert(nodes, tmp_path):
    """Prometheus scrapes a's link-failure and protocol-error series at 0 before anything happens; b is
    frozen (SIGSTOP) and a's pong timeout makes increase(mconn_link_failures_total{error="PongTimeout"}[1m])
    above 0 on a, while a's protocol errors stay 0; then a raw peer sends on channel 0x99 and
    increase(mconn_protocol_errors_total{error="UnknownChannel"}[1m]) goes above 0."""
    assert PROMETHEUS.exists(), "make installs Debian's prometheus package"
    args = ("--reactor", "operators.test_prometheus:Burst", "--status", "tcp:0", "--stats-interval", "0")
    a = nodes("a").start("--listen", "tcp:0:interface=127.0.0.1", "--ping-interval", "1", "--pong-timeout", "1", *args)
    b = nodes("b").start("--listen", "tcp:0:interface=127.0.0.1", "--peer", a.address, *args)
    target = urllib.parse.urlsplit(a.status_url).netloc
    prometheus = Prometheus(tmp_path, [target])
    frozen = False
    try:
        prometheus.wait_ready()
        prometheus.until_equal('sum by (instance) (mconn_peers{state="connected"})', {target: 1.0}, "a connected to b")
        # Both series at 0, scraped before the first event: increase() has a sample to start from.
        prometheus.until_equal('mconn_link_failures_total{error="PongTimeout"}', {target: 0.0}, "the link series at 0")
        prometheus.until_equal(
            'mconn_protocol_errors_total{error="UnknownChannel"}', {target: 0.0}, "the error series at 0"
        )
        b.process.send_signal(signal.SIGSTOP)  # a frozen peer: nothing answers a's ping
        frozen = True
        prometheus.until_equal(
            'increase(mconn_link_failures_total{error="PongTimeout"}[1m]) > 0',
            [target],
            "the frozen peer's pong timeout in increase()",
            by=lambda q: sorted(increased(prometheus, q)),
        )
        errors = prometheus.by_instance("sum by (instance) (mconn_protocol_errors_total)")
        assert errors == {target: 0.0}, f"a pong timeout is not a protocol error: {errors}"
        host, port = a.address.split("@")[1].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as rude:
            rude.sendall(dialer_hello(channels=[ChannelDescriptor(BURST)]) + msg_packet(0x99, b"?"))
            prometheus.until_equal(
                'increase(mconn_protocol_errors_total{error="UnknownChannel"}[1m]) > 0',
                [target],
                "the first protocol error in increase()",
                by=lambda q: sorted(increased(prometheus, q)),
            )
    finally:
        if frozen:
            b.process.send_signal(signal.SIGCONT)
        prometheus.stop()
