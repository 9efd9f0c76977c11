"""The ``mconn`` command: keygen, id, and status against a small twisted.web server."""

import json
import os
import re
import stat

import pytest
import pytest_twisted
from twisted.internet import threads
from twisted.web import resource, server

from mconn import NodeKey
from mconn.ops.cli import format_duration, format_round_trip, format_status, main, status_url

ID_A, ID_B = "a1" * 20, "b2" * 20

#: The status document of a node with two peers, the shape ``mconn status`` reads.
STATUS = {
    "node_id": "c3" * 20,
    "listen_addresses": ["127.0.0.1:26656", "[::1]:26656"],
    "peers": [
        {
            "node_id": ID_A,
            "state": "connected",
            "remote_address": "127.0.0.1:40112",
            "uptime": 3725.4,
            "resumes": 2,
            "round_trip": 0.0123,
            "channels": [{"channel_id": 16, "priority": 5, "queue_depth": 0}],
        },
        {
            "node_id": ID_B,
            "state": "suspended",
            "remote_address": None,
            "uptime": 42,
            "resumes": 0,
            "round_trip": None,
            "channels": [],
        },
    ],
}


def test_keygen_writes_a_0600_key_and_prints_its_node_id(tmp_path, capsys):
    """mconn keygen writes a mode-0600 key, prints its node id and leaves no temporary file."""
    path = tmp_path / "node.key"
    assert main(["keygen", str(path)]) == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    node_id = NodeKey.load(path).node_id
    assert capsys.readouterr().out == f"wrote {path}: node id {node_id}\n"
    assert os.listdir(tmp_path) == ["node.key"]  # no temporary file left


def test_keygen_refuses_to_overwrite(tmp_path, capsys):
    """mconn keygen refuses to overwrite an existing file, says so in one line and leaves the file as it was."""
    path = tmp_path / "node.key"
    path.write_text("precious")
    assert main(["keygen", str(path)]) == 1
    assert capsys.readouterr().err == f"mconn keygen: {path} already exists; remove it first to replace the key\n"
    assert path.read_text() == "precious"
    assert os.listdir(tmp_path) == ["node.key"]


def test_keygen_into_a_missing_directory_says_so(tmp_path, capsys):
    """mconn keygen into a missing directory fails with exit 1 and says it cannot write."""
    assert main(["keygen", str(tmp_path / "nowhere" / "node.key")]) == 1
    assert "cannot write" in capsys.readouterr().err


def test_id_prints_the_node_id(tmp_path, capsys):
    """mconn id prints the node id of a key file."""
    key = NodeKey.generate()
    key.save(tmp_path / "node.key")
    assert main(["id", str(tmp_path / "node.key")]) == 0
    assert capsys.readouterr().out == key.node_id + "\n"


