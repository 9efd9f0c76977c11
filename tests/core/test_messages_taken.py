"""``Connection.messages_taken`` (the adapter offers room to waiting sends only when it
grew, specs/connection.md section 7): it counts the messages ``data_to_send`` took off
the channel queues, when a message starts going out, not the packets after it.

Sans-I/O: a Connection with an explicit ``now``.
"""

from mconn.core.channel import ChannelDescriptor
from tests.helpers_core import open_connection

CH = 0x20


def test_messages_taken_counts_messages_leaving_the_queue_not_packets():
    """Two 40 KB messages cut into 16 KiB packets, sent 16 KiB at a time: the count
    grows when each message starts (its queue slot is free), not on its later packets."""
    conn = open_connection(peer_payload=65536, channels=[ChannelDescriptor(CH, send_queue_capacity=2)])
    conn.set_packet_payload(16384)
    for _ in range(2):
        assert conn.queue_message(CH, bytes(40_000))
    counts = []
    while True:
        data = conn.data_to_send(1.0, budget=1)  # one packet per call
        if not data:
            break
        counts.append(conn.messages_taken)
    assert counts == [1, 1, 1, 2, 2, 2]


def test_small_messages_are_counted_each():
    """Ten small messages in one write: ten taken."""
    conn = open_connection(peer_payload=65536, channels=[ChannelDescriptor(CH, send_queue_capacity=10)])
    for _ in range(10):
        assert conn.queue_message(CH, b"m")
    assert conn.data_to_send(1.0) and conn.messages_taken == 10
