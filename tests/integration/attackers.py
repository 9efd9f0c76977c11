"""Attackers for tests/integration/test_hostile_load.py, in their own process.

    python attackers.py PORT SECONDS [--host HOST] [--ws PATH] [--ipv6] [--transport-attacks]

For SECONDS, against HOST:PORT (127.0.0.1 by default), at once:

* **dormant**: from one address, a hello with a made-up node id, then a reset, again and
  again (sessions that would stay suspended and hold inbound slots);
* **hoard**: from ten addresses, a made-up identity that reads what the node sends and
  never acknowledges it, then resets after a moment (recovery buffers pinned by dormant
  sessions);
* **stall**: from eight addresses, eight silent sockets each, renewed as soon as the node
  closes one (the handshake budget; on a WebSocket listener, before the upgrade);
* **sybil**: from ten addresses, made-up identities with the PEX channel whose hellos
  announce, as their own listen address, a target of the attacker's choosing: the cloud
  metadata address, a private host, the node's own listener, a scan of loopback ports
  (the node must never dial the first three, and dial the rest at a bounded rate).

With ``--transport-attacks``, also:

* **slowloris**: from one address, 64 sockets kept open that say almost nothing (on a
  WebSocket listener the first line of an upgrade request, never its end);
* **flood**: from two addresses, a made-up identity that sends empty messages on the busy
  channel 0x22 as fast as the node reads them (the reactor backlog: a bound on payload
  bytes alone never stops reading zero-byte messages);
* **tiny**: from one address, a hello announcing ``max_packet_payload`` 1, then reading
  what the node sends: ``tiny_cut`` counts the connections on which the node cut a
  message into packets of less than ``MIN_CUT`` bytes (each costs it a packet's work);
* **browser** (WebSocket only): from one address, upgrades that carry an ``Origin``
  header, as a web page's would; ``browser_open`` counts the ones the listener took.

``--ws PATH`` speaks WebSocket (RFC 6455: an upgrade request, then masked binary frames)
to a ``ws://HOST:PORT/PATH`` listener. Sources are loopback addresses of 127.0.0.0/8,
one per role and index (``source``); with ``--ipv6``, addresses of ``IPV6_PREFIX``
instead, one /64 per role with several addresses in it (an IPv6 host has a whole /64):
the test adds them to the loopback interface of a network namespace of its own.

Every loop is bounded by the deadline; every socket is closed. At the end one JSON
object goes to stdout: how many of each were made.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import select
import socket
import struct
import sys
import threading
import time

from mconn import ChannelDescriptor
from mconn.core import wire
from mconn.core.frame_buffer import MSG, FrameBuffer
from mconn.core.handshake import make_hello
from mconn.net.websocket_frames import FrameReader, binary_frames
from tests.helpers_core import PacketByPacket

#: The victim's channels, announced by the attackers so that the node sends them data.
CHANNELS = [
    ChannelDescriptor(0x20, priority=1, send_queue_capacity=64, recv_message_capacity=1 << 20),
    ChannelDescriptor(0x21, priority=5, send_queue_capacity=64, recv_message_capacity=1 << 16),
]
#: A channel whose reactor at the victim is busy most of the time (test_hostile_load's Busy).
BUSY = ChannelDescriptor(0x22, priority=1, send_queue_capacity=8, recv_message_capacity=1 << 10)
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a RST
#: The PEX channel, announced by the sybils (reactors/pex.py).
PEX = ChannelDescriptor(0x00, priority=1, send_queue_capacity=10, recv_message_capacity=1 << 16)
#: A non-final msg packet shorter than this, sent to a peer that announced payload 1, is a
#: message cut small (CometBFT's default packet payload; mconn's floor).
MIN_CUT = 1024
#: The IPv6 sources: role r, index i is IPV6_PREFIX:r::(i+1) (one /64 per role).
IPV6_PREFIX = "fd00:0:0"
#: Each role's first IPv4 source (127.0.0.BASE + i) and, as a hex group, its IPv6 /64.
ROLES = {"dormant": 2, "hoard": 30, "stall": 50, "slowloris": 60, "sybil": 70, "flood": 90, "tiny": 95, "browser": 97}
#: How many sources each role uses.
SOURCES = {"dormant": 1, "hoard": 10, "stall": 8, "slowloris": 1, "sybil": 10, "flood": 2, "tiny": 1, "browser": 1}
#: One empty message on BUSY is 4 bytes; a write of the flood carries this many of them.
EMPTY_MESSAGE = wire.encode_packet(wire.PacketType.MSG, channel_id=BUSY.id, eof=True, data=b"")
FLOOD_WRITE = EMPTY_MESSAGE * 16384


def source(role: str, index: int, ipv6: bool) -> str:
    """The address ``role``'s ``index``-th attacker connects from."""
    if ipv6:
        return f"{IPV6_PREFIX}:{ROLES[role]:x}::{index + 1:x}"
    return f"127.0.0.{ROLES[role] + index}"


