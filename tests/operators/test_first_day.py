"""A node operator's first day: the commands as a new user types them.

Real ``twistd -n mconn`` processes started from one directory with no ``--pidfile``, the
``mconn`` command in a shell pipe, ``twistd mconn --help``, a TOML file with a typo and
the chat example. Every process a test starts is stopped by its PID (the ``typed``
fixture), every wait is bounded.
"""

from __future__ import annotations

import json
import pathlib
import re
import signal
import socket
import subprocess
import sys
import urllib.request
import warnings

import pytest

from mconn import Config, SessionExpired, SessionRejected
from mconn.switch.peer import PeerStats
from mconn.ops.node_help import CONFIG_FIELDS, config_field_docs
from mconn.ops.node_settings import Options
from mconn.ops.telemetry_file import read_events
from operators.twistd_nodes import ENV, ROOT, STATUS_LINE, TIMEOUT, TWISTD, wait_until

pytestmark = pytest.mark.integration

MCONN = pathlib.Path(sys.executable).with_name("mconn")
LOOPBACK = "tcp:0:interface=127.0.0.1"


class Typed:
    """``twistd ARGS`` run in ``directory`` exactly as typed, stdout and stderr kept apart."""

    def __init__(self, directory: pathlib.Path, name: str, *args: str) -> None:
        self.directory, self.name = directory, name
        self.out, self.err = directory / f"{name}.out", directory / f"{name}.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen([str(TWISTD), *args], cwd=directory, env=ENV, stdout=out, stderr=err)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")

    def wait_log(self, text: str) -> str:
        def found():
            if text in self.log():
                return self.log()
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            return None

        return wait_until(found, f"{self.name}: {text!r}")

    def events(self, telemetry: str, name: str) -> list[dict]:
        path = self.directory / telemetry
        return [e for e in read_events(path) if e["event"] == name] if path.exists() else []

    def terminate(self) -> int:
        return terminate_all(self)[0]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=TIMEOUT)


def terminate_all(*nodes: Typed) -> list[int]:
    """SIGTERM to each node once it runs (SIGTERM is orderly from then on), then their exit
    statuses: they stop side by side."""
    for node in nodes:
        node.wait_log(" started: listening on ")
        node.process.send_signal(signal.SIGTERM)
    return [node.process.wait(timeout=TIMEOUT) for node in nodes]


@pytest.fixture
def typed(tmp_path):
    """Starts Typed processes in tmp_path; kills any still running at the end, by PID."""
    started = []

    def start(name, *args):
        started.append(Typed(tmp_path, name, *args))
        return started[-1]

    yield start
    for process in started:
        process.kill()


def run(args, cwd, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=TIMEOUT, **kwargs
    )


def keygen(directory: pathlib.Path, name: str) -> str:
    """``mconn keygen NAME.key``; the node id."""
    result = run([MCONN, "keygen", f"{name}.key"], directory)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("node id ")[1].strip()


def assert_clean_stop(node: Typed, status: int) -> None:
    log = node.log()
    assert status == -signal.SIGTERM, f"{node.name} exited with {status}:\n{log}"
    assert "Traceback" not in log and "Failed to unlink" not in log, log


