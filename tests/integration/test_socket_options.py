"""TCP_NODELAY and TCP_NOTSENT_LOWAT are set on real loopback sockets (Config fields)."""

import socket

import pytest
import pytest_twisted

from mconn import Config

from .test_loopback import bounded, start_pair, stop

pytestmark = pytest.mark.integration

TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)


def options_of(peer):
    sock = peer._protocol.transport.getHandle()
    return (
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
        sock.getsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT),
    )


@pytest_twisted.ensureDeferred
async def test_default_config_sets_nodelay_and_notsent_lowat_on_both_ends():
    """By default both ends of a connection set TCP_NODELAY and TCP_NOTSENT_LOWAT (16384)."""
    a, b, ra, rb, port = await start_pair()
    try:
        outbound = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        inbound = await bounded(ra.added)
        for peer in (outbound, inbound):
            nodelay, lowat = options_of(peer)
            assert nodelay != 0
            assert lowat == Config().tcp_notsent_lowat == 16384
    finally:
        await stop(a, b)


@pytest_twisted.ensureDeferred
async def test_socket_options_follow_config():
    """tcp_nodelay=False and tcp_notsent_lowat in the Config are what the socket gets."""
    a, b, ra, rb, port = await start_pair(config=Config(tcp_nodelay=False, tcp_notsent_lowat=65536))
    try:
        peer = await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
        nodelay, lowat = options_of(peer)
        assert nodelay == 0
        assert lowat == 65536
    finally:
        await stop(a, b)
