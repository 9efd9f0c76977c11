"""Priority under a shaped bottleneck: a probe's delay beyond the network's own.

Needs root and iproute2 (``ip netns``, veth, ``tc tbf``); not part of ``make test``.

Three network namespaces, ``mcs_a`` (the dialer) -- ``mcs_r`` (a router) -- ``mcs_b``
(the listener). The router's egress towards the listener is shaped by ``tc tbf`` to the
rate measured: shaping the sender's own interface would show nothing, since TCP small
queues keep a sender's qdisc nearly empty and the backlog would sit in its socket. This
kernel has no netem, so no delay is added: the path's only delay is the router's queue.

In each measurement the dialer keeps a priority-1 channel full of 64 KiB messages (64
queued) and sends a 100-byte probe on a priority-10 channel every 50 ms, each with a UDP
datagram through the same bottleneck at the same moment; both carry the send time
(``time.time()``: one machine, one clock). The listener reports, per probe after a
warm-up, the probe's delay (absolute) and that minus its datagram's (added: the time
spent below the scheduler and behind other bytes in the sender, beyond the network's
queue), and the bulk goodput as a fraction of the shaped rate. The raw baseline is one
plain TCP connection, length-prefixed frames, no scheduler and no TCP_NOTSENT_LOWAT:
the probe is written behind whatever bulk is queued.

    sudo .venv/bin/python bench/shaped.py                   # 20 and 2 Mbit/s, 20 s each
    sudo .venv/bin/python bench/shaped.py --rates 20 --duration 10 --variants raw,mconn

Every namespace is deleted at the end, by name, whatever happens.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NAMESPACES = ("mcs_a", "mcs_r", "mcs_b")
DIALER_IP, LISTENER_IP = "10.77.1.1", "10.77.2.1"
BULK_SIZE = 64 * 1024
PROBE_SIZE = 100
PROBE_INTERVAL = 0.05
WARMUP = 3.0
#: The mconn configurations measured, as Config fields. "before" is the write path without
#: the write-ahead (write_batch_bytes per write, Twisted pausing us only past 64 KiB).
VARIANTS = {
    "raw": None,
    "mconn-before": {"write_ahead_time": None},
    "mconn": {},
    "mconn-lowat4k": {"tcp_notsent_lowat": 4096},
    # The packet size before it followed the link (1 KiB packets at any rate).
    "mconn-1k": {"max_packet_payload": 1024},
}
_PROBE = struct.Struct(">Id")
SIOCOUTQNSD = 0x894B  # unsent bytes in a TCP socket's send queue (linux/sockios.h)


# -- the namespaces (orchestrator, root) -------------------------------------------


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def in_ns(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", ns, *args, check=check)


def make_namespaces() -> None:
    for ns in NAMESPACES:
        sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", "mcs_a0", "type", "veth", "peer", "name", "mcs_ra")
    sh("ip", "link", "add", "mcs_b0", "type", "veth", "peer", "name", "mcs_rb")
    for dev, ns in (("mcs_a0", "mcs_a"), ("mcs_ra", "mcs_r"), ("mcs_rb", "mcs_r"), ("mcs_b0", "mcs_b")):
        sh("ip", "link", "set", dev, "netns", ns)
    for ns, dev, addr in (
        ("mcs_a", "mcs_a0", DIALER_IP + "/24"),
        ("mcs_r", "mcs_ra", "10.77.1.2/24"),
        ("mcs_r", "mcs_rb", "10.77.2.2/24"),
        ("mcs_b", "mcs_b0", LISTENER_IP + "/24"),
    ):
        in_ns(ns, "ip", "addr", "add", addr, "dev", dev)
        in_ns(ns, "ip", "link", "set", dev, "up")
    for ns in NAMESPACES:
        in_ns(ns, "ip", "link", "set", "lo", "up")
    in_ns("mcs_a", "ip", "route", "add", "default", "via", "10.77.1.2")
    in_ns("mcs_b", "ip", "route", "add", "default", "via", "10.77.2.2")
    in_ns("mcs_r", "sysctl", "-qw", "net.ipv4.ip_forward=1")


def shape(mbit: float) -> str:
    """tbf on the router's egress towards the listener; returns the qdisc as tc shows it."""
    in_ns("mcs_r", "tc", "qdisc", "del", "dev", "mcs_rb", "root", check=False)
    in_ns(
        "mcs_r",
        "tc",
        "qdisc",
        "add",
        "dev",
        "mcs_rb",
        "root",
        "tbf",
        "rate",
        f"{mbit}mbit",
        "burst",
        "8kb",
        "latency",
        "2s",
    )
    return in_ns("mcs_r", "tc", "qdisc", "show", "dev", "mcs_rb").stdout.strip()


