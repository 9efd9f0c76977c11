"""A node operator's first hour: names, networks and reactor options on real ``twistd -n mconn`` nodes.

Nodes on 127.0.0.1 with ``--network`` and ``--moniker`` refuse a node of another network and
name the peers of their own by moniker in their logs and in ``mconn status``; a reactor gets
its options from the command line and a TOML table; twistd's own options given after
``mconn`` and ``--help`` are what a newcomer meets first. Every process started is stopped
by its PID (the ``nodes`` fixture), every wait is bounded.
"""

from __future__ import annotations

import pathlib
import re
import signal
import subprocess
import sys

import pytest

from operators.twistd_nodes import ENV, LOOPBACK, TIMEOUT, run_twistd, wait_until

pytestmark = pytest.mark.integration

MCONN = pathlib.Path(sys.executable).with_name("mconn")


def logged(node, text: str) -> str:
    """Wait until ``node``'s log holds ``text``; the log."""

    def found():
        if text in node.log():
            return node.log()
        if node.process.poll() is not None:
            raise AssertionError(f"{node.name} exited with {node.process.returncode}:\n{node.log()}")
        return None

    return wait_until(found, f"{node.name}: {text!r}")


def test_nodes_of_another_network_are_refused_and_peers_of_ours_are_named_by_moniker(tmp_path, nodes):
    """alice and carol are on chain-a, bob on chain-b. bob's dial to alice is refused by both sides with
    network_mismatch, in both logs, and bob does not dial again; carol's session with alice is logged on
    both sides with the peer's moniker and the first 8 hex digits of its id, and ``mconn status`` names
    carol the same way."""
    alice = nodes("alice").start(
        "--listen", LOOPBACK, "--network", "chain-a", "--moniker", "alice", "--status", "tcp:0"
    )
    address = alice.address
    alice_id = address.partition("@")[0]
    bob = nodes("bob").start("--peer", address, "--network", "chain-b", "--moniker", "bob")
    carol = nodes("carol").start("--peer", address, "--network", "chain-a", "--moniker", "carol")

    refusal = bob.wait_event("peer_rejected")
    assert refusal["reason"] == "network_mismatch", refusal
    bob_id = refusal["node_id"]
    logged(alice, f"refused bob ({bob_id[:8]}) at ")
    assert re.search(
        rf"refused bob \({bob_id[:8]}\) at 127\.0\.0\.1:\d+: network_mismatch: peer {bob_id} is on network "
        r"'chain-b'; this node is on 'chain-a'",
        alice.log(),
    ), alice.log()
    assert f"refused alice ({alice_id[:8]}) at " in logged(bob, "network_mismatch")
    assert "mconn node bob (" in bob.log() and " on network chain-b started: listening on " in bob.log()

    carol_id = carol.wait_event("session_started")["node_id"]
    logged(alice, f" with carol ({carol_id[:8]}) started")
    logged(carol, f" with alice ({alice_id[:8]}) started")
    status = subprocess.run(
        [str(MCONN), "status", alice.status_url], env=ENV, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert status.returncode == 0, status.stderr
    assert re.search(rf"^carol \({carol_id[:8]}\)\s+connected\s", status.stdout, re.M), status.stdout
    assert len(bob.events("dial_attempt")) == 1  # an incompatible node is not dialed again
    for node in (carol, bob, alice):
        assert node.terminate() == -signal.SIGTERM, node.log()


def test_a_reactor_gets_its_options_from_the_command_line_and_a_toml_table(tmp_path, nodes):
    """``[reactors.Greeter]`` in the --config file and ``--reactor-option Greeter.KEY=VALUE`` reach the
    reactor's constructor: the file's values with their TOML types, the command line's converted to the
    types its parameters declare, one of its keys replacing the file's; the reactor logs them as it starts."""
    (tmp_path / "node.toml").write_text(
        'reactor = "operators.option_reactors:Greeter"\n'
        "[reactors.Greeter]\n"
        'greeting = "from the file"\n'
        "repeat = 2\n"
        'tags = ["x", "y"]\n'
    )
    node = nodes("greeter").start(
        "--config",
        "node.toml",
        "--listen",
        LOOPBACK,
        "--reactor-option",
        "Greeter.repeat=3",
        "--reactor-option",
        "Greeter.loud=true",
    )
    log = logged(node, "greeter options: ")
    assert (
        "greeter options: greeting='from the file' (str), repeat=3 (int), loud=True (bool), ratio=None (NoneType), "
        "tags=['x', 'y'] (list)"
    ) in log, log
    assert node.terminate() == -signal.SIGTERM, node.log()


def test_a_twistd_option_after_mconn_and_the_help_a_newcomer_reads(tmp_path):
    """``twistd -n mconn --pidfile x.pid`` stops with one line saying that --pidfile is twistd's option
    and goes before ``mconn``; ``twistd mconn --help`` shows --key and --listen before the Config
    fields' heading, and the fields after it."""
    wrong = run_twistd(["-n", "mconn", "--key", "n.key", "--pidfile", "n.pid"], tmp_path)
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert wrong.stderr.strip() == (
        "mconn: --pidfile is an option of twistd, not of mconn: give it before 'mconn', "
        "as in 'twistd --pidfile ... mconn ...'"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    help_text = run_twistd(["mconn", "--help"], tmp_path).stdout
    heading = help_text.index("Tuning: each field of mconn.Config")
    assert help_text.index("--key=") < help_text.index("--listen=") < help_text.index("--moniker=") < heading
    assert heading < help_text.index("--ping-interval=") and heading < help_text.index("--no-tcp-keepalive")
