"""Reactors' own metrics and status sections, and the send-queue delay histogram
(``Reactor.metrics``, ``Reactor.status``, ``MessageCounter``: specs/reactor-api.md
section 12; ``mconn_channel_send_queue_seconds``: specs/status.md section 4).

Two real Switches with the mempool and blocksync ports on 127.0.0.1, each with its status
service (``/metrics`` and ``/status.json`` over HTTP from twisted.web in this process);
the rest drives ``SwitchMetrics`` and the reactors directly. Every wait is bounded; every
Switch and service started is stopped.
"""

from __future__ import annotations

import functools
import json
import urllib.request

import pytest
import pytest_twisted
from prometheus_client import Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from twisted.internet import defer, threads
from twisted.logger import globalLogPublisher

from helpers import the_reactor, until as poll
from mconn import ChannelDescriptor, Config, MessageCounter, Reactor, Switch
from mconn.ops.metrics import SwitchMetrics
from mconn.ops.status import STATUS_ROWS, STATUS_TEXT_CHARS, reactor_sections, reactor_status, serve_status

from mconn.testing import FakePeer
from operators.prometheus import samples, value
from reactors.blocksync import BlocksyncReactor
from reactors.mempool import MEMPOOL_CHANNEL, MempoolReactor

pytestmark = pytest.mark.integration

TIMEOUT = 15.0
#: Every wait of this module polls for at most TIMEOUT seconds.
until = functools.partial(poll, seconds=TIMEOUT)
CONFIG = Config(stats_interval=0)
BLOCKS = {h: b"block-%d:" % h + b"b" * 2000 for h in range(1, 11)}
TXS = [b"tx-%d:" % i + b"t" * 300 for i in range(20)]


def check_tx(tx: bytes) -> None:
    if not tx.startswith(b"tx-"):
        raise ValueError("not a transaction")


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        return response.read()


@pytest.fixture
def started():
    """Collects Switches and services to stop at the end."""
    running = []
    yield running
    stops = [defer.maybeDeferred(s.stopService) for s in running if s.running]
    pytest_twisted.blockon(defer.DeferredList(stops).addTimeout(TIMEOUT, the_reactor()))


def node(blocks=None):
    mempool = MempoolReactor(check_tx=check_tx)
    blocksync = BlocksyncReactor(blocks, status_interval=0.1, request_timeout=5.0)
    switch = Switch([mempool, blocksync], config=CONFIG, clock=the_reactor())
    switch.startService()
    return switch, mempool, blocksync


@pytest_twisted.ensureDeferred
async def test_a_real_node_serves_its_reactors_metrics_the_send_queue_histogram_and_status_sections(started):
    """Node a (ten blocks, twenty transactions) and node b sync over 127.0.0.1. a's /metrics
    counts 20 transactions and 10 block responses sent by type, and has send-queue delay
    samples on both channels; b's counts them received, with its height and mempool size;
    b's status.json has a section per reactor with those figures."""
    a, a_mempool, _ = node(BLOCKS)
    b, b_mempool, b_blocksync = node()
    started.extend([a, b])
    services = [await serve_status(s) for s in (a, b)]
    started.extend(services)
    port = await a.listen("tcp:0:interface=127.0.0.1")
    await b.dial(f"{a.node_id}@127.0.0.1:{port.getHost().port}")
    for tx in TXS:
        assert a_mempool.add_tx(tx)
    await until(lambda: len(b_mempool.txs) == len(TXS) and b_blocksync.height == len(BLOCKS), "b to sync")

    at_a = samples((await threads.deferToThread(fetch, services[0].metrics_url)).decode())
    assert value(at_a, "mempool_messages_total", direction="sent", type="tx") == len(TXS)
    assert value(at_a, "mempool_messages_total", direction="received", type="tx") == 0
    assert value(at_a, "blocksync_messages_total", direction="sent", type="block_response") == len(BLOCKS)
    assert value(at_a, "mempool_size") == len(TXS)
    for channel in ("0x30", "0x40"):
        count = value(at_a, "mconn_channel_send_queue_seconds_count", channel=channel)
        assert count >= 1
        assert value(at_a, "mconn_channel_send_queue_seconds_bucket", channel=channel, le="+Inf") == count
        assert value(at_a, "mconn_channel_send_queue_seconds_sum", channel=channel) >= 0

    at_b = samples((await threads.deferToThread(fetch, services[1].metrics_url)).decode())
    assert value(at_b, "mempool_messages_total", direction="received", type="tx") == len(TXS)
    assert value(at_b, "blocksync_messages_total", direction="received", type="block_response") == len(BLOCKS)
    assert value(at_b, "blocksync_blocks_received_total") == len(BLOCKS)
    assert value(at_b, "blocksync_height") == len(BLOCKS)
    assert value(at_b, "mempool_txs_refused_total", reason="invalid") == 0

    document = json.loads(await threads.deferToThread(fetch, services[1].url + "status.json"))
    sections = {r["name"]: r["status"] for r in document["reactors"]}
    assert [r["name"] for r in document["reactors"]] == ["mempool", "blocksync"]
    assert sections["mempool"]["txs"] == len(TXS) and sections["mempool"]["received"] == len(TXS)
    assert sections["blocksync"]["height"] == len(BLOCKS)
    assert sections["blocksync"]["blocks_received"] == len(BLOCKS)
    assert json.loads(sections["blocksync"]["received"])["block_response"] == len(BLOCKS)


