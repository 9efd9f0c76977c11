"""The processes of bench/many_peers.py: the listener (a Switch, a plain Twisted port for
the raw accepts and one for the raw rounds) and a dialer (raw mconn peers from many
loopback sources), each driven by one JSON command a line on stdin. The phases and what
each measures are in bench/many_peers.py's docstring."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import resource
import sys
import time

from many_peers_bytes import CHANNEL, hello_template, round_sizes  # bench/ is the script's path

SOURCES = [f"127.0.{i // 250}.{2 + i % 250}" for i in range(200)]
#: Connection attempts under way at once per dialer (the listener's backlog is BACKLOG).
CONCURRENCY = 64
BACKLOG = 1024
#: Seconds a dialer waits for its share of a storm before it reports what it has.
STORM_DEADLINE = 150.0
#: Seconds between the storm and the measurements: two stats ticks (10 s each) and a
#: margin, so that the idle window holds no handshake, no tick's first ping of a new
#: peer, and no tick logging that ping's round trip (each peer's second channel_stats).
SETTLE = 22.0
#: Seconds of the idle measurement: two keepalive intervals (ping_interval, 60 s) and a
#: margin, so that every peer's keepalive ping and pong fall in it twice.
IDLE = 130.0


def limits(peers: int) -> dict:
    """The admission limits an operator raises for ``peers`` inbound peers."""
    return {
        "max_inbound_peers": peers,
        "max_connections_per_ip": peers,
        "max_pending_handshakes": BACKLOG,
        "max_pending_per_group": BACKLOG,
    }


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def rss_bytes() -> int:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Commands:
    """Reads one JSON command a line from stdin, hands it to ``handle``, prints replies."""

    def __init__(self, clock, handle) -> None:
        from twisted.internet import stdio
        from twisted.protocols.basic import LineReceiver

        class Lines(LineReceiver):
            delimiter = b"\n"

            def lineReceived(self, line):
                handle(json.loads(line))

            def connectionLost(self, reason):
                if clock.running:
                    clock.stop()

        self.stdio = stdio.StandardIO(Lines())

    @staticmethod
    def reply(**fields) -> None:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


class IdleWork:
    """Counts what the listener does in the idle window: event loop turns (one
    ``doIteration`` each: a wake-up from epoll), runs of the shared keepalive timer heap
    (``Timers._run``: one DelayedCall firing), connection timers fired
    (``MConnectionProtocol._on_timer``), reads handed to a connection
    (``dataReceived``) and the writes of its pump. Each count is a wrapper installed over
    the method for the window only (a Python call more per count: a few percent of the
    work counted, the same in either tree)."""

    def __init__(self, clock) -> None:
        import mconn
        from mconn.net import timers
        from mconn.net.protocol import MConnectionProtocol

        one_tree(mconn)

        self.counts = {"loop_turns": 0, "timer_runs": 0, "connection_timers": 0, "reads": 0}
        self._undo: list = []
        self._wrap(clock, "doIteration", "loop_turns", instance=True)
        self._wrap(timers.Timers, "_run", "timer_runs")
        self._wrap(MConnectionProtocol, "_on_timer", "connection_timers")
        self._wrap(MConnectionProtocol, "dataReceived", "reads")

    def _wrap(self, owner, name: str, key: str, instance: bool = False) -> None:
        original = getattr(owner, name)
        counts = self.counts

        if instance:

            def counted(*a):
                counts[key] += 1
                return original(*a)

            setattr(owner, name, counted)
            self._undo.append(lambda: delattr(owner, name))
        else:

            def counted_method(this, *a):
                counts[key] += 1
                return original(this, *a)

            setattr(owner, name, counted_method)
            self._undo.append(lambda: setattr(owner, name, original))

    def stop(self) -> dict:
        for undo in self._undo:
            undo()
        return dict(self.counts)


def telemetry_mark(path: str) -> tuple[int, int, float]:
    """Where the telemetry log ``path`` stands now: its inode, size and the time."""
    status = os.stat(path)
    return status.st_ino, status.st_size, time.time()


def events_since(path: str, mark: tuple[int, int, float]) -> dict:
    """Telemetry records written to ``path`` since ``mark`` (``telemetry_mark``), counted
    by event, in it and in the files it rotated to meanwhile (``PATH.<time>-<seq>``:
    the file of the mark keeps its inode, from its offset; the later ones are whole)."""
    inode, offset, since = mark
    folder, name = os.path.split(path)
    counts: dict = {}
    for entry in os.scandir(folder):
        if not entry.name.startswith(name):
            continue
        status = entry.stat()
        if status.st_ino != inode and status.st_mtime < since:
            continue  # closed before the mark
        with open(entry.path, "rb") as log:
            if status.st_ino == inode:
                log.seek(offset)
            for line in log:
                with contextlib.suppress(ValueError):
                    event = json.loads(line).get("event")
                    counts[event] = counts.get(event, 0) + 1
    return counts


# -- the listener -------------------------------------------------------------------------


def in_tree(mconn, path: str) -> bool:
    """Whether the tree ``mconn`` was imported from has the module file ``path`` (an import
    would not tell: the working tree's editable install supplies what a tree lacks)."""
    return os.path.exists(os.path.join(os.path.dirname(os.path.abspath(mconn.__file__)), path))


def one_tree(mconn) -> None:
    """Exit unless every mconn module loaded comes from the tree ``mconn`` came from: an
    older tree on PYTHONPATH (``--before REV``) that lacks a module would otherwise take it,
    silently, from the working tree through its editable install."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(mconn.__file__))) + os.sep
    strays = sorted(
        name
        for name, module in list(sys.modules.items())
        if name.partition(".")[0] == "mconn"
        and not os.path.abspath(getattr(module, "__file__", None) or root).startswith(root)
    )
    if strays:
        sys.exit(f"mconn modules from outside {root}: {', '.join(strays)}; that tree lacks them")


def listener(args) -> None:
    from twisted.internet import defer, protocol
    from twisted.internet import reactor as clock
    from twisted.internet.endpoints import serverFromString
    from twisted.logger import globalLogBeginner

    import mconn
    from mconn import ChannelDescriptor, Config, Reactor, Switch

    if in_tree(mconn, "ops/telemetry_file.py"):
        from mconn.ops.telemetry_file import TelemetryFileService
    else:  # a tree from before the layers were packages (--before REV)
        from mconn.telemetry_file import TelemetryFileService  # type: ignore[no-redef]
    one_tree(mconn)

    raise_nofile()
    globalLogBeginner.beginLoggingTo([], discardBuffer=True, redirectStandardIO=False)
    fields = {f for f in Config.__dataclass_fields__}
    config = Config(**{k: v for k, v in limits(args.peers).items() if k in fields})

    class Quiet(Reactor):
        def get_channels(self):
            return [ChannelDescriptor(CHANNEL, priority=1)]

    switch = Switch([Quiet()], config=config, clock=clock)
    telemetry = None
    if args.telemetry == "file":
        telemetry = TelemetryFileService(os.path.join(args.tmp, "telemetry.jsonl"), switch.node_id)
        telemetry.startService()
    switch.startService()
    times = {"raw": [], "made": [], "round": [], "answered": []}
    sizes = {}  # the bytes of the raw round (listening: the listener's hello needs the port)

    class RawServer(protocol.Protocol):
        def connectionMade(self):
            times["raw"].append(time.time())

    class RawRound(protocol.Protocol):
        """The socket work of a handshake without mconn: our hello's bytes at once, the
        session answer's once the dialer's hello's bytes are in."""

        def connectionMade(self):
            times["round"].append(time.time())
            self.got = 0
            self.transport.write(sizes["hello_bytes"])

        def dataReceived(self, data):
            if self.got < sizes["request"] <= self.got + len(data):
                self.transport.write(sizes["answer_bytes"])
                times["answered"].append(time.time())
            self.got += len(data)

    class RawKeepalive(protocol.Protocol):
        """The keepalive in plain Twisted, the floor of the idle phase: a one-byte ping
        ``ping_interval`` after the last byte received (one DelayedCall per connection,
        reset by each read), written with ``transport.write``."""

        def connectionMade(self):
            keepalive.add(self)
            self.call = clock.callLater(config.ping_interval, self.ping)

        def ping(self):
            self.transport.write(b"\x01")
            self.call = clock.callLater(config.ping_interval, self.ping)

        def dataReceived(self, data):
            if self.call.active():
                self.call.reset(config.ping_interval)

        def connectionLost(self, reason):
            keepalive.discard(self)
            if self.call.active():
                self.call.cancel()

    keepalive: set = set()
    raw_factory = protocol.Factory.forProtocol(RawServer)
    round_factory = protocol.Factory.forProtocol(RawRound)
    keepalive_factory = protocol.Factory.forProtocol(RawKeepalive)

    def connected_count():
        return sum(1 for p in switch.peers.values() if p.state == "connected")

    sessions_up = []

    class Watcher(Reactor):
        def add_peer(self, peer):
            sessions_up.append(time.time())

    switch.reactors.append(Watcher())
    owner = switch._connections  # every connection reports to it (IConnectionOwner)
    made = owner.connection_made

    def connection_made(proto):
        times["made"].append(time.time())
        return made(proto)

    owner.connection_made = connection_made
    ticks = []  # when each stats tick began
    if switch._stats_loop is not None:
        emit_stats = switch._stats_loop.f

        def stats_tick():
            ticks.append(time.time())
            return emit_stats()

        switch._stats_loop.f = stats_tick
    base_rss = [0]
    profiler = [None]
    storm_cpu = [0.0]  # the listener's CPU seconds when the storm began
    gc_time = {"seconds": 0.0, "collections": [0, 0, 0], "began": None}
    storm_began = [0.0]

    def gc_watch(phase, info):
        """Wall time spent in the garbage collector, and collections by generation."""
        if phase == "start":
            gc_time["began"] = time.perf_counter()
        elif gc_time["began"] is not None:
            gc_time["seconds"] += time.perf_counter() - gc_time["began"]
            gc_time["collections"][info["generation"]] += 1
            gc_time["began"] = None

    gc.callbacks.append(gc_watch)

    def handle(command):
        name = command["do"]
        if name == "base":
            base_rss[0] = rss_bytes()
            Commands.reply(rss=base_rss[0])
        elif name == "raw_span":
            stamps = times["raw"]
            Commands.reply(accepted=len(stamps), seconds=(stamps[-1] - stamps[0]) if stamps else None)
        elif name == "mark_cpu":  # a raw round begins
            storm_cpu[0] = cpu_seconds()
            times["round"].clear()
            times["answered"].clear()
            Commands.reply(cpu=storm_cpu[0])
        elif name == "round_span":
            first, last = times["round"][:1], times["answered"][-1:]
            cpu = cpu_seconds() - storm_cpu[0]
            Commands.reply(
                accepted=len(times["round"]),
                answered=len(times["answered"]),
                seconds=(last[0] - first[0]) if first and last else None,
                cpu_seconds=cpu,
                cpu_us_per_round=cpu / len(times["answered"]) * 1e6 if times["answered"] else None,
            )
        elif name == "profile_storm":
            storm_cpu[0] = cpu_seconds()
            gc_time.update(seconds=0.0, collections=[0, 0, 0])
            storm_began[0] = time.time()
            if switch._stats_loop is not None and switch._stats_loop.running:
                switch._stats_loop.reset()  # the next tick one interval from now, whatever the tree
            if args.profile:
                import cProfile

                profiler[0] = cProfile.Profile()
                profiler[0].enable()
            Commands.reply(profiling=bool(args.profile))
        elif name == "storm_span":
            cpu = cpu_seconds() - storm_cpu[0]
            if profiler[0] is not None:
                profiler[0].disable()
                profiler[0].dump_stats(args.profile + ".storm")
                profiler[0] = None
            up, first = sessions_up, times["made"][:1]
            Commands.reply(
                sessions=len(up),
                connected=connected_count(),
                first_made=first[0] if first else None,
                last_up=up[-1] if up else None,
                refusals=dict(switch.refusals),
                seconds=(up[-1] - first[0]) if up and first else None,
                cpu_seconds=cpu,
                cpu_us_per_session=cpu / len(up) * 1e6 if up else None,
                gc_seconds=gc_time["seconds"],
                gc_collections=list(gc_time["collections"]),
                ticks_in_storm=sum(1 for t in ticks if t >= storm_began[0]),
            )
        elif name == "rss":
            peers = connected_count()
            rss = rss_bytes()
            Commands.reply(rss=rss, peers=peers, per_peer=(rss - base_rss[0]) / peers if peers else None)
        elif name == "idle":
            idle(command["seconds"])
        elif name == "keepalive_count":
            Commands.reply(connections=len(keepalive))
        elif name == "broadcast":
            broadcast()
        elif name == "quit":
            d = switch.stopService()
            d.addBoth(lambda _: clock.stop())

    def idle(seconds):
        if args.profile:
            import cProfile

            profiler[0] = cProfile.Profile()
            profiler[0].enable()
        counts = IdleWork(clock)
        telemetry_path = os.path.join(args.tmp, "telemetry.jsonl")
        telemetry_at = telemetry_mark(telemetry_path) if telemetry is not None else None
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        cpu0, wall0 = cpu_seconds(), time.monotonic()
        timers0 = len(clock.getDelayedCalls())

        def done():
            cpu, wall = cpu_seconds() - cpu0, time.monotonic() - wall0
            usage = resource.getrusage(resource.RUSAGE_SELF)
            if profiler[0] is not None:
                profiler[0].disable()
                profiler[0].dump_stats(args.profile)
            work = counts.stop()
            if telemetry is not None:  # (the records of this turn are written at its end)
                work["telemetry"] = events_since(telemetry_path, telemetry_at)
            Commands.reply(
                cpu_seconds=cpu,
                user_seconds=usage.ru_utime - usage0.ru_utime,  # Python (and libc)
                system_seconds=usage.ru_stime - usage0.ru_stime,  # the kernel: sends, reads, polls, writes
                wall=wall,
                cpu_share=cpu / wall,
                peers=connected_count(),
                delayed_calls=[timers0, len(clock.getDelayedCalls())],
                work=work,
            )

        clock.callLater(seconds, done)

    def broadcast():
        timers0 = len(clock.getDelayedCalls())
        cpu0, wall0 = cpu_seconds(), time.monotonic()
        d = switch.broadcast(CHANNEL, b"x" * 100)
        call_cpu, call_wall = cpu_seconds() - cpu0, time.monotonic() - wall0
        results = []
        d.addCallback(results.append)

        def settled():
            cpu, wall = cpu_seconds() - cpu0, time.monotonic() - wall0
            peers = connected_count()
            sent = sum(1 for ok in results[0].values() if ok) if results else None
            Commands.reply(
                peers=peers,
                sent=sent,
                call_cpu=call_cpu,
                call_wall=call_wall,
                cpu=cpu,
                wall=wall,
                call_us_per_peer=call_cpu / peers * 1e6 if peers else None,
                delayed_calls=[timers0, len(clock.getDelayedCalls())],
            )

        clock.callLater(0, clock.callLater, 0, settled)  # the turns after the call write its bytes

    def listening(ports):
        mconn_port, raw, round_port, keepalive_port = ports
        sizes.update(round_sizes(switch))
        Commands.reply(
            port=mconn_port.getHost().port,
            raw_port=raw.getHost().port,
            round_port=round_port.getHost().port,
            keepalive_port=keepalive_port.getHost().port,
            mconn_file=mconn.__file__,
            answer_size=len(sizes["hello_bytes"]) + len(sizes["answer_bytes"]),
            config={k: getattr(config, k) for k in limits(args.peers) if k in fields},
        )

    endpoint = f"tcp:0:interface=127.0.0.1:backlog={BACKLOG}"
    d1 = switch.listen(endpoint)
    d2 = serverFromString(clock, endpoint).listen(raw_factory)
    d3 = serverFromString(clock, endpoint).listen(round_factory)
    d4 = serverFromString(clock, endpoint).listen(keepalive_factory)
    defer.gatherResults([d1, d2, d3, d4]).addCallback(listening)
    Commands(clock, handle)
    clock.run()
    if telemetry is not None:
        telemetry.stopService()


# -- a dialer -------------------------------------------------------------------------------


def dialer(args) -> None:
    import random

    from twisted.internet import protocol
    from twisted.internet import reactor as clock
    from twisted.internet.endpoints import TCP4ClientEndpoint

    import mconn

    if in_tree(mconn, "core/wire.py"):
        from mconn.core.wire import PacketType
    else:  # a tree from before the layers were packages (--before REV)
        from mconn.wire import PacketType  # type: ignore[no-redef]
    one_tree(mconn)

    raise_nofile()
    rng = random.Random(args.index)
    template = hello_template()
    node_at, session_at = template.index(b"\xab" * 20), template.index(b"\xcd" * 16)
    pong = bytes([PacketType.PONG])
    stats = {
        "pings": 0,
        "messages": 0,
        "closed": 0,
        "refused": 0,
        "failed": 0,
        "answered": 0,
        "answer_at": None,
        "round_failed": 0,
        "raw_pings": 0,
    }
    held = []

    def hello() -> bytes:
        packet = bytearray(template)
        packet[node_at : node_at + 20] = rng.randbytes(20)
        packet[session_at : session_at + 16] = rng.randbytes(16)
        return bytes(packet)

    class RawPeer(protocol.Protocol):
        """A peer that only says hello and answers pings (the listener sends no messages
        unless asked to broadcast; those are counted, never acknowledged)."""

        def __init__(self):
            self.buffer = b""
            self.answered = False
            self.received = 0

        def connectionMade(self):
            self.transport.write(hello())

        def dataReceived(self, data):
            buffer = self.buffer + data
            self.received += len(data)
            offset = self.received - len(buffer)  # where the buffer begins in the stream
            at = 0
            while at < len(buffer):
                kind = buffer[at]
                if kind == PacketType.PING:
                    self.transport.write(pong)
                    stats["pings"] += 1
                    at += 1
                    continue
                if kind == PacketType.PONG:
                    at += 1
                    continue
                head = at + 3 if kind == PacketType.MSG else at + 1
                if head >= len(buffer) or head + 1 + buffer[head] > len(buffer):
                    break
                width = buffer[head]
                length = int.from_bytes(buffer[head + 1 : head + 1 + width], "big")
                end = head + 1 + width + length
                if end > len(buffer):
                    break
                if kind == PacketType.MSG:
                    stats["messages"] += 1
                elif kind == PacketType.SESSION and not self.answered:
                    self.answered = True
                    stats["answered"] += 1
                    stats["answer_at"] = offset + end  # the bytes up to the session answer
                    storm.one_done()
                elif kind == PacketType.CLOSE:
                    stats["refused"] += 1
                at = end
            self.buffer = buffer[at:]

        def connectionLost(self, reason):
            stats["closed"] += 1
            if not self.answered:
                storm.one_done()

    class Blank(protocol.Protocol):
        pass

    class Ponger(protocol.Protocol):
        """The plain keepalive's peer: a pong for each ping byte."""

        def dataReceived(self, data):
            pings = data.count(b"\x01")
            stats["raw_pings"] += pings
            self.transport.write(b"\x02" * pings)

    class RoundPeer(protocol.Protocol):
        """The raw round's dialer: a hello's bytes, done once the listener's hello and
        session answer's bytes are in."""

        def connectionMade(self):
            self.got, self.done = 0, False
            self.transport.write(hello())

        def dataReceived(self, data):
            self.got += len(data)
            if not self.done and self.got >= storm.answer_size:
                self.done = True
                storm.one_done()

        def connectionLost(self, reason):
            if not self.done:
                stats["round_failed"] += 1
                storm.one_done()

    class Storm:
        """Opens ``count`` connections, at most CONCURRENCY under way."""

        def __init__(self):
            self.deadline = None
            self.reset("", 0, None)

        def reset(self, kind, port, factory):
            self.kind, self.port, self.factory = kind, port, factory
            self.started = self.done = self.under_way = 0
            self.t0 = time.time()
            self.finished = None

        def start(self, kind, port, factory, count, answer_size=0):
            self.reset(kind, port, factory)
            self.count, self.answer_size = count, answer_size
            # This phase's deadline only: a later phase must not be cut short by it.
            self.deadline = clock.callLater(STORM_DEADLINE, self.report, True)
            self.fill()

        def fill(self):
            while self.under_way < CONCURRENCY and self.started < self.count:
                source = SOURCES[(args.index * 7919 + self.started) % len(SOURCES)]
                endpoint = TCP4ClientEndpoint(clock, "127.0.0.1", self.port, timeout=30, bindAddress=(source, 0))
                self.started += 1
                self.under_way += 1
                d = endpoint.connect(self.factory)
                d.addCallbacks(self.connected, self.failed)

        def connected(self, proto):
            held.append(proto)
            if self.kind in ("raw", "keepalive"):
                self.one_done()

        def failed(self, failure):
            stats["failed"] += 1
            self.one_done()

        def one_done(self):
            if self.finished is not None:
                return
            self.under_way -= 1
            self.done += 1
            if self.done >= self.count:
                self.report(False)
            else:
                self.fill()

        def report(self, timed_out):
            if self.finished is not None:
                return
            self.finished = time.time()
            if not timed_out and self.deadline is not None and self.deadline.active():
                self.deadline.cancel()
            Commands.reply(
                kind=self.kind, done=self.done, seconds=self.finished - self.t0, timed_out=timed_out, **stats
            )

    storm = Storm()

    def handle(command):
        name = command["do"]
        if name == "raw":
            storm.start("raw", command["port"], protocol.Factory.forProtocol(Blank), command["count"])
        elif name == "keepalive":
            storm.start("keepalive", command["port"], protocol.Factory.forProtocol(Ponger), command["count"])
        elif name == "round":
            storm.start(
                "round",
                command["port"],
                protocol.Factory.forProtocol(RoundPeer),
                command["count"],
                command["answer_size"],
            )
        elif name == "close_raw":
            for proto in held:
                proto.transport.abortConnection()
            held.clear()
            Commands.reply(closed=True)
        elif name == "storm":
            storm.start("storm", command["port"], protocol.Factory.forProtocol(RawPeer), command["count"])
        elif name == "report":
            Commands.reply(held=len(held), **stats)
        elif name == "quit":
            clock.stop()

    Commands(clock, handle)
    Commands.reply(ready=True)
    clock.run()
