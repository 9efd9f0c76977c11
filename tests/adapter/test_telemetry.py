"""specs/telemetry.md against the events a live two-switch exchange emits, so neither drifts.

The field tables of the spec are parsed; a scripted exchange over in-memory transports
makes every event in mconn.switch.telemetry.FORMATS happen at least once; each emitted event
must carry exactly the documented fields, with the documented types, at the documented
level, and survive a round trip through Twisted's JSON log format.
"""

import pathlib
import re

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import eventAsJSON, eventFromJSON, formatEvent, formatEventAsClassicLogText

from helpers import SPEC_ROW, SPEC_TYPE_CHECKS, RawPeer, RecordingReactor, Telemetry, hello_packet, msg_packet
from mconn import ChannelDescriptor, Config
from mconn.switch.telemetry import DATA_ONLY, FORMATS, format_for
from mconn.testing import MemoryNetwork

SPEC = pathlib.Path(__file__).resolve().parents[2] / "specs" / "telemetry.md"

_HEADING = re.compile(r"^### `(\w+)`\s*$")
_LEVEL = re.compile(r"^Level `(\w+)`")


def parse_spec(text: str) -> dict:
    """{event: {"level": str, "fields": {name: type}, "items": {list_field: {name: type}}}}."""
    events: dict = {}
    current = None
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading:
            current = events.setdefault(heading.group(1), {"level": None, "fields": {}, "items": {}})
            continue
        if current is None:
            continue
        level = _LEVEL.match(line)
        if level:
            current["level"] = level.group(1)
        row = SPEC_ROW.match(line)
        if row:
            name, type_name = row.group(1), row.group(2).strip()
            assert type_name in SPEC_TYPE_CHECKS, f"unknown type {type_name!r} for {name} in {SPEC.name}"
            if "[]." in name:
                parent, child = name.split("[].")
                current["items"].setdefault(parent, {})[child] = type_name
            else:
                current["fields"][name] = type_name
    return events


SPEC_EVENTS = parse_spec(SPEC.read_text())

CHANNELS = [ChannelDescriptor(0x20, priority=5), ChannelDescriptor(0x21, priority=1)]


class Grumpy(RecordingReactor):
    """Raises on every receive (for reactor_error)."""

    def receive(self, channel_id, peer, message):
        super().receive(channel_id, peer, message)
        raise RuntimeError("grumpy")


@pytest.fixture(scope="module")
def emitted():
    """Every mconn event of a scripted exchange that makes each kind of event happen."""
    capture = Telemetry().start()
    try:
        network = MemoryNetwork(MemoryReactorClock())
        config = Config(stats_interval=5, reactor_errors="log")  # Grumpy's peer stays for the events after
        a = network.switch([RecordingReactor(CHANNELS[:1]), Grumpy(CHANNELS[1:])], config=config)
        b = network.switch([RecordingReactor(CHANNELS)], config=config)
        a.startService()
        b.startService()
        a.listen("tcp:26656:interface=127.0.0.1")  # listening
        b.dial(f"{a.node_id}@127.0.0.1:26656")  # connection_made, handshake_done
        [link] = network.complete_dials()
        peer = link.peer_of(b)
        peer.try_send(0x20, b"block")
        peer.try_send(0x21, b"upsets a reactor")  # reactor_error
        network.flush()
        network.advance(5)  # channel_stats
        link.disconnect()  # session_suspended; b re-dials: dial_attempt
        network.advance(0.001)
        network.complete_dials()  # session_resumed
        network.flush()
        impostor = RawPeer(hello_packet(b.node_id, CHANNELS))  # peer_rejected (duplicate)
        network.connect_raw(impostor, a)
        early = RawPeer(b"\x00")  # protocol_error without a peer
        network.connect_raw(early, a)
        late = RawPeer(hello_packet("ab" * 20, CHANNELS) + msg_packet(0x99, b"?"))  # ... with one
        network.connect_raw(late, a)
        network.flush()  # the old connection answers the probe: duplicate_connection
        network.advance(config.ping_interval + 1)  # keepalive pings, late (no verdict: no stall)
        network.advance(5)  # channel_stats with the round trip the pings measured
        c = network.switch([RecordingReactor(CHANNELS)], config=Config(stats_interval=0, max_reconnects=1))
        c.dial(f"{'cd' * 20}@127.0.0.1:9", retry_initial_dial=True).addErrback(lambda f: None)
        for _ in range(3):  # the dialer's wait, then HostnameEndpoint's attempts (0.3 s apart)
            network.clock.advance(0.4)
            network.complete_dials()  # refused; max_reconnects 1: dial_gave_up
        d = network.switch([RecordingReactor(CHANNELS)], config=Config(stats_interval=0, max_connections_per_ip=1))
        network.connect_raw(RawPeer(), d)
        network.connect_raw(RawPeer(), d)  # a second one from that address: connection_refused
        # The first never says hello: its verdict, 1 s late, waits a turn (loop_stalled), link_failed.
        network.advance(d.config.handshake_timeout + 1)
        a.stopService()  # connection_lost, both sides
        b.stopService()
        network.flush()
        return list(capture.events)
    finally:
        capture.stop()