def all_sources(ipv6: bool) -> list[str]:
    """Every address any role connects from (the test adds the IPv6 ones)."""
    return [source(role, i, ipv6) for role in ROLES for i in range(SOURCES[role])]


def made_up_hello(
    rng: random.Random,
    *,
    listen_address: str = "",
    pex: bool = False,
    busy: bool = False,
    max_packet_payload: int = 1024,
) -> bytes:
    request = wire.SessionRequest(session_id=rng.randbytes(16), resume=False)
    fields = ((wire.HelloTag.SESSION, wire.encode_session_request(request)),)
    channels = CHANNELS + ([PEX] if pex else []) + ([BUSY] if busy else [])
    hello = make_hello(
        node_id=rng.randbytes(20).hex(),
        channels=channels,
        max_packet_payload=max_packet_payload,
        fields=fields,
        listen_address=listen_address,
    )
    return wire.encode_extension(wire.PacketType.HELLO, wire.encode_hello(hello))


class Target:
    """Where the attackers go: ``host``, ``port``, and ``path`` for a WebSocket listener
    (None: plain TCP)."""

    def __init__(self, host: str, port: int, path: str | None, ipv6: bool) -> None:
        self.host, self.port, self.path, self.ipv6 = host, port, path, ipv6

    def address(self, host: str, port: int) -> str:
        """A listen address to announce, in the target's transport."""
        hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return f"ws://{hostport}{self.path}" if self.path else hostport


def connect(target: Target | int, source_address: str) -> socket.socket | None:
    """A TCP connection from ``source_address``; ``target`` may be a port of 127.0.0.1."""
    host, port = ("127.0.0.1", target) if isinstance(target, int) else (target.host, target.port)
    try:
        return socket.create_connection((host, port), timeout=2, source_address=(source_address, 0))
    except OSError:
        return None


def reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
    except OSError:
        pass
    sock.close()


def connections(target: Target, role: str, index: int, deadline: float, retry: float = 0.1):
    """Sockets from ``role``'s address, one after another until ``deadline``; a connect
    the node refuses waits ``retry`` before the next. The caller closes each."""
    while time.monotonic() < deadline:
        sock = connect(target, source(role, index, target.ipv6))
        if sock is None:
            time.sleep(retry)
            continue
        yield sock


def upgrade_request(target: Target, extra: str = "") -> bytes:
    """A WebSocket upgrade to the target's path; ``extra``: more header lines."""
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET {target.path} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Sec-WebSocket-Protocol: mconn\r\n{extra}\r\n"
    ).encode()


class Wire:
    """mconn bytes over one attacker's socket: as they are (TCP), or in masked binary
    WebSocket frames after an upgrade (RFC 6455). ``open`` raises OSError if the
    listener does not upgrade."""

    def __init__(self, sock: socket.socket, target: Target) -> None:
        self.sock = sock
        self.ws = target.path is not None
        self.target = target
        self.reader = FrameReader(masked=False, max_message=1 << 30)
        self.early = b""  # frame bytes that came with the 101 answer

    def open(self, extra: str = "") -> None:
        if not self.ws:
            return
        self.sock.sendall(upgrade_request(self.target, extra))
        head = b""
        while b"\r\n\r\n" not in head:
            part = self.sock.recv(4096)
            if not part or len(head) > 65536:
                raise OSError(f"no upgrade: {head[:80]!r}")
            head += part
        head, self.early = head.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise OSError(f"no upgrade: {head[:80]!r}")

    def send(self, data: bytes) -> None:
        self.sock.sendall(binary_frames(data, limit=65536, keys=os.urandom) if self.ws else data)

    def recv(self) -> bytes:
        """The next mconn bytes the node sent; b"" at the end (or a close frame)."""
        if not self.ws:
            return self.sock.recv(1 << 16)
        while True:
            data, self.early = self.early or self.sock.recv(1 << 16), b""
            if not data:
                return b""
            out = []
            while data:
                payloads, stop, data = self.reader.read(data)
                out += payloads
                if stop is None:
                    break
                if stop[0] != "control" or stop[1][0] & 0x0F == 0x8:
                    return b"".join(out)  # a close, or a frame the reader refuses: the end
            if out:
                return b"".join(out)


