"""A terminal chat peer: gossip chat and file transfer over mconn (reactors/chat.py).

    python examples/chat.py --name alice --listen tcp:7001 --key alice.key
    python examples/chat.py --name bob --listen tcp:7002 --key bob.key --peer ID@127.0.0.1:7001

It prints its own ``ID@HOST:PORT`` at start for others' ``--peer``. An endpoint without
``interface=`` listens on 127.0.0.1 only (``tcp:7001`` is ``tcp:7001:interface=127.0.0.1``);
``--listen tcp:7001:interface=0.0.0.0`` lets other machines in. Type a line to say
it to everyone; ``/peers`` lists the peers, ``/send FILE`` sends a file to every peer
(with a progress bar), ``/quit`` (or Ctrl-D) closes every connection with a close packet
and exits 0. Lines from others print above the prompt, which stays usable. Peers given
with ``--peer`` are persistent: broken connections are resumed, or dialed again, and a
status line says so.

Received files are limited (specs/chat.md section 3.1): ``--max-file-size``,
``--peer-quota-bytes`` per ``--peer-quota-window`` seconds, ``--downloads-quota-bytes`` and
``--min-free-bytes``. A refused file is reported on both sides with the reason.

Everything a peer chose (names, lines, file names, reasons) goes through
``reactors.chat_display.printable`` before it is shown: a control character reaches the
terminal as its escape (``\x1b``), never as a command.

Twisted runs on asyncio (asyncioreactor) so that prompt_toolkit's ``prompt_async`` and
``patch_stdout`` share its event loop; the progress bar is rich's, shown in the prompt's
bottom toolbar and printed whole when the transfer ends.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys

from twisted.python import usage

if __name__ == "__main__":  # run from a checkout: mconn and reactors are beside examples/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from reactors.chat_display import printable  # noqa: E402 (after the path is set)
from reactors.chat_quota import FileLimits  # noqa: E402

HELP = "commands: /peers, /send FILE, /quit; anything else is said to everyone"
#: The options that set the ChatReactor's file limits, and their types.
LIMITS = {
    "max_file_size": int,
    "peer_quota_bytes": int,
    "peer_quota_window": float,
    "downloads_quota_bytes": int,
    "min_free_bytes": int,
}


def _limit_parameters() -> list:
    docs = {
        "max_file_size": "refuse files larger than this many bytes",
        "peer_quota_bytes": "accept at most this many bytes from one peer per --peer-quota-window",
        "peer_quota_window": "the window of --peer-quota-bytes, in seconds",
        "downloads_quota_bytes": "refuse files once the downloads directory would hold more bytes than this",
        "min_free_bytes": "refuse files that would leave less than this many bytes free on its disk",
    }
    return [
        [name.replace("_", "-"), None, getattr(FileLimits, name), docs[name], kind] for name, kind in LIMITS.items()
    ]


class Options(usage.Options):
    synopsis = "chat.py [--name NAME] [--listen ENDPOINT]... [--peer ID@HOST:PORT]... [--key PATH]"
    longdesc = "A terminal chat peer over mconn (reactors/chat.py). " + HELP + "."
    optFlags = [
        ["plaintext", None, "no TLS (every peer must say it): node ids are then only claimed, not proven"],
    ]
    optParameters = [
        ["name", None, None, "the name others see (default: from the node id)"],
        ["key", None, None, "node key file (PEM), created if missing; without it a new identity each run"],
        ["downloads", None, "downloads", "directory received files are stored in"],
        ["log", None, None, "write the Twisted log (mconn telemetry) to this file"],
    ] + _limit_parameters()

    def __init__(self):
        super().__init__()
        self["listen"] = []
        self["peer"] = []

    def opt_listen(self, endpoint):
        """a Twisted server endpoint to accept peers on, e.g. tcp:7001; without interface=
        it listens on 127.0.0.1 only, tcp:7001:interface=0.0.0.0 lets other machines in
        (repeatable)"""
        self["listen"].append(endpoint)

    def opt_peer(self, address):
        """ID@HOST:PORT of a peer to keep connected to (repeatable)"""
        if "@" not in address:
            raise usage.UsageError(f"--peer needs ID@HOST:PORT (each peer prints its own at start), got {address!r}")
        self["peer"].append(address)

    def postOptions(self):
        try:
            FileLimits(**limits_of(self))
        except ValueError as e:
            raise usage.UsageError(str(e)) from None


def limits_of(options) -> dict:
    """The ChatReactor keyword arguments of the file-limit options."""
    return {name: options[name.replace("_", "-")] for name in LIMITS}


def bar(sent: int, total: int, width: int = 30) -> str:
    """A rich progress bar with percentage and MiB, as ANSI text."""
    from rich.console import Console
    from rich.progress_bar import ProgressBar

    console = Console(file=io.StringIO(), force_terminal=True, color_system="standard", width=width)
    with console.capture() as capture:
        console.print(ProgressBar(total=max(total, 1), completed=sent, width=width), end="")
    percent = 100 * sent // total if total else 100
    return f"{capture.get()} {percent:3d}% {sent / 2**20:.1f}/{total / 2**20:.1f} MiB"


class ChatTerminal:
    """The prompt, the printing and the commands, around one Switch with a ChatReactor.

    Every text shown goes through ``printable`` (``out``, the toolbar, the prompt); only
    the progress bar, which is ours, is written as ANSI.
    """

    def __init__(self, switch, chat, clock) -> None:
        from prompt_toolkit import PromptSession

        self.switch = switch
        self.chat = chat
        self.clock = clock
        self.status = ""
        self.sending = None  # (file name, sent, total) while a /send runs
        self.waiting_names: dict[str, str] = {}  # node id -> status to print once its name is known
        self.session = PromptSession(bottom_toolbar=self.toolbar, refresh_interval=0.5)
        chat.on_line = self.show_line
        chat.on_file = self.show_file
        chat.on_refused = self.show_refused
        chat.on_status = self.show_status
        chat.on_peers_changed = self.peers_changed

    # -- output ----------------------------------------------------------------------

    def out(self, text: str, progress: tuple[int, int] | None = None) -> None:
        """Print ``text`` as printable text, then the progress bar of ``progress`` if given."""
        from prompt_toolkit import print_formatted_text
        from prompt_toolkit.formatted_text import FormattedText

        print_formatted_text(FormattedText(self.fragments(text, progress)))

    @staticmethod
    def fragments(text: str, progress: tuple[int, int] | None = None) -> list:
        """prompt_toolkit fragments: ``text`` made printable, then our own ANSI progress bar."""
        from prompt_toolkit.formatted_text import ANSI, to_formatted_text

        shown = [("", printable(text))]
        return shown if progress is None else shown + to_formatted_text(ANSI(bar(*progress)))

    def say_status(self, text: str) -> None:
        self.status = text
        self.out(f"*** {text}")
        self.session.app.invalidate()

    def toolbar(self):
        from prompt_toolkit.formatted_text import FormattedText

        connected = [self.chat.peer_name(p.node_id) for p in self.switch.peers.values() if p.state == "connected"]
        text = f" {self.chat.name} | peers: {', '.join(connected) or '(none)'}"
        if self.sending is not None:
            name, sent, total = self.sending
            return FormattedText(self.fragments(f"{text} | sending {name} ", (sent, total)))
        if self.status:
            text += f" | {self.status}"
        return FormattedText(self.fragments(text))

    def show_line(self, line) -> None:
        self.out(f"[{line.name}] {line.text}")

    def show_file(self, received) -> None:
        who = self.chat.peer_name(received.sender)
        size, digest = received.size, received.sha256[:16]
        self.out(f"*** {who} sent {received.name} ({size} bytes, sha256 {digest}…): {received.path}")

    def show_refused(self, refused) -> None:
        who = self.chat.peer_name(refused.peer)
        later = f"; try again in {refused.retry_after} s" if refused.retry_after else ""
        if refused.by_us:
            self.out(f"*** not storing {refused.name} ({refused.size} bytes) from {who}: {refused.reason}")
        else:
            self.out(f"*** {who} refused {refused.name} ({refused.code}): {refused.reason}{later}")

    def show_status(self, node_id: str, status: str, detail: str) -> None:
        if status in ("joined", "reconnected") and node_id not in self.chat.names:
            self.waiting_names[node_id] = status  # said once the peer has told us its name
            return
        who = self.chat.peer_name(node_id)
        text = {
            "joined": f"{who} joined ({node_id[:8]})",
            "reconnected": f"{who}: reconnected",
            "suspended": f"{who}: connection lost, resuming…",
            "resumed": f"{who}: resumed",
            "left": f"{who}: session ended ({detail})",
            "dropped": f"{who}: dropped for a bad message ({detail})",
        }[status]
        self.say_status(text)

    def peers_changed(self) -> None:
        for node_id in [n for n in self.waiting_names if n in self.chat.names]:
            self.show_status(node_id, self.waiting_names.pop(node_id), "")
        self.session.app.invalidate()

    # -- commands ----------------------------------------------------------------------

    async def run(self) -> None:
        from prompt_toolkit.patch_stdout import patch_stdout
        from twisted.internet.defer import Deferred

        self.out(HELP)
        with patch_stdout(raw=True):
            while True:
                try:
                    prompt = asyncio.ensure_future(self.session.prompt_async(printable(f"{self.chat.name}> ")))
                    text = await Deferred.fromFuture(prompt)
                except (EOFError, KeyboardInterrupt):
                    return
                if not self.command(text.strip()):
                    return

    def command(self, text: str) -> bool:
        """Run one typed line; False to quit."""
        if text in ("/quit", "/exit"):
            return False
        if text == "/peers":
            self.list_peers()
        elif text.startswith("/send"):
            self.send(os.path.expanduser(text[len("/send") :].strip()))
        elif text.startswith("/"):
            self.out(f"unknown command {text.split()[0]}; {HELP}")
        elif text:
            try:
                self.chat.say(text)
            except ValueError as e:
                self.out(f"not sent: {e}")
        return True

    def list_peers(self) -> None:
        if not self.switch.peers:
            self.out("no peers")
        for peer in self.switch.peers.values():
            rtt = f"{peer.round_trip * 1000:.1f} ms" if peer.round_trip is not None else "-"
            direction = "out" if peer.is_outbound else "in"
            self.out(
                f"  {self.chat.peer_name(peer.node_id):16} {peer.node_id}  {peer.state:10} {direction:3} "
                f"{peer.remote_address}  rtt {rtt}"
            )

    def send(self, path: str) -> None:
        if not path:
            return self.out("usage: /send FILE")
        if self.sending is not None:
            return self.out(f"already sending {self.sending[0]}; wait for it to finish")
        if not self.switch.peers:
            return self.out("no peers to send to")
        name = os.path.basename(path)
        try:
            d = self.chat.send_file(path, on_progress=lambda sent, total: self.progress(name, sent, total))
        except OSError as e:
            return self.out(f"cannot send {path}: {e.strerror or e}")
        self.sending = (name, 0, os.path.getsize(path))  # the file's bytes, counted once (not per peer)
        d.addCallback(self.sent, name)
        d.addErrback(lambda f: self.out(f"sending {name} failed: {f.getErrorMessage()}"))
        d.addBoth(lambda _: setattr(self, "sending", None))

    def progress(self, name: str, sent: int, total: int) -> None:
        self.sending = (name, sent, total)
        self.session.app.invalidate()

    def sent(self, receipts: dict, name: str) -> None:
        _, sent, total = self.sending
        self.out(f"{name} ", (sent, total))
        results = [
            f"{self.chat.peer_name(node_id)} {'ok' if receipt.ok else 'FAILED: ' + receipt.reason}"
            for node_id, receipt in receipts.items()
        ]
        self.out(f"*** sent {name}: {'; '.join(results)}")


def announce(switch, port) -> str:
    host = port.getHost()
    shown = "127.0.0.1" if host.host in ("0.0.0.0", "::") else host.host
    address = f"{switch.node_id}@{shown}:{host.port}"
    print(f"listening on {host.host}:{host.port}; others can use --peer {address}", flush=True)
    return address


async def main(clock, options, key) -> None:
    from twisted.internet.defer import Deferred

    from mconn import Config, Switch, TLSOptions
    from mconn.ops.status import local_endpoint
    from reactors.chat import ChatReactor

    chat = ChatReactor(options["name"], options["downloads"], **limits_of(options))
    # Identity-mode TLS: each peer's node id is proven by its key, so a peer that restarts
    # gets a fresh session at once (in plaintext it waits out its old session's grace).
    tls = None if options["plaintext"] else TLSOptions.identity(key)
    switch = Switch([chat], node_key=key, tls=tls, config=Config(stats_interval=0), clock=clock)
    switch.startService()
    stopping = []

    def stop():
        if not stopping:
            stopping.append(switch.stopService())
        return stopping[0]

    clock.addSystemEventTrigger("before", "shutdown", stop)  # SIGTERM, SIGINT
    print(f"{chat.name} is node {switch.node_id}", flush=True)
    for endpoint in map(local_endpoint, options["listen"]):
        try:
            announce(switch, await switch.listen(endpoint))
        except Exception as e:  # a busy port, a bad endpoint string: say which, and stop
            print(f"cannot listen on {endpoint}: {e}", file=sys.stderr)
            await stop()
            raise SystemExit(2) from None  # said above
    terminal = ChatTerminal(switch, chat, clock)
    for address in options["peer"]:
        d = switch.dial(address, persistent=True, retry_initial_dial=True)
        d.addErrback(lambda f, a=address: terminal.say_status(f"gave up on {a}: {f.getErrorMessage()}"))
    await terminal.run()
    terminal.out("closing connections…")
    await stop()
    await Deferred.fromFuture(asyncio.ensure_future(asyncio.sleep(0)))  # let the last output flush


def run(argv=None) -> None:
    options = Options()
    try:
        options.parseOptions(argv)
    except usage.UsageError as e:
        print(f"{sys.argv[0]}: {e}\n{options}", file=sys.stderr)
        raise SystemExit(2) from None  # said above
    from mconn import NodeKey

    try:
        key = NodeKey.load_or_create(options["key"]) if options["key"] else NodeKey.generate()
    except ValueError as e:  # unreadable, readable by others, not an Ed25519 key: it says which
        print(f"{sys.argv[0]}: {e}", file=sys.stderr)
        raise SystemExit(2) from None  # said above
    from twisted.internet import asyncioreactor

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    asyncioreactor.install(loop)
    from twisted.internet import defer, task
    from twisted.logger import globalLogBeginner, textFileLogObserver

    log = open(options["log"], "a") if options["log"] else open(os.devnull, "w")
    globalLogBeginner.beginLoggingTo([textFileLogObserver(log)], redirectStandardIO=False)
    task.react(lambda clock: defer.ensureDeferred(main(clock, options, key)))


if __name__ == "__main__":
    run()
