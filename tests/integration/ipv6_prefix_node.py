"""The two sides of tests/integration/test_ipv6_prefix.py, each run inside the test's
network namespace (``ip netns exec NS python ipv6_prefix_node.py ...``).

    python ipv6_prefix_node.py listen WATCHED_NETWORK
    python ipv6_prefix_node.py attack PORT TARGET ATTACKER_ADDRESSES... -- HONEST_ADDRESSES...

``listen``: a Switch listening on ``[::]`` (any port; resume_grace 60 s, so a reset
session stays suspended), whose reactor answers every message on channel 0x20 with one
of its own. It writes one JSON object per line to stdout, flushed at once:

    {"event": "listening", "port": 12345}
    {"event": "add_peer", "peer_id": "...", "host": "2001:db8:7:1::2", "key": "...", "held": 3}

where ``held`` counts the sessions in the peer table whose remote host is in
WATCHED_NETWORK (suspended ones included) as this session starts, and ``key`` is the
session's ``ip_key``: the most the network ever holds shows in these lines.

``attack``: raw IPv6 sockets speaking mconn bytes to TARGET:PORT. From each attacker
address in turn, sessions with made-up node ids that carry one message each (the
listener's answer read back, so the session counts as having carried traffic) and then
reset (left suspended), 8 per address; then 2 per address kept open; then one honest
session from each honest address. One JSON summary line on stdout, then the open
sockets are held for at most HOLD seconds (the test kills the process by PID before).
Every socket operation has a timeout.
"""

from __future__ import annotations

import ipaddress
import json
import random
import socket
import struct
import sys
import time

from mconn import ChannelDescriptor, Config, Reactor, Switch
from mconn.core import wire
from mconn.core.handshake import make_hello
from mconn.core.wire_primitives import read_uvarint

CHANNEL = ChannelDescriptor(0x20, priority=1, send_queue_capacity=64, recv_message_capacity=1 << 16)
#: Sessions each attacker address opens and resets (left suspended), and then keeps open.
DORMANT_PER_ADDRESS = 8
LIVE_PER_ADDRESS = 2
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a RST
TIMEOUT = 3.0
#: Seconds the open sessions are held after the summary, at most.
HOLD = 120.0


