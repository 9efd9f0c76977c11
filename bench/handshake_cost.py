"""CPU of the listener's side of a plaintext handshake, in one process, without sockets.

    PYTHONPATH=<tree> .venv/bin/python bench/handshake_cost.py [--peers 3000] [--rounds 5]
        [--telemetry file|none] [--profile FILE] [--count] [--gc-freeze] [--text-log [twisted|mconn]]

What bench/many_peers.py's storm costs the listening Switch in Python, without the
kernel's accept, read and send or Twisted's event loop: a Switch at the
default Config with the admission limits raised for ``--peers`` (as the storm's), its
telemetry written to a file (``TelemetryFileService``, its batch written every 50
connections, about a storm's reactor turn). The clock is Twisted's reactor, never run:
its ``callLater`` costs what it costs in the storm (a ``task.Clock`` sorts its calls at
every one). Each connection is ``MConnectionFactory.buildProtocol``, ``makeConnection``
on a ``StringTransport`` from one of 200 loopback sources, and ``dataReceived`` of a
dialer's hello with a session request (bench/many_peers_bytes.py): accept, hello
decision, session start and answer, all as the storm's. Prints one JSON line:
microseconds of process time per handshake (the smallest of ``--rounds`` rounds of
``--peers`` connections each, a fresh Switch each round, the garbage collector on), the
sessions connected and the connections whose written bytes end with a session answer,
per round; with ``--count`` the Python and C function calls (``sys.setprofile``),
Deferreds, DelayedCalls and log events per handshake of one more round, and with
``--profile FILE`` a cProfile of one more round. ``--gc-freeze`` calls ``gc.freeze()``
once the round's Switch is built (and ``gc.unfreeze()`` after it), as a node could after
its start. ``--text-log`` adds the observer twistd logs a node's events with (Twisted's
``textFileLogObserver``, into /dev/null): a node run by twistd writes each event as a
line of text too, which the storm's listener does not; ``--text-log mconn`` is the observer
twistd gets from an mconn node (mconn/ops/text_log.py: the same lines, cached). Run it
with the trees to compare on PYTHONPATH, in turns, in the same minutes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from many_peers_bytes import CHANNEL, hello_template  # noqa: E402

SOURCES = [f"127.0.{i // 250}.{2 + i % 250}" for i in range(200)]
#: Connections per simulated reactor turn (the storm's epoll turns hold ~50).
PER_TURN = 50


def _hellos(count: int, seed: int) -> list[bytes]:
    template = hello_template()
    node_at, session_at = template.index(b"\xab" * 20), template.index(b"\xcd" * 16)
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        packet = bytearray(template)
        packet[node_at : node_at + 20] = rng.randbytes(20)
        packet[session_at : session_at + 16] = rng.randbytes(16)
        out.append(bytes(packet))
    return out


def _round(args, tmp: str, seed: int, mode: str = "") -> dict:
    """One round of ``args.peers`` handshakes; ``mode`` "count" or "profile" measures it so."""
    from twisted.internet import reactor as clock
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import StringTransport
    from twisted.logger import globalLogPublisher

    from mconn import ChannelDescriptor, Config, Reactor, Switch
    from mconn.net.protocol import MConnectionFactory
    from mconn.ops.telemetry_file import TelemetryFileService
    from mconn.core.wire import PacketType

    class Quiet(Reactor):
        def get_channels(self):
            return [ChannelDescriptor(CHANNEL, priority=1)]

    limits = {
        "max_inbound_peers": args.peers,
        "max_connections_per_ip": args.peers,
        "max_pending_handshakes": 1024,
        "max_pending_per_group": 1024,
    }
    fields = set(Config.__dataclass_fields__)
    switch = Switch([Quiet()], config=Config(**{k: v for k, v in limits.items() if k in fields}), clock=clock)
    telemetry = None
    if args.telemetry == "file":
        telemetry = TelemetryFileService(
            os.path.join(tmp, f"telemetry-{seed}.jsonl"), switch.node_id, publisher=globalLogPublisher, clock=clock
        )
        telemetry.startService()
    switch.startService()
    factory = MConnectionFactory(switch, is_outbound=False)
    hellos = _hellos(args.peers, seed)
    addresses = [IPv4Address("TCP", SOURCES[i % len(SOURCES)], 40000 + i) for i in range(args.peers)]
    transports = [StringTransport(peerAddress=a) for a in addresses]
    counters = _Counters() if mode == "count" else None
    profiler = None
    if mode == "profile":
        import cProfile

        profiler = cProfile.Profile()
    gc.collect()
    if args.gc_freeze:
        gc.freeze()  # as a node would after its start: what is there now is never traversed again
    if counters is not None:
        counters.start()
    if profiler is not None:
        profiler.enable()
    began = time.process_time()
    for i in range(args.peers):
        proto = factory.buildProtocol(addresses[i])
        proto.makeConnection(transports[i])
        proto.dataReceived(hellos[i])
        if telemetry is not None and i % PER_TURN == PER_TURN - 1:
            telemetry._writer.flush()  # the end of a reactor turn: telemetry writes its batch
    if telemetry is not None:
        telemetry._writer.flush()
    spent = time.process_time() - began
    if args.gc_freeze:
        gc.unfreeze()  # the next round starts as this one did
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    counts = counters.stop(args.peers) if counters is not None else None
    answer = bytes([PacketType.SESSION])
    answered = sum(1 for t in transports if answer in t.value()[-40:])
    connected = sum(1 for p in switch.peers.values() if p.state == "connected")
    switch._stats_loop and switch._stats_loop.running and switch._stats_loop.stop()
    if telemetry is not None:
        telemetry.stopService()
    return {
        "us_per_handshake": spent / args.peers * 1e6,
        "connected": connected,
        "answered": answered,
        "counts": counts,
    }


class _Counters:
    """Python function calls (sys.setprofile), Deferreds, DelayedCalls and log events
    made during one round, per handshake."""

    def __init__(self) -> None:
        self.calls = 0
        self.made = {"Deferred": 0, "DelayedCall": 0, "log events": 0}

    def start(self) -> None:
        from twisted.internet import base, defer
        from twisted.logger import globalLogPublisher

        made = self.made
        self._patched = []
        for cls, name in ((defer.Deferred, "Deferred"), (base.DelayedCall, "DelayedCall")):
            init = cls.__init__

            def counting(obj, *a, _init=init, _name=name, **k):
                made[_name] += 1
                _init(obj, *a, **k)

            self._patched.append((cls, init))
            cls.__init__ = counting
        self._observer = lambda event: made.__setitem__("log events", made["log events"] + 1)
        globalLogPublisher.addObserver(self._observer)

        def profile(frame, event, arg):
            if event == "call" or event == "c_call":
                self.calls += 1

        sys.setprofile(profile)

    def stop(self, peers: int) -> dict:
        from twisted.logger import globalLogPublisher

        sys.setprofile(None)
        for cls, init in self._patched:
            cls.__init__ = init
        globalLogPublisher.removeObserver(self._observer)
        out = {name: round(count / peers, 2) for name, count in self.made.items()}
        out["calls (Python and C)"] = round(self.calls / peers, 1)
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--telemetry", choices=["file", "none"], default="file")
    parser.add_argument("--profile", default=None, help="cProfile of the counted round, to FILE")
    parser.add_argument("--count", action="store_true", help="count calls, Deferreds, DelayedCalls, log events")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() before each round (the process's objects then)"
    )
    parser.add_argument(
        "--text-log",
        nargs="?",
        const="twisted",
        choices=["twisted", "mconn"],
        help="also twistd's text log of every event (to /dev/null): Twisted's textFileLogObserver (the default), "
        "or mconn's, which twistd uses for a node",
    )
    args = parser.parse_args()
    from twisted.logger import globalLogBeginner, textFileLogObserver

    import mconn

    # twistd's log file observer: a node run by twistd writes every event as a line of text
    from mconn.ops.text_log import text_file_log_observer

    observers = {"twisted": textFileLogObserver, "mconn": text_file_log_observer}
    text = [observers[args.text_log](open(os.devnull, "w"))] if args.text_log else []
    globalLogBeginner.beginLoggingTo(text, discardBuffer=True, redirectStandardIO=False)
    tmp = tempfile.mkdtemp(prefix="mconn-handshake-cost-")
    try:
        rounds = [_round(args, tmp, seed) for seed in range(args.rounds)]
        out = {
            "mconn": os.path.dirname(mconn.__file__),
            "peers": args.peers,
            "text_log": args.text_log,
            "us_per_handshake": round(min(r["us_per_handshake"] for r in rounds), 1),
            "rounds_us": [round(r["us_per_handshake"], 1) for r in rounds],
            "connected": [r["connected"] for r in rounds],
            "answered": [r["answered"] for r in rounds],
        }
        if args.count:
            out["per_handshake"] = _round(args, tmp, args.rounds, "count")["counts"]
        if args.profile:
            _round(args, tmp, args.rounds + 1, "profile")
        print(json.dumps(out))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