def dormant(target: Target, deadline: float, counts: dict) -> None:
    rng = random.Random(4)
    for sock in connections(target, "dormant", 0, deadline, retry=0.05):
        try:
            peer = Wire(sock, target)
            peer.open()
            peer.send(made_up_hello(rng))
            sock.settimeout(0.5)
            sock.recv(4096)  # the node's hello (and maybe its answer)
        except OSError:
            pass
        reset(sock)
        counts["dormant"] += 1
        time.sleep(0.01)


def hoard(target: Target, index: int, deadline: float, counts: dict) -> None:
    rng = random.Random(index)
    for sock in connections(target, "hoard", index, deadline):
        try:
            peer = Wire(sock, target)
            peer.open()
            peer.send(made_up_hello(rng))
            sock.settimeout(0.2)
            until = min(deadline, time.monotonic() + 1.5)
            while time.monotonic() < until:
                try:
                    if not sock.recv(1 << 16):
                        break
                except TimeoutError:
                    continue
        except OSError:
            pass
        reset(sock)
        counts["hoard"] += 1
        time.sleep(0.05)  # a refused one ends at once: no busy loop


def hold_sockets(
    target: Target, role: str, index: int, count: int, greeting: bytes, deadline: float, counts: dict
) -> None:
    """Keep ``count`` sockets open that send ``greeting`` (maybe nothing) and then
    nothing more, renewed as soon as the node closes one."""
    held: list[socket.socket] = []
    while time.monotonic() < deadline:
        while len(held) < count and time.monotonic() < deadline:
            sock = connect(target, source(role, index, target.ipv6))
            if sock is None:
                break
            try:
                if greeting:
                    sock.sendall(greeting)
            except OSError:
                sock.close()
                continue
            sock.setblocking(False)
            held.append(sock)
            counts[role] += 1
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


def stall(target: Target, index: int, deadline: float, counts: dict) -> None:
    hold_sockets(target, "stall", index, 8, b"", deadline, counts)


def slowloris(target: Target, deadline: float, counts: dict) -> None:
    greeting = f"GET {target.path} HTTP/1.1\r\n".encode() if target.path else b""
    hold_sockets(target, "slowloris", 0, 64, greeting, deadline, counts)


def sybil(target: Target, index: int, deadline: float, counts: dict) -> None:
    rng = random.Random(100 + index)
    targets = [target.address("169.254.169.254", 80), target.address("10.0.0.1", 22)]
    targets += [target.address(target.host, target.port), target.address("fd00:ec2::254", 80)]
    targets += [target.address(target.host, p) for p in range(20000, 20040)]
    for sock in connections(target, "sybil", index, deadline):
        try:
            peer = Wire(sock, target)
            peer.open()
            peer.send(made_up_hello(rng, listen_address=rng.choice(targets), pex=True))
            sock.settimeout(0.5)
            sock.recv(4096)
            time.sleep(0.5)
        except OSError:
            pass
        sock.close()
        counts["sybil"] += 1
        time.sleep(0.05)  # a refused one ends at once: no busy loop


def flood(target: Target, index: int, deadline: float, counts: dict) -> None:
    """Empty messages on BUSY, as fast as the node takes them, on one session at a time."""
    rng = random.Random(200 + index)
    write = binary_frames(FLOOD_WRITE, limit=len(FLOOD_WRITE), keys=os.urandom) if target.path else FLOOD_WRITE
    for sock in connections(target, "flood", index, deadline):
        counts["flood"] += 1
        try:
            peer = Wire(sock, target)
            peer.open()
            peer.send(made_up_hello(rng, busy=True))
            pending = memoryview(b"")
            while time.monotonic() < deadline:
                if not pending:  # whole writes only: a part of one would break the stream
                    pending = memoryview(write)
                    counts["flood_messages"] += len(FLOOD_WRITE) // len(EMPTY_MESSAGE)
                _, writable, _ = select.select([], [sock], [], 0.5)
                if writable:  # else the node stopped reading: it may again
                    pending = pending[sock.send(pending) :]
        except OSError:
            pass
        reset(sock)
        time.sleep(0.1)