def delete_namespaces() -> None:
    for ns in NAMESPACES:
        sh("ip", "netns", "del", ns, check=False)


def netem_available() -> bool:
    result = in_ns("mcs_r", "tc", "qdisc", "add", "dev", "mcs_ra", "root", "netem", "delay", "20ms", check=False)
    if result.returncode == 0:
        in_ns("mcs_r", "tc", "qdisc", "del", "dev", "mcs_ra", "root", check=False)
    return result.returncode == 0


def measure(variant: str, mbit: float, duration: float, dial_ns: str = "mcs_a") -> dict:
    """One measurement: a listener in mcs_b, a dialer in ``dial_ns`` (mcs_b itself: over
    its loopback interface, unshaped); the listener's report."""
    me = [sys.executable, os.path.abspath(__file__)]
    common = ["--variant", variant, "--duration", str(duration), "--mbit", str(mbit)]
    env = dict(os.environ, PYTHONPATH=ROOT)
    listener = subprocess.Popen(
        ["ip", "netns", "exec", "mcs_b", *me, "--role", "listen", *common], stdout=subprocess.PIPE, text=True, env=env
    )
    dialer = None
    try:
        hello = json.loads(listener.stdout.readline())
        dialer = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                dial_ns,
                *me,
                "--role",
                "dial",
                *common,
                "--port",
                str(hello["port"]),
                "--node-id",
                hello.get("node_id") or "",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        result = json.loads(listener.stdout.readline())
        sender = json.loads(dialer.stdout.readline() or "{}")
        result["sender"] = sender
        return result
    finally:
        for process in (dialer, listener):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


# -- the two ends (inside a namespace) ---------------------------------------------


def channels():
    from mconn import ChannelDescriptor

    return [
        ChannelDescriptor(0x10, priority=1, send_queue_capacity=64),
        ChannelDescriptor(0x30, priority=10, send_queue_capacity=1000),
    ]


def committed_below(transport) -> tuple[int, int]:
    """(bytes in Twisted's buffer, unsent bytes in the kernel) of a TCP transport: a
    diagnostic through Twisted's private attributes."""
    twisted_bytes = len(transport.dataBuffer) - transport.offset + transport._tempDataLen
    raw = fcntl.ioctl(transport.getHandle().fileno(), SIOCOUTQNSD, b"\0\0\0\0")
    return twisted_bytes, struct.unpack("i", raw)[0]


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


