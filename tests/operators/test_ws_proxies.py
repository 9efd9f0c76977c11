"""mconn over WebSocket through real proxies (specs/websocket.md section 6, specs/tls.md section 8).

Debian's nginx as a reverse proxy (``proxy_pass`` with the Upgrade headers) in front of a
node listening on ws://: a dialer reaches it with ws://, and with wss:// where nginx
terminates TLS with a certificate made here (the dialer trusts the test's CA through
``Config.wss_ca_file``; the node id is only claimed, and the hello's id check still
applies). Debian's squid as an HTTP forward proxy that allows CONNECT to loopback: a
dialer with ``Config.http_proxy`` reaches a wss listener through the tunnel. nginx and
squid are started by the test on loopback with configurations it writes, and stopped
by their PIDs; every wait is bounded.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import pathlib
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from helpers import sleep, the_reactor
from mconn import ChannelDescriptor, Config, NodeKey, PeerIdMismatch, Switch, TLSError
from mconn.net.tls import TLSOptions
from mconn.errors import ProxyError
from mconn.net.websocket_endpoints import transport_kind
from tests.integration.test_loopback import Collector, bounded, stop

pytestmark = pytest.mark.integration

NGINX = pathlib.Path("/usr/sbin/nginx")
SQUID = pathlib.Path("/usr/sbin/squid")
TIMEOUT = 10.0
PATH = "/mconn"
CHANNELS = [ChannelDescriptor(0x20, priority=1, send_queue_capacity=16)]
CONFIG = Config(stats_interval=0, max_reconnect_delay=0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accepting(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Server:
    """A proxy process of the test: started with a config it wrote, stopped by its PID."""

    def __init__(self, argv: list[str], directory: pathlib.Path, ports: list[int], name: str) -> None:
        self.directory, self.ports, self.name = directory, ports, name
        self.log = directory / f"{name}.out"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(argv, cwd=directory, stdout=out, stderr=subprocess.STDOUT)

    async def ready(self) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not all(accepting(p) for p in self.ports):
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.process.returncode}: {self.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} not listening on {self.ports} after {TIMEOUT}s: {self.logs()}")
            await sleep(0.05)

    def logs(self) -> str:
        texts = []
        for path in sorted(self.directory.glob("*.log")) + [self.log]:
            try:
                texts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
            except OSError:
                pass
        return "\n".join(texts)

    def stop(self) -> None:
        """SIGTERM by PID, a bounded wait, then SIGKILL."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=TIMEOUT)


@pytest.fixture
def workdir():
    """A directory the proxies' unprivileged users can enter (pytest's tmp_path is 0700)."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix="mconn-ws-proxy-"))
    directory.chmod(0o777)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


# -- certificates ---------------------------------------------------------------------------


def write_ca_and_server_cert(directory: pathlib.Path, name: str) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """A CA, and a certificate it signs for localhost and 127.0.0.1; (ca, cert, key) paths."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / f"{name}-ca.pem", directory / f"{name}.pem", directory / f"{name}.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


# -- nginx ----------------------------------------------------------------------------------

NGINX_LOCATION = """
        location {path} {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}"""


async def start_nginx(directory: pathlib.Path, upstream: int) -> tuple[Server, int, int, pathlib.Path]:
    """nginx on two loopback ports in front of ``upstream``: plain HTTP, and TLS it
    terminates; returns (server, http port, https port, the CA that signed its certificate)."""
    ca, cert, key = write_ca_and_server_cert(directory, "nginx")
    http_port, https_port = free_port(), free_port()
    location = NGINX_LOCATION.format(path=PATH, upstream=upstream)
    (directory / "nginx.conf").write_text(f"""
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log {directory}/access.log;
    client_body_temp_path {directory}/client_body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    server {{
        listen 127.0.0.1:{http_port};{location}
    }}
    server {{
        listen 127.0.0.1:{https_port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};{location}
    }}
}}
""")
    server = Server(
        [str(NGINX), "-p", str(directory), "-c", str(directory / "nginx.conf"), "-g", "daemon off;"],
        directory,
        [http_port, https_port],
        "nginx",
    )
    await server.ready()
    return server, http_port, https_port, ca