# -- the hook and its registry -------------------------------------------------------------------


class Recording(Reactor):
    """Registers what the test gives it; counts the hook's calls."""

    name = "recording"

    def __init__(self, register):
        self.register = register
        self.calls = 0

    def get_channels(self):
        return [ChannelDescriptor(0x50)]

    def metrics(self, registry):
        self.calls += 1
        self.register(registry)


class Broken:
    """A collector whose describe works and whose collect raises."""

    def describe(self):
        return [GaugeMetricFamily("broken_thing", "x")]

    def collect(self):
        raise RuntimeError("collect broke")


def test_a_reactor_cannot_register_mconn_names_and_a_failing_collector_is_left_out():
    """The hook runs once per SwitchMetrics, never without one. A reactor registering
    mconn_forged gets a ValueError naming itself and the name (logged; the metric is not
    served, what it registered before is); a collector that raises at a scrape is logged
    and left out, and the scrape still serves everything else."""
    errors = []

    def register(registry):
        Counter("recording_ok", "fine", registry=registry)
        registry.register(Broken())
        Counter("mconn_forged", "not allowed", registry=registry)

    reactor = Recording(register)
    switch = Switch([reactor], config=CONFIG, clock=the_reactor())
    assert reactor.calls == 0  # no metrics endpoint, no call

    def observe(event):
        if event.get("log_namespace") == "mconn.metrics" and "log_failure" in event:
            errors.append(event)

    globalLogPublisher.addObserver(observe)
    try:
        metrics = SwitchMetrics(switch)
        text = generate_latest(metrics.registry).decode()
    finally:
        globalLogPublisher.removeObserver(observe)
    assert reactor.calls == 1
    assert "recording_ok_total 0.0" in text and "mconn_forged" not in text and "broken_thing" not in text
    assert "mconn_node_info" in text
    [hook, scrape] = errors
    assert isinstance(hook["log_failure"].value, ValueError)
    assert "reactor 'recording' registers mconn_forged" in str(hook["log_failure"].value)
    assert "collect broke" in str(scrape["log_failure"].value) and scrape["reactor"] == "recording"


def test_two_reactors_cannot_register_one_name():
    first = Recording(lambda registry: Counter("shared_name", "a", registry=registry))
    second = Recording(lambda registry: Counter("shared_name", "b", registry=registry))
    second.name = "second"
    second.get_channels = lambda: [ChannelDescriptor(0x51)]
    errors = []
    globalLogPublisher.addObserver(errors.append)
    try:
        SwitchMetrics(Switch([first, second], config=CONFIG, clock=the_reactor()))
    finally:
        globalLogPublisher.removeObserver(errors.append)
    failures = [e for e in errors if e.get("log_namespace") == "mconn.metrics" and "log_failure" in e]
    assert [e["reactor"] for e in failures] == ["second"]
    assert "shared_name" in str(failures[0]["log_failure"].value)


# -- MessageCounter ------------------------------------------------------------------------------


