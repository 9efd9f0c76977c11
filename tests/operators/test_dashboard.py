"""The shipped Grafana dashboard and Prometheus alert rules, against a real fleet (contrib/).

``contrib/grafana/mconn-fleet.json`` and ``contrib/prometheus/mconn-alerts.yml`` name
metrics of specs/status.md section 4. Here:

* ``promtool check rules`` accepts the rules file (shipped, and with its ``for:`` cut to
  0s as the fleet test loads it), and every metric the dashboard and the rules name is one
  the spec lists;
* three ``twistd mconn`` nodes with monikers (alpha, beta, gamma) connect to each other
  and send on two named channels; Debian's ``/usr/bin/prometheus`` scrapes their
  ``/metrics`` every second with the rules loaded. Every target expression of every panel,
  with ``$node`` a regex of the three targets and ``$__rate_interval`` 1m, returns series,
  each with the labels its legend names (the moniker, the channel's name...); the ``node``
  variable's query lists the three targets; every alert expression evaluates and every
  rule's health is ok. Then a raw peer raises a reactor error on alpha and sends on an
  unknown channel, and gamma is frozen (SIGSTOP): the reactor-error, protocol-error and
  node-down alerts fire, named by the nodes' monikers, and alpha's link failures move.

Every wait is bounded; Prometheus and the nodes are stopped by their PIDs whatever the
outcome (the ``nodes`` fixture, ``Prometheus.stop``).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import urllib.parse

import pytest

from helpers import encode_extension, encode_hello, encode_session_request, msg_packet, new_node_id
from mconn import ChannelDescriptor, NodeInfo, Reactor
from mconn.core.handshake import make_hello
from mconn.core.wire import HelloTag, PacketType, SessionRequest
from operators.prometheus import PROMETHEUS, Prometheus

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "contrib" / "grafana" / "mconn-fleet.json"
RULES = ROOT / "contrib" / "prometheus" / "mconn-alerts.yml"
#: promtool's unit tests of the rules, on synthetic series.
RULE_TESTS = ROOT / "contrib" / "prometheus" / "mconn-alerts.test.yml"
STATUS_SPEC = ROOT / "specs" / "status.md"
NETWORK = "mconn-dashboard"
VOTES, BLOCKS = 0x20, 0x30
COUNT = 40
#: A message the Traffic reactor raises on (a reactor error, kept with on_error "log").
BOOM = b"boom"


class Traffic(Reactor):
    """Channels 0x20 "votes" and 0x30 "blocks"; the dialing side sends COUNT messages on
    each to every new peer. A message ``BOOM`` makes ``receive`` raise; the peer is kept."""

    def get_channels(self):
        return [
            ChannelDescriptor(VOTES, priority=5, send_queue_capacity=COUNT, name="votes"),
            ChannelDescriptor(BLOCKS, priority=1, send_queue_capacity=COUNT, name="blocks"),
        ]

    def add_peer(self, peer) -> None:
        if peer.is_outbound:
            assert peer.try_send_many(VOTES, [b"v" * 100] * COUNT) == COUNT
            assert peer.try_send_many(BLOCKS, [b"b" * 2000] * COUNT) == COUNT

    def receive(self, channel_id, peer, message) -> None:
        if message == BOOM:
            raise ValueError("boom")

    def on_error(self, peer, channel_id, error):
        return "log"


def spec_metrics() -> set[str]:
    """The metric names specs/status.md section 4 lists in its tables, with the
    ``_bucket``, ``_sum``, ``_count`` series of its histograms."""
    names = set()
    for name, kind in re.findall(r"^\| `(mconn_\w+)` \| ([a-z ]+) \|", STATUS_SPEC.read_text(), re.M):
        names.add(name)
        if "histogram" in kind:
            names.update(name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panel_targets() -> list[tuple[str, str, str]]:
    """(panel title, expression, legend format) of every target of every panel."""
    return [(p["title"], t["expr"], t.get("legendFormat", "")) for p in dashboard()["panels"] for t in p["targets"]]


RULE = re.compile(
    r"^      - alert: (?P<alert>\w+)\n"
    r"        expr: \|\n(?P<expr>(?:          .*\n)+)"
    r"        for: (?P<for>\S+)\n"
    r"        labels:\n          severity: (?P<severity>\w+)\n"
    r"        annotations:\n          summary: \"(?P<summary>(?:[^\"\\]|\\.)*)\"\n",
    re.M,
)


def rules() -> list[dict]:
    """Each alert rule of the file (its layout: the virtualenv has no YAML parser; promtool
    and Prometheus read the YAML itself): alert, expr, for, severity, summary."""
    text = RULES.read_text()
    assert re.search(r"^groups:\n  - name: mconn\n    rules:\n", text, re.M), "one group, mconn"
    found = [m.groupdict() for m in RULE.finditer(text)]
    assert len(found) == text.count("- alert:"), f"{text.count('- alert:')} alerts, {len(found)} in the layout read"
    return found


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(mconn_\w+)", expr))


def promtool(*args: str) -> subprocess.CompletedProcess:
    found = shutil.which("promtool")
    assert found, "promtool ships with Debian's prometheus package (make installs it)"
    return subprocess.run([found, *args], capture_output=True, text=True, timeout=60)


def immediate(text: str) -> str:
    """The rules with every ``for:`` cut to 0s, so that the test sees them fire at once."""
    cut, count = re.subn(r"^(\s+for:) \S+$", r"\1 0s", text, flags=re.M)
    assert count == len(rules()), f"{count} for: lines cut, {len(rules())} rules"
    return cut


def test_promtool_accepts_the_rules_and_every_rule_has_a_for_a_severity_and_a_summary(tmp_path):
    """promtool check rules passes on the shipped file and on its 0s variant, and promtool
    test rules on contrib's unit tests (each alert silent before its event, firing after
    its ``for:`` with the moniker and its summary); each rule has
    a nonzero ``for:``, a severity, and a summary naming the moniker; every alert the brief
    of operators needs is there; every metric a rule names is in specs/status.md."""
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout, checked.stdout
    fast = tmp_path / "fast.yml"
    fast.write_text(immediate(RULES.read_text()))
    checked = promtool("check", "rules", str(fast))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    by_name = {r["alert"]: r for r in rules()}
    assert set(by_name) == {
        "MConnProtocolErrors",
        "MConnLinkFailures",
        "MConnNoConnectedPeers",
        "MConnRecoveryBufferNearLimit",
        "MConnSessionsExpiring",
        "MConnReactorErrors",
        "MConnNodeDown",
        "MConnSendQueueDelayHigh",
    }
    known = spec_metrics()
    for name, rule in by_name.items():
        assert rule["for"] not in ("0s", "0m"), f"{name}: for: {rule['for']}"
        assert rule["severity"] in ("warning", "critical"), name
        assert "$labels.moniker" in rule["summary"], name
        assert "mconn_node_info" in rule["expr"], f"{name} does not join mconn_node_info for the moniker"
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{name} names metrics specs/status.md does not list: {sorted(unknown)}"


def test_the_dashboard_model_has_its_variables_and_every_panel_reads_the_selected_nodes():
    """schemaVersion 39, a prometheus ``datasource`` variable that every panel and target
    uses, a ``node`` variable over mconn_node_info's instances; every target selects
    ``instance=~"$node"`` and names only metrics specs/status.md lists."""
    model = dashboard()
    assert model["schemaVersion"] == 39
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    node = variables["node"]
    assert node["type"] == "query" and node["includeAll"] and node["allValue"] == ".*"
    assert node["query"]["query"] == "label_values(mconn_node_info, instance)"
    titles = [p["title"] for p in model["panels"]]
    assert len(set(titles)) == len(titles) == 11, titles
    ids = [p["id"] for p in model["panels"]]
    assert len(set(ids)) == len(ids), ids
    known = spec_metrics()
    for panel in model["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            expr = target["expr"]
            selectors = re.findall(r"\b(mconn_\w+)(\{[^}]*\})?", expr)
            # every metric read from the nodes is filtered by $node; the info series joined
            # for names (mconn_node_info, mconn_channel_info) are matched by the join
            filtered = [(m, s) for m, s in selectors if m not in ("mconn_node_info", "mconn_channel_info")]
            assert filtered and all('instance=~"$node"' in s for _, s in filtered), (panel["title"], expr)
            unknown = metric_names(expr) - known
            assert not unknown, f"{panel['title']}: {sorted(unknown)} not in specs/status.md"
            assert set(re.findall(r"\$\w+", expr)) <= {"$node", "$__rate_interval"}, expr


def rude_hello() -> bytes:
    """A dialer's hello on our network with both channels, as a raw peer sends it."""
    hello = make_hello(
        node_id=new_node_id(),
        channels=[ChannelDescriptor(VOTES), ChannelDescriptor(BLOCKS)],
        max_packet_payload=1024,
        fields=((HelloTag.SESSION, encode_session_request(SessionRequest(session_id=os.urandom(16), resume=False))),),
        node_info=NodeInfo(network=NETWORK),
    )
    return encode_extension(PacketType.HELLO, encode_hello(hello))


