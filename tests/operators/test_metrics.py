"""Prometheus metrics of a Switch (mconn/ops/metrics.py, specs/status.md section 4).

Real Switches on 127.0.0.1 in this process; each test reads its Switch's own registry
(``SwitchMetrics.registry``, rendered and parsed back with prometheus_client) after
known traffic, a forced reset, a grace expiry and refused connections, and ``/metrics``
over HTTP from a real twisted.web server. Every wait is bounded; every Switch and
service started is stopped.
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
import urllib.request

import pytest
import pytest_twisted
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import threads

from helpers import until as poll
from mconn import ChannelDescriptor, Config, Reactor, Switch
from mconn.switch import telemetry
from mconn.errors import MISBEHAVIOUR, PeerClosed
from mconn.ops.metrics import MAX_LABEL_VALUES, SwitchMetrics, error_classes, round_trip_histogram
from mconn.ops.status import serve_status
from operators.prometheus import scrape, value

pytestmark = pytest.mark.integration

TIMEOUT = 15.0
#: Every wait of this module polls for at most TIMEOUT seconds.
until = functools.partial(poll, seconds=TIMEOUT)
CHANNELS = (ChannelDescriptor(0x20, priority=1), ChannelDescriptor(0x30, priority=7, send_queue_capacity=64))
LOOPBACK = "tcp:0:interface=127.0.0.1"


class Sink(Reactor):
    def get_channels(self):
        return list(CHANNELS)

    def receive(self, channel_id, peer, message):
        pass


@pytest.fixture
def switches(metered_switches):
    """Started Switches of a Sink, each with its started SwitchMetrics (operators/conftest.py)."""
    return functools.partial(metered_switches, Sink)


async def connect(listener: Switch, dialer: Switch):
    port = await listener.listen(LOOPBACK)
    peer = await dialer.dial(f"{listener.node_id}@127.0.0.1:{port.getHost().port}")
    await until(lambda: dialer.node_id in listener.peers, "the listener to have the session")
    return peer


async def send(peer, count: int, size: int = 1000) -> None:
    for _ in range(count):
        assert await peer.send(0x30, b"m" * size)


# -- counters after known traffic ----------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_channel_and_wire_counters_match_known_traffic_on_both_ends(switches):
    """After 20 messages of 1000 bytes from b to a on channel 0x30, a counts 20 received messages and
    20000 payload bytes on 0x30 and b 20 sent, none on 0x20; wire bytes equal the connection's; each
    node's registry shows only its own node id."""
    a, ma = switches()
    b, mb = switches()
    peer = await connect(a, b)
    await send(peer, 20)
    await until(lambda: a.peers[b.node_id].stats.channels[1].messages_received == 20, "a to get 20 messages")
    sa, sb = scrape(ma), scrape(mb)
    assert value(sa, "mconn_channel_received_messages_total", channel="0x30") == 20
    assert value(sa, "mconn_channel_received_bytes_total", channel="0x30") == 20_000
    assert value(sa, "mconn_channel_received_messages_total", channel="0x20") == 0
    assert value(sb, "mconn_channel_sent_messages_total", channel="0x30") == 20
    channel = peer.stats.channels[1]
    assert value(sb, "mconn_channel_sent_bytes_total", channel="0x30") == channel.bytes_sent >= 20_000
    assert value(sb, "mconn_sent_bytes_total") == peer.stats.bytes_sent
    assert value(sa, "mconn_received_bytes_total") == a.peers[b.node_id].stats.bytes_received
    assert value(sa, "mconn_peers", state="connected", direction="inbound") == 1
    assert value(sb, "mconn_peers", state="connected", direction="outbound") == 1
    assert value(sa, "mconn_peers", state="connected", direction="outbound") == 0
    assert value(sa, "mconn_connections", direction="inbound", stage="established") == 1
    assert value(sa, "mconn_sessions_started_total", direction="inbound") == 1
    assert ma.registry is not mb.registry
    assert {dict(k[1])["node_id"] for k in sa if k[0] == "mconn_node_info"} == {a.node_id}
    assert {dict(k[1])["node_id"] for k in sb if k[0] == "mconn_node_info"} == {b.node_id}


