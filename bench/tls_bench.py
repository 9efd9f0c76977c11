"""TLS against plaintext mconn and raw Twisted, all in the same run (specs/tls.md).

    .venv/bin/python bench/tls_bench.py [--duration S] [--repeat N] [--rtt-count N]
        [--scenarios bulk,small,rtt,handshake] [--impls raw,raw_tls,mconn,mconn_tls]
        [--json PATH] [--profile DIR]

Four transports, the same measurements over each:

* ``raw``: raw Twisted, the baseline of bench/run.py (links.RawLink: a 4-byte length,
  then the payload; batched writes; no channels);
* ``raw_tls``: the same RawLink over mconn's TLS transport and contexts (identity mode,
  TLS 1.3): what TLS alone costs;
* ``mconn``: plaintext mconn (default Config);
* ``mconn_tls``: mconn with TLS first (identity mode, TLS 1.3).

The measurements are bench/scenarios.py's, written against the link interface of
bench/links.py, so every transport is driven by the same code:

* ``bulk``: 1 MiB messages, the queue kept full, for ``duration`` seconds; MiB/s as the
  receiver measures it (scenarios.Sink);
* ``small``: 100-byte messages, likewise; messages/s;
* ``rtt``: one 100-byte message echoed at a time, up to ``rtt_count``; p50 and p99;
* ``handshake``: sequential connections for ``duration`` seconds, each one connect, one
  100-byte echo (so the connection is proven usable: for mconn the hello and session
  answer, for TLS the handshake), then close; connections/s. mconn dials come from a
  pool of 32 client Switches used round-robin. Also ``mconn_upgrade``: the plaintext
  start that upgrades (pre-hello, then TLS) to the same listener, which is built with
  ``tls_required=False`` so it takes both starts.

Each round starts, for each transport in turn (the order reverses every other round), a
receiver process (this file, ``--role receiver``) that listens on 127.0.0.1, prints its
port and node id and then one JSON line per bulk/small measurement; this process dials it.
Every figure also gets the CPU time per unit of work of both processes (``cpu_us``): on
a machine whose cores are shared, rates wobble and CPU cost much less. The table shows
medians over the rounds, and medians of the per-round ratios TLS/plaintext-mconn,
TLS/raw, raw_tls/raw and mconn_tls/raw_tls. A receiver is stopped by closing its stdin,
and killed by its PID if it has not exited 5 s later. ``--profile DIR`` runs each
receiver under cProfile (DIR/<impl>-<round>.prof); profiled figures are not the real ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

from links import LinkReactor, raw_factory  # noqa: E402
from scenarios import BULK_CHANNEL, ROUND_TRIP, RTT_CHANNEL, SMALL_CHANNEL, SMALL_SIZE, Sender, Sink, padded  # noqa: E402

from mconn import Config, NodeKey  # noqa: E402

CHANNELS = [BULK_CHANNEL, SMALL_CHANNEL, RTT_CHANNEL]
CONFIG = Config(stats_interval=0, resume_grace=0)
#: The handshake scenario closes connections as fast as it opens them: the closes still
#: in progress must not trip the listener's per-IP and pending limits.
RECEIVER_CONFIG = CONFIG.replace(max_connections_per_ip=1000, max_pending_handshakes=1000, max_pending_per_group=1000)
SCENARIOS = ("bulk", "small", "rtt", "handshake")
IMPLS = ("raw", "raw_tls", "mconn", "mconn_tls")
CLIENTS = 32
#: (row label, numerator, denominator) of the ratios shown.
RATIOS = (
    ("tls/mconn", "mconn_tls", "mconn"),
    ("tls/raw", "mconn_tls", "raw"),
    ("raw_tls/raw", "raw_tls", "raw"),
    ("tls/raw_tls", "mconn_tls", "raw_tls"),
    ("upgrade/tls", "mconn_upgrade", "mconn_tls"),
)


def tls_options(impl: str, node_key: NodeKey, *, listener: bool = False):
    if impl not in ("raw_tls", "mconn_tls", "mconn_upgrade"):
        return None
    from mconn.net.tls import TLSOptions

    return TLSOptions.identity(node_key, tls_required=not listener, upgrade=impl == "mconn_upgrade")


# -- the receiver --------------------------------------------------------------------


def receiver(impl: str) -> int:
    from twisted.internet import reactor

    def report(result: dict) -> None:
        if "B" in result or "S" in result:  # a bulk or small measurement; not rtt or handshakes
            result["cpu_s"] = time.process_time()
            print(json.dumps(result), flush=True)

    def on_link(link) -> None:
        link.handler = Sink(link, report)

    key = NodeKey.generate()
    if impl.startswith("raw"):
        d = _raw_listen(reactor, impl, key, on_link)
        d.addCallback(lambda port: print(port.getHost().port, key.node_id, flush=True))
    else:
        from mconn import Switch

        tls = tls_options(impl, key, listener=True)
        switch = Switch([LinkReactor(CHANNELS, on_link)], node_key=key, tls=tls, config=RECEIVER_CONFIG, clock=reactor)
        switch.startService()
        d = switch.listen("tcp:0:interface=127.0.0.1")
        d.addCallback(lambda port: print(port.getHost().port, switch.node_id, flush=True))
    d.addErrback(lambda failure: (print(failure.getTraceback(), file=sys.stderr, flush=True), reactor.stop()))
    reactor.addReader(_StdinWatch(reactor))
    reactor.run()
    return 0


def _raw_listen(reactor, impl: str, key: NodeKey, on_link):
    from twisted.internet.endpoints import TCP4ServerEndpoint

    from mconn.net.tls_transport import tls_server_factory

    factory = raw_factory(on_link)
    options = tls_options(impl, key, listener=True)
    if options is not None:
        factory = tls_server_factory(options, factory, clock=reactor, on_plaintext=lambda protocol, rejection: None)
    return TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)


class _StdinWatch:
    """Stops the receiver's reactor when the sender closes our stdin."""

    def __init__(self, reactor) -> None:
        self.reactor = reactor

    def fileno(self) -> int:
        return sys.stdin.fileno()

    def doRead(self):
        if not os.read(sys.stdin.fileno(), 4096):
            self.connectionLost(None)

    def connectionLost(self, reason) -> None:
        # epoll reports a closed pipe as a hang-up without data: connectionLost, no doRead.
        self.reactor.removeReader(self)
        if self.reactor.running:
            self.reactor.stop()

    def logPrefix(self) -> str:
        return "stdin"


