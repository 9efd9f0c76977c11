"""twistd's log names a peer with a moniker as ``moniker (abcd1234)`` (``log_peer``,
mconn.switch.telemetry.peer_name); the telemetry record keeps ``peer_id`` and nothing else.

Switches over mconn.testing's in-memory network; the text is what twisted.logger's text
observers (twistd's log) write.
"""

from twisted.internet.testing import MemoryReactorClock
from twisted.logger import formatEvent

from helpers import RecordingReactor, Telemetry
from mconn import ChannelDescriptor, Config, NodeInfo
from mconn.ops.telemetry_file import format_record
from mconn.testing import MemoryNetwork

CHANNELS = [ChannelDescriptor(0x20, priority=5)]


def exchange(a_info, b_info, c_info=None):
    """b dials a (and c dials a, if c_info); both then stop. The mconn events and the switches."""
    capture = Telemetry().start()
    try:
        network = MemoryNetwork(MemoryReactorClock())
        config = Config(stats_interval=0)
        a, b, c = (
            network.switch([RecordingReactor(CHANNELS)], config=config, node_info=i) for i in (a_info, b_info, c_info)
        )
        for s in (a, b, c):
            s.startService()
        a.listen("tcp:26656:interface=127.0.0.1")
        b.dial(f"{a.node_id}@127.0.0.1:26656").addErrback(lambda f: None)
        if c_info is not None:
            c.dial(f"{a.node_id}@127.0.0.1:26656").addErrback(lambda f: None)
        network.complete_dials()
        network.flush()
        for s in (a, b, c):
            s.stopService()
        network.flush()
        return capture.events, (a, b, c)
    finally:
        capture.stop()


def texts(events, node_id):
    return [formatEvent(e) for e in events if e["node_id"] == node_id]


def test_session_and_connection_lines_name_a_peer_with_a_moniker():
    """Each line of a's log about b (handshake, session start and end, connection end) names it
    ``bob (first 8 hex digits)``, not by its id; the telemetry record has peer_id and no log_peer."""
    events, (a, b, _) = exchange(NodeInfo(network="n", moniker="alice"), NodeInfo(network="n", moniker="bob"))
    bob = f"bob ({b.node_id[:8]})"
    lines = texts(events, a.node_id)
    for text in (f"handshake with {bob} at ", f"with {bob} started", f"with {bob} ended", f"connection with {bob} at "):
        assert any(text in line for line in lines), (text, lines)
    assert not any(b.node_id + " " in line for line in lines if "session" in line or "handshake" in line), lines
    started = next(e for e in events if e["event"] == "session_started" and e["node_id"] == a.node_id)
    assert started["peer_id"] == b.node_id and b"log_peer" not in format_record(started)


def test_a_refusal_for_another_network_names_the_refused_peer_by_moniker():
    """a on network n refuses b on network m: a's peer_rejected line says ``refused bob (...)`` and the
    reason; a peer without a moniker is named by its whole id, as before."""
    events, (a, b, c) = exchange(
        NodeInfo(network="n", moniker="alice"), NodeInfo(network="m", moniker="bob"), NodeInfo(network="n")
    )
    lines = texts(events, a.node_id)
    assert any(f"refused bob ({b.node_id[:8]}) at " in line and "network_mismatch" in line for line in lines), lines
    assert any("session " in line and f"with {c.node_id} started" in line for line in lines), lines
