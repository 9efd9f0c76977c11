"""One end of one measurement, in its own process (``run.py --role send|recv``).

The receiver listens on 127.0.0.1 port 0 and prints ``{"port": ..., "node_id": ...}``;
the sender connects to it. Each prints one ``{"result": ...}`` (or ``{"error": ...}``)
line on stdout and stops its reactor; a hard deadline stops it in any case. A result
carries the process's CPU time and minor page faults from connection to report, so
that the table can say which side was the bottleneck.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

from twisted.logger import (
    FilteringLogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    globalLogBeginner,
    textFileLogObserver,
)

from links import SOCKET_OPTIONS, LinkReactor, raw_factory
from scenarios import CHANNELS, Filler, Sender, Sink


def emit(obj: dict) -> None:
    """One JSON line on stdout; a reader that has gone away is not an error here."""
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        pass


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Role:
    """Starts the link, hands it to the scenario, reports, and stops the reactor."""

    def __init__(self, args, clock) -> None:
        self.args = args
        self.clock = clock
        self._started = {"cpu": 0.0, "wall": 0.0, "faults": 0}

    def begin(self) -> None:
        """From now on CPU time and page faults count."""
        self._started = {"cpu": time.process_time(), "wall": time.monotonic(), "faults": _minor_faults()}

    def on_link(self, link) -> None:
        self.begin()
        args = self.args
        if args.role == "recv":
            link.handler = Sink(link, self.report)
            return
        sender = Sender(link, args.scenario, args.duration, self.clock, self.report, rtt_count=args.rtt_count)
        link.handler = sender
        self.clock.callLater(0.1, sender.start)

    def report(self, result: dict) -> None:
        wall = time.monotonic() - self._started["wall"]
        cpu = time.process_time() - self._started["cpu"]
        process = {
            "cpu_s": cpu,
            "wall_s": wall,
            "cpu_share": cpu / wall if wall else None,
            "minor_faults": _minor_faults() - self._started["faults"],
            # Which mconn ran: run.py checks that a "before" role ran the old tree.
            "mconn_file": getattr(sys.modules.get("mconn"), "__file__", None),
        }
        emit({"result": dict(result, process=process)})
        self.clock.callLater(0.3, self.stop)

    def stop(self) -> None:
        if self.clock.running:
            self.clock.stop()

    def give_up(self) -> None:
        try:
            emit({"error": f"{self.args.role} deadline of {self.args.deadline}s passed"})
        finally:
            self.stop()

    def failed(self, failure) -> None:
        emit({"error": failure.getTraceback()})
        self.stop()

    def start_raw(self):
        from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint

        if self.args.impl == "prebuilt":  # bench/prebuilt.py: frames built once, written in blocks
            from prebuilt import prebuilt_factory

            factory = prebuilt_factory(self.on_link)
        else:
            factory = raw_factory(self.on_link, self.args.raw_framing)
        if self.args.role == "recv":
            d = TCP4ServerEndpoint(self.clock, 0, interface="127.0.0.1").listen(factory)
            return d.addCallback(lambda port: emit({"port": port.getHost().port}))
        return TCP4ClientEndpoint(self.clock, "127.0.0.1", self.args.port).connect(factory)

    def start_mconn(self):
        from mconn import Config, Switch

        if self.args.scenario == "resume":
            return self.start_resume()
        # Only the --ack-* fields given: the code before the session layer has none.
        fields = {k: v for k, v in vars(self.args).items() if k.startswith("ack_") and v is not None}
        # Experiments: MCONN_BENCH_CONFIG='{"write_batch_bytes": 262144}' sets any Config
        # field of both mconn roles (bench/history/*.md name it next to such figures).
        fields.update(json.loads(os.environ.get("MCONN_BENCH_CONFIG") or "{}"))
        if self.args.max_packet_payload is not None:
            fields["max_packet_payload"] = self.args.max_packet_payload
        config = Config(**fields)
        reactor = LinkReactor(CHANNELS[self.args.scenario], self.on_link)
        switch = Switch([reactor], config=config, clock=self.clock)
        switch.startService()
        if self.args.role == "recv":
            d = switch.listen("tcp:0:interface=127.0.0.1")
            return d.addCallback(lambda port: emit({"port": port.getHost().port, "node_id": switch.node_id}))
        return switch.dial(f"{self.args.node_id}@127.0.0.1:{self.args.port}")

    def start_resume(self):
        """The resume scenario (resume.py): its own reactors, a proxy on the dialing side."""
        import resume

        self.begin()
        if self.args.role == "recv":
            return resume.start_receiver(self.clock, self.report).addCallback(emit)
        d = resume.start_dialer(self.clock, self.args.port, self.args.node_id, self.args.resets)
        return d.addCallback(self.report)


def role_main(args) -> None:
    """Run one role on the global Twisted reactor until it reports or its deadline."""
    from twisted.internet import reactor as clock

    SOCKET_OPTIONS.update(nodelay=args.nodelay, notsent_lowat=args.notsent_lowat)
    Filler.batched = not args.one_by_one
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) >= 2:
        os.sched_setaffinity(0, {cpus[0] if args.role == "send" else cpus[1]})
    globalLogBeginner.beginLoggingTo(
        [FilteringLogObserver(textFileLogObserver(sys.stderr), [LogLevelFilterPredicate(LogLevel.warn)])],
        redirectStandardIO=False,
    )
    role = Role(args, clock)
    d = role.start_mconn() if args.impl == "mconn" else role.start_raw()
    d.addErrback(role.failed)
    clock.callLater(args.deadline, role.give_up)
    clock.run()