def fields_of(event: dict) -> set:
    return {k for k in event if not k.startswith("log_")}


def test_spec_lists_exactly_the_events_of_telemetry_formats():
    """Every event name in FORMATS has a section in the spec, and no section is extra."""
    assert set(SPEC_EVENTS) == set(FORMATS)
    for name, spec in SPEC_EVENTS.items():
        assert spec["level"], f"{name}: no level in the spec"
        assert {"event", "node_id"} <= set(spec["fields"]), f"{name}: every event has event and node_id"


def test_the_exchange_emits_every_event(emitted):
    """The scripted exchange covers every documented event (so the next tests check them all)."""
    assert {e["event"] for e in emitted} == set(FORMATS)


def test_events_carry_exactly_the_documented_fields(emitted):
    """Each emitted event has the spec's fields for it: none missing, none extra."""
    for event in emitted:
        spec = SPEC_EVENTS[event["event"]]
        assert fields_of(event) == set(spec["fields"]), event["event"]
        for parent, children in spec["items"].items():
            for item in event[parent]:
                assert set(item) == set(children), f"{event['event']}.{parent}[]"


def test_field_values_have_the_documented_types(emitted):
    """Each field's value has the spec's type, items of object lists included."""
    for event in emitted:
        spec = SPEC_EVENTS[event["event"]]
        for name, type_name in spec["fields"].items():
            assert SPEC_TYPE_CHECKS[type_name](event[name]), (
                f"{event['event']}.{name} = {event[name]!r} is not {type_name}"
            )
        for parent, children in spec["items"].items():
            for item in event[parent]:
                for name, type_name in children.items():
                    assert SPEC_TYPE_CHECKS[type_name](item[name]), f"{event['event']}.{parent}[].{name}"


def test_events_are_logged_at_the_documented_level(emitted):
    """Every emitted event is logged at the level the telemetry spec gives for it."""
    for event in emitted:
        assert event["log_level"].name == SPEC_EVENTS[event["event"]]["level"], event["event"]


def test_events_are_in_the_mconn_namespace_with_the_event_name_in_the_field(emitted):
    """Every event is logged in the mconn namespace, with the log format FORMATS gives its name (worded by
    format_for for what is known: no "with None" before a hello, a failed dial's error)."""
    for event in emitted:
        assert event["log_namespace"] == "mconn"
        assert event["log_format"] == format_for(event["event"], event)


def test_events_render_with_their_format(emitted):
    """The human-readable format of every event renders from its fields; a data-only event
    (channel_stats) has none, so text observers skip it, and its FORMATS template renders."""
    for event in emitted:
        if event["event"] in DATA_ONLY:
            assert event["log_format"] is None and formatEventAsClassicLogText(event) is None
            event = {**event, "log_format": FORMATS[event["event"]]}
        text = formatEvent(event)
        assert "Unable to format" not in text and "MISSING" not in text, text
        assert event["node_id"] in text
    assert DATA_ONLY == {"channel_stats"} <= {e["event"] for e in emitted}


def test_channel_ids_print_as_two_hex_digits(emitted):
    """A channel id in an event's text is 0x plus two hex digits, as everywhere else."""
    stats = next(e for e in emitted if e["event"] == "channel_stats")
    text = formatEvent({**stats, "log_format": FORMATS["channel_stats"]})
    assert f" channel {stats['channel_id']:#04x} with " in text and "channel 0x" in text


def test_events_survive_the_json_log_format(emitted):
    """eventAsJSON/eventFromJSON (what jsonFileLogObserver writes) keep every documented field."""
    for event in emitted:
        loaded = eventFromJSON(eventAsJSON(event))
        for name in SPEC_EVENTS[event["event"]]["fields"]:
            assert loaded[name] == event[name], f"{event['event']}.{name}"
        if event["event"] == "reactor_error":
            assert "RuntimeError" in loaded["log_failure"].getTraceback()


