"""``twistd mconn --tls --status ...`` as real processes on 127.0.0.1.

Three identity-mode TLS nodes connect; the status page of one (its port found in the line
the node logs once bound) shows the other two over TLS, and ``mconn status URL`` prints
them. Two CA-mode nodes with certificates made here connect the same way. A bad TLS
option stops twistd before anything starts, with one line on stderr. Every process
started is stopped by its PID.
"""

import datetime
import json
import pathlib
import signal
import socket
import ssl
import subprocess
import sys
import urllib.request

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from integration.test_tls import CA
from mconn import NodeKey
from operators.twistd_nodes import ENV, LOOPBACK, TIMEOUT, run_twistd, wait_until

pytestmark = pytest.mark.integration

CHAT = ("--reactor", "operators.sample_reactors:Chat")
STATUS = ("--status", LOOPBACK)
MCONN = pathlib.Path(sys.executable).with_name("mconn")


def status_of(url: str) -> dict:
    with urllib.request.urlopen(url + "status.json", timeout=TIMEOUT) as response:
        return json.loads(response.read())


def connected_peers(url: str) -> set:
    return {p["node_id"] for p in status_of(url)["peers"] if p["state"] == "connected"}


def test_three_tls_nodes_show_each_other_on_their_status_pages(nodes):
    """Three identity-mode TLS twistd nodes connect, and status pages and mconn status show each one's peers,
    connected."""
    a = nodes("a").start("--listen", LOOPBACK, "--tls", *CHAT, *STATUS)
    b = nodes("b").start("--listen", LOOPBACK, "--tls", *CHAT, *STATUS, "--peer", a.address)
    c = nodes("c").start("--listen", LOOPBACK, "--tls", *CHAT, "--peer", a.address, "--peer", b.address)
    ids = {n.name: n.wait_event("listening")["node_id"] for n in (a, b, c)}
    url = a.status_url
    assert url.startswith("http://127.0.0.1:")
    wait_until(lambda: connected_peers(url) == {ids["b"], ids["c"]}, "a's status page to show b and c")
    wait_until(lambda: connected_peers(b.status_url) == {ids["a"], ids["c"]}, "b's status page to show a and c")

    document = status_of(url)
    assert document["node_id"] == ids["a"] and document["tls"] == "identity"
    assert document["listen_addresses"] == [a.address.split("@")[1]]
    assert [ch["channel_id"] for p in document["peers"] for ch in p["channels"]] == [0x10, 0x10]
    assert {e["peer_id"] for e in a.events("handshake_done")} == {ids["b"], ids["c"]}

    shown = subprocess.run([str(MCONN), "status", url], env=ENV, capture_output=True, text=True, timeout=TIMEOUT)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"node       {ids['a']}"
    assert lines[2].startswith("hot path   ") and lines[3].startswith("ws frames  ")
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["PEER"])  # the table below the node's lines
    rows = {line.split()[0]: line.split() for line in lines[header + 1 :]}
    assert set(rows) == {ids["b"], ids["c"]}
    assert {row[1] for row in rows.values()} == {"connected"}

    for node in (a, b, c):
        node.terminate()
    assert " started: listening on " in c.log()  # c ran without a status page
    assert "status page" not in c.log()


def test_the_upgrade_start_between_twistd_nodes(nodes):
    """--tls-upgrade dials with the pre-hello; only --tls-accept-upgrade listeners take it."""
    accepting = nodes("accepting").start("--listen", LOOPBACK, "--tls", "--tls-accept-upgrade", *CHAT)
    strict = nodes("strict").start("--listen", LOOPBACK, "--tls", *CHAT)
    dialer = nodes("dialer").start(
        "--tls",
        "--tls-upgrade",
        *CHAT,
        "--peer",
        accepting.address,
        "--peer",
        strict.address,
    )
    ids = {n.name: n.wait_event("listening")["node_id"] for n in (accepting, strict)}
    done = accepting.wait_event("handshake_done")
    assert done["peer_id"] == dialer.wait_event("node_started")["node_id"]
    refused = strict.wait_event("peer_rejected")
    assert refused["reason"] == "tls_required" and refused["peer_id"] is None
    assert ids["strict"] not in {e["peer_id"] for e in dialer.events("handshake_done")}
    for node in (accepting, strict, dialer):
        node.terminate()


def test_two_ca_mode_nodes_connect_over_mutual_tls(nodes, tmp_path):
    """Two CA-mode twistd nodes connect over mutual TLS, and the status page says ca."""
    ca = CA()
    ca.write(tmp_path / "ca.pem")
    for name in ("a", "b"):
        key = NodeKey.generate()
        key.save(tmp_path / f"{name}.key")
        pem = ca.issue(key).public_bytes(serialization.Encoding.PEM)
        (tmp_path / f"{name}.pem").write_bytes(pem)
    ca_args = ("--tls-ca", str(tmp_path / "ca.pem"))
    a = nodes("a").start("--listen", LOOPBACK, *ca_args, "--tls-cert", str(tmp_path / "a.pem"), *CHAT, *STATUS)
    b = nodes("b").start(
        "--listen", LOOPBACK, *ca_args, "--tls-cert", str(tmp_path / "b.pem"), *CHAT, "--peer", a.address
    )
    b_id = b.wait_event("listening")["node_id"]
    wait_until(lambda: connected_peers(a.status_url) == {b_id}, "a's status page to show b")
    assert status_of(a.status_url)["tls"] == "ca"
    for node in (a, b):
        node.terminate()


