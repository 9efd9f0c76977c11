"""How large the msg packets of a connection are cut (specs/wire.md section 4,
specs/connection.md section 7). Pure: the drain rate comes in as an argument.

Theory of operation
-------------------
A packet is never split: once the scheduler has cut one, a message queued after it on a
higher-priority channel waits for all of it. So the packet size is the grain of the
priority guarantee, and large packets are what makes bulk cheap (the per-packet work of
1 KiB packets bounded bulk throughput, bench/history/2026-11-24-evening.md). The sender therefore cuts
packets of a quarter of what a write carries at the link's drain rate (``PER_WRITE``
packets per ``write_ahead_time``, the budget that sizes the writes, so the packet that
crosses a write's budget adds at most a quarter of it), never below ``FLOOR`` and never
above the size both hellos allow (the negotiated ``max_packet_payload``, which
``Connection.set_packet_payload`` applies; a hello announcing less than ``FLOOR`` is
refused, so whatever a peer announces, the work per byte sent stays that of 1 KiB
packets at worst): up to about 33 Mbit/s that is ``FLOOR``, as
before; at 1 Gbit/s about 31 KB; on loopback the negotiated maximum. Per-packet work
only matters at the rates where packets grow. A receiver accepts any payload up to the
negotiated maximum, so the sender may choose any size per write.

A connection paced by a rate (``Config.send_rate``, or the lower rate the peer announced
in its hello: specs/connection.md section 5) drains no faster than that rate, whatever
the link could take: its packets are cut at ``PER_WRITE``-th of the token bucket's burst
at that rate (``payload_for_pace``), at least ``FLOOR``, so a message on a higher-priority
channel waits behind at most a quarter of a burst (at 1 MB/s a 2.5 KB packet, 2.5 ms)
instead of a whole 64 KiB packet (65 ms).

Where the rate is not measured (TLS, WebSocket over TLS: wss and ws+tls,
``write_ahead_time=None``) and on a
plain TCP connection before its first rate sample, packets are ``UNMEASURED``: one TLS
record's worth. Those transports write ``write_batch_bytes`` (64 KiB) at a time and
keep up to their own buffer size (64 KiB for Twisted's TCP) below the scheduler, so a
16 KiB packet adds at most a quarter of that ahead of a high-priority message.
"""

from __future__ import annotations

from mconn.config import MIN_PACKET_PAYLOAD
from mconn.core.rate import BURST_TIME

#: The smallest payload the rate picks, in bytes: CometBFT's packet size, the floor of
#: every max_packet_payload (``config.MIN_PACKET_PAYLOAD``). Below it the per-packet work
#: dominates, and a link that slow is already one packet per write.
FLOOR = MIN_PACKET_PAYLOAD
#: The payload where the drain rate is not known, in bytes: one TLS record's plaintext.
UNMEASURED = 16384
#: Packets per write-ahead: a packet is at most this fraction of a write's bytes.
PER_WRITE = 4


def payload_for_rate(rate: float | None, ahead_time: float | None) -> int:
    """The payload to cut packets at for a link draining ``rate`` bytes per second (None:
    not measured) under a write-ahead of ``ahead_time`` seconds (None: none): a
    ``PER_WRITE``-th of a write, at least ``FLOOR``. The caller caps it at the negotiated
    ``max_packet_payload``."""
    if rate is None or ahead_time is None:
        return UNMEASURED
    return max(FLOOR, int(rate * ahead_time / PER_WRITE))


def payload_for_pace(rate: float) -> int:
    """The largest payload for a connection paced at ``rate`` bytes per second: a
    ``PER_WRITE``-th of the token bucket's burst (``BURST_TIME`` of the rate), at least
    ``FLOOR``. The caller caps it at the negotiated ``max_packet_payload``."""
    return max(FLOOR, int(rate * BURST_TIME / PER_WRITE))