@pytest_twisted.ensureDeferred
async def test_a_forced_reset_shows_suspended_then_a_resume_and_totals_keep_the_old_connection(switches):
    """A reset suspends a's session with b (mconn_peers state suspended), b re-dials and resumes it
    (resumes 1); a's channel totals keep the 10 messages of the lost connection although the new
    connection's own counters start again from zero."""
    a, ma = switches()
    b, mb = switches(reconnect_delay=lambda attempt: 0.5)
    peer = await connect(a, b)
    await send(peer, 10)
    await until(lambda: a.peers[b.node_id].stats.channels[1].messages_received == 10, "a to get 10 messages")
    peer.force_reconnect()
    await until(
        lambda: value(scrape(ma), "mconn_peers", state="suspended", direction="inbound") == 1,
        "a to show b's session suspended",
    )
    assert value(scrape(ma), "mconn_peers", state="connected", direction="inbound") == 0
    await until(lambda: value(scrape(ma), "mconn_session_resumes_total") == 1, "a to count the resume")
    await send(peer, 5)
    await until(lambda: a.peers[b.node_id].stats.channels[1].messages_received == 5, "5 on the new connection")
    sa = scrape(ma)
    assert value(sa, "mconn_channel_received_messages_total", channel="0x30") == 15
    assert value(sa, "mconn_channel_received_bytes_total", channel="0x30") == 15_000
    assert value(sa, "mconn_peers", state="connected", direction="inbound") == 1
    assert value(sa, "mconn_sessions_suspended_total") == 1
    assert value(sa, "mconn_connections_opened_total", direction="inbound") == 2
    assert value(sa, "mconn_connections_closed_total", direction="inbound") == 1
    assert value(sa, "mconn_sessions_started_total", direction="inbound") == 1
    assert value(scrape(mb), "mconn_channel_sent_messages_total", channel="0x30") == 15


@pytest_twisted.ensureDeferred
async def test_a_session_that_outlives_its_grace_counts_as_a_grace_expiry(switches):
    """b's transport is reset and b does not re-dial within a's resume_grace (0.3 s): a counts one
    grace expiry and one session ended by SessionExpired, and no peer is left."""
    a, ma = switches(Config(stats_interval=0, resume_grace=0.3))
    b, _ = switches(reconnect_delay=lambda attempt: 60.0)
    peer = await connect(a, b)
    peer.force_reconnect()
    await until(lambda: value(scrape(ma), "mconn_session_grace_expiries_total") == 1, "a grace expiry")
    sa = scrape(ma)
    assert value(sa, "mconn_sessions_ended_total", reason="SessionExpired") == 1
    assert sum(v for (name, _), v in sa.items() if name == "mconn_peers") == 0


@pytest_twisted.ensureDeferred
async def test_the_recovery_buffers_are_exported_beside_their_bound(switches):
    """mconn_recovery_buffer_limit_bytes is the node's max_unacked_bytes, so an alert compares
    each node's buffers with its own bound; the buffers hold what the peer has not confirmed."""
    a, ma = switches(Config(stats_interval=0, max_unacked_bytes=3 << 20, ack_every_messages=1000))
    b, _ = switches()
    peer = await connect(b, a)
    assert peer.try_send(0x30, b"m" * 1000)
    samples = scrape(ma)
    assert value(samples, "mconn_recovery_buffer_limit_bytes") == 3 << 20
    assert value(samples, "mconn_recovery_buffer_bytes") >= 1000


@pytest_twisted.ensureDeferred
async def test_refusals_are_counted_by_reason(switches):
    """A node outside allowed_peers is refused as unauthorized, then one connection too many from
    127.0.0.1 as ip_limit: mconn_refusals_total counts one of each."""
    a, ma = switches(Config(stats_interval=0, max_connections_per_ip=1))
    b, _ = switches()
    c, _ = switches()
    a.allowed_peers = {b.node_id}
    port = await a.listen(LOOPBACK)
    address = f"{a.node_id}@127.0.0.1:{port.getHost().port}"
    with pytest.raises(PeerClosed, match="unauthorized"):
        await c.dial(address)
    await until(lambda: not a.connections, "c's refused connection to go")
    await b.dial(address)
    with pytest.raises(PeerClosed, match="ip_limit"):
        await c.dial(address)
    await until(lambda: value(scrape(ma), "mconn_refusals_total", reason="ip_limit") == 1, "the ip_limit refusal")
    sa = scrape(ma)
    assert value(sa, "mconn_refusals_total", reason="unauthorized") == 1
    refused = {dict(labels)["reason"]: v for (name, labels), v in sa.items() if name == "mconn_refusals_total"}
    assert {reason for reason, count in refused.items() if count} == {"unauthorized", "ip_limit"}
    assert refused["pending_limit"] == 0  # a known reason: its series is there from the start