def test_common_field_values(emitted):
    """node_id and peer_id are 40 hex characters; direction is inbound or outbound."""
    for event in emitted:
        assert re.fullmatch(r"[0-9a-f]{40}", event["node_id"])
        if event.get("peer_id") is not None:
            assert re.fullmatch(r"[0-9a-f]{40}", event["peer_id"])
        if "direction" in event:
            assert event["direction"] in ("inbound", "outbound")
    reasons = {e["reason"] for e in emitted if e["event"] == "peer_rejected"}
    assert reasons == {"duplicate"}
    assert {e["reason"] for e in emitted if e["event"] == "connection_refused"} == {"ip_limit"}
    errors = {(e["error_type"], e["peer_id"] is None) for e in emitted if e["event"] == "protocol_error"}
    assert errors == {("UnknownPacketType", True), ("UnknownChannel", False)}
    links = {(e["error_type"], e["peer_id"] is None) for e in emitted if e["event"] == "link_failed"}
    assert links == {("HandshakeTimeout", True)}  # a link failure, never a protocol_error
    kinds = {(e["reason_type"], e["reason_kind"]) for e in emitted if e["event"] == "connection_lost"}
    assert {("HandshakeTimeout", "link"), ("UnknownChannel", "misbehaviour")} <= kinds


def test_node_started_opens_each_run_with_a_fresh_run_id(emitted):
    """Each started Switch logs node_started before anything else of its own, with its run id."""
    started = [e for e in emitted if e["event"] == "node_started"]
    assert len(started) == 2 and len({e["run_id"] for e in started}) == 2
    for event in started:
        assert re.fullmatch(r"[0-9a-f]{32}", event["run_id"])
        own = [e for e in emitted if e["node_id"] == event["node_id"]]
        assert own[0] is event
        assert event["process_started"] <= event["log_time"]


def test_channel_stats_name_the_session_the_connection_and_a_measured_round_trip(emitted):
    """channel_stats carry the session of session_started, the connection number (2 after
    the resume) and, once a ping was answered, its round trip."""
    sessions = {(e["node_id"], e["peer_id"]): e["session_id"] for e in emitted if e["event"] == "session_started"}
    stats = [e for e in emitted if e["event"] == "channel_stats"]
    assert stats and all(e["session_id"] == sessions[(e["node_id"], e["peer_id"])] for e in stats)
    assert {e["connection"] for e in stats} == {1, 2}
    assert all(e["round_trip"] is None for e in stats if e["connection"] == 1)  # before the first pong
    measured = [e["round_trip"] for e in stats if e["round_trip"] is not None]
    assert measured and all(rtt >= 0 for rtt in measured)


def test_a_busy_link_gets_its_round_trip_from_the_stats_ticks():
    """The keepalive never pings a link that always has traffic; the stats ticks do."""
    capture = Telemetry().start()
    try:
        network = MemoryNetwork(MemoryReactorClock())
        config = Config(stats_interval=2)  # ping_interval 60: never silent that long here
        a = network.switch([RecordingReactor(CHANNELS)], config=config)
        b = network.switch([RecordingReactor(CHANNELS)], config=config)
        a.startService()
        b.startService()
        link = network.connect(a, b)
        to_b, to_a = link.peer_of(a), link.peer_of(b)
        for step in range(20):  # 10 s, a message each way every 0.5 s
            assert to_b.try_send(0x20, b"tick %d" % step) and to_a.try_send(0x20, b"tock %d" % step)
            network.advance(0.5)
        for peer in (to_b, to_a):
            assert peer.round_trip is not None and 0 <= peer.round_trip < 0.5, peer.round_trip
            assert peer.state == "connected"
        logged = [e["round_trip"] for e in capture.named("channel_stats") if e["round_trip"] is not None]
        assert len(logged) >= 4  # from the second tick on, on both sides
    finally:
        capture.stop()


def test_connection_lost_names_the_session_it_carried(emitted):
    """The connections of the session name it; the refused ones name none."""
    sessions = {e["session_id"] for e in emitted if e["event"] == "session_started"}
    lost = [e for e in emitted if e["event"] == "connection_lost"]
    carried = {e["session_id"] for e in lost if e["session_id"] is not None}
    assert carried and carried <= sessions
    assert all(e["session_id"] is None for e in lost if e["peer_id"] is None)


def test_a_switch_that_listens_before_it_starts_logs_node_started_first():
    """twistd binds ports before it starts services: node_started still opens the run, once."""
    capture = Telemetry().start()
    try:
        network = MemoryNetwork(MemoryReactorClock())
        switch = network.switch([RecordingReactor(CHANNELS)], config=Config(stats_interval=0))
        switch.listen("tcp:26656:interface=127.0.0.1")
        switch.startService()
        switch.stopService()
        network.flush()
    finally:
        capture.stop()
    names = [e["event"] for e in capture.events if e["node_id"] == switch.node_id]
    assert names[:2] == ["node_started", "listening"] and names.count("node_started") == 1
    assert capture.named("node_started")[0]["run_id"] == switch.run_id
