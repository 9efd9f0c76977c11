"""examples/chat.py used as a person would: three chat peers in a real terminal (tmux).

The test types with ``send-keys`` and reads with ``capture-pane``, on a private tmux server
(``tmux -S <socket in a fresh temporary directory>``) that it kills at the end whatever
happens; every chat process
is stopped by its PID. The final screens are saved under the test's tmp dir (the path is
printed). Every wait is a bounded poll.
"""

import hashlib
import os
import pathlib
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from mconn import NodeKey

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (make installs it)"),
]

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 20.0
EXITED = "[chat exited with status"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Terminal:
    """A private tmux server with one window per chat peer."""

    def __init__(self, tmp_path):
        self.socket_dir = tempfile.mkdtemp(prefix="mconn-chat-")  # short: a socket path has a length limit
        self.socket = os.path.join(self.socket_dir, "tmux")
        self.env = dict(os.environ, LC_ALL="C.UTF-8", LANG="C.UTF-8", PYTHONPATH=str(ROOT))
        self.env.pop("TMUX", None)
        self.tmp_path = tmp_path
        self.commands = {}
        self.pids = set()
        idle = "sleep 100000"  # a first window, so that the session outlives the chat windows
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", "chat", "-n", "idle", "-x", "160", "-y", "50", idle)
        self.tmux("set-option", "-g", "remain-on-exit", "on")

    def tmux(self, *args) -> str:
        result = subprocess.run(
            ["tmux", "-u", "-S", self.socket, *args], env=self.env, capture_output=True, text=True, timeout=10
        )
        assert result.returncode == 0, f"tmux {' '.join(args)}: {result.stderr}"
        return result.stdout

    def start(self, window, *args, shell=""):
        """Run examples/chat.py in ``window``; the shell reports its exit status after it.

        ``shell`` is appended to the command line unquoted (``--name "$(printf ...)"``).
        """
        chat = " ".join(shlex.quote(a) for a in (sys.executable, str(ROOT / "examples" / "chat.py"), *args))
        chat = f"{chat} {shell}" if shell else chat
        self.commands[window] = f'{chat}; echo "{EXITED} $?]"'
        if window not in self.windows():
            self.tmux("new-window", "-d", "-t", "chat:", "-n", window, "sleep 100000")
        self.tmux("respawn-pane", "-k", "-t", f"chat:{window}", self.commands[window])
        self.pid(window)

    def restart(self, window):
        """Run the window's command again; its old screen is saved and cleared first."""
        captures = self.tmp_path / "captures"
        captures.mkdir(exist_ok=True)
        (captures / f"{window}-before-restart.txt").write_text(self.screen(window))
        self.tmux("clear-history", "-t", f"chat:{window}")
        self.tmux("respawn-pane", "-k", "-t", f"chat:{window}", self.commands[window])
        self.pid(window)

    def windows(self):
        return self.tmux("list-windows", "-t", "chat", "-F", "#{window_name}").split()

    def pid(self, window) -> int:
        """The chat process's PID: the child of the pane's shell."""
        shell = int(self.tmux("list-panes", "-t", f"chat:{window}", "-F", "#{pane_pid}").split()[0])

        def child():
            try:
                return pathlib.Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
            except FileNotFoundError:
                return []

        [pid] = wait(child, f"the chat process in {window}")
        self.pids.add(int(pid))
        return int(pid)

    def type(self, window, text, enter=True):
        self.tmux("send-keys", "-t", f"chat:{window}", "-l", text)
        if enter:
            self.tmux("send-keys", "-t", f"chat:{window}", "Enter")

    def visible(self, window) -> str:
        """The pane as it is on the screen now, without the scrollback."""
        return self.tmux("capture-pane", "-p", "-J", "-t", f"chat:{window}")

    def title(self, window) -> str:
        """The pane's title, which a program sets with ESC ] 0 or 2 ; title BEL."""
        return self.tmux("display-message", "-p", "-t", f"chat:{window}", "#{pane_title}").rstrip("\n")

    def screen(self, window) -> str:
        """The pane with its scrollback, wrapped lines joined."""
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", f"chat:{window}")

    def wait_for(self, window, text, after=None):
        """Wait until ``text`` shows in ``window`` (after the first ``after`` if given)."""

        def shown():
            screen = self.screen(window)
            if after is not None:
                at = screen.find(after)
                screen = screen[at + len(after) :] if at >= 0 else ""
            return text in screen

        wait(shown, f"{text!r} in the {window} window", lambda: self.screen(window))

    def close(self):
        """Save every screen, kill the tmux server, then any chat process still alive."""
        captures = self.tmp_path / "captures"
        captures.mkdir(exist_ok=True)
        try:
            for window in self.windows():
                (captures / f"{window}.txt").write_text(self.screen(window))
        finally:
            subprocess.run(["tmux", "-S", self.socket, "kill-server"], env=self.env, capture_output=True, timeout=10)
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            for pid in self.pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            print(f"\nfinal tmux screens saved in {captures}")