# -- bounded labels --------------------------------------------------------------------------


def series(samples: dict) -> set:
    """The series of a scrape: names and label sets, without values."""
    return set(samples)


@pytest_twisted.ensureDeferred
async def test_series_do_not_grow_with_peers_and_peer_ids_appear_only_when_asked(switches):
    """With one peer and with four, a's scrape has the same series and no peer's node id in any label;
    per_peer=True, or Config.metrics_per_peer, adds one mconn_peer_up series per peer, labelled by
    its node id."""
    a, ma = switches()
    dialers = [switches()[0] for _ in range(4)]
    port = await a.listen(LOOPBACK)
    await dialers[0].dial(f"{a.node_id}@127.0.0.1:{port.getHost().port}")
    await until(lambda: len(a.peers) == 1, "one peer")
    one = series(scrape(ma))
    for d in dialers[1:]:
        await d.dial(f"{a.node_id}@127.0.0.1:{port.getHost().port}")
    await until(lambda: len(a.peers) == 4, "four peers")
    four = series(scrape(ma))
    assert one == four
    labels = {v for _, ls in four for _, v in ls}
    assert not labels & {d.node_id for d in dialers}
    per_peer = SwitchMetrics(a, per_peer=True)
    up = {dict(ls)["peer"] for name, ls in scrape(per_peer) if name == "mconn_peer_up"}
    assert up == {d.node_id for d in dialers}
    a.config = a.config.replace(metrics_per_peer=True)  # the Config field, read at scrape time
    up = {dict(ls)["peer"] for name, ls in scrape(ma) if name == "mconn_peer_up"}
    assert up == {d.node_id for d in dialers}


@pytest_twisted.ensureDeferred
async def test_event_labels_are_capped_and_other_nodes_events_ignored(switches):
    """100 protocol errors of distinct made-up classes make at most MAX_LABEL_VALUES series, the rest
    counted as "other", none lost; an event logged for another node id is not counted; 100 refusal
    reasons are capped the same way."""
    a, ma = switches()
    for i in range(100):
        telemetry.emit(
            "protocol_error",
            node_id=a.node_id,
            peer_id=None,
            remote_address="127.0.0.1:1",
            error_type=f"MadeUp{i}",
            error="made up by the test",
        )
    telemetry.emit(
        "protocol_error",
        node_id="0" * 40,
        peer_id=None,
        remote_address="127.0.0.1:1",
        error_type="MadeUp0",
        error="another node's",
    )
    errors = {dict(ls)["error"]: v for (name, ls), v in scrape(ma).items() if name == "mconn_protocol_errors_total"}
    known = error_classes(MISBEHAVIOUR)  # their series are there from the start, at 0
    assert len(errors) == MAX_LABEL_VALUES and all(errors[k] == 0 for k in known)
    assert errors["other"] == 100 - (MAX_LABEL_VALUES - 1 - len(known))
    assert sum(errors.values()) == 100 and errors["MadeUp0"] == 1
    a.refusals.update({f"made_up_{i}": 2 for i in range(100)})  # as the Switch counts them
    refusals = {dict(ls)["reason"]: v for (name, ls), v in scrape(ma).items() if name == "mconn_refusals_total"}
    assert len(refusals) == MAX_LABEL_VALUES and sum(refusals.values()) == 200


# -- the round trip histogram ------------------------------------------------------------------


def test_the_round_trip_histogram_counts_peers_into_cumulative_buckets():
    """Round trips of 0.4 ms, 3 ms and 7 s fall cumulatively into their buckets; 7 s only into +Inf."""
    family = round_trip_histogram([0.0004, 0.003, 7.0])
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert (buckets["0.0005"], buckets["0.0025"], buckets["0.005"], buckets["5.0"], buckets["+Inf"]) == (1, 1, 2, 2, 3)
    totals = {s.name: s.value for s in family.samples if not s.name.endswith("_bucket")}
    assert totals["mconn_peer_round_trip_seconds_gcount"] == 3
    assert totals["mconn_peer_round_trip_seconds_gsum"] == pytest.approx(7.0034)


