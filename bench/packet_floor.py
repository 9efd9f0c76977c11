"""CPU per MiB sent to a peer by the max_packet_payload it announces, and per MiB
received by the packets it sends: what the floor of 1024 (config.MIN_PACKET_PAYLOAD)
bounds, and what it does not.

    PYTHONPATH=<tree> .venv/bin/python bench/packet_floor.py [--mib 64] [--repeat 3] [--loopback-mib 64]

Sans-I/O, process time only (no event loop, no kernel): the per-packet work is the
core's, since the adapter writes ``write_batch_bytes`` at a time whatever the packets.

* **send**: a default ``Connection`` gets the hello of a peer announcing 65536, 1024 (the
  floor) or, as before the floor, 1 (no hello may announce it now: the negotiated size is
  forced to 1 on the sender, as a hello of 1 negotiated it before); it cuts ``--mib`` MiB
  of 1 MiB messages (1/64 of that at payload 1) with ``data_to_send``, its packet size at
  the negotiated maximum (what the adapter sets on loopback).
* **receive**: a default ``Connection`` is fed, in 64 KiB reads, the streams the sender
  cut at 65536 and at 1024, the 1024-byte packets of two channels' messages alternating
  packet by packet (no two packets of a channel in a row: each alone, no run), and two
  streams a peer may still send whatever it announces (a receiver accepts any payload up
  to the negotiated maximum): messages cut into 1-byte packets, and empty messages (a
  4-byte packet each). Per MiB of wire bytes.

* **loopback**: the same through the whole stack, as the attack measured it: a default
  Switch in this process sends ``--loopback-mib`` MiB in 1 MiB messages over plain TCP on
  127.0.0.1 to a Switch in a child process configured with ``max_packet_payload`` 65536
  or 1024 (the floor: no Config or hello may announce less now), and the CPU time of
  this process (user + system, the child's not counted) from the session to the last
  message confirmed, per MiB.

Prints one JSON line per repeat, and the medians with their ratios to 64 KiB packets;
then the loopback's CPU per MiB at the floor over 64 KiB packets, the median of the
per-round ratios, against its target (at most 1.5), with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from mconn.core.channel import ChannelDescriptor
from mconn.config import Config
from mconn.core.connection import Connection
from mconn.core.handshake import hello_packet, make_hello
from mconn.core.wire import PacketType, encode_packet

CHANNEL = 0x10
#: The second channel of the alternating stream (receive only).
OTHER = 0x11
#: The bound on the whole stack's CPU per MiB at the floor over the default's (64 KiB packets).
FLOOR_TARGET = 1.5
CHANNELS = [ChannelDescriptor(CHANNEL, send_queue_capacity=64, recv_message_capacity=1 << 21)]
MIB = 1 << 20
READ = 65536


def connection(node_id: str, channels: list[ChannelDescriptor] = CHANNELS) -> Connection:
    config = Config()
    hello = make_hello(node_id=node_id, channels=channels, max_packet_payload=config.max_packet_payload)
    return Connection(config=config, hello=hello, channels=channels, now=0.0)


def sender_to(payload: int) -> Connection:
    """A sender whose peer announced ``payload`` (1: forced, as before the floor)."""
    sender = connection("a" * 40)
    announced = max(payload, 1024)
    peer = make_hello(node_id="b" * 40, channels=CHANNELS, max_packet_payload=announced)
    sender.receive_data(hello_packet(peer), 0.0)
    if payload < announced:
        sender.max_packet_payload = payload  # what a hello announcing it negotiated before
    sender.set_packet_payload(None)
    sender.data_to_send(0.0)  # our hello
    return sender


def send(payload: int, mib: float) -> tuple[float, bytes]:
    """Seconds of process time per MiB sent at ``payload``, and the bytes sent."""
    sender = sender_to(payload)
    message = bytes(MIB) if mib >= 1 else bytes(int(mib * MIB))
    count = max(1, int(mib))
    out = []
    spent = 0.0
    for _ in range(count):
        sender.queue_message(CHANNEL, message)
        while True:
            start = time.process_time()
            data = sender.data_to_send(1.0)
            spent += time.process_time() - start
            if not data:
                break
            out.append(data)
    return spent / (count * len(message) / MIB), b"".join(out)


def receive(stream: bytes, channels: list[ChannelDescriptor] = CHANNELS) -> float:
    """Seconds of process time per MiB of ``stream`` fed to a receiver in 64 KiB reads."""
    receiver = connection("b" * 40, channels)
    sender_hello = make_hello(node_id="a" * 40, channels=channels, max_packet_payload=65536)
    receiver.receive_data(hello_packet(sender_hello), 0.0)
    spent = 0.0
    for at in range(0, len(stream), READ):
        chunk = stream[at : at + READ]
        start = time.process_time()
        receiver.receive_data(chunk, 1.0)
        spent += time.process_time() - start
    return spent / (len(stream) / MIB)


def alternating_packets(mib: float, payload: int = 1024) -> bytes:
    """1 MiB messages of CHANNEL and OTHER, two at a time, their ``payload``-byte packets
    alternating: ``mib`` MiB of payload in all."""
    message = bytes(MIB)
    count = MIB // payload
    pair = b"".join(
        encode_packet(
            PacketType.MSG, channel_id=channel, eof=i == count - 1, data=message[i * payload : (i + 1) * payload]
        )
        for i in range(count)
        for channel in (CHANNEL, OTHER)
    )
    return pair * max(1, int(mib / 2))


def one_byte_packets(size: int) -> bytes:
    packet = encode_packet(PacketType.MSG, channel_id=CHANNEL, eof=False, data=b"\0")
    last = encode_packet(PacketType.MSG, channel_id=CHANNEL, eof=True, data=b"\0")
    return packet * (size - 1) + last


def empty_messages(size: int) -> bytes:
    return encode_packet(PacketType.MSG, channel_id=CHANNEL, eof=True, data=b"") * (size // 4)


def run(mib: float) -> dict:
    result = {}
    streams = {}
    for payload in (65536, 1024, 1):
        seconds, streams[payload] = send(payload, mib if payload > 1 else mib / 64)
        result[f"send_s_per_MiB_at_{payload}"] = seconds
    result["receive_s_per_MiB_of_65536_packets"] = receive(streams[65536])
    result["receive_s_per_MiB_of_1024_packets"] = receive(streams[1024])
    two = [*CHANNELS, ChannelDescriptor(OTHER, send_queue_capacity=64, recv_message_capacity=1 << 21)]
    result["receive_s_per_MiB_of_1024_packets_alternating"] = receive(alternating_packets(mib), two)
    result["receive_s_per_MiB_of_1_byte_packets"] = receive(one_byte_packets(int(mib * MIB / 64)))
    result["receive_s_per_MiB_of_empty_messages"] = receive(empty_messages(int(mib * MIB / 16)))
    return result


# -- loopback -------------------------------------------------------------------------


def receiver(payload: int, mib: int) -> None:
    """The child: a Switch announcing ``payload`` that takes ``mib`` messages and stops."""
    from twisted.internet import reactor as twisted_reactor

    from mconn import Reactor, Switch

    class Count(Reactor):
        got = 0

        def get_channels(self):
            return CHANNELS

        def receive(self, channel_id, peer, message):
            self.got += 1
            if self.got == mib:
                twisted_reactor.callLater(0.5, twisted_reactor.stop)

    switch = Switch([Count()], clock=twisted_reactor, config=Config(max_packet_payload=payload, stats_interval=0))
    switch.startService()

    def listening(port):
        print(json.dumps({"port": port.getHost().port, "node_id": switch.node_id}), flush=True)

    switch.listen("tcp:0:interface=127.0.0.1").addCallback(listening)
    twisted_reactor.callLater(120, twisted_reactor.stop)  # a hard deadline
    twisted_reactor.run()


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def loopback(payload: int, mib: int) -> float:
    """CPU seconds of this process per MiB sent to a child Switch announcing ``payload``."""
    from twisted.internet import defer
    from twisted.internet import reactor as twisted_reactor

    from mconn import Reactor, Switch

    class Quiet(Reactor):
        def get_channels(self):
            return CHANNELS

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, __file__, "--receiver", str(payload), "--loopback-mib", str(mib)],
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    switch = Switch([Quiet()], clock=twisted_reactor, config=Config(stats_interval=0))
    try:
        hello = json.loads(child.stdout.readline())
        switch.startService()
        peer = await switch.dial(f"{hello['node_id']}@127.0.0.1:{hello['port']}")
        message = bytes(MIB)
        start = cpu_seconds()
        confirmed = await defer.gatherResults([peer.send_confirmed(CHANNEL, message) for _ in range(mib)])
        if not all(confirmed):
            raise RuntimeError(f"{confirmed.count(False)} of {mib} messages not accepted")
        return (cpu_seconds() - start) / mib
    finally:
        await switch.stopService()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 9)
            child.wait()


def loopback_runs(mib: int, repeat: int) -> dict:
    """``repeat`` rounds of ``loopback`` at 65536 and 1024, in one run of the reactor."""
    from twisted.internet import defer, task

    out: dict = {65536: [], 1024: []}

    async def rounds(_reactor):
        for _ in range(repeat):
            for payload in out:
                out[payload].append(await loopback(payload, mib))
            print(json.dumps({f"loopback_s_per_MiB_at_{p}": v[-1] for p, v in out.items()}), flush=True)

    try:
        task.react(lambda r: defer.ensureDeferred(rounds(r)))
    except SystemExit as done:
        if done.code:
            raise
    medians = {f"loopback_s_per_MiB_at_{p}": statistics.median(v) for p, v in out.items()}
    medians["rounds_1024_over_65536"] = [a / b for a, b in zip(out[1024], out[65536], strict=True)]
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=64, help="MiB sent at 64 KiB and 1 KiB packets (1/64 of it at 1)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--loopback-mib", type=int, default=64, help="MiB sent over loopback per peer (0: skip)")
    parser.add_argument("--receiver", type=int, help=argparse.SUPPRESS)  # the child of the loopback run
    args = parser.parse_args()
    if args.receiver is not None:
        receiver(args.receiver, args.loopback_mib)
        return
    runs = []
    for _ in range(args.repeat):
        runs.append(run(args.mib))
        print(json.dumps(runs[-1]))
    medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    base_send = medians["send_s_per_MiB_at_65536"]
    base_receive = medians["receive_s_per_MiB_of_65536_packets"]
    for key, value in medians.items():
        base = base_send if key.startswith("send") else base_receive
        print(f"{key:48} {value * 1000:9.2f} ms  {value / base:7.1f}x 64 KiB packets")
    print(f"{'send at 1 / send at 1024':48} {medians['send_s_per_MiB_at_1'] / medians['send_s_per_MiB_at_1024']:9.1f}x")
    if args.loopback_mib:
        load = os.getloadavg()[0]
        wire = loopback_runs(args.loopback_mib, args.repeat)
        rounds = wire.pop("rounds_1024_over_65536")
        for key, value in wire.items():
            ratio = value / wire["loopback_s_per_MiB_at_65536"]
            print(f"{key:48} {value * 1000:9.2f} ms  {ratio:7.2f}x 64 KiB packets")
        # The target: at the floor a peer costs us at most FLOOR_TARGET x the default's CPU per MiB.
        ratio = statistics.median(rounds)
        print(
            f"{'loopback, floor / 64 KiB, per round':48} {ratio:9.2f}x  "
            f"({min(rounds):.2f}..{max(rounds):.2f}; target <= {FLOOR_TARGET}: "
            f"{'PASS' if ratio <= FLOOR_TARGET else 'MISS'}); load average {load:.1f} to {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