def test_a_message_counter_keeps_its_declared_types_and_counts_the_rest_as_other():
    counter = MessageCounter("demo_messages", ["ping", "pong"])
    counter.received("ping")
    counter.received("garbage-from-the-wire", 3)
    counter.sent("pong", 2)
    assert counter.as_dict() == {"received": {"ping": 1, "other": 3}, "sent": {"pong": 2}}
    [family] = counter.collect()
    assert family.name == "demo_messages" and family.type == "counter"
    got = {(s.labels["direction"], s.labels["type"]): s.value for s in family.samples if s.name.endswith("_total")}
    assert len(got) == 6 and got[("received", "other")] == 3 and got[("sent", "ping")] == 0


@pytest.mark.parametrize(
    "name, types, message",
    [
        ("mconn_messages", ["a"], "not starting 'mconn_', got 'mconn_messages'"),
        ("bad name", ["a"], "got 'bad name'"),
        ("demo_total", ["a"], "must not end in '_total'"),
        ("demo", [], "types must be non-empty strings, got []"),
        ("demo", ["a", "a"], "at most 64 distinct strings"),
        ("demo", ["other"], "'other' not among them"),
        ("demo", [str(i) for i in range(65)], "at most 64 distinct strings"),
    ],
)
def test_a_message_counter_refuses_bad_declarations_naming_them(name, types, message):
    with pytest.raises(ValueError) as error:
        MessageCounter(name, types)
    assert message in str(error.value)


# -- status sections -----------------------------------------------------------------------------


def test_a_status_is_bounded_and_made_json_safe():
    """Past STATUS_ROWS keys a '...' row says how many more; long text is cut; lists and
    dicts become compact JSON of their first items; nan and inf become text."""
    status = {f"key{i}": i for i in range(STATUS_ROWS + 5)}
    out = reactor_status(status)
    assert len(out) == STATUS_ROWS + 1 and out["..."] == "5 more"
    out = reactor_status(
        {"long": "x" * 1000, "list": list(range(100)), "dict": {"a": 1}, "nan": float("nan"), "k" * 100: None}
    )
    assert len(out["long"]) == STATUS_TEXT_CHARS and out["long"].endswith("\u2026")
    assert out["list"] == "[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15] (+84 more)"
    assert out["dict"] == '{"a":1}' and out["nan"] == "nan" and out["k" * 64] is None
    json.dumps(out, allow_nan=False)
    assert reactor_status(["not", "a", "dict"]) == {"error": "status() returned a list, not a dict"}


def test_reactors_without_a_status_have_no_section_and_one_that_raises_shows_its_error():
    class Quiet(Reactor):
        name = "quiet"

    class Failing(Reactor):
        name = "failing"

        def status(self):
            raise KeyError("gone")

    switch = Switch([Quiet(), Failing(), MempoolReactor()], config=CONFIG, clock=the_reactor())
    sections = reactor_sections(switch)
    assert [s["name"] for s in sections] == ["failing", "mempool"]
    assert sections[0]["status"] == {"error": "KeyError: 'gone'"}
    assert sections[1]["status"]["txs"] == 0


# -- the mempool's invalid transactions ----------------------------------------------------------


def test_a_transaction_failing_check_tx_is_counted_and_its_peer_kept():
    """As in CometBFT's mempool reactor: receive does not raise for a transaction that
    fails check_tx (nor for an empty one): it is not kept, it is counted, the peer is not
    stopped and its next valid transaction is admitted and charged to it."""
    reactor = MempoolReactor(check_tx=check_tx)
    peer = FakePeer()
    reactor.add_peer(peer)
    reactor.receive(MEMPOOL_CHANNEL, peer, b"garbage")
    reactor.receive(MEMPOOL_CHANNEL, peer, b"")
    assert reactor.invalid_txs == 2 and reactor.txs == {} and peer.state != "closed"
    reactor.receive(MEMPOOL_CHANNEL, peer, b"tx-ok")
    assert list(reactor.txs.values()) == [b"tx-ok"] and reactor.charged(peer.node_id) == 1
    assert reactor.messages.as_dict()["received"] == {"tx": 3}
    assert reactor.status()["invalid_txs"] == 2
