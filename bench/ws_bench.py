"""WebSocket transports against TCP and TLS mconn, all in the same run (specs/websocket.md).

    .venv/bin/python bench/ws_bench.py [--duration S] [--repeat N] [--rtt-count N]
        [--scenarios bulk,small,rtt,handshake] [--impls mconn,mconn_ws,mconn_tls,mconn_wss]
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

SCENARIOS = ("bulk", "small", "rtt", "handshake")
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


def sender(args) -> int:
    from twisted.internet import defer, reactor

    rounds, outcome = [], {}

    async def run():
        for n in range(args.repeat):
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
    rows = table(rounds, args.scenarios, args.impls)
    load = os.getloadavg()
    print(f"ws_bench: {args.repeat} rounds, {args.duration}s each (medians); load average {load[0]:.1f} {load[1]:.1f}")
    print_table(rows, args.impls)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "load": load, "rows": rows, "rounds": rounds}, f, indent=1, default=str)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv, __doc__, IMPLS, SCENARIOS)
    if args.role == "receiver":
        return receiver(args.impl)
    return sender(args)


if __name__ == "__main__":
    sys.exit(main())
