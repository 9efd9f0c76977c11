"""What an operator reads: the console log of a ``twistd -n mconn`` node that runs and stops
cleanly holds no warning, no per-channel statistics and no factory noise.

Three real nodes on 127.0.0.1 with identity TLS: ``a`` listens on tcp and ws (mconn's TLS
inside the WebSocket, where TLS closes its transport twice: autobahn warned ``dropping
connection ... abort=False`` on every close), ``b`` dials it over tcp and ``c`` over ws.
Their telemetry files get ``channel_stats`` (so there were statistics to keep off the
console); then each is stopped with SIGTERM. Every process is stopped by its PID.
"""

import re

import pytest

from mconn import NodeKey
from operators.twistd_nodes import LOOPBACK

pytestmark = pytest.mark.integration

WS = "ws:tcp:0:interface=127.0.0.1:path=/m"
COMMON = ("--tls", "--reactor", "operators.sample_reactors:Chat", "--stats-interval", "0.5")
#: Console lines of a level above info (twisted.logger's text format: ``[namespace#level]``).
LOUD = re.compile(r"#(warn|error|critical)\]|Traceback|Unhandled")


def quiet_node(nodes, tmp_path, name):
    NodeKey.generate().save(tmp_path / f"{name}.key")  # an existing key: no "created a new node key" warning
    return nodes(name)


def test_a_clean_run_over_tcp_and_ws_logs_no_warnings_stats_or_factories(nodes, tmp_path):
    """Nodes connected over tcp and ws (TLS inside), stopped with SIGTERM: no warning, no "Starting factory", no
    channel_stats line on any console, while every telemetry file has channel_stats."""
    a = quiet_node(nodes, tmp_path, "a").start(*COMMON, "--listen", LOOPBACK, "--listen", WS)
    a_id = a.wait_event("listening")["node_id"]
    a.wait_event("listening", lambda e: e["address"].startswith("ws://"))
    tcp, ws = (e["address"] for e in a.events("listening"))
    b = quiet_node(nodes, tmp_path, "b").start(*COMMON, "--peer", f"{a_id}@{tcp}")
    c = quiet_node(nodes, tmp_path, "c").start(*COMMON, "--peer", f"{a_id}@{ws}")
    for dialer in (b, c):
        dialer.wait_event("session_started")
        dialer.wait_event("channel_stats")
    a.wait_event("channel_stats")
    assert {e["remote_address"].split(":")[0] for e in a.events("session_started")} == {"127.0.0.1"}

    for node in (c, b, a):
        node.terminate()
    for node in (a, b, c):
        log = node.log()
        assert log.rstrip().endswith("Server Shut Down."), log
        assert not LOUD.search(log), f"{node.name}:\n{log}"
        assert "Starting factory" not in log and "Stopping factory" not in log, f"{node.name}:\n{log}"
        assert not re.search(r" channel \S+ with [0-9a-f]{40}: queue ", log), f"{node.name}:\n{log}"
        assert node.events("channel_stats"), f"{node.name} logged no channel_stats to its telemetry file"
        assert "dropping connection" not in log
