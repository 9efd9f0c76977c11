"""WebSocket transports against TCP and TLS mconn, all in the same run (specs/websocket.md).

    .venv/bin/python bench/ws_bench.py [--duration S] [--repeat N] [--rtt-count N]
        [--scenarios bulk,small,rtt,handshake,layer] [--impls mconn,mconn_ws,mconn_tls,mconn_wss]
        [--json PATH] [--profile DIR]

Four transports of mconn, the same measurements over each:

* ``mconn``: plaintext mconn over TCP (default Config), the baseline of ``ws``;
* ``mconn_ws``: the same over ws:// (binary WebSocket messages, the dialer masking);
* ``mconn_tls``: mconn with TLS first (identity mode, TLS 1.3), the baseline of ``wss``;
* ``mconn_wss``: the same TLS beneath a wss:// WebSocket.

The measurements are bench/scenarios.py's (as bench/tls_bench.py's, whose receiver
plumbing this file shares): ``bulk`` (1 MiB messages, MiB/s), ``small`` (100-byte
messages, msg/s), ``rtt`` (one 100-byte echo at a time, p50 and p99), ``handshake``
(sequential connect, one echo, close; connections/s, from 32 client Switches). Each round
runs every transport against its own receiver process (this file, ``--role receiver``),
the order reversed every other round; the table shows medians, and medians of the
per-round ratios ws/tcp and wss/tls. CPU per unit of work of both processes is shown too:
on a shared machine it is steadier than the rates.

``--profile DIR`` runs each receiver under cProfile (DIR/<impl>-<round>-receiver.prof)
and profiles the sender's side of each transport too (DIR/<impl>-<round>-sender.prof);
profiled figures are not the real ones.

Each scenario also shows ``send cpu`` and ``recv cpu``: the CPU per unit of each process
alone, whose ratios say which side a slower transport costs more.

``layer`` measures the WebSocket layer alone, with no sockets: a dialer's carrier
framing and masking bulk writes (64 KiB and 40 bytes of packet headers, as the protocol
above writes them) into a transport that drops them, and a listener's carrier reading
the frames back in 64 KiB reads for a protocol that drops them; CPU microseconds per MiB
of each side (best of 5), in one process on the compiled twin (mconn/net/_wsframe.pyx)
and in another with ``MCONN_PURE=1``, alternating, ``--repeat`` times; the table shows
medians and the ratio. That is what ws adds to TCP's CPU per MiB.

Targets: ws bulk >= 0.9 of TCP mconn, small >= 0.7, round trip <= 1.3x.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

from links import LinkReactor  # noqa: E402
from scenarios import Sink  # noqa: E402
from tls_bench import CHANNELS, CONFIG, RECEIVER_CONFIG, _StdinWatch, figures  # noqa: E402
from tls_bench import Receiver as TlsReceiver, handshakes as tls_handshakes, parse_args, scenario_run  # noqa: E402

from mconn import NodeKey  # noqa: E402

SCENARIOS = ("bulk", "small", "rtt", "handshake", "layer")
#: The scenarios measured over sockets, by each transport (``layer`` is not).
LINK_SCENARIOS = ("bulk", "small", "rtt", "handshake")
IMPLS = ("mconn", "mconn_ws", "mconn_tls", "mconn_wss")
PATH = "/mconn"
#: impl -> (TLS options?, listen endpoint, dial address template)
TRANSPORTS = {
    "mconn": (False, "tcp:0:interface=127.0.0.1", "{id}@127.0.0.1:{port}"),
    "mconn_ws": (False, f"ws:tcp:0:interface=127.0.0.1:path={PATH}", "{id}@ws://127.0.0.1:{port}" + PATH),
    "mconn_tls": (True, "tcp:0:interface=127.0.0.1", "{id}@127.0.0.1:{port}"),
    "mconn_wss": (True, f"wss:tcp:0:interface=127.0.0.1:path={PATH}", "{id}@wss://127.0.0.1:{port}" + PATH),
}
#: (row label, numerator, denominator) of the ratios shown.
RATIOS = (("ws/tcp", "mconn_ws", "mconn"), ("wss/tls", "mconn_wss", "mconn_tls"), ("wss/tcp", "mconn_wss", "mconn"))


def tls_options(impl: str, key: NodeKey):
    if not TRANSPORTS[impl][0]:
        return None
    from mconn.net.tls import TLSOptions

    return TLSOptions.identity(key)


# -- the receiver --------------------------------------------------------------------


def receiver(impl: str) -> int:
    from twisted.internet import reactor

    from mconn import Switch

    def report(result: dict) -> None:
        if "B" in result or "S" in result:
            result["cpu_s"] = time.process_time()
            print(json.dumps(result), flush=True)

    def on_link(link) -> None:
        link.handler = Sink(link, report)

    key = NodeKey.generate()
    switch = Switch(
        [LinkReactor(CHANNELS, on_link)],
        node_key=key,
        tls=tls_options(impl, key),
        config=RECEIVER_CONFIG,
        clock=reactor,
    )
    switch.startService()
    d = switch.listen(TRANSPORTS[impl][1])
    d.addCallback(lambda port: print(port.getHost().port, switch.node_id, flush=True))
    d.addErrback(lambda failure: (print(failure.getTraceback(), file=sys.stderr, flush=True), reactor.stop()))
    reactor.addReader(_StdinWatch(reactor))
    reactor.run()
    return 0


# -- the sender ------------------------------------------------------------------------


class Connector:
    """A client Switch of one transport; ``connect()`` fires with a new link to the receiver."""

    def __init__(self, impl: str, port: int, node_id: str, clock) -> None:
        from mconn import Switch

        self.address = TRANSPORTS[impl][2].format(id=node_id, port=port)
        key = NodeKey.generate()
        self._pending = None
        self.switch = Switch(
            [LinkReactor(CHANNELS, self._on_link)], node_key=key, tls=tls_options(impl, key), config=CONFIG, clock=clock
        )
        self.switch.startService()

    def _on_link(self, link) -> None:
        d, self._pending = self._pending, None
        d.callback(link)

    def connect(self):
        from twisted.internet import defer

        self._pending = d = defer.Deferred()
        self.switch.dial(self.address).addErrback(d.errback)
        return d

    def stop(self):
        return self.switch.stopService()


class Receiver(TlsReceiver):
    """A receiver process of this file; its stdout lines arrive on ``lines``."""

    script = os.path.abspath(__file__)


async def handshakes(impl: str, receiver, duration: float, clock) -> dict:
    """tls_bench's handshake measurement over this file's Connector (every scheme)."""
    return await tls_handshakes(impl, receiver, duration, clock, connector_type=Connector)


async def measure(impl: str, args, clock, n: int = 0) -> dict:
    profile = sender_profile = None
    if args.profile:
        import cProfile

        os.makedirs(args.profile, exist_ok=True)
        profile = os.path.join(args.profile, f"{impl}-{n + 1}-receiver.prof")
        sender_profile = cProfile.Profile()
    receiver = Receiver(impl, clock, profile)
    results = {}
    try:
        await receiver.start(clock)
        connector = Connector(impl, receiver.port, receiver.node_id, clock)
        try:
            for scenario in ("bulk", "small", "rtt"):
                if scenario in args.scenarios:
                    if sender_profile is not None:
                        sender_profile.enable()
                    try:
                        results[scenario] = await scenario_run(connector, receiver, scenario, args, clock)
                    finally:
                        if sender_profile is not None:
                            sender_profile.disable()
        finally:
            await connector.stop()
        if sender_profile is not None:
            sender_profile.dump_stats(os.path.join(args.profile, f"{impl}-{n + 1}-sender.prof"))
        if "handshake" in args.scenarios:
            results["handshake"] = await handshakes(impl, receiver, args.duration, clock)
    finally:
        await receiver.stop(clock)
    return results


def _figures(scenario: str, r: dict) -> dict:
    """tls_bench's figures, and the CPU per unit of each process alone."""
    out = figures(scenario, r)
    both = (r["send_cpu_s"] + r["recv_cpu_s"]) / out["cpu us/unit"]  # the units of work / 1e6
    out["send cpu"] = r["send_cpu_s"] / both
    out["recv cpu"] = r["recv_cpu_s"] / both
    return out