def node(tls=None, config=CONFIG):
    reactor = Collector(CHANNELS)
    switch = Switch([reactor], tls=tls, clock=the_reactor(), config=config)
    switch.startService()
    return switch, reactor


async def exchange(dialer, listener, rd, rl, address):
    """``dialer`` dials ``address``; one message each way."""
    peer = await bounded(dialer.dial(address), TIMEOUT)
    peer_l = await bounded(rl.added, TIMEOUT)
    assert peer.try_send(0x20, b"up " * 1000) and peer_l.try_send(0x20, b"down")
    await rl.until(1)
    await rd.until(1)
    assert rl.received() == [b"up " * 1000] and rd.received() == [b"down"]
    return peer, peer_l


def access_log(directory: pathlib.Path) -> str:
    path = directory / "access.log"
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.skipif(not NGINX.exists(), reason="make installs nginx (/usr/sbin/nginx)")
@pytest_twisted.ensureDeferred
async def test_a_node_behind_nginx_is_reached_with_ws_and_with_wss_where_nginx_terminates_tls(workdir):
    """A node listening on ws:// behind nginx: one dialer reaches it with ws:// through
    nginx, another with wss:// to nginx's TLS (checked against the test's CA, host
    127.0.0.1), and nginx logged both upgrades (101). The hello's node-id check still
    applies: a dial naming another node id fails with PeerIdMismatch."""
    (b, rb), (plain, rp) = node(), node()
    secure, nginx = None, None
    try:
        upstream = (await b.listen(f"ws:tcp:0:interface=127.0.0.1:path={PATH}")).getHost().port
        nginx, http_port, https_port, ca = await start_nginx(workdir, upstream)
        peer, _ = await exchange(plain, b, rp, rb, f"{b.node_id}@ws://127.0.0.1:{http_port}{PATH}")
        assert transport_kind(peer._protocol.transport) == "ws"
        secure, _ = node(config=CONFIG.replace(wss_ca_file=str(ca)))
        secure_peer = await bounded(secure.dial(f"{b.node_id}@wss://127.0.0.1:{https_port}{PATH}"), TIMEOUT)
        assert transport_kind(secure_peer._protocol.transport) == "wss"
        assert secure_peer.try_send(0x20, b"through TLS")
        await rb.until(2)
        assert rb.received()[-1] == b"through TLS"
        assert sorted(b.peers) == sorted([plain.node_id, secure.node_id])
        with pytest.raises(PeerIdMismatch):
            await bounded(secure.dial(f"{NodeKey.generate().node_id}@wss://127.0.0.1:{https_port}{PATH}"), TIMEOUT)
        await stop(b, plain, secure)
        nginx.stop()  # nginx logs a request when it ends: the upgraded connections are over now
        log = access_log(workdir)
        assert log.count(f'"GET {PATH} HTTP/1.1" 101') >= 2, log
    finally:
        await stop(*[s for s in (b, plain, secure) if s is not None])
        if nginx is not None:
            nginx.stop()