class Listener:
    """Counts bulk bytes, and timestamps probes and datagrams by sequence number."""

    def __init__(self, clock, args) -> None:
        self.clock, self.args = clock, args
        self.probes: dict[int, tuple[float, float]] = {}  # seq -> (sent, arrived)
        self.datagrams: dict[int, tuple[float, float]] = {}
        self.bulk: list[tuple[float, int]] = []  # (arrived, bytes)
        self.first_sent = None

    def message(self, channel: int, data: bytes) -> None:
        now = time.time()
        if len(data) == PROBE_SIZE:
            seq, sent = _PROBE.unpack_from(data)
            self.probes[seq] = (sent, now)
            if self.first_sent is None:
                self.first_sent = sent
                self.clock.callLater(self.args.duration + 1.0, self.report)
        else:
            self.bulk.append((now, len(data)))

    def datagram(self, data: bytes) -> None:
        seq, sent = _PROBE.unpack_from(data)
        self.datagrams[seq] = (sent, time.time())

    def report(self) -> None:
        start, end = self.first_sent + WARMUP, self.first_sent + self.args.duration
        absolute, added, network = [], [], []
        for seq, (sent, arrived) in self.probes.items():
            if start <= sent <= end and seq in self.datagrams:
                probe, udp = arrived - sent, self.datagrams[seq][1] - sent
                absolute.append(probe * 1000)
                network.append(udp * 1000)
                added.append((probe - udp) * 1000)
        sent_in_window = sum(1 for s, _ in self.probes.values() if start <= s <= end)
        bulk = sum(n for t, n in self.bulk if start <= t <= end)
        goodput = bulk / (end - start) / (self.args.mbit * 1e6 / 8)
        summary = {
            "probes": len(absolute),
            "probes_without_datagram": sent_in_window - len(absolute),
            "goodput_of_shaped_rate": goodput,
        }
        for name, values in (("added_ms", added), ("absolute_ms", absolute), ("network_ms", network)):
            summary[name] = {
                "p50": percentile(values, 50),
                "p99": percentile(values, 99),
                "max": max(values) if values else None,
            }
        print(json.dumps(summary), flush=True)
        self.clock.callLater(0.2, self.clock.stop)


class Dialer:
    """Keeps the bulk channel full, sends a probe and a datagram every 50 ms."""

    def __init__(self, clock, args, send_bulk, send_probe, transport) -> None:
        self.clock, self.args = clock, args
        self.send_probe, self.transport = send_probe, transport
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.seq = 0
        self.info = b""
        self.below: list[tuple[int, int]] = []
        send_bulk()
        self.clock.callLater(0.5, self.probe)
        self.clock.callLater(args.duration + 2.0, self.done)

    def probe(self) -> None:
        self.seq += 1
        sent = time.time()
        head = _PROBE.pack(self.seq, sent)
        transport = self.transport()
        if transport is None:
            return  # the listener is done
        self.below.append(committed_below(transport))
        self.info = transport.getHandle().getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        self.send_probe(head + bytes(PROBE_SIZE - len(head)))
        self.udp.sendto(head, (LISTENER_IP, self.args.port))
        self.clock.callLater(PROBE_INTERVAL, self.probe)

    def done(self) -> None:
        info = self.info  # at the last probe: the listener may have closed by now
        twisted_bytes = [t for t, _ in self.below[20:]]
        total = [t + k for t, k in self.below[20:]]
        print(
            json.dumps(
                {
                    "total_retrans": struct.unpack_from("=I", info, 100)[0] if info else None,
                    "twisted_buffer_p99": percentile(twisted_bytes, 99),
                    "committed_below_p50": percentile(total, 50),
                    "committed_below_p99": percentile(total, 99),
                }
            ),
            flush=True,
        )
        self.clock.stop()


def transport_of(peer):
    protocol = peer._protocol  # a diagnostic: mconn has no public way to the socket
    if protocol is None:
        return None
    return protocol.transport