def wait(predicate, what, show=lambda: ""):
    deadline = time.monotonic() + TIMEOUT
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {TIMEOUT}s waiting for {what}\n{show()}")
        time.sleep(0.1)


@pytest.fixture
def terminal(tmp_path):
    t = Terminal(tmp_path)
    try:
        yield t
    finally:
        t.close()


def test_three_chat_peers_in_a_terminal_chat_send_a_file_and_ride_out_a_restart(terminal, tmp_path):
    """Three terminal chat peers exchange lines once each (a half-typed line survives), send a file intact and
    ride out one peer's kill and restart."""
    names = ("alice", "bob", "carol")
    ports = {name: free_port() for name in names}
    ids = {}
    for name in names:
        key = NodeKey.generate()
        key.save(tmp_path / f"{name}.key")
        ids[name] = key.node_id

    def address(name):
        return f"{ids[name]}@127.0.0.1:{ports[name]}"

    def args(name, *peers):
        return [
            "--name", name, "--listen", f"tcp:{ports[name]}:interface=127.0.0.1",
            "--key", str(tmp_path / f"{name}.key"),
            "--downloads", str(tmp_path / f"{name}-downloads"), "--log", str(tmp_path / f"{name}.log"),
            *[a for p in peers for a in ("--peer", address(p))],
        ]  # fmt: skip

    terminal.start("alice", *args("alice"))
    terminal.start("bob", *args("bob", "alice"))
    terminal.start("carol", *args("carol", "alice", "bob"))
    for name in names:
        terminal.wait_for(name, f"others can use --peer {address(name)}")
        for other in names:
            if other != name:
                terminal.wait_for(name, f"*** {other} joined ({ids[other][:8]})")

    # A line typed in one appears in the other two, once; a half-typed line survives
    # a message arriving meanwhile.
    terminal.type("alice", "hello from alice")
    terminal.type("bob", "half typ", enter=False)
    for name in ("bob", "carol"):
        terminal.wait_for(name, "[alice] hello from alice")
    terminal.type("bob", "ed line")
    for name in ("alice", "carol"):
        terminal.wait_for(name, "[bob] half typed line")
    for name in names:
        screen = terminal.screen(name)
        assert screen.count("hello from alice") == 1 and screen.count("half typed line") == 1, screen

    # A file sent arrives intact at both others, with the progress bar shown.
    data = os.urandom(3 << 20)
    (tmp_path / "photo.bin").write_bytes(data)
    terminal.type("bob", f"/send {tmp_path / 'photo.bin'}")
    terminal.wait_for("bob", "*** sent photo.bin: ")
    screen = terminal.screen("bob")
    [result] = [line for line in screen.splitlines() if line.startswith("*** sent photo.bin: ")]
    assert sorted(result.split(": ", 1)[1].split("; ")) == ["alice ok", "carol ok"], result
    [progress] = [line for line in screen.splitlines() if line.startswith("photo.bin ")]
    assert "━" * 30 in progress and "100% 3.0/3.0 MiB" in progress, progress  # counted once, not per peer
    for name in ("alice", "carol"):
        terminal.wait_for(name, "*** bob sent photo.bin (3145728 bytes")
        stored = (tmp_path / f"{name}-downloads" / "photo.bin").read_bytes()
        assert hashlib.sha256(stored).digest() == hashlib.sha256(data).digest()

    # Killing carol shows the loss to the others; restarting her (same key and port)
    # shows the reconnect, and she chats again.
    os.kill(terminal.pid("carol"), signal.SIGKILL)
    for name in ("alice", "bob"):
        terminal.wait_for(name, "*** carol: connection lost, resuming…")
    terminal.wait_for("carol", f"{EXITED} {128 + signal.SIGKILL}]")
    terminal.restart("carol")
    for name in ("alice", "bob"):
        terminal.wait_for(name, "*** carol: reconnected", after="carol: connection lost")
    terminal.wait_for("carol", "*** alice joined")
    terminal.wait_for("carol", "*** bob joined")
    terminal.type("carol", "back again")
    for name in ("alice", "bob"):
        terminal.wait_for(name, "[carol] back again")

    terminal.type("alice", "/peers")
    for other in ("bob", "carol"):
        terminal.wait_for("alice", f"{ids[other]}  connected", after="/peers")

    for name in names:
        terminal.type(name, "/quit")
        terminal.wait_for(name, f"{EXITED} 0]")


