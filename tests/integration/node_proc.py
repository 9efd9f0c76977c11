"""A listening mconn node in its own process, for tests that kill and restart a node.

    python node_proc.py KEY_FILE PORT

Loads the node key from KEY_FILE (NodeKey.save format), listens on 127.0.0.1:PORT (0: any
free port) and reports on stdout, one JSON object per line, flushed at once:

    {"event": "listening", "node_id": "...", "port": 12345}
    {"event": "add_peer", "peer_id": "..."}
    {"event": "receive", "peer_id": "...", "channel_id": 32, "message": "<latin-1 text>"}
    {"event": "remove_peer", "peer_id": "...", "reason_type": "...", "reason": "..."}

Every "receive" line is written inside ``Reactor.receive``, before the Switch counts the
message as delivered, so the lines a killed process left behind are a lower bound of what
it delivered, and exactly what it delivered once its acknowledgements were seen.
The channels are tests/integration/test_resume_scenarios.py's CHANNELS.
"""

import json
import sys


def main(argv):
    key_file, port = argv[1], int(argv[2])
    from twisted.internet import reactor as twisted_reactor

    from mconn import ChannelDescriptor, Config, NodeKey, Reactor, Switch

    channels = [
        ChannelDescriptor(0x20, priority=1, send_queue_capacity=64),
        ChannelDescriptor(0x21, priority=5, send_queue_capacity=64),
        ChannelDescriptor(0x30, priority=10, send_queue_capacity=64),
    ]

    def report(**fields):
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()

    class Recorder(Reactor):
        def get_channels(self):
            return channels

        def add_peer(self, peer):
            report(event="add_peer", peer_id=peer.node_id)

        def remove_peer(self, peer, reason):
            report(event="remove_peer", peer_id=peer.node_id, reason_type=type(reason).__name__, reason=str(reason))

        def receive(self, channel_id, peer, message):
            report(event="receive", peer_id=peer.node_id, channel_id=channel_id, message=message.decode("latin-1"))

    switch = Switch(
        [Recorder()],
        node_key=NodeKey.load(key_file),
        config=Config(stats_interval=0, resume_grace=30.0),
        clock=twisted_reactor,
    )
    switch.startService()

    def listening(listening_port):
        report(event="listening", node_id=switch.node_id, port=listening_port.getHost().port)

    def failed(failure):
        report(event="error", error=str(failure.value))
        twisted_reactor.stop()

    switch.listen(f"tcp:{port}:interface=127.0.0.1").addCallbacks(listening, failed)
    twisted_reactor.run()


if __name__ == "__main__":
    main(sys.argv)