def table(rounds: list[dict], scenarios, impls) -> list[dict]:
    rows = []
    for scenario in scenarios:
        per_round = [{impl: _figures(scenario, r[impl][scenario]) for impl in impls} for r in rounds]
        for name in per_round[0][impls[0]]:
            row = {"scenario": scenario, "figure": name}
            for impl in impls:
                row[impl] = statistics.median(f[impl][name] for f in per_round)
            for label, top, bottom in RATIOS:
                if top in impls and bottom in impls:
                    row[label] = statistics.median(f[top][name] / f[bottom][name] for f in per_round)
            rows.append(row)
    return rows


def print_table(rows, impls) -> None:
    columns = list(impls) + [label for label, top, bottom in RATIOS if top in impls and bottom in impls]
    print(f"{'scenario':<10} {'figure':<12}" + "".join(f" {c:>11}" for c in columns))
    for row in rows:
        cells = [f" {row[c]:>11.3f}" if "/" in c else f" {row[c]:>11.1f}" for c in columns]
        print(f"{row['scenario']:<10} {row['figure']:<12}" + "".join(cells))


# -- the WebSocket layer alone ---------------------------------------------------------

#: A bulk write of the protocol above: a 64 KiB packet payload and its packet headers.
LAYER_WRITE = 65536 + 40
#: Writes per timed pass (about 250 MiB).
LAYER_WRITES = 4000