def test_nodes_from_one_directory_keys_status_pipe_and_wording(tmp_path, typed):
    """A --key that does not exist stops twistd with one line saying how to make
    one, writing nothing. Two ``twistd -n mconn`` nodes started from one directory without --pidfile
    each write the pid file named after their key (not both ./twistd.pid), connect, and stop cleanly
    removing it; one more on a running node's key stops with one line naming the running process; a
    node given --create-key logs loudly that it made a new identity (the others, whose keys exist, do
    not). The logs say "1 peer", "connection at ADDRESS" for a connection that ended before its hello,
    and why a dial failed; ``mconn status URL | head -3`` and a reader that reads nothing end without a
    BrokenPipeError."""
    refused = run([TWISTD, "-n", "mconn", "--key", "nodde.key", "--listen", LOOPBACK], tmp_path)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip() == (
        f"mconn: --key: {tmp_path / 'nodde.key'} does not exist; create a key with 'mconn keygen "
        f"{tmp_path / 'nodde.key'}' or start once with --create-key (a new node identity)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    a_id, b_id = keygen(tmp_path, "a"), keygen(tmp_path, "b")
    a = typed(
        "a",
        "-n",
        "mconn",
        "--key",
        "a.key",
        "--listen",
        LOOPBACK,
        "--status",
        "tcp:0",
        "--telemetry",
        "a.json",
        "--reactor",
        "operators.sample_reactors:Chat",
    )
    with socket.socket() as closed:  # a port nobody listens on, for a dial that fails
        closed.bind(("127.0.0.1", 0))
        dead = f"{'cd' * 20}@127.0.0.1:{closed.getsockname()[1]}"
    c = typed("c", "-n", "mconn", "--key", "c.key", "--create-key", "--peer", dead)  # starts while a does
    url = STATUS_LINE.search(a.wait_log("mconn status page of node")).group(1)
    address = wait_until(lambda: a.events("a.json", "listening"), "a's listening event")[0]["address"]
    b = typed(
        "b",
        "-n",
        "mconn",
        "--key",
        "b.key",
        "--peer",
        f"{a_id}@{address}",
        "--peer",
        f"{b_id}@{address}",
        "--telemetry",
        "b.json",
        "--reactor",
        "operators.sample_reactors:Chat",
    )
    b.wait_log(" started: listening on nothing, keeping 1 peer connected")
    wait_until(lambda: b.events("b.json", "session_started"), "b's session with a")
    assert (tmp_path / "a.pid").read_text().strip() == str(a.pid)
    assert (tmp_path / "b.pid").read_text().strip() == str(b.pid)
    assert not (tmp_path / "twistd.pid").exists()
    assert f"--peer {b_id}@{address} is this node itself" in b.log() and "1 peers" not in b.log()

    again = run([TWISTD, "-n", "mconn", "--key", "a.key", "--listen", LOOPBACK], tmp_path)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.strip().splitlines() == [
        f"mconn: pid file {tmp_path / 'a.pid'}: process {a.pid} is running; is a node with the key "
        f"{tmp_path / 'a.key'} running already? Stop it, or give twistd another --pidfile"
    ]
    assert (tmp_path / "a.pid").read_text().strip() == str(a.pid)

    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT):
        pass  # connects and closes before any hello
    a.wait_log(f"connection at {host}:")
    assert "with None" not in a.log()

    document = json.loads(urllib.request.urlopen(url + "status.json", timeout=TIMEOUT).read())
    [channel] = document["peers"][0]["channels"]  # named for what it counts
    assert channel["unconfirmed"] == 0 and "undelivered" not in channel
    assert ">unconfirmed</th>" in urllib.request.urlopen(url, timeout=TIMEOUT).read().decode()

    piped = run(["sh", "-c", f"'{MCONN}' status {url} | head -3"], tmp_path)
    assert piped.stderr == "" and len(piped.stdout.splitlines()) == 3 and a_id in piped.stdout
    unread = run(["sh", "-c", f"'{MCONN}' status {url} | head -n 0; echo status=$?"], tmp_path)
    assert unread.stderr == "" and unread.stdout == "status=0\n"

    c.wait_log("dial 1 to ")
    created = re.search(
        r"\[mconn\.node#warn\] created a new node key (\S+): this is a new node identity, "
        r"node id ([0-9a-f]{40})",
        c.log(),
    )
    assert created and created.group(1) == str(tmp_path / "c.key"), c.log()
    assert "created a new node key" not in a.log() + b.log()
    assert re.search(r"dial 1 to (?:cd)+@127\.0\.0\.1:\d+: failed \(ConnectionRefusedError: .*refused", c.log()), (
        c.log()
    )
    for node, status in zip((c, b, a), terminate_all(c, b, a), strict=True):
        assert_clean_stop(node, status)
        assert not (tmp_path / f"{node.name}.pid").exists()