@pytest.mark.integration
def test_every_panel_and_alert_answers_on_a_real_fleet_and_the_alerts_fire(nodes, tmp_path):
    assert PROMETHEUS.exists(), "make installs Debian's prometheus package"
    common = ("--network", NETWORK, "--reactor", "operators.test_dashboard:Traffic", "--status", "tcp:0")
    common += ("--stats-interval", "1")  # each new link pinged within a second: round trips
    listen = ("--listen", "tcp:0:interface=127.0.0.1")
    # alpha's short ping and pong timeout: gamma frozen is a link failure within seconds
    a = nodes("a").start(*listen, "--moniker", "alpha", "--ping-interval", "1", "--pong-timeout", "2", *common)
    b = nodes("b").start(*listen, "--moniker", "beta", "--peer", a.address, *common)
    c = nodes("c").start("--moniker", "gamma", "--peer", a.address, "--peer", b.address, *common)
    fleet = {"alpha": a, "beta": b, "gamma": c}
    target = {name: urllib.parse.urlsplit(node.status_url).netloc for name, node in fleet.items()}
    everyone = set(target.values())
    rule_file = tmp_path / "mconn-alerts.yml"
    rule_file.write_text(immediate(RULES.read_text()))
    prometheus = Prometheus(tmp_path, sorted(everyone), rule_file)
    frozen = False
    try:
        prometheus.wait_ready()
        prometheus.until(
            "the three nodes up, two connected peers each, alpha's messages received",
            lambda: (
                prometheus.by_instance("up") == dict.fromkeys(everyone, 1.0)
                and prometheus.by_instance('sum by (instance) (mconn_peers{state="connected"})')
                == dict.fromkeys(everyone, 2.0)
                and prometheus.by_instance('mconn_channel_received_messages_total{channel="0x30"}').get(target["alpha"])
                == 2.0 * COUNT
            ),
        )
        # The series the alerts below read, scraped at 0 before their first event.
        prometheus.until(
            "reactor errors and protocol errors at 0 on every node",
            lambda: (
                prometheus.by_instance('mconn_reactor_errors_total{method="receive"}')
                == prometheus.by_instance('mconn_protocol_errors_total{error="UnknownChannel"}')
                == dict.fromkeys(everyone, 0.0)
            ),
        )

        # The node variable: Grafana's label_values(mconn_node_info, instance).
        assert prometheus.api("label/instance/values", **{"match[]": "mconn_node_info"}) == sorted(everyone)
        monikers = {r["metric"]["instance"]: r["metric"]["moniker"] for r in prometheus.query("mconn_node_info")}
        assert monikers == {t: name for name, t in target.items()}

        node = "|".join(re.escape(t) for t in sorted(everyone))
        for title, expr, legend in panel_targets():
            promql = expr.replace("$node", node.replace("\\", "\\\\")).replace("$__rate_interval", "1m")
            labels = re.findall(r"\{\{(\w+)\}\}", legend)
            last: list = []

            def legend_complete(q=promql, labels=labels, last=last):
                """Series with every label the legend names; all three monikers, both
                channel names (a rate needs two scrapes of each node first)."""
                last[:] = result = prometheus.query(q)
                values = {label: {r["metric"].get(label) for r in result} for label in labels}
                return (
                    result
                    and all(None not in v for v in values.values())
                    and values.get("moniker", {"alpha", "beta", "gamma"}) == {"alpha", "beta", "gamma"}
                    and values.get("name", {"votes", "blocks"}) == {"votes", "blocks"}
                )

            try:
                prometheus.until(f"{title}: {promql}", legend_complete)
            except AssertionError as e:
                raise AssertionError(f"{e}; series with the labels of legend {legend!r} expected, got {last}") from None

        for rule in rules():
            prometheus.query(rule["expr"])  # success, or api() fails naming the error

        def every_rule_evaluated():
            (group,) = prometheus.api("rules")["groups"]
            health = {r["name"]: (r["health"], r.get("lastError", "")) for r in group["rules"]}
            assert all(h != "err" for h, _ in health.values()), health
            return len(health) == len(rules()) and all(h == "ok" for h, _ in health.values())

        prometheus.until("every rule evaluated with health ok", every_rule_evaluated)

        host, port = a.address.split("@")[1].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as rude:
            # a message alpha's reactor raises on (kept: "log"), then a channel alpha lacks
            rude.sendall(rude_hello() + msg_packet(BLOCKS, BOOM) + msg_packet(0x99, b"?"))
            reactor_alert = prometheus.until(
                "MConnReactorErrors firing", lambda: prometheus.firing("MConnReactorErrors")
            )
            assert [(x.get("moniker"), x["instance"], x.get("method"), x["severity"]) for x in reactor_alert] == [
                ("alpha", target["alpha"], "receive", "warning")
            ]
            protocol_alert = prometheus.until(
                "MConnProtocolErrors firing", lambda: prometheus.firing("MConnProtocolErrors")
            )
            assert [(x.get("moniker"), x["instance"], x.get("error")) for x in protocol_alert] == [
                ("alpha", target["alpha"], "UnknownChannel")
            ]

        c.process.send_signal(signal.SIGSTOP)  # gamma frozen: its /metrics times out, alpha's pings go unanswered
        frozen = True
        down = prometheus.until("MConnNodeDown firing", lambda: prometheus.firing("MConnNodeDown"))
        assert [(x.get("moniker"), x["instance"], x["severity"]) for x in down] == [
            ("gamma", target["gamma"], "critical")
        ]
        failures = prometheus.until(
            "alpha's PongTimeout link failure",
            lambda: prometheus.by_instance('increase(mconn_link_failures_total{error="PongTimeout"}[1m]) > 0'),
        )
        assert set(failures) == {target["alpha"]}, failures
    finally:
        if frozen:
            c.process.send_signal(signal.SIGCONT)
        prometheus.stop()