def run_mconn(clock, args) -> None:
    from twisted.internet.defer import ensureDeferred

    from mconn import Config, Reactor, Switch

    fields = VARIANTS[args.variant]
    config = Config(**fields)

    class Bench(Reactor):
        def get_channels(self):
            return channels()

        def add_peer(self, peer):
            if args.role == "dial":
                self.start(peer)

        def start(self, peer):
            async def fill():
                message = bytes(BULK_SIZE)
                while await peer.send(0x10, message):
                    pass

            Dialer(
                clock,
                args,
                lambda: ensureDeferred(fill()),
                lambda probe: peer.try_send(0x30, probe),
                lambda: transport_of(peer),
            )

        def receive(self, channel_id, peer, message):
            listener.message(channel_id, message)

    switch = Switch([Bench()], config=config, clock=clock)
    switch.startService()
    if args.role == "listen":
        listener = Listener(clock, args)
        listen_udp(clock, listener)
        d = switch.listen(f"tcp:{args.port}:interface={LISTENER_IP}")
        d.addCallback(
            lambda port: print(json.dumps({"port": port.getHost().port, "node_id": switch.node_id}), flush=True)
        )
    else:
        switch.dial(f"{args.node_id}@{LISTENER_IP}:{args.port}")


def listen_udp(clock, listener) -> None:
    from twisted.internet.protocol import DatagramProtocol

    class Datagrams(DatagramProtocol):
        def datagramReceived(self, data, addr):
            listener.datagram(data)

    clock.listenUDP(listener.args.port, Datagrams(), interface=LISTENER_IP)


def run_raw(clock, args) -> None:
    from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
    from twisted.internet.interfaces import IPushProducer
    from twisted.internet.protocol import Factory, Protocol
    from zope.interface import implementer

    listener = Listener(clock, args) if args.role == "listen" else None

    @implementer(IPushProducer)
    class Raw(Protocol):
        """4-byte length, payload; the dialer writes 64 KiB frames until Twisted pauses it."""

        buffer = b""

        def connectionMade(self):
            self.transport.setTcpNoDelay(True)
            if listener is None:
                self.transport.registerProducer(self, True)
                self.frame = struct.pack(">I", BULK_SIZE) + bytes(BULK_SIZE)
                self.paused = False
                Dialer(clock, args, self.resumeProducing, self.send_probe, lambda: self.transport)

        def send_probe(self, probe):
            self.transport.write(struct.pack(">I", len(probe)) + probe)

        def pauseProducing(self):
            self.paused = True

        def resumeProducing(self):
            self.paused = False
            while not self.paused:
                self.transport.write(self.frame)

        def stopProducing(self):
            self.paused = True

        def dataReceived(self, data):
            self.buffer += data
            while len(self.buffer) >= 4:
                (length,) = struct.unpack_from(">I", self.buffer)
                if len(self.buffer) < 4 + length:
                    break
                listener.message(0, self.buffer[4 : 4 + length])
                self.buffer = self.buffer[4 + length :]

    factory = Factory.forProtocol(Raw)
    if args.role == "listen":
        listen_udp(clock, listener)
        d = TCP4ServerEndpoint(clock, args.port, interface=LISTENER_IP).listen(factory)
        d.addCallback(lambda port: print(json.dumps({"port": port.getHost().port}), flush=True))
    else:
        TCP4ClientEndpoint(clock, LISTENER_IP, args.port).connect(factory)


def role_main(args) -> None:
    from twisted.internet import reactor as clock

    (run_raw if args.variant == "raw" else run_mconn)(clock, args)
    clock.callLater(args.duration + 30, clock.stop)  # a hard deadline
    clock.run()


# -- the table ---------------------------------------------------------------------