def test_a_port_in_use_stops_the_node_in_one_line(tmp_path):
    """A --listen or --status port already in use stops ``twistd -n mconn`` with one line on
    stderr, exit status 1, no traceback in its log, no node_started event and no pid file left."""
    keygen(tmp_path, "n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = f"tcp:{taken.getsockname()[1]}:interface=127.0.0.1"
        for option, args in (
            ("--listen", ["--listen", endpoint]),
            ("--status", ["--listen", LOOPBACK, "--status", endpoint]),
        ):
            result = run([TWISTD, "-n", "mconn", "--key", "n.key", "--telemetry", "n.json", *args], tmp_path)
            assert result.returncode == 1, result.stdout + result.stderr
            assert result.stderr.splitlines() == [f"mconn: StartupError: {option} {endpoint}: Address already in use"]
            assert "Traceback" not in result.stdout, result.stdout
            assert not [e for e in read_events(tmp_path / "n.json") if e["event"] == "node_started"]
            assert not (tmp_path / "n.pid").exists()


def help_blocks(text: str) -> dict[str, str]:
    """{long option: its help with all whitespace removed} from ``twistd mconn --help``."""
    blocks, current = {}, None
    for line in text.splitlines():
        start = re.match(r"^ {2,8}(?:-\w, )?--([\w-]+)=?(?:\s+(.*))?$", line)
        if start:
            current = start.group(1)
            blocks[current] = start.group(2) or ""
        elif current is not None and line.startswith(" " * 20):
            blocks[current] += line
    return {name: re.sub(r"\s+", "", text) for name, text in blocks.items()}


def shown(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, frozenset):
        return ", ".join(sorted(value)) or "none"
    return str(value)


def test_help_states_each_config_fields_meaning_and_true_default(tmp_path):
    """``twistd mconn --help`` gives every Config field's option the comment above the field in
    mconn/config.py and the default a twistd node really uses (Config's: a field whose node default
    differed would say both); a boolean field is a pair of flags, and --no-tcp-keepalive turns it off."""
    result = run([TWISTD, "mconn", "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    blocks = help_blocks(result.stdout)
    docs = config_field_docs()
    options = Options()
    options.parseOptions([])
    node_config, config = options.settings.config, Config()
    for name in CONFIG_FIELDS:
        option = name.replace("_", "-")
        assert len(docs.get(name, "").split()) >= 4, f"Config.{name} needs a #: comment: meaning, unit, default"
        assert re.sub(r"\s+", "", docs[name]) in blocks[option], (name, blocks[option])
        default = re.search(r"\[default:([^\]]*)\]", blocks[option]).group(1)
        assert default.startswith(re.sub(r"\s+", "", shown(getattr(node_config, name)))), (name, default)
        if getattr(node_config, name) != getattr(config, name):
            assert f"Config'sis{shown(getattr(config, name))}" in default, (name, default)
        if isinstance(getattr(config, name), bool):
            assert f"no-{option}" in blocks, name
    off = Options()
    off.parseOptions(["--no-tcp-keepalive", "--tcp-nodelay"])
    assert (off.settings.config.tcp_keepalive, off.settings.config.tcp_nodelay) == (False, True)
    assert node_config == config  # no twistd default differs from Config's


def test_a_plaintext_node_gives_up_on_a_tls_only_node_at_once_saying_why(tmp_path, typed):
    """A plaintext node whose --peer is a TLS-only node is refused with close code tls_required
    and stops dialing it after that one attempt, logging why, instead of retrying forever."""
    tls_id, _ = keygen(tmp_path, "tls"), keygen(tmp_path, "plain")
    tls = typed("tls", "-n", "mconn", "--key", "tls.key", "--tls", "--listen", LOOPBACK, "--telemetry", "tls.json")
    address = wait_until(lambda: tls.events("tls.json", "listening"), "the TLS node's listening event")[0]["address"]
    plain = typed(
        "plain", "-n", "mconn", "--key", "plain.key", "--peer", f"{tls_id}@{address}", "--telemetry", "plain.json"
    )
    gave_up = wait_until(lambda: plain.events("plain.json", "dial_gave_up"), "the plaintext node to give up")
    assert "tls_required" in gave_up[0]["reason"]
    plain.wait_log(f"dialing {tls_id}@{address} failed: gave up dialing")
    attempts = plain.events("plain.json", "dial_attempt")
    assert [e["result"] for e in attempts] == ["not_retried"], attempts
    assert_clean_stop(plain, plain.terminate())
    assert [e["result"] for e in plain.events("plain.json", "dial_attempt")] == ["not_retried"]
    assert_clean_stop(tls, tls.terminate())


def test_toml_typo_dashed_key_lonely_node_chat_on_loopback_and_layout(tmp_path, typed):
    """A TOML key with a typo stops twistd with one short line naming the closest
    valid key; a dashed key (``ping-interval = 5``) is the setting of the same name; a node with neither
    --listen nor --peer warns that nobody can reach it; the chat example's ``--listen tcp:0`` listens on
    127.0.0.1 only; the README's layout names every tests/ directory and the pipeline's events table."""
    keygen(tmp_path, "n")
    (tmp_path / "typo.toml").write_text("ping_intervall = 5\n")
    result = run([TWISTD, "-n", "mconn", "--key", "n.key", "--config", "typo.toml"], tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == "mconn: typo.toml: ping_intervall: unknown setting; did you mean ping_interval?"
    (tmp_path / "dashed.toml").write_text("ping-interval = 5\n")
    lonely = typed("lonely", "-n", "mconn", "--key", "n.key", "--config", "dashed.toml")
    warning = lonely.wait_log("no --listen and no --peer")
    assert "this node has no --listen and no --peer: nobody can reach it" in warning
    options = Options()
    options.parseOptions(["--config", str(tmp_path / "dashed.toml")])
    assert options.settings.config.ping_interval == 5.0
    chat = run(
        [sys.executable, ROOT / "examples" / "chat.py", "--name", "x", "--listen", "tcp:0", "--key", "x.key"],
        tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert re.search(r"^listening on 127\.0\.0\.1:\d+;", chat.stdout, re.M), chat.stdout + chat.stderr
    assert_clean_stop(lonely, lonely.terminate())
    readme = (ROOT / "README.md").read_text()
    layout = next(line for line in readme.splitlines() if line.startswith("| `tests/` |"))
    for directory in sorted(
        p.name for p in (ROOT / "tests").iterdir() if (p / "conftest.py").exists() or (p / "__init__.py").exists()
    ):
        assert f"`{directory}/`" in layout, directory
    assert "`events`" in readme.split("## Study a fleet's telemetry")[1].split("##")[0]


def test_the_count_a_session_ends_with_is_named_not_confirmed_delivered():
    """The reason a session ends with counts the messages not confirmed delivered as
    ``unconfirmed`` and says so in its message; ``undelivered``, the old name on reasons and on
    ``peer.stats``, still answers the same counts and warns that it is deprecated."""
    expired, rejected = SessionExpired(30.0, {0x10: 2}), SessionRejected("unknown_session", {})
    assert (expired.unconfirmed, rejected.unconfirmed) == ({0x10: 2}, {})
    assert str(expired) == "session not resumed within resume_grace 30.0s; not confirmed delivered per channel: 0x10=2"
    stats = PeerStats(
        node_id="ab" * 20,
        is_outbound=True,
        state="connected",
        uptime=1.0,
        bytes_sent=0,
        bytes_received=0,
        round_trip=None,
        channels=(),
        unconfirmed={0x10: 1},
    )
    for old, new in (
        (lambda: expired.undelivered, expired.unconfirmed),
        (lambda: stats.undelivered, stats.unconfirmed),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert old() == new
        assert [w.category for w in caught] == [DeprecationWarning]
        assert "not confirmed delivered" in str(caught[0].message) and "unconfirmed" in str(caught[0].message)