@pytest.mark.skipif(not NGINX.exists(), reason="make installs nginx (/usr/sbin/nginx)")
@pytest_twisted.ensureDeferred
async def test_a_client_behind_nginx_that_writes_its_own_x_forwarded_for_gets_no_more_sessions(workdir):
    """A node behind nginx trusts it (ws_trusted_proxies, max_connections_per_ip 4). A client
    behind nginx opens 8 sessions, each claiming another address: 4 in an X-Forwarded-For of
    its own (nginx appends the client's real address, the last hop, which counts), 4 smuggled
    inside another header after a 0x85 byte (which autobahn alone would take for a line break).
    The smuggled ones are refused with 400 naming the byte; of the others the limit lets 4
    in, all counted as 127.0.0.1 (the client nginx saw); the fifth and later get 429."""
    import random

    from tests.integration.hostile_clients import CHANNELS as HOSTILE_CHANNELS, hello
    from tests.integration.test_websocket import client_frame, raw_client, upgrade_request

    b = Switch(
        [Collector(HOSTILE_CHANNELS)],
        clock=the_reactor(),
        config=CONFIG.replace(
            ws_trusted_proxies=frozenset({"127.0.0.1"}),
            max_connections_per_ip=4,
        ),
    )
    b.startService()
    nginx, raws, rng = None, [], random.Random(3)
    try:
        upstream = (await b.listen(f"ws:tcp:0:interface=127.0.0.1:path={PATH}")).getHost().port
        nginx, http_port, _, _ = await start_nginx(workdir, upstream)
        answers = []
        for n in range(8):
            claim = f"203.0.113.{n + 1}".encode()
            extra = b"X-Forwarded-For: " + claim if n % 2 else b"X-Note: a\x85X-Forwarded-For: " + claim
            request = upgrade_request(http_port)[:-2] + extra + b"\r\n\r\n"
            raw = await raw_client(http_port, request)
            raws.append(raw)
            deadline = time.monotonic() + TIMEOUT
            while b"\r\n\r\n" not in raw.data and raw.lost is None:
                assert time.monotonic() < deadline, f"no answer from nginx: {nginx.logs()}"
                await sleep(0.02)
            status = bytes(raw.data).split(b"\r\n", 1)[0]
            answers.append(status)
            if status.startswith(b"HTTP/1.1 101"):
                raw.transport.write(client_frame(0x2, hello(rng)))
        smuggled, own = answers[0::2], answers[1::2]
        assert all(a.startswith(b"HTTP/1.1 400") for a in smuggled), answers
        assert [a[:12] for a in own] == [b"HTTP/1.1 101"] * 4, answers
        deadline = time.monotonic() + TIMEOUT
        while len(b.peers) < 4:
            assert time.monotonic() < deadline, f"{len(b.peers)} sessions: {answers}"
            await sleep(0.02)
        for n in range(4):  # past the limit: refused, naming the client nginx saw
            request = upgrade_request(http_port)[:-2] + f"X-Forwarded-For: 198.51.100.{n}\r\n\r\n".encode()
            raw = await raw_client(http_port, request)
            raws.append(raw)
            deadline = time.monotonic() + TIMEOUT
            while b"\r\n\r\n" not in raw.data and raw.lost is None:
                assert time.monotonic() < deadline, "no answer from nginx"
                await sleep(0.02)
            status = bytes(raw.data).split(b"\r\n", 1)[0]
            assert status.startswith(b"HTTP/1.1 429"), status
        assert len(b.peers) == 4
        assert {p.remote_address.rpartition(":")[0] for p in b.peers.values()} == {"127.0.0.1"}
        assert b._admission.per_ip == {"127.0.0.1": 4}
        b._check_invariants()
    finally:
        for raw in raws:
            raw.transport.abortConnection()
        await stop(b)
        if nginx is not None:
            nginx.stop()


@pytest.mark.skipif(not NGINX.exists(), reason="make installs nginx (/usr/sbin/nginx)")
@pytest_twisted.ensureDeferred
async def test_a_wss_dial_to_nginx_refuses_a_certificate_its_cas_did_not_sign(workdir):
    """A dialer that trusts another CA (Config.wss_ca_file) refuses nginx's certificate
    with a TLSError saying the verification failed; no session starts."""
    (b, rb) = node()
    other_ca, _, _ = write_ca_and_server_cert(workdir, "other")
    (dialer, rd) = node(config=CONFIG.replace(wss_ca_file=str(other_ca)))
    nginx = None
    try:
        upstream = (await b.listen(f"ws:tcp:0:interface=127.0.0.1:path={PATH}")).getHost().port
        nginx, _, https_port, _ = await start_nginx(workdir, upstream)
        with pytest.raises(TLSError, match="certificate verify failed"):
            await bounded(dialer.dial(f"{b.node_id}@wss://127.0.0.1:{https_port}{PATH}"), TIMEOUT)
        assert not b.peers and not dialer.peers
    finally:
        await stop(b, dialer)
        if nginx is not None:
            nginx.stop()


# -- squid ----------------------------------------------------------------------------------


