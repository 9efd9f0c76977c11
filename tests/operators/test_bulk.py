"""BulkReactor (reactors/bulk.py) on real Switches over a MemoryNetwork driven by one Clock."""

from __future__ import annotations

import pytest

from mconn import Config
from mconn.testing import MemoryNetwork
from reactors.bulk import CHANNEL, HEADER, BulkReactor, BulkStreamError, check, encode

CONFIG = Config(ping_interval=5.0, pong_timeout=5.0, resume_grace=30.0, stats_interval=0)


def two_nodes(rate=64 * 1024, chunk=4096, window=None, **config):
    network = MemoryNetwork(window=window)
    config = CONFIG.replace(**config)
    a_bulk, b_bulk = BulkReactor(rate=rate, chunk_size=chunk), BulkReactor(rate=rate, chunk_size=chunk)
    a = network.switch([a_bulk], config=config)
    b = network.switch([b_bulk], config=config)
    b.listen("tcp:26656")
    d = a.dial(network.dial_address(b))
    network.flush()
    assert d.called
    return network, a, b, a_bulk, b_bulk


def test_streams_both_ways_at_the_rate():
    """Each node streams at its configured rate, never ahead of time, and the other receives all but what is
    in flight, error-free."""
    network, a, b, a_bulk, b_bulk = two_nodes(rate=64 * 1024, chunk=4096)
    network.run(10.0)
    for bulk in (a_bulk, b_bulk):
        # 64 KiB/s for 10 s in 4 KiB messages: 160 due (the first at t=0), none ahead of time
        assert 150 <= bulk.messages_sent <= 161
        assert bulk.errors == 0
    assert a_bulk.messages_sent - 2 <= b_bulk.messages_received <= a_bulk.messages_sent
    assert b_bulk.bytes_received == 4096 * b_bulk.messages_received


def test_backpressure_slows_the_stream_to_what_the_link_carries():
    """A link with little room and a long delay: the stream waits for send Deferreds."""
    network, a, b, a_bulk, b_bulk = two_nodes(rate=10 * 1024 * 1024, chunk=16 * 1024, window=32 * 1024)
    network.delay(a, b, 0.5)
    network.run(5.0)
    # unbounded, 10 MiB/s for 5 s would be 3200 messages; a window of 32 KiB per 0.5 s
    # one-way delay lets through about 64 KiB/s, so the stream held back
    assert a_bulk.messages_sent < 200
    # the sender never ran far ahead of what arrived: send_queue_capacity and the window bound it
    assert a_bulk.messages_sent - b_bulk.messages_received <= 8
    assert b_bulk.errors == 0


def test_stream_survives_resets_in_order():
    """A bulk stream survives five resets through resume with no checking error: the sequence stays unbroken."""
    network, a, b, a_bulk, b_bulk = two_nodes(rate=256 * 1024, chunk=8192)
    for _ in range(5):
        network.run(1.0)
        network.reset(a, b)  # a re-dials b; the session resumes
    network.run(6.0)
    assert a.peers[b.node_id].resumes == 5
    assert a_bulk.errors == b_bulk.errors == 0
    assert b_bulk.messages_received >= a_bulk.messages_sent - 2 > 100


def test_a_corrupt_message_is_an_error_and_drops_the_peer():
    """A bulk message whose pattern is corrupt counts as an error and drops the peer on both sides."""
    network, a, b, a_bulk, b_bulk = two_nodes(rate=64 * 1024, chunk=1024)
    network.run(1.0)
    peer = a.peers[b.node_id]
    a_bulk._streams[peer].stop()  # no more well-formed messages in between
    network.flush()
    bad = bytearray(encode(b_bulk._expected[b.peers[a.node_id]], 1024))
    bad[-1] ^= 0xFF
    assert peer.try_send(CHANNEL, bytes(bad))
    network.run(1.0)
    assert b_bulk.errors == 1
    assert a.node_id not in b.peers and b.node_id not in a.peers
    assert peer.state == "closed"


def test_check_names_the_problem():
    """check() accepts the expected message and names what is wrong otherwise: sequence number, short header
    or broken pattern."""
    assert check("n", 3, encode(3, 100)) == 3
    with pytest.raises(BulkStreamError, match="sequence number 4, expected 3"):
        check("n", 3, encode(4, 100))
    with pytest.raises(BulkStreamError, match="shorter than its 8-byte header"):
        check("n", 0, b"abc")
    bad = bytearray(encode(7, 10))
    bad[HEADER.size] ^= 1
    with pytest.raises(BulkStreamError, match="message 7 .10 bytes. does not carry its pattern"):
        check("n", 7, bytes(bad))


@pytest.mark.parametrize("kwargs", [{"rate": 0}, {"rate": True}, {"chunk_size": 0}, {"chunk_size": 65537}])
def test_bad_settings(kwargs):
    """A BulkReactor refuses a zero or boolean rate and a chunk size outside 1..65536."""
    with pytest.raises(ValueError, match="BulkReactor"):
        BulkReactor(**kwargs)


def test_fleet_bulk_takes_its_settings_from_the_environment(monkeypatch):
    """FleetBulk reads its rate and chunk size from the environment and refuses a rate that is not a number or
    is below 1."""
    from reactors.fleet import FleetBulk

    monkeypatch.setenv("MCONN_DEMO_BULK_RATE", "1000")
    monkeypatch.setenv("MCONN_DEMO_BULK_CHUNK", "512")
    bulk = FleetBulk()
    assert (bulk.rate, bulk.chunk_size) == (1000.0, 512)
    monkeypatch.setenv("MCONN_DEMO_BULK_RATE", "fast")
    with pytest.raises(ValueError, match="MCONN_DEMO_BULK_RATE='fast' is not a number"):
        FleetBulk()
    monkeypatch.setenv("MCONN_DEMO_BULK_RATE", "0")
    with pytest.raises(ValueError, match="MCONN_DEMO_BULK_RATE='0' must be at least 1.0"):
        FleetBulk()