def _open_carriers():
    """A dialer's and a listener's carrier, upgraded to each other over StringTransports,
    each carrying a protocol that drops what it reads."""
    from twisted.internet.protocol import Factory, Protocol
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport

    from mconn import Config
    from mconn.net.websocket import WebSocketClientCarrierFactory, WebSocketServerCarrierFactory

    class Drop(Protocol):
        def dataReceived(self, data: bytes) -> None:
            pass

    clock, config = Clock(), Config()
    server = WebSocketServerCarrierFactory(
        Factory.forProtocol(Drop), path=PATH, secure=False, config=config, clock=clock
    ).buildProtocol(None)
    client = WebSocketClientCarrierFactory(
        Factory.forProtocol(Drop), url=f"ws://127.0.0.1:1{PATH}", config=config, clock=clock
    ).buildProtocol(None)
    to_server, to_client = StringTransport(), StringTransport()
    server.makeConnection(to_server)
    client.makeConnection(to_client)
    for _ in range(4):  # the upgrade: request, answer
        for transport, peer in ((to_client, server), (to_server, client)):
            data = transport.value()
            transport.clear()
            if data:
                peer.dataReceived(data)
    if not (server.state == client.state == client.STATE_OPEN):
        raise RuntimeError(f"the carriers did not open (states {server.state}, {client.state})")
    return client, to_client, server


def layer_cost() -> dict:
    """CPU us per MiB of the WebSocket layer alone, each side (see the module docstring)."""
    from mconn.net import websocket_frames

    client, transport, server = _open_carriers()
    payload = os.urandom(LAYER_WRITE)
    written: list[bytes] = []
    transport.write = written.append
    for _ in range(16):
        client.write(payload)
    stream = b"".join(written)
    reads = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]
    transport.write = lambda data: None
    mib = LAYER_WRITES * LAYER_WRITE / 2**20
    send = recv = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(LAYER_WRITES):
            client.write(payload)
        send = min(send, (time.process_time() - start) / mib * 1e6)
        start = time.process_time()
        for _ in range(LAYER_WRITES // 16):
            for data in reads:
                server.dataReceived(data)
        recv = min(recv, (time.process_time() - start) / mib * 1e6)
    return {"implementation": websocket_frames.describe(), "send": send, "recv": recv}


def layer_rounds(repeat: int) -> list[dict]:
    """``layer_cost`` in a process on the compiled twin and one on pure Python, ``repeat`` times."""
    import subprocess

    program = f"import json, sys; sys.path[:0] = {[os.path.dirname(HERE), HERE]!r}; import ws_bench; "
    program += "print(json.dumps(ws_bench.layer_cost()))"
    rounds = []
    for n in range(repeat):
        row = {}
        for name in ("compiled", "pure") if n % 2 == 0 else ("pure", "compiled"):
            env = {k: v for k, v in os.environ.items() if k != "MCONN_PURE"}
            if name == "pure":
                env["MCONN_PURE"] = "1"
            print(f"round {n + 1}/{repeat}: ws layer, {name} ...", file=sys.stderr, flush=True)
            out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True)
            row[name] = json.loads(out.stdout)
        rounds.append(row)
    return rounds


def print_layer(rounds: list[dict]) -> None:
    print(f"ws layer alone, CPU us per MiB (medians of {len(rounds)}): {rounds[0]['compiled']['implementation']}")
    print(f"{'side':<10} {'compiled':>11} {'pure':>11} {'ratio':>11}")
    for side in ("send", "recv"):
        compiled = statistics.median(r["compiled"][side] for r in rounds)
        pure = statistics.median(r["pure"][side] for r in rounds)
        ratio = statistics.median(r["compiled"][side] / r["pure"][side] for r in rounds)
        print(f"{side:<10} {compiled:>11.1f} {pure:>11.1f} {ratio:>11.3f}")


def sender(args) -> int:
    from twisted.internet import defer, reactor

    rounds, outcome = [], {}
    links = [s for s in args.scenarios if s in LINK_SCENARIOS]

    async def run():
        for n in range(args.repeat if links else 0):
            order = args.impls if n % 2 == 0 else args.impls[::-1]
            results = {}
            for impl in order:
                print(f"round {n + 1}/{args.repeat}: {impl} ...", file=sys.stderr, flush=True)
                results[impl] = await measure(impl, args, reactor, n)
            rounds.append(results)

    def done(result):
        outcome["result"] = result
        reactor.stop()

    reactor.callWhenRunning(lambda: defer.ensureDeferred(run()).addBoth(done))
    reactor.run()
    if outcome.get("result") is not None:
        outcome["result"].raiseException()
    layer = layer_rounds(args.repeat) if "layer" in args.scenarios else []
    rows = table(rounds, links, args.impls) if links else []
    load = os.getloadavg()
    print(f"ws_bench: {args.repeat} rounds, {args.duration}s each (medians); load average {load[0]:.1f} {load[1]:.1f}")
    if rows:
        print_table(rows, args.impls)
    if layer:
        print_layer(layer)
    if args.json:
        with open(args.json, "w") as f:
            document = {"settings": vars(args), "load": load, "rows": rows, "rounds": rounds, "layer": layer}
            json.dump(document, f, indent=1, default=str)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv, __doc__, IMPLS, SCENARIOS)
    if args.role == "receiver":
        return receiver(args.impl)
    return sender(args)


if __name__ == "__main__":
    sys.exit(main())