def test_a_peer_whose_name_is_a_terminal_command_shows_as_text_and_changes_nothing(terminal, tmp_path):
    """A peer named with a window-title sequence and a clear-screen sequence (wrapped in \\x01...\\x02, which
    prompt_toolkit's ANSI() writes raw) joins and talks: the other peer's pane title stays, its screen is not
    cleared, and the name shows as escaped text in its status line, chat line and toolbar."""
    ports = {name: free_port() for name in ("alice", "mallory")}
    key = NodeKey.generate()
    key.save(tmp_path / "alice.key")
    alice = f"{key.node_id}@127.0.0.1:{ports['alice']}"

    def args(name):
        return ["--listen", f"tcp:{ports[name]}:interface=127.0.0.1", "--downloads", str(tmp_path / f"{name}-dl"),
                "--log", str(tmp_path / f"{name}.log")]  # fmt: skip

    terminal.start("alice", "--name", "alice", "--key", str(tmp_path / "alice.key"), *args("alice"))
    terminal.wait_for("alice", f"others can use --peer {alice}")
    title = terminal.title("alice")
    assert "pwned" not in title
    name = r"\001\033]0;pwned\007\033[2J\002mallory"  # printf makes the octal escapes bytes
    terminal.start("mallory", *args("mallory"), "--peer", alice, shell=f'--name "$(printf {shlex.quote(name)})"')
    shown = r"\x01\x1b]0;pwned\x07\x1b[2J\x02mallory"
    terminal.wait_for("alice", "mallory joined (")
    terminal.wait_for("mallory", "*** alice joined (")
    terminal.type("mallory", "hello from mallory")
    terminal.wait_for("alice", "mallory] hello from mallory")
    time.sleep(1.5)  # three refreshes of the bottom toolbar, which names the peers
    screen = terminal.visible("alice")
    assert terminal.title("alice") == title, "a peer's name retitled the window"
    assert f"others can use --peer {alice}" in screen, f"a peer's name cleared the screen:\n{screen}"
    assert f"*** {shown} joined (" in screen and f"[{shown}] hello from mallory" in screen, screen
    [toolbar] = [line for line in screen.splitlines() if line.startswith(" alice | peers: ")]
    assert shown in toolbar, toolbar
    for name in ("alice", "mallory"):
        terminal.type(name, "/quit")
        terminal.wait_for(name, f"{EXITED} 0]")