@pytest_twisted.ensureDeferred
async def test_measured_round_trips_appear_in_the_histogram(switches):
    """Once the stats tick has pinged the link, a's connected peer is in the histogram with its
    last round trip as the sum."""
    a, ma = switches(Config(stats_interval=0.1))
    b, _ = switches()
    await connect(a, b)
    await until(lambda: a.peers[b.node_id].round_trip is not None, "a round trip")
    sa = scrape(ma)
    assert value(sa, "mconn_peer_round_trip_seconds_bucket", le="+Inf") == 1
    assert value(sa, "mconn_peer_round_trip_seconds_gsum") == pytest.approx(a.peers[b.node_id].round_trip)


# -- /metrics over HTTP -------------------------------------------------------------------------


def fetch(url: str, accept: str | None = None) -> tuple[str, bytes]:
    """(content type, body) of a GET; runs in a thread."""
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        return response.headers["content-type"], response.read()


@pytest_twisted.ensureDeferred
async def test_metrics_are_served_in_both_formats_next_to_the_status_page(switches):
    """/metrics answers Prometheus' text format 0.0.4, or OpenMetrics (ending in # EOF) when asked;
    / (which links to /metrics) and /status.json are still served by the same server."""
    a, _ = switches()
    b, _ = switches()
    await connect(a, b)
    service = await serve_status(a)
    try:
        kind, body = await threads.deferToThread(fetch, service.metrics_url)
        assert kind.startswith("text/plain; version=0.0.4")
        info = f'mconn_node_info{{moniker="",network="",node_id="{a.node_id}",tls="off",version=""}} 1.0'
        assert info in body.decode()
        assert 'mconn_peers{direction="inbound",state="connected"} 1.0' in body.decode()
        kind, body = await threads.deferToThread(
            fetch, service.metrics_url, "application/openmetrics-text; version=1.0.0"
        )
        assert kind.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
        kind, body = await threads.deferToThread(fetch, service.url + "status.json")
        assert kind == "application/json" and json.loads(body)["node_id"] == a.node_id
        kind, body = await threads.deferToThread(fetch, service.url)
        assert kind.startswith("text/html") and b'<a href="metrics">' in body
    finally:
        await service.stopService()


# -- the spec ------------------------------------------------------------------------------------

SPEC = pathlib.Path(__file__).resolve().parents[2] / "specs" / "status.md"
#: A row of specs/status.md section 4: | `metric` | type | labels | meaning |
METRIC_ROW = re.compile(r"^\| `(mconn_\w+)` \| ([a-z ]+) \|([^|]*)\|")
#: prometheus_client's family type (0.0.4 text format) of each type the spec names.
SPEC_TYPES = {"counter": "counter", "gauge": "gauge", "gauge histogram": "histogram", "histogram": "histogram"}


def spec_metrics() -> dict:
    """metric name -> (type, set of labels), from the tables of specs/status.md section 4."""
    section = SPEC.read_text().split("## 4. Prometheus metrics", 1)[1]
    rows = (METRIC_ROW.match(line) for line in section.splitlines())
    return {
        m.group(1): (SPEC_TYPES[m.group(2)], {label.strip(" `") for label in m.group(3).split(",") if label.strip()})
        for m in rows
        if m
    }


@pytest_twisted.ensureDeferred
async def test_the_exposed_metrics_are_exactly_those_of_the_spec_with_their_types_and_labels(switches):
    """Every metric /metrics exposes (per-peer ones included) is in specs/status.md section 4 with
    its type and labels, and every metric there is exposed."""
    a, _ = switches(Config(stats_interval=0.1))
    b, _ = switches()
    await connect(a, b)
    await until(lambda: a.peers[b.node_id].round_trip is not None, "a round trip")
    text = generate_latest(SwitchMetrics(a, per_peer=True).registry).decode()
    exposed = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        if name.endswith(("_gcount", "_gsum")):
            continue  # the gauge histogram's own gauges
        exposed[name] = (family.type, {label for s in family.samples for label in s.labels})
    spec = spec_metrics()
    assert set(exposed) == set(spec)
    for name, (kind, labels) in exposed.items():
        assert kind == spec[name][0], name
        assert not labels or labels == spec[name][1], name  # a counter with no events yet has no sample