# -- the sender: connecting ------------------------------------------------------------


class Connector:
    """Opens links of one transport to the receiver: ``connect()`` fires with a link."""

    def __init__(self, impl: str, port: int, node_id: str, clock) -> None:
        self.impl, self.port, self.node_id, self.clock = impl, port, node_id, clock
        self.key = NodeKey.generate()
        self.switch = None
        self._pending = None
        self.tls = tls_options(impl, self.key)  # one certificate and context per connector
        if impl.startswith("mconn"):
            from mconn import Switch

            reactor = LinkReactor(CHANNELS, self._on_link)
            tls = self.tls
            self.switch = Switch([reactor], node_key=self.key, tls=tls, config=CONFIG, clock=clock)
            self.switch.startService()

    def _on_link(self, link) -> None:
        d, self._pending = self._pending, None
        d.callback(link)

    def connect(self):
        from twisted.internet import defer

        self._pending = d = defer.Deferred()
        if self.switch is not None:
            self.switch.dial(f"{self.node_id}@127.0.0.1:{self.port}").addErrback(d.errback)
            return d
        from twisted.internet.endpoints import TCP4ClientEndpoint

        from mconn.net.tls_transport import tls_client_endpoint

        endpoint = TCP4ClientEndpoint(self.clock, "127.0.0.1", self.port)
        if self.tls is not None:
            endpoint = tls_client_endpoint(self.tls, endpoint, "127.0.0.1", clock=self.clock)
        endpoint.connect(raw_factory(self._on_link)).addErrback(d.errback)
        return d

    def stop(self):
        from twisted.internet import defer

        return self.switch.stopService() if self.switch is not None else defer.succeed(None)


class _Echoed:
    """A link handler that fires ``done`` at the first message (the echo)."""

    def __init__(self, done) -> None:
        self.done = done

    def message(self, channel: int, msg: bytes) -> None:
        if not self.done.called:
            self.done.callback(msg)

    def closed(self) -> None:
        pass


# -- the sender: measuring -----------------------------------------------------------


