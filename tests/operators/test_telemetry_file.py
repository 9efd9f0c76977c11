"""``--telemetry PATH``: a live three-node network writes files a pipeline can rely on.

Three nodes built by makeService, as twistd builds them, on real 127.0.0.1 sockets: each
writes its own events to its own file; every record read back (JSON Lines, version 2
records, specs/telemetry.md section 2) matches specs/telemetry.md (the parser of
tests/adapter/test_telemetry.py); one node's file rotates many times, and across all
rotations its records are exactly the events the node logged, in order.
"""

import functools
import pytest
import pytest_twisted
from twisted.internet import defer

from adapter.test_telemetry import SPEC_EVENTS, fields_of
from helpers import SPEC_TYPE_CHECKS, Telemetry, the_reactor, until as poll
from mconn.ops.node import Options, build_service
from mconn.ops.telemetry_file import ENVELOPE, read_events, rotated_paths
from operators.sample_reactors import CHAT

pytestmark = pytest.mark.integration

TIMEOUT = 15.0
#: Every wait of this module polls for at most TIMEOUT seconds.
until = functools.partial(poll, seconds=TIMEOUT)
ROTATE_BYTES = 1500  # a few lean records (specs/telemetry.md section 2): many rotations
#: What a network that connects, exchanges and shuts down must have written.
EXPECTED = {
    "listening",
    "connection_made",
    "handshake_done",
    "session_started",
    "channel_stats",
    "connection_lost",
    "session_ended",
}


def node(tmp_path, name, *args):
    """A node as twistd builds it; its retention keeps every rotated file, so that nothing read back is missing."""
    options = Options()
    options.parseOptions(
        [
            "--listen",
            "tcp:0:interface=127.0.0.1",
            "--key",
            str(tmp_path / f"{name}.key"),
            "--telemetry",
            str(tmp_path / f"{name}.json"),
            "--reactor",
            "operators.sample_reactors:Chat",
            "--stats-interval",
            "0.02",
            "--telemetry-keep-files",
            "1000",
            "--telemetry-keep-bytes",
            str(1 << 30),
            *args,
        ]
    )
    return build_service(options.settings, clock=the_reactor())


def address_of(service):
    return f"{service.switch.node_id}@127.0.0.1:{service.ports[0].getHost().port}"


@pytest.fixture
def network(tmp_path):
    """Three nodes: a (rotating every 1500 bytes), b and c dialing a, c also dialing b."""
    capture = Telemetry().start()
    started = []

    async def start():
        a = node(tmp_path, "a", "--telemetry-rotate-bytes", str(ROTATE_BYTES))
        a.startService()
        started.append(a)
        b = node(tmp_path, "b", "--peer", address_of(a))
        b.startService()
        started.append(b)
        c = node(tmp_path, "c", "--peer", address_of(a), "--peer", address_of(b))
        c.startService()
        started.append(c)
        return a, b, c

    yield start, capture
    stops = [defer.maybeDeferred(s.stopService) for s in reversed(started) if s.running]
    if stops:
        pytest_twisted.blockon(defer.DeferredList(stops).addTimeout(TIMEOUT, the_reactor()))
    capture.stop()


@pytest_twisted.ensureDeferred
async def test_telemetry_files_of_a_live_network_match_the_spec_and_rotate_without_loss(network, tmp_path):
    """A live network's telemetry files hold every logged event, matching the spec, and rotate by size without
    losing or splitting a record."""
    start, capture = network
    a, b, c = await start()
    await until(lambda: all(len(s.switch.peers) == 2 for s in (a, b, c)), "every node connected to the other two")
    for service in (a, b, c):
        for peer in service.switch.peers.values():
            peer.try_send(CHAT, b"hello from " + service.switch.node_id.encode())
    await until(lambda: len(rotated_paths(tmp_path / "a.json")) >= 4, "a's telemetry file to rotate a few times")
    for service in (c, b, a):
        await defer.maybeDeferred(service.stopService).addTimeout(TIMEOUT, the_reactor())

    for service, name in ((a, "a"), (b, "b"), (c, "c")):
        written = read_events(tmp_path / f"{name}.json")
        logged = [e for e in capture.events if e["node_id"] == service.switch.node_id]
        assert [(e["event"], e["log_time"]) for e in written] == [(e["event"], e["log_time"]) for e in logged], name
        assert EXPECTED <= {e["event"] for e in written}, name
        for event in written:
            assert_matches_spec(event)

    files = rotated_paths(tmp_path / "a.json")
    for path in files[:-1]:  # each rotated file: past the limit by less than one record
        size = (tmp_path / path).stat().st_size
        assert ROTATE_BYTES <= size < ROTATE_BYTES + 2048, (path, size)
        assert (tmp_path / path).read_bytes().endswith(b"\n"), path  # whole lines only
    ended = [e for e in read_events(tmp_path / "c.json") if e["event"] == "session_ended"]
    assert {e["reason_type"] for e in ended} == {"ConnectionClosed"}  # c stopped first: it closed both


def assert_matches_spec(event: dict) -> None:
    """The version 2 record has the envelope (v, event, node_id, log_time, level) and exactly the fields of its
    event in specs/telemetry.md, with their types and level; none of Twisted's log_ keys but log_time."""
    name = event["event"]
    assert name in SPEC_EVENTS, f"{name} is not in specs/telemetry.md"
    spec = SPEC_EVENTS[name]
    assert list(event)[: len(ENVELOPE)] == list(ENVELOPE) and event["v"] == 2, name
    assert fields_of(event) - {"v", "level"} == set(spec["fields"]), name
    assert [k for k in event if k.startswith("log_")] == ["log_time"], name
    assert event["level"] == spec["level"], name
    for field, type_name in spec["fields"].items():
        assert SPEC_TYPE_CHECKS[type_name](event[field]), f"{name}.{field} = {event[field]!r} is not {type_name}"
    for parent, children in spec["items"].items():
        for item in event[parent]:
            assert set(item) == set(children), f"{name}.{parent}[]"
            for field, type_name in children.items():
                assert SPEC_TYPE_CHECKS[type_name](item[field]), f"{name}.{parent}[].{field}"
