"""Channel names (``ChannelDescriptor.name``, specs/reactor-api.md section 2): checked like the
other descriptor fields, this node's own (never on the wire), and shown in telemetry's
``channel_stats`` (``channel_name``) and ``peer.stats``.
"""

import pytest
from twisted.internet.testing import MemoryReactorClock

from helpers import RecordingReactor, Telemetry
from mconn import ChannelDescriptor, Config
from mconn.core.handshake import make_hello
from mconn.core.wire import encode_hello
from mconn.testing import MemoryNetwork


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("has space", "'has space'"),
        ("x" * 33, "'" + "x" * 33 + "'"),
        (5, "5"),
        ("é", "'é'"),
        ("votes\n", "'votes\\n'"),
    ],
)
def test_a_bad_name_is_refused_naming_the_channel_the_rule_and_the_value(name, problem):
    """A name that is not text, too long, or has characters outside [A-Za-z0-9_.-] raises ValueError
    naming the channel, the rule and the value."""
    with pytest.raises(ValueError) as refused:
        ChannelDescriptor(0x20, name=name)
    assert str(refused.value) == (
        f"channel 0x20: name must be text of at most 32 characters of [A-Za-z0-9_.-], got {problem}"
    )


def test_a_name_is_kept_and_is_not_on_the_wire():
    """A good name is kept; the hello of a channel with a name is the hello without one."""
    assert ChannelDescriptor(0x20, name="block-parts_2.v1").name == "block-parts_2.v1"
    assert ChannelDescriptor(0x20).name == ""
    hellos = [
        encode_hello(make_hello(node_id="ab" * 20, channels=[ChannelDescriptor(0x20, name=n)], max_packet_payload=1024))
        for n in ("", "votes")
    ]
    assert hellos[0] == hellos[1]


def test_channel_stats_and_peer_stats_carry_the_channel_name():
    """Each node's channel_stats records and peer.stats name its own channels as its descriptors do:
    a names 0x20 "votes", b names it "ballots", 0x21 has no name on either side."""
    capture = Telemetry().start()
    try:
        network = MemoryNetwork(MemoryReactorClock())
        config = Config(stats_interval=5)
        a = network.switch(
            [RecordingReactor([ChannelDescriptor(0x20, name="votes"), ChannelDescriptor(0x21)])], config=config
        )
        b = network.switch(
            [RecordingReactor([ChannelDescriptor(0x20, name="ballots"), ChannelDescriptor(0x21)])], config=config
        )
        a.startService()
        b.startService()
        a.listen("tcp:26656:interface=127.0.0.1")
        b.dial(f"{a.node_id}@127.0.0.1:26656")
        [link] = network.complete_dials()
        link.peer_of(b).try_send(0x20, b"vote")
        network.flush()
        network.advance(5)
        names = {
            (e["node_id"], e["channel_id"]): e["channel_name"] for e in capture.events if e["event"] == "channel_stats"
        }
        assert names == {
            (a.node_id, 0x20): "votes",
            (a.node_id, 0x21): "",
            (b.node_id, 0x20): "ballots",
            (b.node_id, 0x21): "",
        }
        assert [c.name for c in a.peers[b.node_id].stats.channels] == ["votes", ""]
        a.stopService()
        b.stopService()
        network.flush()
    finally:
        capture.stop()
