"""The ``mconn`` command: node keys, a running node's status, and a fault proxy.

::

    mconn --version      print mconn's version and which per-packet path runs:
                         "accelerated" (the compiled twin) or "pure Python" (and why)
    mconn keygen PATH    write a new node key (mode 0600); refuses to overwrite a file
    mconn id PATH        print the node id of a key
    mconn status URL     print a running node's status page (URL/status.json) as a table
    mconn faultproxy --listen ADDR --to ADDR [--reset-every S] [--blackhole S]
                     [--delay MS] [--duration S]
                         relay TCP connections between loopback addresses and break them
                         on a schedule (mconn/ops/faultproxy.py), to rehearse failures

Output to a pipe that its reader closes early (``mconn status URL | head -3``) ends the
command quietly, with exit status 0.

Running a node is twistd's job: ``twistd -n mconn --help``.

The status document (``GET URL/status.json``, served by ``twistd mconn --status ENDPOINT``,
mconn/ops/status.py) is specified field by field in specs/status.md; the fields read here::

    {"node_id": str, "listen_addresses": [str], "hot_path": str, "hot_path_why": str or null,
     "ws_frames": str, "ws_frames_why": str or null,
     "peers": [{"node_id": str, "moniker": str, "state": str, "remote_address": str,
                "uptime": seconds (number), "resumes": int,
                "round_trip": seconds (number) or null, "channels": [...]}]}
"""

from __future__ import annotations

import argparse
import importlib.metadata
import ipaddress
import json
import math
import os
import sys
import time
import urllib.error
import urllib.request


from mconn.core.node_info import display_name
from mconn.core.speedups import describe as implementation
from mconn.net.websocket_frames import describe as ws_frames
from mconn.core.node_key import NodeKey

#: Seconds ``mconn status`` waits for the node's answer.
STATUS_TIMEOUT = 10.0


def main(argv: list[str] | None = None) -> int:
    """Run one command; 0 on success, 1 with one line on stderr on failure, 2 for bad usage."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        args.command(args)
        sys.stdout.flush()
    except CommandError as e:
        print(f"mconn {args.name}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader stopped early (``mconn status URL | head -3``): that is its choice,
        # not an error. Point stdout at /dev/null so that the flush at exit is quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


class CommandError(Exception):
    """What went wrong, for one line on stderr."""


def version_line() -> str:
    """``mconn 0.1.0 (accelerated; ws frames accelerated)``: the per-packet path, then the
    WebSocket frames' copies, each ``pure Python (why)`` without its compiled twin."""
    try:
        version = importlib.metadata.version("mconn")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
        version = "unknown"
    return f"mconn {version} ({implementation()}; ws frames {ws_frames()})"