def cut_small(peer: Wire, sock: socket.socket, deadline: float) -> bool:
    """Whether the node cuts a message into packets under MIN_CUT bytes, judged from the
    first 64 KiB it sends (or what comes within 1.5 s)."""
    # Packet by packet: a FrameBuffer alone joins a read's small not-last packets.
    packets = PacketByPacket(FrameBuffer(max_payload=1 << 20, default_extension_limit=1 << 20))
    sock.settimeout(0.2)
    seen, until = 0, min(deadline, time.monotonic() + 1.5)
    while seen < 65536 and time.monotonic() < until:
        try:
            data = peer.recv()
        except TimeoutError:
            continue
        if not data:
            break
        seen += len(data)
        found, error = packets.feed(data)
        if any(p[0] == MSG and not p[2] and len(p[3]) < MIN_CUT for p in found):
            return True
        if error is not None or any(p[0] == wire.PacketType.CLOSE for p in found):
            break  # refused, as it should be
    return False


def tiny(target: Target, deadline: float, counts: dict) -> None:
    """Hellos announcing max_packet_payload 1; counts the connections cut small."""
    rng = random.Random(300)
    for sock in connections(target, "tiny", 0, deadline):
        counts["tiny"] += 1
        try:
            peer = Wire(sock, target)
            peer.open()
            peer.send(made_up_hello(rng, max_packet_payload=1))
            if cut_small(peer, sock, deadline):
                counts["tiny_cut"] += 1
        except OSError:
            pass
        reset(sock)
        time.sleep(0.2)


def browser(target: Target, deadline: float, counts: dict) -> None:
    """What a web page in the operator's browser can do: upgrades with an Origin header
    (``browser_open`` counts the ones the listener took), each then a made-up peer."""
    rng = random.Random(400)
    for sock in connections(target, "browser", 0, deadline):
        counts["browser"] += 1
        try:
            peer = Wire(sock, target)
            peer.open("Origin: http://attacker.example\r\n")
            counts["browser_open"] += 1
            peer.send(made_up_hello(rng, pex=True, listen_address=target.address(target.host, target.port)))
            sock.settimeout(0.5)
            sock.recv(4096)
        except OSError:
            pass
        sock.close()
        time.sleep(0.2)


def roles(target: Target, deadline: float, counts: dict, transport_attacks: bool) -> list[threading.Thread]:
    def each(function, role):
        return [threading.Thread(target=function, args=(target, i, deadline, counts)) for i in range(SOURCES[role])]

    threads = [threading.Thread(target=dormant, args=(target, deadline, counts))]
    threads += each(hoard, "hoard") + each(stall, "stall") + each(sybil, "sybil")
    if transport_attacks:
        threads.append(threading.Thread(target=slowloris, args=(target, deadline, counts)))
        threads += each(flood, "flood")
        threads.append(threading.Thread(target=tiny, args=(target, deadline, counts)))
        if target.path:
            threads.append(threading.Thread(target=browser, args=(target, deadline, counts)))
    return threads


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--ws", metavar="PATH", help="speak WebSocket to a ws:// listener at PATH")
    parser.add_argument("--ipv6", action="store_true", help=f"connect from addresses of {IPV6_PREFIX}::/48")
    parser.add_argument("--transport-attacks", action="store_true", help="slowloris, flood and tiny too")
    args = parser.parse_args(argv[1:])
    target = Target(args.host, args.port, args.ws, args.ipv6)
    deadline = time.monotonic() + args.seconds
    counts = dict.fromkeys(["dormant", "hoard", "stall", "sybil"], 0)
    if args.transport_attacks:
        counts.update(dict.fromkeys(["slowloris", "flood", "flood_messages", "tiny", "tiny_cut"], 0))
        if args.ws:
            counts.update(browser=0, browser_open=0)
    threads = roles(target, deadline, counts, args.transport_attacks)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.seconds + 10)
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