def served_certificate(address: str) -> x509.Certificate:
    """The certificate a TLS-first listener at ``ID@HOST:PORT`` presents (no client cert)."""
    host, port = address.split("@")[1].rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as raw:
        with context.wrap_socket(raw) as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


def test_sighup_reloads_the_certificate_without_dropping_peers(nodes, tmp_path):
    """SIGHUP reloads a renewed certificate without dropping peers; a certificate for another key is refused
    and the old one stays."""
    ca = CA()
    ca.write(tmp_path / "ca.pem")
    keys = {name: NodeKey.generate() for name in ("a", "b")}
    for name, key in keys.items():
        key.save(tmp_path / f"{name}.key")
        (tmp_path / f"{name}.pem").write_bytes(ca.issue(key).public_bytes(serialization.Encoding.PEM))
    ca_args = ("--tls-ca", str(tmp_path / "ca.pem"))
    a = nodes("a").start(
        "--listen", LOOPBACK, *ca_args, "--tls-cert", str(tmp_path / "a.pem"), "--tls-no-client-cert", *CHAT
    )
    b = nodes("b").start(*ca_args, "--tls-cert", str(tmp_path / "b.pem"), *CHAT, "--peer", a.address)
    b.wait_event("handshake_done")
    wait_until(lambda: " started: listening on " in a.log(), "a to be running")
    first = served_certificate(a.address)

    renewed = ca.issue(keys["a"])
    (tmp_path / "a.pem").write_bytes(renewed.public_bytes(serialization.Encoding.PEM))
    a.process.send_signal(signal.SIGHUP)
    wait_until(lambda: "TLS files reloaded" in a.log(), "a to reload its certificate")
    assert served_certificate(a.address).serial_number == renewed.serial_number != first.serial_number

    other = ca.issue(NodeKey.generate())  # a certificate for another key: refused, old one kept
    (tmp_path / "a.pem").write_bytes(other.public_bytes(serialization.Encoding.PEM))
    a.process.send_signal(signal.SIGHUP)
    wait_until(lambda: "TLS reload failed, the old certificate stays in use" in a.log(), "a to refuse the reload")
    assert served_certificate(a.address).serial_number == renewed.serial_number
    assert a.process.poll() is None
    # The probes above end without a hello (peer_id null); the peer's connection stays.
    b_id = b.wait_event("node_started")["node_id"]
    assert [e for e in a.events("connection_lost") if e["peer_id"] is not None] == []
    assert b.events("connection_lost") == []
    assert [e["peer_id"] for e in a.events("handshake_done")] == [b_id]
    for node in (a, b):
        node.terminate()


def test_bad_tls_options_stop_twistd_with_one_line(tmp_path):
    """Missing, mismatched or conflicting TLS options stop twistd with one line, before it writes or opens
    anything."""
    key = NodeKey.generate()
    key.save(tmp_path / "node.key")
    other = CA()
    (tmp_path / "other.pem").write_bytes(other.issue(NodeKey.generate()).public_bytes(serialization.Encoding.PEM))
    other.write(tmp_path / "ca.pem")
    base = ["-n", "--pidfile", "", "mconn", "--key", str(tmp_path / "node.key"), "--listen", LOOPBACK, *STATUS]
    cases = [
        (
            ["--tls-ca", str(tmp_path / "missing.pem"), "--tls-cert", str(tmp_path / "other.pem")],
            f"mconn: --tls-ca: cannot read {tmp_path / 'missing.pem'}: No such file or directory",
        ),
        (
            ["--tls-ca", str(tmp_path / "ca.pem"), "--tls-cert", str(tmp_path / "other.pem")],
            f"mconn: --tls-cert: certificate {str(tmp_path / 'other.pem')!r} holds the key of node ",
        ),
        (
            ["--tls", "--tls-ca", str(tmp_path / "ca.pem")],
            "mconn: --tls: identity mode (--tls) and CA mode (--tls-ca) exclude each other; choose one",
        ),
    ]
    for args, expected in cases:
        result = run_twistd(base + args, cwd=tmp_path)
        assert result.returncode != 0
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(expected), result.stderr
        assert result.stdout == ""  # twistd never started: no log, no port, no status page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.pem", "node.key", "other.pem"]


def test_an_expired_own_certificate_stops_twistd_saying_so(tmp_path):
    """An expired own certificate stops twistd with one line giving the expiry date and saying to renew it."""
    ca = CA()
    ca.write(tmp_path / "ca.pem")
    key = NodeKey.generate()
    key.save(tmp_path / "node.key")
    now, day = datetime.datetime.now(datetime.UTC), datetime.timedelta(days=1)
    expired = ca.issue(key, not_before=now - 10 * day, not_after=now - day)
    (tmp_path / "node.pem").write_bytes(expired.public_bytes(serialization.Encoding.PEM))
    result = run_twistd(
        [
            "-n",
            "--pidfile",
            "",
            "mconn",
            "--key",
            str(tmp_path / "node.key"),
            "--listen",
            LOOPBACK,
            "--tls-ca",
            str(tmp_path / "ca.pem"),
            "--tls-cert",
            str(tmp_path / "node.pem"),
        ],
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert result.stderr == (
        f"mconn: --tls-cert: certificate {tmp_path / 'node.pem'} expired on "
        f"{expired.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; renew it\n"
    )
