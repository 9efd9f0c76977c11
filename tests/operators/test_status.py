"""The status page (mconn/ops/status.py, specs/status.md) of a live three-node network on 127.0.0.1.

Real Switches and a real twisted.web server in this process; ``/status.json`` is checked
against the Switches and against the spec's field table, and the HTML page is rendered by
a real headless Chromium (``/usr/bin/chromium``, which ``make test`` installs), whose DOM
must show every peer, and whose screenshot is kept under tests/artifacts/ (git-ignored).

Every wait is bounded; every Switch, port and browser started is stopped (the browser by
its process group, whose leader is the PID started here).
"""

from __future__ import annotations

import functools
import base64
import json
import os
import pathlib
import re
import urllib.request

import pytest
import pytest_twisted
from twisted.internet import defer, task, threads

from browser import ARTIFACTS, CHROMIUM, run_browser
from helpers import SPEC_ROW, SPEC_TYPE_CHECKS, the_reactor, until as poll
from mconn import ChannelDescriptor, Config, NodeInfo, Reactor, Switch
from mconn.core import speedups
from mconn.net import websocket_frames
from mconn.ops.cli import format_status
from mconn.ops.status import PAGE, StatusService, local_endpoint, serve_status

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "status.md"
TIMEOUT = 15.0
#: Every wait of this module polls for at most TIMEOUT seconds.
until = functools.partial(poll, seconds=TIMEOUT)
CHANNELS = (ChannelDescriptor(0x20, priority=1, name="votes"), ChannelDescriptor(0x30, priority=7))
#: The monikers of a, b and c (the node infos of the network fixture).
MONIKERS = ("alice", "bob", "carol")
CONFIG = Config(stats_interval=0)


#: A reactor's status value that would be markup if the page parsed it as HTML.
MARKUP = '<b id="injected">bold</b> & <img src=x>'


class Sink(Reactor):
    def get_channels(self):
        return list(CHANNELS)

    def receive(self, channel_id, peer, message):
        pass

    def status(self):
        return {"messages": 3, "note": MARKUP}


def fetch(url: str) -> tuple[dict, bytes]:
    """(headers, body) of a GET; runs in a thread."""
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        return dict(response.headers.items()), response.read()


async def get_json(service) -> dict:
    _, body = await threads.deferToThread(fetch, service.url + "status.json")
    return json.loads(body)


@pytest.fixture
def network():
    """Three started Switches (a, b, c), fully connected on 127.0.0.1; stopped at the end."""
    switches = [
        Switch([Sink()], config=CONFIG, clock=the_reactor(), node_info=NodeInfo(network="status-test", moniker=m))
        for m in MONIKERS
    ]
    for s in switches:
        s.startService()
    services = []

    async def connect():
        a, b, c = switches
        ports = [await s.listen("tcp:0:interface=127.0.0.1") for s in switches]
        address = [f"{s.node_id}@127.0.0.1:{p.getHost().port}" for s, p in zip(switches, ports, strict=True)]
        await b.dial(address[0])
        await c.dial(address[0])
        await c.dial(address[1])
        await until(lambda: all(len(s.peers) == 2 for s in switches), "a full mesh")
        return switches, services

    yield connect
    stops = [defer.maybeDeferred(s.stopService) for s in services + switches if s.running]
    pytest_twisted.blockon(defer.DeferredList(stops).addTimeout(TIMEOUT, the_reactor()))


