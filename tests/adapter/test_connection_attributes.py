"""A connection's protocol sets its rarely needed attributes only when they are needed,
so that running its keepalive keeps it within its 28 instance attributes
(tests/adapter/test_inbound_handshake.py caps them after the handshake).

CPython keeps a class's instance attributes without a dict while every name an instance
sets is among the keys the class's first instances set, plus one spare; a connection
sets 28, and each name a long-lived connection sets later (here, on every timer run)
either takes the spare or, once another name has, builds a dict of ~1.5 KiB for every
connection: bench/RESULTS.md, "Memory per peer", measured that after the first keepalive
ping of 2,000 idle peers.
"""

from helpers import PING, PONG, open_switch_connection, parse_packets
from mconn import Config

CONFIG = Config(ping_interval=10, pong_timeout=4, stats_interval=0)


def test_the_keepalive_timer_sets_no_attribute_of_its_own_on_the_connection():
    h = open_switch_connection(config=CONFIG)
    before = set(vars(h.proto))
    for _ in range(3):  # three keepalive rounds: the timer fires, a ping, its pong
        h.clock.advance(10)
        assert parse_packets(h.take()) == [(PING,)]
        h.feed(bytes([PONG]))
    assert not h.transport.disconnecting
    assert set(vars(h.proto)) <= before, sorted(set(vars(h.proto)) - before)
    assert len(vars(h.proto)) <= 28, sorted(vars(h.proto))