def test_id_of_a_loose_key_fails_with_one_line(tmp_path, capsys):
    """mconn id of a key others can read fails with one line that says to chmod 600."""
    NodeKey.generate().save(tmp_path / "node.key")
    (tmp_path / "node.key").chmod(0o644)
    assert main(["id", str(tmp_path / "node.key")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mconn id: node key ") and "chmod 600" in err and err.count("\n") == 1


def test_usage_errors_exit_2(capsys):
    """An unknown subcommand is a usage error: exit code 2."""
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2


def test_status_table():
    """The status table shows the node id, the listen addresses and one aligned row per peer, '-' where a
    value is unknown."""
    lines = format_status(STATUS).splitlines()
    assert lines[0] == f"node       {'c3' * 20}"
    assert lines[1] == "listening  127.0.0.1:26656, [::1]:26656"
    header, first, second = lines[3:]
    assert header.split() == ["PEER", "STATE", "ADDRESS", "UPTIME", "RESUMES", "RTT"]
    assert re.fullmatch(rf"{ID_A}  connected  127\.0\.0\.1:40112 +1h02m +2  12\.3 ms", first)
    assert re.fullmatch(rf"{ID_B}  suspended  - +42s +0 +-", second)


def test_status_says_which_hot_path_the_node_runs_and_why():
    """With the status document's hot_path (and hot_path_why when pure), a line under the listen
    addresses says which per-packet path the node runs."""
    pure = format_status({**STATUS, "hot_path": "pure Python", "hot_path_why": "MCONN_PURE=1"}).splitlines()
    assert pure[2] == "hot path   pure Python (MCONN_PURE=1)"
    fast = format_status({**STATUS, "hot_path": "accelerated", "hot_path_why": None}).splitlines()
    assert fast[2] == "hot path   accelerated"
    assert fast[4].split() == ["PEER", "STATE", "ADDRESS", "UPTIME", "RESUMES", "RTT"]


def test_status_says_what_websocket_frames_run_on_and_why():
    """With ws_frames (and ws_frames_why when pure), a line under the hot path's says which
    code builds and reads WebSocket frames."""
    both = {**STATUS, "hot_path": "accelerated", "hot_path_why": None}
    pure = format_status({**both, "ws_frames": "pure Python", "ws_frames_why": "MCONN_PURE=1"}).splitlines()
    assert pure[2:4] == ["hot path   accelerated", "ws frames  pure Python (MCONN_PURE=1)"]
    fast = format_status({**both, "ws_frames": "accelerated", "ws_frames_why": None}).splitlines()
    assert fast[3] == "ws frames  accelerated"
    assert fast[5].split() == ["PEER", "STATE", "ADDRESS", "UPTIME", "RESUMES", "RTT"]


def test_status_without_peers():
    """A status without peers ends with 'no peers'."""
    assert format_status({"node_id": "x", "listen_addresses": [], "peers": []}).splitlines()[-1] == "no peers"


@pytest.mark.parametrize(
    "url, expected",
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/status.json"),
        ("127.0.0.1:8080/", "http://127.0.0.1:8080/status.json"),
        ("https://node.example/admin/status.json", "https://node.example/admin/status.json"),
    ],
)
def test_status_url(url, expected):
    """A status address becomes the URL of its status.json: http:// added when missing, a full URL kept."""
    assert status_url(url) == expected


def test_durations_and_round_trips():
    """Durations and round trips are shown in short human units, and '-' when unknown or negative."""
    assert [format_duration(s) for s in (0, 59.9, 60, 3599, 3600, 90000, None, -1)] == [
        "0s",
        "59s",
        "1m00s",
        "59m59s",
        "1h00m",
        "1d01h",
        "-",
        "-",
    ]
    assert [format_round_trip(s) for s in (0.0004, 1.5, None)] == ["0.4 ms", "1500.0 ms", "-"]


class StatusPage(resource.Resource):
    """Serves ``body`` at /status.json, 404 elsewhere."""

    isLeaf = True

    def __init__(self, body: bytes) -> None:
        super().__init__()
        self.body = body

    def render_GET(self, request):
        if request.path != b"/status.json":
            request.setResponseCode(404)
            return b"not found"
        request.setHeader(b"content-type", b"application/json")
        return self.body


def serve(body: bytes):
    from twisted.internet import reactor

    return reactor.listenTCP(0, server.Site(StatusPage(body)), interface="127.0.0.1")


@pytest_twisted.ensureDeferred
async def test_status_fetches_status_json_from_a_running_server(capsys):
    """mconn status fetches status.json from a running server and prints it as the status table."""
    port = serve(json.dumps(STATUS).encode())
    try:
        code = await threads.deferToThread(main, ["status", f"http://127.0.0.1:{port.getHost().port}"])
    finally:
        await port.stopListening()
    assert code == 0
    assert capsys.readouterr().out == format_status(STATUS) + "\n"


@pytest_twisted.ensureDeferred
async def test_status_errors_are_one_line(capsys):
    """mconn status reports an HTTP error, a body that is not JSON and an unreachable server in one line each,
    exit 1."""
    port = serve(b"<html>")
    number = port.getHost().port
    try:
        assert await threads.deferToThread(main, ["status", f"127.0.0.1:{number}/missing"]) == 1
        assert (
            capsys.readouterr().err
            == f"mconn status: http://127.0.0.1:{number}/missing/status.json: HTTP 404 Not Found\n"
        )
        assert await threads.deferToThread(main, ["status", f"127.0.0.1:{number}"]) == 1
        assert capsys.readouterr().err.startswith(f"mconn status: http://127.0.0.1:{number}/status.json is not JSON")
    finally:
        await port.stopListening()
    assert await threads.deferToThread(main, ["status", f"127.0.0.1:{number}"]) == 1
    assert (
        capsys.readouterr().err
        == f"mconn status: cannot reach http://127.0.0.1:{number}/status.json: Connection refused\n"
    )
