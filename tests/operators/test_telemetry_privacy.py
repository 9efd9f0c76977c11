"""Telemetry files give a local reader nothing to act with (specs/telemetry.md section 2.2).

The files are the owner's only (0600), however the umask is set, after every rotation,
and when an earlier run left them wider; and no record shows a session id, which in
plaintext mode is the resume secret: a reader who takes every ``session_id`` the file
shows and asks to resume with it, claiming the peer's node id, is refused and receives
none of the messages queued for the suspended session. Real Switches on 127.0.0.1, a
fault proxy to break the link, a raw socket for the reader; every wait bounded.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
import pytest_twisted

from faultproxy import FaultProxy
from helpers import bounded, close_packets_in, the_reactor, until
from integration.test_attacks_sessions import claiming_hello, listen, node, raw_connect
from integration.test_loopback import stop
from mconn import Config
from mconn.core.session_ref import session_ref
from mconn.ops.telemetry_file import FILE_MODE, TelemetryFileService, open_log_file, rotated_paths

RECORD = b'{"v":2,"event":"listening","node_id":"' + b"ab" * 20 + b'","log_time":1.0,"level":"info"}\n'


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_022():
    """The usual umask, under which Twisted's LogFile created 0644 files."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_a_new_file_and_every_rotated_one_are_0600_under_umask_022(tmp_path, umask_022):
    """PATH is created 0600, and so is each PATH a rotation makes; the rotated files keep 0600."""
    path = tmp_path / "n0.json"
    log_file = open_log_file(path, rotate_bytes=len(RECORD) * 2)
    try:
        for _ in range(9):
            log_file.write(RECORD)
    finally:
        log_file.close()
    files = rotated_paths(path)
    assert len(files) >= 4, files  # several rotations happened
    assert {name: mode_of(name) for name in files} == {name: FILE_MODE for name in files}


def test_files_an_earlier_run_left_readable_are_tightened_when_opened(tmp_path, umask_022):
    """PATH and its rotated files found 0644 and 0666 (an older node's) are 0600 once the
    service opens them, their records untouched."""
    path = tmp_path / "n0.json"
    for name, mode in ((path, 0o644), (tmp_path / "n0.json.1", 0o666), (tmp_path / "n0.json.2", 0o640)):
        name.write_bytes(RECORD)
        os.chmod(name, mode)
    service = TelemetryFileService(path, "ab" * 20, clock=the_reactor())
    try:
        assert {name: mode_of(name) for name in rotated_paths(path)} == {
            name: FILE_MODE for name in rotated_paths(path)
        }
        assert all(open(name, "rb").read() == RECORD for name in rotated_paths(path))
    finally:
        service.log_file.close()


def test_a_file_that_cannot_be_tightened_is_refused_naming_it_and_its_mode(tmp_path, monkeypatch):
    """A readable file whose mode cannot be changed (another user's) is an OSError naming
    the path and the mode, before anything is written to it."""
    path = tmp_path / "n0.json"
    path.write_bytes(b"")
    os.chmod(path, 0o644)

    def refuse(fd, mode):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchmod", refuse)
    with pytest.raises(OSError, match="its mode 0644 lets others read it and cannot be made 0600") as info:
        open_log_file(path)
    assert info.value.filename == str(path)


def test_a_device_path_keeps_its_mode(tmp_path):
    """Telemetry to /dev/null (not a regular file) leaves the device's mode alone."""
    before = mode_of(os.devnull)
    log_file = open_log_file(os.devnull, rotate_bytes=0)
    log_file.write(RECORD)
    log_file.close()
    assert mode_of(os.devnull) == before


def refs_in(path) -> set[str]:
    """Every session_id value the telemetry file at ``path`` shows."""
    refs = set()
    for name in rotated_paths(path):
        for line in open(name, encoding="ascii"):
            record = json.loads(line)
            if record.get("session_id"):
                refs.add(record["session_id"])
    return refs


@pytest_twisted.ensureDeferred
async def test_a_reader_of_the_file_cannot_resume_the_session_it_shows(tmp_path):
    """Node a writes telemetry while Alice's plaintext session with it is live, then
    suspended with lines queued for her. The file never contains the session id (hex, as a
    resume needs it), only its reference; a raw connection claiming Alice's id and asking
    to resume with each session_id the file shows is refused (session_held) and receives
    none of the queued lines; Alice herself resumes and gets them all."""
    config = Config(stats_interval=0.05, resume_grace=20.0, max_reconnect_delay=0.1)
    a, a_log = node(config)
    alice, alice_log = node(config)
    path = tmp_path / "a.json"
    telemetry = TelemetryFileService(path, a.node_id, clock=the_reactor())
    telemetry.startService()
    proxy = None
    try:
        port = await listen(a)
        proxy = FaultProxy("127.0.0.1", port)
        proxy_port = await proxy.start()
        await bounded(alice.dial(f"{a.node_id}@127.0.0.1:{proxy_port}"))
        await until(lambda: alice.node_id in a.peers, "a's side of the session")
        held = a.peers[alice.node_id]
        secret = held.session.id
        await until(lambda: refs_in(path), "a record naming the session")
        proxy.refuse(True)  # Alice's re-dials are refused until the path heals
        proxy.reset_all()
        await until(lambda: held.state == "suspended", "the suspension")
        lines = [f"queued line {n}".encode() for n in range(17)]
        for line in lines:
            assert held.try_send(0x30, line)
        await until(
            lambda: any('"session_suspended"' in open(p).read() for p in rotated_paths(path)),
            "session_suspended in the file",
        )
        shown = refs_in(path)

        def got(reader):
            """The queued lines a reader received: any means it resumed the session."""
            return [line for line in lines if line in bytes(reader.data)]

        for ref in shown:  # what a reader of the file would try
            reader = await raw_connect(port, claiming_hello(alice.node_id, session_id=bytes.fromhex(ref), resume=True))
            await until(
                lambda reader=reader: reader.lost is not None or got(reader), "the reader refused or resumed", 5
            )
            assert got(reader) == [], "the reader resumed the session and received its queued lines"
            await until(lambda reader=reader: reader.lost is not None, "the reader refused", 5)
            assert [code for code, _ in close_packets_in(bytes(reader.data))] == ["session_held"]
        assert a.peers[alice.node_id] is held and held.state == "suspended" and held.resumes == 0
        text = "".join(open(p).read() for p in rotated_paths(path))
        assert secret.hex() not in text and secret.hex().upper() not in text
        assert shown == {session_ref(secret)}
        proxy.refuse(False)
        await until(lambda: held.state == "connected", "Alice's resume", 10)
        await until(lambda: len(alice_log.messages[0x30]) == len(lines), "the queued lines at Alice")
        assert [message for _, message in alice_log.messages[0x30]] == lines
        a._check_invariants()
    finally:
        if proxy is not None:
            await proxy.stop()
        await stop(a, alice)
        telemetry.stopService()
    assert mode_of(path) == FILE_MODE