# -- /status.json against the Switches ---------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_status_json_shows_the_switch_its_peers_channels_and_moving_counters(network):
    """status.json shows the node, each peer with its addresses and channels, and per-channel counters and
    send rates that move with traffic."""
    (a, b, c), services = await network()
    service = await serve_status(a, interval=0.05)
    services.append(service)
    document = await get_json(service)
    assert document["version"] == 1 and document["node_id"] == a.node_id
    assert document["moniker"] == "alice" and document["name"] == f"alice ({a.node_id[:8]})"
    assert document["listen_addresses"] == [a.listen_address] and document["tls"] is None
    peers = {p["node_id"]: p for p in document["peers"]}
    assert set(peers) == {b.node_id, c.node_id}
    assert {p["name"] for p in peers.values()} == {f"bob ({b.node_id[:8]})", f"carol ({c.node_id[:8]})"}
    assert {p["state"] for p in peers.values()} == {"connected"}
    assert {p["direction"] for p in peers.values()} == {"inbound"}
    for node_id, peer in peers.items():
        assert peer["remote_address"] == a.peers[node_id].remote_address
        assert peer["listen_address"] == a.peers[node_id].listen_address != ""
        assert [(ch["channel_id"], ch["name"], ch["priority"]) for ch in peer["channels"]] == [
            (0x20, "votes", 1),
            (0x30, "", 7),
        ]

    before = peers[b.node_id]["channels"][1]
    for _ in range(20):
        await a.peers[b.node_id].send(0x30, b"x" * 1000)
    await until(lambda: b.peers[a.node_id].stats.channels[1].messages_received == 20, "b to get 20 messages")
    await until(lambda: any(service.sampler.fields(b.node_id, 0x30)["send_history"]), "a send rate sample")
    after = {p["node_id"]: p for p in (await get_json(service))["peers"]}[b.node_id]
    channel = after["channels"][1]
    assert channel["messages_sent"] - before["messages_sent"] == 20
    assert channel["bytes_sent"] - before["bytes_sent"] >= 20_000
    assert channel["accepted"] - before["accepted"] == 20
    assert max(channel["send_history"]) > 0 and not any(after["channels"][0]["send_history"])
    assert after["bytes_sent"] > peers[b.node_id]["bytes_sent"]


@pytest_twisted.ensureDeferred
async def test_node_counters_and_refusals_appear(network):
    """The Switch's refusals and per-node counters appear in status.json, node-wide and on each peer."""
    (a, b, c), services = await network()
    a.refusals["ip_limit"] = 3  # as the Switch counts them (a refusal needs a flood to provoke)
    a._sessions.count(b.node_id, "duplicates_refused")
    service = await serve_status(a)
    services.append(service)
    document = await get_json(service)
    assert document["refusals"] == {"ip_limit": 3}
    counters = {n["node_id"]: n for n in document["node_counters"]}
    assert counters[b.node_id]["duplicates_refused"] == 1
    assert {p["node_id"]: p["duplicates_refused"] for p in document["peers"]} == {b.node_id: 1, c.node_id: 0}


@pytest_twisted.ensureDeferred
async def test_the_page_is_self_contained_and_json_has_no_key_material(network):
    """The status page loads nothing from elsewhere under a strict CSP, status.json holds no key material, and
    mconn status reads it."""
    (a, b, c), services = await network()
    service = await serve_status(a)
    services.append(service)
    headers, page = await threads.deferToThread(fetch, service.url)
    assert page.decode() == PAGE
    assert headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert not re.search(r"(src|href)=\"?(https?:)?//", PAGE), "the page loads nothing from elsewhere"
    _, body = await threads.deferToThread(fetch, service.url + "status.json")
    assert b"PRIVATE KEY" not in body and b"CERTIFICATE" not in body
    for switch in (a, b, c):
        raw = switch.node_key.private_key.private_bytes_raw()
        assert raw.hex().encode() not in body and base64.b64encode(raw) not in body
    text = format_status(json.loads(body))  # `mconn status` reads the same document
    lines = text.splitlines()
    assert lines[0] == f"node       alice ({a.node_id[:8]})" and lines[1] == f"id         {a.node_id}"
    assert lines[3] == f"hot path   {speedups.describe()}"
    assert lines[4] == f"ws frames  {websocket_frames.describe()}"
    for name, switch in (("bob", b), ("carol", c)):
        [row] = [line for line in lines if line.startswith(f"{name} ({switch.node_id[:8]})")]
        assert "connected" in row


def test_endpoints_without_an_interface_listen_on_loopback():
    """A TCP status endpoint without an interface is bound to the loopback (127.0.0.1 or ::1); others are kept
    as given."""
    assert local_endpoint("tcp:8080") == "tcp:8080:interface=127.0.0.1"
    assert local_endpoint("tcp6:8080") == "tcp6:8080:interface=\\:\\:1"
    assert local_endpoint("tcp:8080:interface=0.0.0.0") == "tcp:8080:interface=0.0.0.0"
    assert local_endpoint("unix:/run/mconn.sock") == "unix:/run/mconn.sock"


@pytest_twisted.ensureDeferred
async def test_a_service_with_tcp_0_binds_127_0_0_1(network):
    """A status service on tcp:0 binds 127.0.0.1, and its URL says so."""
    (a, b, c), services = await network()
    service = StatusService(a, "tcp:0")
    services.append(service)
    service.startService()
    await until(lambda: service.port is not None, "the port")
    assert service.port.getHost().host == "127.0.0.1"
    assert service.url.startswith("http://127.0.0.1:")


# -- the document against specs/status.md -------------------------------------------------


