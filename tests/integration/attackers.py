"""Attackers for tests/integration/test_hostile_load.py, in their own process.

    python attackers.py PORT SECONDS

For SECONDS, against 127.0.0.1:PORT, at once (issue 12, attacks 4 to 7):

* **dormant**: from 127.0.0.2, a hello with a made-up node id, then a reset, again and
  again (sessions that would stay suspended and hold inbound slots);
* **hoard**: from 127.0.0.30 to .39, a made-up identity that reads what the node sends
  and never acknowledges it, then resets after a moment (recovery buffers pinned by
  dormant sessions);
* **stall**: from 127.0.0.50 to .57, eight silent sockets each, renewed as soon as the
  node closes one (the handshake budget);
* **sybil**: from 127.0.0.70 to .79, made-up identities with the PEX channel whose hellos
  announce, as their own listen address, a target of the attacker's choosing: the cloud
  metadata address, a private host, the node's own listener, a scan of loopback ports
  (attack 7: the node must never dial the first three, and dial the rest at a bounded rate).

Every loop is bounded by the deadline; every socket is closed. At the end one JSON
object goes to stdout: how many of each were made.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import sys
import threading
import time

from mconn import ChannelDescriptor, wire
from mconn.handshake import make_hello

#: The victim's channels, announced by the attackers so that the node sends them data.
CHANNELS = [
    ChannelDescriptor(0x20, priority=1, send_queue_capacity=64, recv_message_capacity=1 << 20),
    ChannelDescriptor(0x21, priority=5, send_queue_capacity=64, recv_message_capacity=1 << 16),
]
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a RST


#: The PEX channel, announced by the sybils (reactors/pex.py).
PEX = ChannelDescriptor(0x00, priority=1, send_queue_capacity=10, recv_message_capacity=1 << 16)


def made_up_hello(rng: random.Random, *, listen_address: str = "", pex: bool = False) -> bytes:
    request = wire.SessionRequest(session_id=rng.randbytes(16), resume=False)
    fields = ((wire.HelloTag.SESSION, wire.encode_session_request(request)),)
    channels = CHANNELS + [PEX] if pex else CHANNELS
    hello = make_hello(
        node_id=rng.randbytes(20).hex(), channels=channels, max_packet_payload=1024, fields=fields,
        listen_address=listen_address,
    )
    return wire.encode_extension(wire.PacketType.HELLO, wire.encode_hello(hello))


def connect(port: int, source: str) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=2, source_address=(source, 0))
    except OSError:
        return None


def reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
    except OSError:
        pass
    sock.close()


def dormant(port: int, deadline: float, counts: dict) -> None:
    rng = random.Random(4)
    while time.monotonic() < deadline:
        sock = connect(port, "127.0.0.2")
        if sock is None:
            time.sleep(0.05)
            continue
        try:
            sock.sendall(made_up_hello(rng))
            sock.settimeout(0.5)
            sock.recv(4096)  # the node's hello (and maybe its answer)
        except OSError:
            pass
        reset(sock)
        counts["dormant"] += 1
        time.sleep(0.01)


def hoard(port: int, source: str, deadline: float, counts: dict) -> None:
    rng = random.Random(source)
    while time.monotonic() < deadline:
        sock = connect(port, source)
        if sock is None:
            time.sleep(0.1)
            continue
        try:
            sock.sendall(made_up_hello(rng))
            sock.settimeout(0.2)
            until = min(deadline, time.monotonic() + 1.5)
            while time.monotonic() < until:
                try:
                    if not sock.recv(1 << 16):
                        break
                except socket.timeout:
                    continue
        except OSError:
            pass
        reset(sock)
        counts["hoard"] += 1


def stall(port: int, source: str, deadline: float, counts: dict) -> None:
    held: list[socket.socket] = []
    while time.monotonic() < deadline:
        while len(held) < 8 and time.monotonic() < deadline:
            sock = connect(port, source)
            if sock is None:
                break
            sock.setblocking(False)
            held.append(sock)
            counts["stall"] += 1
        time.sleep(0.1)
        for sock in list(held):  # renew the ones the node closed
            try:
                if sock.recv(4096) == b"":
                    held.remove(sock)
                    sock.close()
            except BlockingIOError:
                pass
            except OSError:
                held.remove(sock)
                sock.close()
    for sock in held:
        sock.close()


def sybil(port: int, source: str, deadline: float, counts: dict) -> None:
    rng = random.Random(source)
    targets = ["169.254.169.254:80", "10.0.0.1:22", f"127.0.0.1:{port}"]
    targets += [f"127.0.0.1:{p}" for p in range(20000, 20040)]
    while time.monotonic() < deadline:
        sock = connect(port, source)
        if sock is None:
            time.sleep(0.1)
            continue
        try:
            sock.sendall(made_up_hello(rng, listen_address=rng.choice(targets), pex=True))
            sock.settimeout(0.5)
            sock.recv(4096)
            time.sleep(0.5)
        except OSError:
            pass
        sock.close()
        counts["sybil"] += 1


def main(argv: list[str]) -> int:
    port, seconds = int(argv[1]), float(argv[2])
    deadline = time.monotonic() + seconds
    counts = {"dormant": 0, "hoard": 0, "stall": 0, "sybil": 0}
    threads = [threading.Thread(target=dormant, args=(port, deadline, counts))]
    threads += [threading.Thread(target=hoard, args=(port, f"127.0.0.{30 + i}", deadline, counts)) for i in range(10)]
    threads += [threading.Thread(target=stall, args=(port, f"127.0.0.{50 + i}", deadline, counts)) for i in range(8)]
    threads += [threading.Thread(target=sybil, args=(port, f"127.0.0.{70 + i}", deadline, counts)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 10)
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