async def scenario_run(connector: Connector, receiver, scenario: str, args, clock) -> dict:
    """One bulk, small or rtt measurement on a new connection: the Sender's and the
    Sink's results, and both processes' CPU seconds."""
    from twisted.internet import defer

    link = await connector.connect().addTimeout(10, clock)
    finished = defer.Deferred()
    sender = Sender(link, scenario, args.duration, clock, finished.callback, rtt_count=args.rtt_count)
    link.handler = sender
    cpu, recv_cpu = time.process_time(), _cpu_of(receiver.pid)
    sender.start()
    result = {"send": await finished.addTimeout(args.duration + 30, clock)}
    if scenario in ("bulk", "small"):
        result["recv"] = json.loads(await receiver.lines.get().addTimeout(10, clock))
    result["send_cpu_s"] = time.process_time() - cpu
    result["recv_cpu_s"] = _cpu_of(receiver.pid) - recv_cpu
    return result


async def handshakes(impl: str, receiver, duration: float, clock, connector_type=None) -> dict:
    """Sequential connect + echo + close for ``duration`` s, over ``connector_type``
    (this file's Connector unless given: bench/ws_bench.py passes its own)."""
    from twisted.internet import defer

    count = CLIENTS if "mconn" in impl else 1
    connectors = [(connector_type or Connector)(impl, receiver.port, receiver.node_id, clock) for _ in range(count)]
    message = padded(ROUND_TRIP, 0, SMALL_SIZE)
    done = 0
    cpu, recv_cpu = time.process_time(), _cpu_of(receiver.pid)
    start = time.perf_counter()
    try:
        while time.perf_counter() - start < duration:
            link = await connectors[done % len(connectors)].connect().addTimeout(10, clock)
            echoed = defer.Deferred()
            link.handler = _Echoed(echoed)
            link.send_now(RTT_CHANNEL.id, message)
            await echoed.addTimeout(10, clock)
            link.close()
            done += 1
        return {
            "connections": done,
            "elapsed": time.perf_counter() - start,
            "send_cpu_s": time.process_time() - cpu,
            "recv_cpu_s": _cpu_of(receiver.pid) - recv_cpu,
        }
    finally:
        await defer.gatherResults([c.stop() for c in connectors])


class Receiver:
    """A receiver process (``--role receiver`` of ``script``), spawned by Twisted; its
    stdout lines arrive on ``lines`` (a DeferredQueue)."""

    #: The benchmark file whose ``--role receiver`` this runs (bench/ws_bench.py sets its own).
    script = os.path.abspath(__file__)

    def __init__(self, impl: str, clock, profile: str | None = None) -> None:
        from twisted.internet import defer, protocol

        self.impl = impl
        self.lines = defer.DeferredQueue()
        self.ended = defer.Deferred()
        receiver = self

        class Watch(protocol.ProcessProtocol):
            buffer = b""

            def outReceived(self, data: bytes) -> None:
                self.buffer += data
                while b"\n" in self.buffer:
                    line, _, self.buffer = self.buffer.partition(b"\n")
                    receiver.lines.put(line.decode())

            def errReceived(self, data: bytes) -> None:
                sys.stderr.write(f"[{impl} receiver] {data.decode(errors='replace')}")

            def processEnded(self, reason) -> None:
                receiver.ended.callback(None)

        args = [sys.executable] + (["-m", "cProfile", "-o", profile] if profile else [])
        args += [self.script, "--role", "receiver", "--impl", impl]
        self.process = clock.spawnProcess(Watch(), sys.executable, args, env=os.environ.copy())
        self.pid = self.process.pid

    async def start(self, clock) -> None:
        line = (await self.lines.get().addTimeout(20, clock)).split()
        if len(line) != 2:
            raise RuntimeError(f"the {self.impl} receiver did not start (printed {line!r})")
        self.port, self.node_id = int(line[0]), line[1]

    async def stop(self, clock) -> None:
        from twisted.internet import defer

        self.process.closeStdin()
        try:
            await self.ended.addTimeout(5, clock)
        except defer.TimeoutError:
            print(f"[{self.impl} receiver] did not exit 5 s after its stdin closed: killed", file=sys.stderr)
            self.process.signalProcess("KILL")  # by its PID: it has no children


