"""Socket options through the listening socket (mconn/net/socket_options.py, specs/connection.md
section 7): a Switch sets its Config's options on the socket it listens on, and an inbound
connection sets again only those its accepted socket did not inherit; on real loopback
sockets, read back with getsockopt."""

import socket
import sys

import pytest
import pytest_twisted

from mconn import Config
from mconn.net.socket_options import _options_of, inherited_options, set_socket_options

from .test_loopback import bounded, start_pair, stop

pytestmark = pytest.mark.integration

TCP = socket.IPPROTO_TCP
NAMES = {
    "TCP_NODELAY": (TCP, socket.TCP_NODELAY),
    "TCP_NOTSENT_LOWAT": (TCP, getattr(socket, "TCP_NOTSENT_LOWAT", 25)),
    "TCP_USER_TIMEOUT": (TCP, getattr(socket, "TCP_USER_TIMEOUT", 18)),
    "SO_KEEPALIVE": (socket.SOL_SOCKET, socket.SO_KEEPALIVE),
    "TCP_KEEPIDLE": (TCP, getattr(socket, "TCP_KEEPIDLE", 4)),
    "TCP_KEEPINTVL": (TCP, getattr(socket, "TCP_KEEPINTVL", 5)),
    "TCP_KEEPCNT": (TCP, getattr(socket, "TCP_KEEPCNT", 6)),
}
#: Not the defaults, so that a value the kernel chose cannot pass for the Config's.
CONFIG = Config(tcp_notsent_lowat=32768, tcp_user_timeout=12.0, ping_interval=20.0, pong_timeout=30.0)
EXPECTED = {
    "TCP_NODELAY": 1,
    "TCP_NOTSENT_LOWAT": 32768,
    "TCP_USER_TIMEOUT": 12000,
    "SO_KEEPALIVE": 1,
    "TCP_KEEPIDLE": 20,
    "TCP_KEEPINTVL": 10,
    "TCP_KEEPCNT": 3,
}
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the option names are Linux's")


def options_of(peer) -> dict:
    sock = peer._protocol.transport.getHandle()
    return {name: sock.getsockopt(level, option) for name, (level, option) in NAMES.items()}


async def inbound_peer(config, change=None):
    """A listening Switch with ``config`` (``change``d after it listens), dialed by
    another: (both switches, the listener's inbound Peer)."""
    a, b, ra, rb, port = await start_pair(config=config)
    if change is not None:
        a.config = change
    await bounded(b.dial(f"{a.node_id}@127.0.0.1:{port}"))
    return (a, b), await bounded(ra.added)


@linux_only
def test_an_accepted_socket_inherits_every_option_on_this_kernel():
    """The probe behind the saving: on Linux, a socket accepted on a listening socket carrying the seven options
    carries them too (getsockopt on a loopback pair), for IPv4 and IPv6."""
    options = _options_of(CONFIG)
    assert {name for name, *_ in options} == set(NAMES)
    assert inherited_options(socket.AF_INET, options) == frozenset(NAMES)
    if socket.has_ipv6:
        assert inherited_options(socket.AF_INET6, options) == frozenset(NAMES)


@linux_only
@pytest_twisted.ensureDeferred
async def test_an_inbound_socket_has_every_option_its_config_asks_for():
    """An inbound connection's socket, whose options come from the listening socket, has the value of each of
    the seven options the Config asks for."""
    switches, peer = await inbound_peer(CONFIG)
    try:
        assert options_of(peer) == EXPECTED
    finally:
        await stop(*switches)


@linux_only
@pytest_twisted.ensureDeferred
async def test_a_config_changed_after_listening_reaches_new_inbound_sockets():
    """A Config set on the Switch after it listens applies to the connections accepted afterwards: a new value
    is set on the accepted socket, and an option no longer asked for (TCP_NODELAY, keepalive) gets back the
    platform's value instead of the listening socket's."""
    changed = CONFIG.replace(tcp_notsent_lowat=65536, tcp_nodelay=False, tcp_keepalive=False)
    switches, peer = await inbound_peer(CONFIG, change=changed)
    try:
        got = options_of(peer)
        assert got["TCP_NOTSENT_LOWAT"] == 65536 and got["TCP_USER_TIMEOUT"] == 12000
        assert got["TCP_NODELAY"] == 0 and got["SO_KEEPALIVE"] == 0
    finally:
        await stop(*switches)


@linux_only
@pytest_twisted.ensureDeferred
async def test_an_inbound_connection_sets_nothing_its_socket_inherited():
    """On a prepared port an inbound connection makes no setsockopt call: set_socket_options given its transport
    does not even ask for the socket (a transport whose getHandle fails shows it)."""
    switches, peer = await inbound_peer(CONFIG)
    try:
        transport = peer._protocol.transport

        class NoSocket:
            server = transport.server

            def getHandle(self):
                raise AssertionError("asked for the socket")

            def setTcpNoDelay(self, enabled):
                raise AssertionError("TCP_NODELAY set again")

        set_socket_options(NoSocket(), switches[0].config)
        with pytest.raises(AssertionError):
            set_socket_options(NoSocket(), CONFIG.replace(tcp_notsent_lowat=8192))  # not what the port has
    finally:
        await stop(*switches)
