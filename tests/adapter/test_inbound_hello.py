"""An inbound connection's hello is built once and shared (mconn/switch/connection_set.py,
``ConnectionSet._inbound_hello``), and built again when what it says changes."""

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mconn import Config, Switch
from mconn.core.handshake import make_hello
from mconn.net.protocol import MConnectionFactory
from mconn.core.wire import HelloTag

from helpers import CHANNELS, RecordingReactor


def connect(switch, *, is_outbound=False):
    proto = MConnectionFactory(switch, is_outbound=is_outbound).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport.value()


def test_inbound_connections_share_one_hello_equal_to_a_fresh_one():
    """Two inbound connections get the same Hello object, equal to the one make_hello builds from the Switch's
    node id, channels, Config and listen address, and write the same hello bytes."""
    switch = Switch([RecordingReactor(CHANNELS)], clock=Clock())
    switch.listen_address = "127.0.0.1:26656"
    (first, sent1), (second, sent2) = connect(switch), connect(switch)
    assert first.core.hello is second.core.hello
    assert first.core.hello == make_hello(
        node_id=switch.node_id,
        channels=CHANNELS,
        max_packet_payload=Config().max_packet_payload,
        listen_address="127.0.0.1:26656",
    )
    assert sent1 == sent2 and sent1


def test_a_new_listen_address_or_config_gives_a_new_hello():
    """Once the listen address or the Config changes, the next inbound connection's hello says so."""
    switch = Switch([RecordingReactor(CHANNELS)], clock=Clock())
    switch.listen_address = "127.0.0.1:1"
    before, _ = connect(switch)
    switch.listen_address = "127.0.0.1:2"
    moved, _ = connect(switch)
    assert moved.core.hello.listen_address == "127.0.0.1:2" and before.core.hello.listen_address == "127.0.0.1:1"
    switch.config = Config(max_packet_payload=4096)
    resized, _ = connect(switch)
    assert (
        resized.core.hello.max_packet_payload == 4096
        and moved.core.hello.max_packet_payload == Config().max_packet_payload != 4096
    )


def test_an_outbound_hello_is_its_own_with_a_fresh_session_request():
    """A dialer's hello is not the shared one: it carries its own session request."""
    switch = Switch([RecordingReactor(CHANNELS)], clock=Clock())
    inbound, _ = connect(switch)
    outbound, _ = connect(switch, is_outbound=True)
    assert outbound.core.hello is not inbound.core.hello
    assert [tag for tag, _ in outbound.core.hello.fields] == [HelloTag.SESSION]
    assert inbound.core.hello.fields == ()