def _cpu_of(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


async def measure(impl: str, args, clock, n: int = 0) -> dict:
    """Every scenario of one transport against one receiver process."""
    profile = None
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        profile = os.path.join(args.profile, f"{impl}-{n + 1}.prof")
    receiver = Receiver(impl, clock, profile)
    results = {}
    try:
        await receiver.start(clock)
        connector = Connector(impl, receiver.port, receiver.node_id, clock)
        try:
            for scenario in ("bulk", "small", "rtt"):
                if scenario in args.scenarios:
                    results[scenario] = await scenario_run(connector, receiver, scenario, args, clock)
        finally:
            await connector.stop()
        if "handshake" in args.scenarios:
            results["handshake"] = await handshakes(impl, receiver, args.duration, clock)
            if impl == "mconn_tls":  # the same listener takes the upgrade start too
                results["handshake_upgrade"] = await handshakes("mconn_upgrade", receiver, args.duration, clock)
    finally:
        await receiver.stop(clock)
    return results


# -- the table -------------------------------------------------------------------------


def figures(scenario: str, r: dict) -> dict:
    """figure name -> value for one measurement (rates, latencies, CPU per unit)."""
    if scenario == "bulk":
        sink = r["recv"]["B"]
        units = sink["messages"]
        out = {"MiB/s": sink["bytes_per_s"] / 2**20}
    elif scenario == "small":
        sink = r["recv"]["S"]
        units = sink["messages"]
        out = {"msg/s": sink["messages_per_s"]}
    elif scenario == "rtt":
        rtt = r["send"]["rtt"]
        units = r["send"]["round_trips"]
        out = {"p50 us": rtt["p50_ms"] * 1000, "p99 us": rtt["p99_ms"] * 1000}
    else:
        units = r["connections"]
        out = {"conn/s": units / r["elapsed"]}
    out["cpu us/unit"] = (r["send_cpu_s"] + r["recv_cpu_s"]) * 1e6 / units
    return out


def table(rounds: list[dict], scenarios) -> list[dict]:
    """Rows: the median of each transport's figure, and medians of per-round ratios."""
    rows = []
    for scenario in scenarios:
        per_round = []
        for r in rounds:
            f = {impl: figures(scenario, r[impl][scenario]) for impl in IMPLS}
            if scenario == "handshake" and "handshake_upgrade" in r["mconn_tls"]:
                f["mconn_upgrade"] = figures(scenario, r["mconn_tls"]["handshake_upgrade"])
            per_round.append(f)
        impls = list(per_round[0])
        for name in per_round[0]["raw"]:
            row = {"scenario": scenario, "figure": name}
            for impl in impls:
                row[impl] = statistics.median(f[impl][name] for f in per_round)
            for label, top, bottom in RATIOS:
                if top in impls:
                    row[label] = statistics.median(f[top][name] / f[bottom][name] for f in per_round)
            rows.append(row)
    return rows


def print_table(rows) -> None:
    columns = list(IMPLS) + ["mconn_upgrade"] + [label for label, _, _ in RATIOS]
    print(f"{'scenario':<10} {'figure':<12}" + "".join(f" {c:>13}" for c in columns))
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c)
            cells.append(f" {'-':>13}" if value is None else f" {value:>13.3f}" if "/" in c else f" {value:>13.1f}")
        print(f"{row['scenario']:<10} {row['figure']:<12}" + "".join(cells))


def sender(args) -> int:
    from twisted.internet import defer, reactor

    rounds = []
    outcome = {}

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
    failure = outcome.get("result")
    if failure is not None:
        failure.raiseException()
    if set(args.impls) != set(IMPLS):
        print(json.dumps(rounds, indent=1, default=str))  # a partial run: no ratios
        return 0
    rows = table(rounds, args.scenarios)
    print(f"tls_bench: {args.repeat} rounds, {args.duration}s each, TLS identity mode, TLS 1.3 (medians)")
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "rows": rows, "rounds": rounds}, f, indent=1, default=str)
    return 0


def parse_args(argv, description: str, impls: tuple, scenarios: tuple):
    """The command line of this benchmark and of bench/ws_bench.py (same options, their own
    implementations and scenarios)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=("sender", "receiver"), default="sender")
    parser.add_argument("--impl", choices=impls, default="mconn")
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rtt-count", type=int, default=2000)
    parser.add_argument("--scenarios", type=lambda s: s.split(","), default=list(scenarios))
    parser.add_argument("--impls", type=lambda s: tuple(s.split(",")), default=impls)
    parser.add_argument("--json")
    parser.add_argument("--profile", metavar="DIR")
    args = parser.parse_args(argv)
    if set(args.scenarios) - set(scenarios) or set(args.impls) - set(impls):
        parser.error(f"choose scenarios from {scenarios} and impls from {impls}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv, __doc__, IMPLS, SCENARIOS)
    if args.role == "receiver":
        return receiver(args.impl)
    return sender(args)


if __name__ == "__main__":
    sys.exit(main())
