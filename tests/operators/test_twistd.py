"""``twistd mconn`` as an operator runs it: real processes on 127.0.0.1.

Foreground nodes find each other, close with a close packet on SIGTERM and shut down in
order; a daemon writes its pid file and removes it when terminated; a bad configuration
stops twistd with one line and leaves nothing running.

twistd exits an orderly SIGTERM shutdown by re-raising the signal (so that a supervisor
sees "terminated by SIGTERM"): the exit status is -SIGTERM, with "Server Shut Down." as
the last line of its log.
"""

import os
import signal
import socket

import pytest

from mconn import NodeKey
from operators.twistd_nodes import LOOPBACK, Node, alive, run_twistd, stop_pid, wait_until

pytestmark = pytest.mark.integration

CHAT = ("--reactor", "operators.sample_reactors:Chat")


def assert_orderly_exit(node, status):
    log = node.log()
    assert status == -signal.SIGTERM, f"{node.name} exited with {status}:\n{log}"
    assert log.rstrip().endswith("Server Shut Down."), log
    assert "Traceback" not in log and "Unhandled" not in log, log


def test_two_foreground_nodes_connect_and_close_with_a_close_packet_on_sigterm(nodes):
    """Two twistd nodes connect; on SIGTERM one exits in order with a close packet, and the other hears
    PeerClosed and keeps dialing."""
    a = nodes("a").start("--listen", LOOPBACK, *CHAT)
    address = a.address
    b = nodes("b").start("--listen", LOOPBACK, *CHAT, "--peer", address)
    b_id = b.wait_event("listening")["node_id"]
    a.wait_event("session_started", lambda e: e["peer_id"] == b_id and e["direction"] == "inbound")
    b.wait_event("session_started", lambda e: address.startswith(e["peer_id"]) and e["direction"] == "outbound")

    assert_orderly_exit(a, a.terminate())
    ended = a.events("session_ended")
    assert [(e["peer_id"], e["reason_type"]) for e in ended] == [(b_id, "ConnectionClosed")]
    seen = b.wait_event("session_ended")
    assert seen["reason_type"] == "PeerClosed" and "shutdown" in seen["reason"]
    b.wait_event("dial_attempt", lambda e: e["result"] == "failed")  # --peer is persistent: b keeps dialing

    assert_orderly_exit(b, b.terminate())


def test_a_key_created_on_first_start_gives_the_same_node_id_on_the_next(nodes, tmp_path):
    """A twistd node creates a 0600 key on its first start and has the same node id on the next."""
    first = nodes("n").start("--listen", LOOPBACK)
    node_id = first.wait_event("listening")["node_id"]
    assert (tmp_path / "n.key").stat().st_mode & 0o777 == 0o600
    assert_orderly_exit(first, first.terminate())
    second = nodes("n").start("--listen", LOOPBACK)  # appends to the same telemetry file
    both = wait_until(lambda: len(second.events("listening")) == 2 and second.events("listening"), "a restart")
    assert [e["node_id"] for e in both] == [node_id, node_id]
    assert_orderly_exit(second, second.terminate())


def test_daemon_writes_its_pid_file_and_removes_it_on_sigterm(tmp_path):
    """A daemonised node writes its pid file, listens, and on SIGTERM exits, removes the pid file and logs its
    shutdown."""
    pidfile, logfile, telemetry = tmp_path / "node.pid", tmp_path / "node.log", tmp_path / "node.json"
    result = run_twistd(
        [
            "--pidfile",
            str(pidfile),
            "--logfile",
            str(logfile),
            "mconn",
            "--listen",
            LOOPBACK,
            "--key",
            str(tmp_path / "node.key"),
            "--create-key",
            "--telemetry",
            str(telemetry),
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), "the pid file"))
    try:
        assert alive(pid)
        node = Node(tmp_path, "node")
        wait_until(lambda: node.events("listening"), "the daemon's listening event")
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not pidfile.exists() and not alive(pid), "the daemon to exit and remove its pid file")
        assert logfile.read_text().rstrip().endswith("Server Shut Down.")
    finally:
        stop_pid(pid)


BAD = [
    (["--bogus"], "mconn: option --bogus not recognized"),
    (["--listen", "tcp:notaport"], "mconn: --listen: endpoint 'tcp:notaport' is not valid"),
    (["--peer", "not-an-id@127.0.0.1:1"], "mconn: --peer: peer address 'not-an-id@127.0.0.1:1': node id"),
    (["--reactor", "operators.sample_reactors:Nope"], "mconn: --reactor: module operators.sample_reactors has no Nope"),
    (
        ["--reactor", "operators.sample_reactors:Chat"] * 2,
        "mconn: --reactor: channel 0x10 is claimed by both Chat and Chat",
    ),
    (["--ping-interval", "0"], "mconn: --ping-interval: Config.ping_interval must be a positive finite number"),
    (["--config", "bad.toml"], "mconn: bad.toml: colour: unknown setting"),
    (["--key", "loose.key"], "mconn: --key: node key"),
    (["--key", "garbage.key"], "mconn: --key: node key"),
]


@pytest.mark.parametrize("args, expected", BAD, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_configuration_stops_twistd_with_one_line_and_nothing_running(tmp_path, args, expected):
    """Each bad configuration stops twistd with one line on stderr, no pid file and no key written."""
    (tmp_path / "bad.toml").write_text("colour = 'blue'\n")
    NodeKey.generate().save(tmp_path / "loose.key")
    (tmp_path / "loose.key").chmod(0o644)
    (tmp_path / "garbage.key").write_text("not a key")
    (tmp_path / "garbage.key").chmod(0o600)
    result = run_twistd(
        ["-n", "--pidfile", str(tmp_path / "twistd.pid"), "mconn", "--listen", LOOPBACK, "--create-key", *args],
        cwd=tmp_path,
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "twistd.pid").exists()
    assert not (tmp_path / "node.key").exists()  # nothing written either


def test_bad_configuration_stops_a_daemon_before_it_forks(tmp_path):
    """The same one line when daemonizing: makeService runs in the process that was started."""
    result = run_twistd(
        [
            "--pidfile",
            str(tmp_path / "node.pid"),
            "--logfile",
            str(tmp_path / "node.log"),
            "mconn",
            "--create-key",
            "--reactor",
            "no_such_module:X",
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == "mconn: --reactor: cannot import no_such_module: No module named 'no_such_module'"
    assert not (tmp_path / "node.pid").exists()


def test_a_port_in_use_stops_a_daemon_with_the_reason_and_no_pid_file(tmp_path):
    """A daemon whose --listen port is in use exits 1 with the reason, and its pid file is removed."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_twistd(
            [
                "--pidfile",
                str(tmp_path / "node.pid"),
                "--logfile",
                str(tmp_path / "node.log"),
                "mconn",
                "--listen",
                f"tcp:{port}:interface=127.0.0.1",
                "--key",
                str(tmp_path / "node.key"),
                "--create-key",
            ],
            cwd=tmp_path,
        )
    assert result.returncode == 1
    assert f"--listen tcp:{port}:interface=127.0.0.1: Address already in use" in result.stderr
    # The parent exits as soon as the daemon reports the error; the daemon removes its pid
    # file on its way out, a moment later.
    wait_until(lambda: not (tmp_path / "node.pid").exists(), "the failed daemon to remove its pid file", timeout=10)
