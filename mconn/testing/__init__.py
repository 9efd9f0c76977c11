"""Test doubles for reactor authors: a recording FakePeer, and Switches on an in-memory network.

Two ways to test a Reactor without sockets (specs/reactor-api.md section 8).

Unit tests call the reactor's methods directly and pass it a ``FakePeer``, which records
what the reactor sends::

    peer = FakePeer(channels=reactor.get_channels())
    reactor.add_peer(peer)
    reactor.receive(0x20, peer, b"ping")
    assert peer.sent == [(0x20, b"pong")]

Two-node tests use real Switches. Their connections run over in-memory transports that
one ``task.Clock`` drives, so the tests are deterministic::

    network = MemoryNetwork()
    a = network.switch([EchoReactor()])
    b = network.switch([EchoReactor()])
    link = network.connect(a, b)          # handshake done when this returns
    link.peer_of(a).try_send(0x20, b"hi") # a sends to b
    network.flush()                       # deliver everything that is due

Unlike Twisted's iosim, these transports can lose bytes, so faults can be injected: a
reset, a black hole and its healing, a delay, a killed or restarted node.

Where each part is explained:

``mconn/testing/fakes.py``
    ``FakePeer`` and the Peer contract it follows.
``mconn/testing/network.py``
    ``MemoryNetwork`` and ``connected_switches``: hosts, listening and dialing, the
    faults and exactly what each does, reproducible runs.
``mconn/testing/transport.py``
    ``MemoryLink`` and ``MemoryTransport``: how bytes travel (on the shared clock, in
    order, with flow control) and how they are lost.
``mconn/testing/node.py``
    The process at each host: its ports, its resolver, how it listens and dials, and a
    Twisted reactor that dies with it.
``mconn/testing/clock.py``
    ``HeapClock``: a ``task.Clock`` for networks of many nodes (its calls in a heap).
``mconn/testing/fabric.py``
    What the nodes and links share: the clock, the hosts, the paths between them and
    their faults, the links.
"""

from mconn.testing.clock import HeapClock
from mconn.testing.fakes import FakePeer
from mconn.testing.network import MemoryNetwork, connected_switches
from mconn.testing.transport import MemoryLink, MemoryTransport

# Module-level constants of the single module this package replaced, still importable here.
from mconn.testing.network import DEFAULT_PORT as DEFAULT_PORT
from mconn.testing.node import LOOPBACK as LOOPBACK

__all__ = ["FakePeer", "HeapClock", "MemoryLink", "MemoryNetwork", "MemoryTransport", "connected_switches"]