def spec_fields() -> dict[str, str]:
    """{path: type} from the field table of specs/status.md section 2 (``peers[].uptime``)."""
    fields = {}
    section = SPEC.read_text().split("## 2. The document", 1)[1].split("\n## 3.", 1)[0]
    for line in section.splitlines():
        row = SPEC_ROW.match(line)
        if row:
            name, type_name = row.group(1), row.group(2).strip()
            assert type_name in SPEC_TYPE_CHECKS, f"unknown type {type_name!r} for {name} in {SPEC.name}"
            fields[name] = type_name
    return fields


def document_fields(value, prefix: str = "") -> dict[str, list]:
    """{path: [values]} of a document, into lists of objects (``peers[].channels[].priority``)."""
    found: dict[str, list] = {}
    for name, item in value.items():
        path = prefix + name
        found.setdefault(path, []).append(item)
        if isinstance(item, list) and item and all(isinstance(i, dict) for i in item):
            for element in item:
                for sub, values in document_fields(element, path + "[].").items():
                    found.setdefault(sub, []).extend(values)
    return found


@pytest_twisted.ensureDeferred
async def test_a_live_document_has_exactly_the_fields_and_types_of_the_spec(network):
    """A live status.json has exactly the fields of specs/status.md, each of its stated type."""
    (a, b, c), services = await network()
    a._sessions.count(b.node_id, "simultaneous_dials")  # so node_counters has an item to check
    a.refusals["pending_limit"] = 1
    service = await serve_status(a, interval=0.05)
    assert (await get_json(service))["reactors"] == [{"name": "Sink", "status": {"messages": 3, "note": MARKUP}}]
    services.append(service)
    await a.peers[b.node_id].send(0x20, b"hello")
    await until(lambda: any(service.sampler.fields(b.node_id, 0x20)["send_history"]), "a rate sample")
    live = document_fields(await get_json(service))
    spec = spec_fields()
    assert set(live) == set(spec), f"only live: {set(live) - set(spec)}; only in the spec: {set(spec) - set(live)}"
    for path, type_name in spec.items():
        for value in live[path]:
            assert SPEC_TYPE_CHECKS[type_name](value), f"{path}: {value!r} is not {type_name}"


# -- a real browser ------------------------------------------------------------------------


def test_chromium_is_installed():
    """``make test`` installs chromium; the browser test is never skipped."""
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} is missing: run make test, which installs it"


@pytest_twisted.ensureDeferred
async def test_a_headless_browser_renders_every_peer_of_a_live_three_node_network(network, tmp_path):
    """A headless browser renders every peer of a live three-node network on the status page while traffic
    flows."""
    (a, b, c), services = await network()
    service = await serve_status(a, interval=0.1)
    services.append(service)

    def traffic():  # while the browser looks, for the sparklines
        a.peers[b.node_id].try_send(0x20, b"y" * 4000)
        a.peers[c.node_id].try_send(0x30, b"z" * 500)
        b.peers[a.node_id].try_send(0x30, b"w" * 1500)

    sending = task.LoopingCall(traffic)
    sending.clock = the_reactor()
    sending.start(0.02)
    try:
        await look_at(service, a, b, c)
    finally:
        sending.stop()