async def start_squid(directory: pathlib.Path, allowed_port: int) -> tuple[Server, int]:
    """squid on a loopback port, allowing CONNECT from loopback to 127.0.0.1:``allowed_port`` only."""
    port = free_port()
    run_as = ""
    if os.geteuid() == 0:  # squid drops root for this user; it must write the logs here
        run_as = "cache_effective_user " + ("proxy" if _user_exists("proxy") else "nobody")
    (directory / "squid.conf").write_text(f"""
http_port 127.0.0.1:{port}
pid_filename {directory}/squid.pid
cache_log {directory}/cache.log
access_log stdio:{directory}/access.log
coredump_dir {directory}
{run_as}
cache deny all
pinger_enable off
shutdown_lifetime 0 seconds
acl from_loopback src 127.0.0.1/32
acl to_node dst 127.0.0.1/32
acl node_port port {allowed_port}
acl CONNECT method CONNECT
http_access allow CONNECT from_loopback to_node node_port
http_access deny all
""")
    server = Server([str(SQUID), "-N", "-f", str(directory / "squid.conf")], directory, [port], "squid")
    await server.ready()
    return server, port


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@pytest.mark.skipif(not SQUID.exists(), reason="make installs squid (/usr/sbin/squid)")
@pytest_twisted.ensureDeferred
async def test_a_dialer_reaches_a_wss_listener_through_squid_with_connect(workdir):
    """A dialer with Config.http_proxy reaches a wss listener (identity-mode TLS, ids
    proven) through squid's CONNECT tunnel, which squid logged; a CONNECT to a port squid
    does not allow fails with a ProxyError naming squid's 403."""
    listener, rl = node(TLSOptions.identity(NodeKey.generate()))
    squid = None
    try:
        port = (await listener.listen(f"wss:tcp:0:interface=127.0.0.1:path={PATH}")).getHost().port
        squid, squid_port = await start_squid(workdir, port)
        proxied = CONFIG.replace(http_proxy=f"http://127.0.0.1:{squid_port}")
        dialer, rd = node(TLSOptions.identity(NodeKey.generate()), config=proxied)
        try:
            peer, _ = await exchange(dialer, listener, rd, rl, f"{listener.node_id}@wss://127.0.0.1:{port}{PATH}")
            assert transport_kind(peer._protocol.transport) == "wss"
            await sleep(0.1)
            with pytest.raises(ProxyError, match="403"):
                await bounded(dialer.dial(f"{NodeKey.generate().node_id}@wss://127.0.0.1:{free_port()}{PATH}"), TIMEOUT)
        finally:
            await stop(dialer)
        squid.stop()  # squid writes its access log as the tunnel closes, at the latest on exit
        log = access_log(workdir)
        assert f"CONNECT 127.0.0.1:{port}" in log, squid.logs()
    finally:
        await stop(listener)
        if squid is not None:
            squid.stop()


# -- twistd ---------------------------------------------------------------------------------


def test_twistd_nodes_listen_on_wss_and_dial_a_wss_peer(tmp_path):
    """``twistd mconn --tls --listen wss:tcp:0:...:path=/mconn`` and a second node given
    ``--peer ID@wss://127.0.0.1:PORT/mconn``: they connect over wss, the listening event
    names the ws URL, telemetry's connection_made and the status page name the transport."""
    from operators.twistd_nodes import Node, wait_until

    nodes = []
    try:
        listener = Node(tmp_path, "listener").start(
            "--tls", "--listen", f"wss:tcp:0:interface=127.0.0.1:path={PATH}", "--status", "tcp:0"
        )
        nodes.append(listener)
        address = listener.address
        assert "@wss://127.0.0.1:" in address and address.endswith(PATH), address
        dialer = Node(tmp_path, "dialer").start("--tls", "--peer", address)
        nodes.append(dialer)
        made = dialer.wait_event("connection_made")
        assert made["transport"] == "wss" and made["direction"] == "outbound"
        status_url = listener.status_url

        def status():
            with urllib.request.urlopen(status_url + "status.json", timeout=5) as response:
                return json.loads(response.read())

        peers = wait_until(
            lambda: [p for p in status()["peers"] if p["state"] == "connected"] or None, "the status page's peer"
        )
        assert [p["transport"] for p in peers] == ["wss"]
        assert status()["listen_addresses"] == [address.partition("@")[2]]
    finally:
        for node in nodes:
            node.kill()