def report(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


# -- listen ------------------------------------------------------------------------------


def host_of(remote_address: str) -> str:
    """The host of a transport's ``host:port`` text."""
    return remote_address.rpartition(":")[0].strip("[]")


def listen(watched: str) -> None:
    from twisted.internet import reactor as twisted_reactor

    network = ipaddress.ip_network(watched)
    switches = []

    class Echo(Reactor):
        def get_channels(self):
            return [CHANNEL]

        def add_peer(self, peer):
            hosts = [host_of(p.remote_address) for p in switches[0].peers.values()]
            held = sum(1 for h in hosts if ipaddress.ip_address(h) in network)
            host = host_of(peer.remote_address)
            report(event="add_peer", peer_id=peer.node_id, host=host, key=peer.ip_key, held=held)

        def receive(self, channel_id, peer, message):
            peer.try_send(channel_id, b"seen")

    config = Config(stats_interval=0, resume_grace=60.0, handshake_timeout=10.0)
    switch = Switch([Echo()], config=config, clock=twisted_reactor)
    switches.append(switch)
    switch.startService()

    def failed(failure):
        report(event="error", error=str(failure.value))
        twisted_reactor.stop()

    d = switch.listen("tcp6:0:interface=\\:\\:")
    d.addCallbacks(lambda port: report(event="listening", port=port.getHost().port), failed)
    twisted_reactor.run()


# -- attack ------------------------------------------------------------------------------


def made_up_hello(rng: random.Random) -> tuple[str, bytes]:
    node_id = rng.randbytes(20).hex()
    request = wire.SessionRequest(session_id=rng.randbytes(16), resume=False)
    fields = ((wire.HelloTag.SESSION, wire.encode_session_request(request)),)
    hello = make_hello(node_id=node_id, channels=[CHANNEL], max_packet_payload=1024, fields=fields)
    return node_id, wire.encode_extension(wire.PacketType.HELLO, wire.encode_hello(hello))


def packets(data: bytes) -> list[tuple[int, bytes]]:
    """The whole packets at the start of ``data`` as (type, body): the extension packets
    (hello, close, ack, session) with their bodies, a ping or pong, a msg packet (body:
    its data); stops at the first incomplete one."""
    out, pos = [], 0
    while pos < len(data):
        kind = data[pos]
        if kind in (wire.PacketType.PING, wire.PacketType.PONG):
            out.append((kind, b""))
            pos += 1
            continue
        try:  # msg: type, channel, eof, uvarint length, data; extension: type, uvarint length, body
            length, start = read_uvarint(data, pos + (3 if kind == wire.PacketType.MSG else 1))
        except IndexError:
            break
        if start + length > len(data):
            break
        out.append((kind, bytes(data[start : start + length])))
        pos = start + length
    return out


def read_until(sock: socket.socket, done) -> tuple[list, str | None]:
    """Read until ``done(packets)`` or a close packet, the end, or TIMEOUT; the packets and
    the close code (or None)."""
    data = bytearray()
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        found = packets(bytes(data))
        closes = [body for kind, body in found if kind == wire.PacketType.CLOSE]
        if closes:
            return found, wire.decode_close(closes[0])[0]
        if done(found):
            return found, None
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except OSError:
            return found, "connection error"
        if not chunk:
            return found, "connection ended"
        data += chunk
    return packets(bytes(data)), "timeout"


def has(kind):
    return lambda found: any(k == kind for k, _ in found)


def open_session(target: tuple[str, int], source: str, rng: random.Random, *, message: bool):
    """A session from ``source`` with a made-up node id: (socket, None) once the listener
    answered with a session (and, if ``message``, echoed our message), else (None, why)."""
    try:
        sock = socket.create_connection(target, timeout=TIMEOUT, source_address=(source, 0))
    except OSError as e:
        return None, f"connect: {e}"
    _, hello = made_up_hello(rng)
    try:
        sock.sendall(hello)
        _, closed = read_until(sock, has(wire.PacketType.SESSION))
        if closed is None and message:
            sock.sendall(wire.encode_packet(wire.PacketType.MSG, channel_id=CHANNEL.id, eof=True, data=b"hi"))
            _, closed = read_until(sock, has(wire.PacketType.MSG))
    except OSError as e:
        closed = f"send: {e}"
    if closed is not None:
        sock.close()
        return None, closed
    return sock, None


def reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
    sock.close()


def attack(port: int, target_host: str, attackers: list[str], honest: list[str]) -> None:
    rng = random.Random(64)
    target = (target_host, port)
    outcomes: dict[str, dict[str, int]] = {"dormant": {}, "live": {}}

    def count(phase, outcome):
        outcomes[phase][outcome or "session"] = outcomes[phase].get(outcome or "session", 0) + 1

    for _ in range(DORMANT_PER_ADDRESS):
        for source in attackers:
            sock, why = open_session(target, source, rng, message=True)
            count("dormant", why)
            if sock is not None:
                reset(sock)
    held = []
    for _ in range(LIVE_PER_ADDRESS):
        for source in attackers:
            sock, why = open_session(target, source, rng, message=True)
            count("live", why)
            if sock is not None:
                held.append(sock)
    outcomes["honest"] = {}
    for source in honest:
        sock, why = open_session(target, source, rng, message=True)
        outcomes["honest"][source] = why or "session"
        if sock is not None:
            held.append(sock)
    report(event="done", **outcomes)
    deadline = time.monotonic() + HOLD
    while time.monotonic() < deadline:  # the test kills this process by PID before
        time.sleep(0.2)
    for sock in held:
        sock.close()


def main(argv: list[str]) -> int:
    if argv[1] == "listen":
        listen(argv[2])
        return 0
    port, target_host, rest = int(argv[2]), argv[3], argv[4:]
    split = rest.index("--")
    attack(port, target_host, rest[:split], rest[split + 1 :])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