def bound_ms(mbit: float, config_fields: dict | None) -> float:
    """The target's bound on added p99: the kernel's unsent bound plus two packets'
    serialization plus 5 ms (a packet: the payload the sender cuts at the shaped rate,
    mconn.core.packet_size, and its header, on the wire)."""
    from mconn import Config

    config = Config(**(config_fields or {}))
    lowat = config.tcp_notsent_lowat or 0
    try:
        from mconn.core.packet_size import payload_for_rate
    except ImportError:  # a tree before packets followed the link
        payload = config.max_packet_payload
    else:
        payload = min(config.max_packet_payload, payload_for_rate(mbit * 1e6 / 8, config.write_ahead_time))
    packet = payload + 6 + 52 * (payload + 6) / 1448
    return (lowat + 2 * packet) * 8 / (mbit * 1e6) * 1000 + 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--role", choices=("listen", "dial"))
    parser.add_argument("--variant", default="mconn")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rates", default="20,2", help="shaped rates in Mbit/s")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per measurement")
    parser.add_argument("--mbit", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=27000)
    parser.add_argument("--node-id", default="")
    parser.add_argument(
        "--loopback",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="instead: bulk MB/s of --variants over loopback (both ends in mcs_b), ROUNDS rounds",
    )
    args = parser.parse_args()
    if args.role:
        role_main(args)
        return
    if args.loopback:
        loopback(args)
        return
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "duration": args.duration, "rows": []}
    try:
        make_namespaces()
        results["netem"] = netem_available()
        print(f"netem available: {results['netem']} (no delay is added either way)")
        for mbit in (float(r) for r in args.rates.split(",")):
            qdisc = shape(mbit)
            print(qdisc)
            for variant in args.variants.split(","):
                row = measure(variant, mbit, args.duration)
                row.update(
                    variant=variant,
                    mbit=mbit,
                    qdisc=qdisc,
                    bound_ms=None if variant == "raw" else bound_ms(mbit, VARIANTS[variant]),
                )
                results["rows"].append(row)
                print_row(row)
    finally:
        delete_namespaces()
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    path = os.path.join(HERE, "out", f"shaped-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {path}")


def loopback(args) -> None:
    """Bulk throughput of each variant with both ends in one namespace (no shaping), the
    order reversed every other round; medians and per-round ratios to the first variant."""
    variants = [v for v in args.variants.split(",") if v != "raw"]
    rounds: list[dict] = []
    try:
        make_namespaces()
        for index in range(args.loopback):
            order = variants if index % 2 == 0 else variants[::-1]
            # mbit=8: goodput_of_shaped_rate is then MB/s.
            row = {v: measure(v, 8.0, args.duration, dial_ns="mcs_b")["goodput_of_shaped_rate"] for v in order}
            rounds.append(row)
            print(f"round {index + 1}: " + ", ".join(f"{v} {row[v]:.1f} MB/s" for v in variants), flush=True)
    finally:
        delete_namespaces()
    first = variants[0]
    for v in variants[1:]:
        ratios = sorted(r[v] / r[first] for r in rounds)
        print(f"{v}/{first}: median {percentile(ratios, 50):.3f}, rounds {', '.join(f'{x:.3f}' for x in ratios)}")
    for v in variants:
        print(f"{v}: median {percentile([r[v] for r in rounds], 50):.1f} MB/s")


def print_row(row: dict) -> None:
    def ms(part, key):
        value = row[part][key]
        return "-" if value is None else f"{value:7.1f}"

    sender = row.get("sender", {})
    bound = row["bound_ms"]
    verdict = (
        ""
        if bound is None
        else ("PASS" if row["added_ms"]["p99"] <= bound and row["goodput_of_shaped_rate"] >= 0.9 else "MISS")
    )
    limit = "-" if bound is None else f"{bound:.1f}"
    print(
        f"{row['mbit']:5.0f} Mbit/s {row['variant']:14s} added p50 {ms('added_ms', 'p50')} p99 "
        f"{ms('added_ms', 'p99')} | absolute p50 {ms('absolute_ms', 'p50')} p99 {ms('absolute_ms', 'p99')} | "
        f"network p50 {ms('network_ms', 'p50')} p99 {ms('network_ms', 'p99')} | "
        f"goodput {row['goodput_of_shaped_rate']:.3f} | below p99 {sender.get('committed_below_p99')} B "
        f"(twisted {sender.get('twisted_buffer_p99')}) | retrans {sender.get('total_retrans')} | "
        f"n={row['probes']} | bound {limit} ms {verdict}",
        flush=True,
    )


if __name__ == "__main__":
    main()
