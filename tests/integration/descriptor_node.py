"""A listening mconn node whose process may open at most NOFILE descriptors.

    python descriptor_node.py NOFILE SCHEME

Sets RLIMIT_NOFILE to NOFILE, listens on 127.0.0.1 (any free port) with SCHEME ``tcp`` or
``ws`` (path /mconn) and default limits, and reports on stdout, one JSON object per line:

    {"event": "listening", "node_id": "...", "port": 12345}
    {"event": "add_peer", "peer_id": "..."}

It runs until it is killed.
"""

import json
import resource
import sys


def main(argv):
    nofile, scheme = int(argv[1]), argv[2]
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    from twisted.internet import reactor as twisted_reactor

    from mconn import ChannelDescriptor, Config, Reactor, Switch

    def report(**fields):
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()

    class Recorder(Reactor):
        def get_channels(self):
            return [ChannelDescriptor(0x20)]

        def add_peer(self, peer):
            report(event="add_peer", peer_id=peer.node_id)

        def receive(self, channel_id, peer, message):
            pass

    switch = Switch([Recorder()], config=Config(stats_interval=0), clock=twisted_reactor)
    switch.startService()
    where = "tcp:0:interface=127.0.0.1"
    if scheme == "ws":
        where = f"ws:{where}:path=/mconn"

    def listening(port):
        report(event="listening", node_id=switch.node_id, port=port.getHost().port)

    def failed(failure):
        report(event="error", error=str(failure.value))
        twisted_reactor.stop()

    switch.listen(where).addCallbacks(listening, failed)
    twisted_reactor.run()


if __name__ == "__main__":
    main(sys.argv)