async def look_at(service, a, b, c):
    budget = "--virtual-time-budget=3000"
    dom = await threads.deferToThread(run_browser, budget, "--dump-dom", service.url)
    assert f'id="node-id">{a.node_id}<' in dom
    assert f'id="node-name">alice ({a.node_id[:8]})<' in dom  # this node by its moniker
    for name, peer in (("bob", b), ("carol", c)):
        match = re.search(rf'<tr class="peer" data-peer="{peer.node_id}">(.*?)</tr>', dom, re.S)
        assert match, f"no row for peer {peer.node_id} in the rendered page:\n{dom[:3000]}"
        assert f'<td class="mono" title="{peer.node_id}">{name} ({peer.node_id[:8]})</td>' in match.group(1)
        assert '<span class="state connected">connected</span>' in match.group(1)
        assert match.group(1).count('<svg class="spark"') == 2
    channels = re.findall(r'<tr class="channel">(.*?)</tr>', dom, re.S)
    assert len(channels) == 4
    # Channels by name and id; the session's counts in a labelled column each, under sent and received.
    assert sum('<span class="channel-name">votes</span> (0x20), priority 1' in row for row in channels) == 2
    assert sum("<td>channel 0x30, priority 7</td>" in row for row in channels) == 2
    header = re.search(r"<thead>(.*?)</thead>", dom, re.S).group(1)
    assert "acc / ack / dlv" not in dom
    for label in ("sent", "received", "accepted", "acknowledged", "delivered", "unconfirmed"):
        assert f">{label}</th>" in header, label
    for row in channels:  # accepted, acknowledged, delivered, unconfirmed: one number a cell
        accepted, acked, delivered, unconfirmed = re.findall(r'<td class="n">([^<]*)', row)[-4:]
        assert all(n.isdigit() for n in (accepted, acked, delivered, unconfirmed)), row
        assert int(acked) <= int(accepted)
    assert '<div id="error"></div>' in dom  # every fetch of status.json succeeded
    # The reactor's own section, its values written as text, not parsed as HTML.
    section = re.search(r'<section class="reactor" data-reactor="Sink">(.*?)</section>', dom, re.S)
    assert section, f"no section for the reactor in the rendered page:\n{dom[-3000:]}"
    assert "<h2>Reactor Sink</h2>" in section.group(1) and '<td class="mono">messages</td><td>3</td>' in section.group(
        1
    )
    assert '&lt;b id="injected"&gt;bold&lt;/b&gt; &amp; &lt;img src=x&gt;' in section.group(1)
    assert 'id="injected"' not in dom.replace('&lt;b id="injected"', "") and "<img" not in dom

    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "status_page.png"
    await threads.deferToThread(
        run_browser, budget, "--hide-scrollbars", "--window-size=1280,900", f"--screenshot={screenshot}", service.url
    )
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"status page screenshot: {screenshot}")


# -- the sampler, and the node's --status ------------------------------------------------


class FakePeer:
    """Stands in for a Peer: ``stats`` with one channel whose counters the test sets."""

    def __init__(self):
        self.sent = self.received = 0

    @property
    def stats(self):
        from types import SimpleNamespace

        channel = SimpleNamespace(channel_id=0x20, bytes_sent=self.sent, bytes_received=self.received)
        return SimpleNamespace(bytes_sent=self.sent, bytes_received=self.received, channels=[channel])


def test_rates_come_from_counter_deltas_restart_with_the_counter_and_stay_bounded():
    """Rates are counter deltas per interval; a counter that went back (a resume restarted it) counts from
    zero; history keeps the last N; ended peers are forgotten."""
    from types import SimpleNamespace

    from mconn.ops.status import RateSampler

    clock, peer = task.Clock(), FakePeer()
    switch = SimpleNamespace(clock=clock, peers={"p": peer})
    sampler = RateSampler(switch, interval=2.0, samples=3)
    sampler.start()  # a first sample at once: the baseline
    for sent in (1000, 3000, 500, 4500, 4500):  # 500: a resume on a new transport restarted the counter
        peer.sent, peer.received = sent, sent // 10
        clock.advance(2.0)
    fields = sampler.fields("p", 0x20)
    assert fields["send_history"] == [250.0, 2000.0, 0.0]  # the last 3 of 500, 1000, 250, 2000, 0
    assert fields["send_rate"] == 0.0 and fields["receive_history"] == [25.0, 200.0, 0.0]
    assert sampler.fields("p", None)["send_history"] == [250.0, 2000.0, 0.0]
    switch.peers = {"q": FakePeer()}  # p's session ended: its history is forgotten
    clock.advance(2.0)
    assert sampler.fields("p", 0x20)["send_history"] == [] and set(sampler.rates) == {("q", None), ("q", 0x20)}
    sampler.stop()


@pytest_twisted.ensureDeferred
async def test_a_node_whose_status_port_is_in_use_does_not_start(tmp_path):
    """A node whose status port is in use does not start, says which, and never opens its Switch port
    (the status page is bound first)."""
    from mconn.ops.node import Options, StartupError, build_service

    def node(*args):
        options = Options()
        options.parseOptions(["--key", str(tmp_path / "n.key"), *args])
        return build_service(options.settings, clock=the_reactor())

    first = node("--status", "tcp:0")
    first.startService()
    try:
        busy = first.status.port.getHost().port
        assert first.status.port.getHost().host == "127.0.0.1"
        second = node("--listen", "tcp:0:interface=127.0.0.1", "--status", f"tcp:{busy}")
        with pytest.raises(StartupError, match=f"^--status tcp:{busy}:interface=127.0.0.1: Address already in use$"):
            second.startService()
        assert not second.running
        assert second.ports == [] and second.switch.listen_address == ""
    finally:
        await defer.maybeDeferred(first.stopService)
    assert first.status.port is None