class _VersionAction(argparse.Action):
    """``--version``: the version line as it is, on one line (argparse's own action wraps
    it at the terminal's width), then exit."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and the hot paths, and exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_line())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mconn", description="Node keys, status and a fault proxy; run nodes with: twistd mconn"
    )
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    keygen = commands.add_parser("keygen", help="write a new node key (mode 0600); never overwrites")
    keygen.add_argument("path")
    keygen.set_defaults(command=keygen_command, name="keygen")
    node_id = commands.add_parser("id", help="print the node id of a key file")
    node_id.add_argument("path")
    node_id.set_defaults(command=id_command, name="id")
    status = commands.add_parser("status", help="print a running node's status (URL/status.json) as a table")
    status.add_argument("url", help="the node's status page, e.g. http://127.0.0.1:8080")
    status.set_defaults(command=status_command, name="status")
    proxy = commands.add_parser(
        "faultproxy",
        help="relay TCP connections on the loopback and break them on a schedule",
        description=FAULTPROXY_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    proxy.add_argument(
        "--listen",
        required=True,
        type=listen_address,
        metavar="ADDR",
        help="where to accept connections: PORT, 127.0.0.1:PORT or [::1]:PORT (0: any free port)",
    )
    proxy.add_argument(
        "--to",
        required=True,
        type=target_address,
        metavar="ADDR",
        help="the node to relay to: PORT, 127.0.0.1:PORT or [::1]:PORT (its tcp or ws listener)",
    )
    proxy.add_argument(
        "--reset-every",
        type=positive_seconds,
        metavar="S",
        help="every S seconds, reset (RST) every live link",
    )
    proxy.add_argument(
        "--blackhole",
        type=positive_seconds,
        metavar="S",
        help="S seconds forwarding, then S seconds black-holed, over and over; each hole ends with a reset",
    )
    proxy.add_argument(
        "--delay",
        type=milliseconds,
        default=0.0,
        metavar="MS",
        help="delay every chunk, each way, by MS milliseconds [default: 0]",
    )
    proxy.add_argument(
        "--duration",
        type=positive_seconds,
        metavar="S",
        help="stop after S seconds [default: run until SIGINT or SIGTERM]",
    )
    proxy.set_defaults(command=faultproxy_command, name="faultproxy", parser=proxy)
    return parser


# -- keys ------------------------------------------------------------------------------


def keygen_command(args) -> None:
    key = NodeKey.generate()
    directory, name = os.path.split(os.path.abspath(args.path))
    temporary = os.path.join(directory, f".{name}.keygen.{os.getpid()}")
    try:
        key.save(temporary)  # 0600, complete on disk
        os.link(temporary, args.path)  # fails if the path exists: never overwrites
    except FileExistsError:
        raise CommandError(f"{args.path} already exists; remove it first to replace the key") from None
    except OSError as e:
        raise CommandError(f"cannot write {args.path}: {e.strerror or e}") from None
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
    print(f"wrote {args.path}: node id {key.node_id}")


def id_command(args) -> None:
    try:
        print(NodeKey.load(args.path).node_id)
    except ValueError as e:
        raise CommandError(str(e)) from None


# -- status ----------------------------------------------------------------------------


def status_command(args) -> None:
    print(format_status(fetch_status(args.url)))


def status_url(url: str) -> str:
    """``URL/status.json`` (``http://`` added if no scheme; a URL ending in .json is kept)."""
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith(".json") else url.rstrip("/") + "/status.json"


def fetch_status(url: str) -> dict:
    """The status document of the node at ``url``."""
    target = status_url(url)
    try:
        with urllib.request.urlopen(target, timeout=STATUS_TIMEOUT) as response:
            body = response.read()
    except urllib.error.HTTPError as e:
        raise CommandError(f"{target}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise CommandError(f"cannot reach {target}: {getattr(reason, 'strerror', None) or reason}") from None
    try:
        document = json.loads(body)
    except ValueError as e:
        raise CommandError(f"{target} is not JSON: {e}") from None
    if not isinstance(document, dict) or not isinstance(document.get("peers", []), list):
        raise CommandError(f"{target} is not an mconn status document")
    return document


PEER_COLUMNS = ("PEER", "STATE", "ADDRESS", "UPTIME", "RESUMES", "RTT")


def format_status(document: dict) -> str:
    """The status document as text: the node, its listen addresses, a table of peers."""
    lines = [
        f"node       {_peer_name(document)}",
        f"listening  {', '.join(document.get('listen_addresses') or []) or '-'}",
        "",
    ]
    if document.get("hot_path"):  # the compiled twin or pure Python, and why (specs/status.md)
        why = document.get("hot_path_why")
        lines.insert(2, f"hot path   {document['hot_path']}" + (f" ({why})" if why else ""))
    if document.get("ws_frames"):  # the WebSocket frames' compiled twin or pure Python (specs/status.md)
        why = document.get("ws_frames_why")
        at = 3 if document.get("hot_path") else 2  # under the hot path line
        lines.insert(at, f"ws frames  {document['ws_frames']}" + (f" ({why})" if why else ""))
    if document.get("moniker"):  # the name shows 8 hex digits of the id: the whole id too
        lines.insert(1, f"id         {document.get('node_id', '?')}")
    rows = [PEER_COLUMNS] + [
        (
            _peer_name(peer),
            str(peer.get("state", "?")),
            str(peer.get("remote_address") or "-"),
            format_duration(peer.get("uptime")),
            str(peer.get("resumes", "-")),
            format_round_trip(peer.get("round_trip")),
        )
        for peer in document.get("peers", [])
        if isinstance(peer, dict)
    ]
    if len(rows) == 1:
        return "\n".join(lines + ["no peers"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(PEER_COLUMNS))]
    numeric = {3, 4, 5}
    for row in rows:
        cells = [
            cell.rjust(w) if i in numeric else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _peer_name(peer: dict) -> str:
    """``moniker (abcd1234)`` for a peer with a moniker, else its node id (display_name)."""
    moniker = peer.get("moniker")
    return display_name(str(peer.get("node_id", "?")), moniker if isinstance(moniker, str) else None)


def format_duration(seconds) -> str:
    """``42s``, ``3m07s``, ``2h05m``, ``3d04h``; ``-`` if unknown."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_round_trip(seconds) -> str:
    """Milliseconds with one decimal; ``-`` if not measured yet."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
        return "-"
    return f"{seconds * 1000:.1f} ms"


# -- fault proxy -----------------------------------------------------------------------

FAULTPROXY_DESCRIPTION = """\
Relay TCP connections from --listen to --to, both on the loopback, and break them on a
schedule: resets (RST both ends: the sessions suspend and resume), black holes (an
unplugged cable: nothing forwarded, nothing closed; the nodes' keepalive notices) and a
delay each way. Give peers the proxy's address instead of the node's (and
--ignore-discovered-addresses to the dialing node, so it does not learn the direct one).

Prints one line at start, one per fault and a summary at the end, each with the time."""


def parse_address(text: str, *, port_zero: bool) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[HOST]:PORT`` with a loopback IP host -> (host, port)."""
    host, port_text = "127.0.0.1", text
    if ":" in text:
        host, _, port_text = text.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            raise argparse.ArgumentTypeError(f"{text!r}: write an IPv6 address in brackets, [::1]:PORT")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the host must be a loopback IP address (127.0.0.1, ::1); the fault proxy is for "
            "rehearsals on one machine"
        )
    lowest = 0 if port_zero else 1
    if not (port_text.isdigit() and lowest <= int(port_text) <= 65535):
        raise argparse.ArgumentTypeError(f"{text!r}: the port must be a number from {lowest} to 65535")
    return host, int(port_text)


def listen_address(text: str) -> tuple[str, int]:
    """``--listen``: a loopback address; port 0 picks a free one."""
    return parse_address(text, port_zero=True)


def target_address(text: str) -> tuple[str, int]:
    """``--to``: a loopback address with a port."""
    return parse_address(text, port_zero=False)


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of {what}")
    return value


def positive_seconds(text: str) -> float:
    """A number of seconds above 0."""
    value = _number(text, "seconds")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the number of seconds must be above 0")
    return value


def milliseconds(text: str) -> float:
    """A number of milliseconds, 0 or more."""
    value = _number(text, "milliseconds")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the number of milliseconds must be 0 or more")
    return value


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def faultproxy_command(args) -> None:
    """Run the proxy until --duration ends or SIGINT/SIGTERM; the summary line at the end."""
    if args.listen == args.to:
        args.parser.error(
            f"--listen {format_address(*args.listen)} is the --to address: the proxy would relay to itself"
        )
    from twisted.internet import reactor

    run = FaultProxyRun(reactor, args, sys.stdout)
    reactor.callWhenRunning(run.start)
    reactor.run()
    if run.error is not None:
        raise CommandError(run.error)


class FaultProxyRun:
    """One ``mconn faultproxy``: a FaultProxy and its fault schedule in ``clock``.

    Resets every ``--reset-every`` seconds; with ``--blackhole S``, S seconds forwarding
    and S seconds black-holed in turn, each hole ended by ``heal`` and a reset of the
    links it killed (a black-holed link never forwards again). Stops at ``--duration``
    or when the reactor shuts down (SIGINT, SIGTERM), then stops the reactor.
    """

    def __init__(self, clock, args, out) -> None:
        from mconn.ops.faultproxy import FaultProxy

        self.clock = clock
        self.args = args
        self.out = out
        self.proxy = FaultProxy(*args.to, clock=clock)
        #: Why the run could not start (the --listen port in use), for one line on stderr.
        self.error: str | None = None
        self.resets = 0
        self.links_reset = 0
        self.holes = 0
        self._calls: list = []
        self._stopping = None

    def say(self, text: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}", file=self.out, flush=True)

    def start(self) -> None:
        from twisted.internet import defer

        defer.ensureDeferred(self._start()).addErrback(self._failed)

    async def _start(self) -> None:
        from twisted.internet.error import CannotListenError

        args, proxy = self.args, self.proxy
        proxy.set_delay(args.delay / 1000)
        try:
            port = await proxy.start(args.listen[1], interface=args.listen[0])
        except CannotListenError as e:
            reason = getattr(e.socketError, "strerror", None) or str(e.socketError)
            self.error = f"--listen {format_address(*args.listen)}: {reason}"
            self.clock.stop()
            return
        self.clock.addSystemEventTrigger("before", "shutdown", self.stop)
        faults = [f"reset every {args.reset_every:g} s"] if args.reset_every else []
        if args.blackhole:
            faults.append(f"black hole {args.blackhole:g} s in every {2 * args.blackhole:g} s")
        if args.delay:
            faults.append(f"delay {args.delay:g} ms each way")
        self.say(
            f"mconn faultproxy: listening on {format_address(args.listen[0], port)}, relaying to "
            f"{format_address(*args.to)}; "
            + (", ".join(faults) or "no faults")
            + (f"; stopping after {args.duration:g} s" if args.duration else "")
        )
        if args.reset_every:
            self._later(args.reset_every, self._reset)
        if args.blackhole:
            self._later(args.blackhole, self._hole_begins)
        if args.duration:
            self._later(args.duration, self._done)

    def _later(self, seconds: float, call) -> None:
        self._calls = [c for c in self._calls if c.active()]
        self._calls.append(self.clock.callLater(seconds, call))

    def _reset(self) -> None:
        links = self.proxy.reset_all()
        self.resets += 1
        self.links_reset += links
        self.say(f"reset: {_plural(links, 'link')}")
        self._later(self.args.reset_every, self._reset)

    def _hole_begins(self) -> None:
        self.holes += 1
        self.proxy.blackhole_all()
        self.say(f"black hole: {_plural(len(self.proxy.links), 'link')}, for {self.args.blackhole:g} s")
        self._later(self.args.blackhole, self._hole_ends)

    def _hole_ends(self) -> None:
        self.proxy.heal()
        links = self.proxy.reset_all()
        self.links_reset += links
        self.say(f"black hole over: {_plural(links, 'dead link')} reset")
        self._later(self.args.blackhole, self._hole_begins)

    def _done(self) -> None:
        self.clock.stop()  # the shutdown trigger stops the proxy

    def stop(self):
        """Cancel the schedule, stop the proxy (every link aborted), print the summary."""
        if self._stopping is None:
            for call in self._calls:
                if call.active():
                    call.cancel()
            self._calls = []
            from twisted.internet import defer

            self._stopping = defer.ensureDeferred(self.proxy.stop()).addBoth(self._stopped)
        return self._stopping

    def _stopped(self, result) -> None:
        proxy = self.proxy
        self.say(
            f"stopped: {_plural(proxy.connections_accepted, 'connection')}, {proxy.bytes_up} bytes up, "
            f"{proxy.bytes_down} bytes down, {_plural(self.resets, 'reset')}, {_plural(self.holes, 'black hole')}, "
            f"{_plural(self.links_reset, 'link')} reset in all"
        )

    def _failed(self, failure) -> None:
        self.error = f"{type(failure.value).__name__}: {failure.value}"
        if self.clock.running:
            self.clock.stop()


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


if __name__ == "__main__":
    sys.exit(main())
