"""A listening mconn node in a fresh process that measures what its TCP transports
allocate when they first send from Twisted's buffer.

    python transport_memory_node.py PEERS

Listens on 127.0.0.1 (any free port, a backlog for them all); PEERS (at most 256) plain sockets of this process connect and
say a dialer's hello, each with a new node id. The listener answers each at accept
(write-through: nothing goes through Twisted's buffer). Once every peer is connected,
each peer is sent one message from a timer (outside a read, so through Twisted's
buffer and its ``doWrite``), and tracemalloc counts what Twisted's ``abstract.py``
(where ``doWrite`` is) allocated meanwhile and still holds, once every buffer is empty.
Prints one JSON object: ``peers``, ``buffered`` (transports that held the message in
Twisted's buffer after the send), ``abstract_bytes`` (the bytes a transport).

A fresh process, because what a class's instances keep without a dict of their own
depends on what its first instances in the process set.
"""

import json
import socket
import sys
import tracemalloc

CHANNEL = 0x20
#: Reactor turns (10 ms apart) a step waits for its condition before it gives up.
TURNS = 1000


def main(argv):
    peers = int(argv[1])
    from twisted.internet import reactor as twisted_reactor

    from helpers import buffered, dialer_hello
    from mconn import ChannelDescriptor, Config, Reactor, Switch

    class Quiet(Reactor):
        def get_channels(self):
            return [ChannelDescriptor(CHANNEL)]

    # Every peer comes from 127.0.0.1 at once: the admission limits let them all in.
    limits = dict(max_inbound_peers=peers, max_connections_per_ip=peers, max_pending_per_group=peers)
    config = Config(stats_interval=0, max_pending_handshakes=peers, **limits)
    switch = Switch([Quiet()], clock=twisted_reactor, config=config)
    switch.startService()
    sockets = []
    report = {"peers": 0, "buffered": 0, "abstract_bytes": None}

    def finish():
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
        twisted_reactor.stop()

    def listening(port):
        for _ in range(peers):
            sockets.append(socket.create_connection(("127.0.0.1", port.getHost().port)))
            sockets[-1].sendall(dialer_hello())
        twisted_reactor.callLater(0.01, connected, TURNS)

    def connected(turns):
        connections = [peer.connection for peer in switch.peers.values() if peer.connection is not None]
        if len(connections) < peers and turns:
            twisted_reactor.callLater(0.01, connected, turns - 1)
            return
        report["peers"] = len(connections)
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for connection in connections:
            assert connection.peer.try_send(CHANNEL, b"from a timer")
        report["buffered"] = sum(1 for c in connections if buffered(c.transport) > 0)
        twisted_reactor.callLater(0.01, written, connections, before, TURNS)

    def written(connections, before, turns):
        if any(buffered(c.transport) for c in connections) and turns:
            twisted_reactor.callLater(0.01, written, connections, before, turns - 1)
            return
        after = tracemalloc.take_snapshot()
        held = sum(
            stat.size_diff
            for stat in after.compare_to(before, "filename")
            if stat.traceback[0].filename.endswith("twisted/internet/abstract.py")
        )
        report["abstract_bytes"] = held / len(connections) if connections else None
        finish()

    # A backlog for every connect, all made before the first accept.
    switch.listen("tcp:0:interface=127.0.0.1:backlog=256").addCallback(listening)
    twisted_reactor.callLater(60, finish)  # whatever happened, an answer
    twisted_reactor.run()
    for s in sockets:
        s.close()


if __name__ == "__main__":
    main(sys.argv)
