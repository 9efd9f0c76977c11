"""Config: every tunable of a Switch and its connections, validated once.

Defaults follow CometBFT (its ``config/config.go`` and ``p2p/conn/connection.go``) where
its users did not complain about them, and say so where they differ.
"""

from __future__ import annotations

import dataclasses
import math

#: Largest HTTP head (a WebSocket upgrade request or answer, a proxy's answer to CONNECT)
#: read before its end: nginx's default header buffers are 8 KiB; a node's own upgrade is
#: a few hundred bytes (specs/websocket.md section 4).
MAX_HTTP_HEAD_BYTES = 16384

#: Largest max_packet_payload accepted in a Config (go-wire allows more; buffers do not).
MAX_PACKET_PAYLOAD_LIMIT = 1 << 20
#: Smallest max_packet_payload a Config or a peer's hello may announce, in bytes:
#: CometBFT's default packet size. Below it a peer could have everything sent to it cut
#: into tiny packets, each costing the sender a packet's work (payload 1 cost 452 times
#: the core's CPU per MiB at 1024; bench/packet_floor.py). specs/handshake.md section 3.
MIN_PACKET_PAYLOAD = 1024
#: Smallest recv_rate a Config or a peer's hello may announce, in bytes per second: a
#: sender holds what it sends a peer in its own queues at the rate the peer announces,
#: so a lower one would only hold a session open for nothing; at it, a packet of the
#: smallest size (1024) still passes in about a second. specs/handshake.md section 7.
MIN_RECV_RATE = 1000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """Settings of a Switch; every field is keyword-only and checked in ``__post_init__``.

    Times are seconds, rates bytes per second (None: unlimited).
    """

    #: Seconds with nothing received after which we send a ping (CometBFT's 60 s).
    ping_interval: float = 60.0
    #: Seconds after a ping within which anything at all must arrive, or the connection
    #: is dead (CometBFT's 45 s).
    pong_timeout: float = 45.0
    #: Largest payload of one msg packet we send and accept, in bytes; both sides use the
    #: smaller. Within it a sender cuts packets of a quarter of write_ahead_time at the
    #: link's measured drain rate, at least 1024 (16 KiB where it is not measured: TLS, WebSocket),
    #: so a slow link keeps small packets; 64 KiB lets fast links carry bulk with a
    #: fraction of the per-packet work of CometBFT's 1024 (bench/history/2026-11-24-evening.md). At least
    #: MIN_PACKET_PAYLOAD (1024), and a hello announcing less is refused.
    max_packet_payload: int = 65536
    #: Seconds ``Peer.send`` waits for room in a full queue before it fires False
    #: (CometBFT's 10 s).
    send_timeout: float = 10.0
    #: Seconds from connection made to the peer's hello accepted; a connection that takes
    #: longer is closed (CometBFT allows 20 s; a hello is one small packet).
    handshake_timeout: float = 10.0
    #: Seconds one TCP connection attempt of ``Switch.dial`` may take (CometBFT's 3 s).
    dial_timeout: float = 3.0
    #: Seconds the transport may take to flush after a close packet before it is aborted:
    #: long enough for the close to reach a live peer, short enough not to hold a stop.
    close_linger: float = 2.0
    #: Sessions that peers dialed, at most (CometBFT's 40); past it a hello is refused.
    max_inbound_peers: int = 40
    #: Sessions this node dialed, at most (CometBFT's 10); peer exchange dials up to it.
    max_outbound_peers: int = 10
    #: Inbound connections accepted but not yet through the handshake. Past it a new
    #: inbound connection whose address group holds fewer of them than the largest group
    #: is admitted, and the oldest of the largest group gives way ("pending_evicted");
    #: one of a largest group is refused at once ("pending_limit", specs/connection.md 6).
    max_pending_handshakes: int = 64
    #: Inbound handshakes under way from one address group (below) at a time; past it a
    #: new inbound connection from that group is refused ("pending_group_limit"). A
    #: quarter of max_pending_handshakes: four groups are needed to fill it, and a
    #: subnet's nodes that all dial a seed at once (9 in tests/operators/test_pex.py)
    #: are not refused; the eviction above, not this cap, lets newcomers in.
    max_pending_per_group: int = 16
    #: Bits of an inbound IPv4 address that make its address group, a /24 (a loopback
    #: address is a group of its own; mconn.core.admission.address_group).
    pending_group_prefix_v4: int = 24
    #: Bits of an inbound IPv6 address that make its address group (a /64 is one site).
    pending_group_prefix_v6: int = 64
    #: Inbound connections from one remote address at a time ("ip_limit"), and inbound
    #: sessions from it, suspended ones included (the oldest suspended gives way). One
    #: address is an IPv4 address or an IPv6 /64 (the prefixes below).
    max_connections_per_ip: int = 8
    #: Bits of an inbound IPv4 address that max_connections_per_ip counts as one
    #: address: 32, each address (many users share one behind NAT). An IPv4-mapped IPv6
    #: address counts as its IPv4 address; a loopback address always stands alone.
    ip_limit_prefix_v4: int = 32
    #: Bits of an inbound IPv6 address that max_connections_per_ip counts as one address:
    #: 64, the smallest network one host is given (it holds 2**64 addresses for free).
    ip_limit_prefix_v6: int = 64
    #: Pings a peer may send within one of our ping_interval windows (ControlFlood past
    #: it). A peer with our ping_interval sends one or two; the rest is headroom.
    max_pings_per_interval: int = 20
    #: Control packets (pongs...) queued unsent because the peer does not read them.
    max_control_backlog: int = 64
    #: Bytes per second this node sends to one peer, at most (None: unlimited, the link
    #: decides; CometBFT caps it at 5,120,000 by default): every byte on the wire, control
    #: packets and headers included. Lowered to the recv_rate a peer announces.
    send_rate: float | None = None
    #: Bytes per second this node reads from one peer, at most (None: unlimited). Every
    #: byte counts, as for send_rate. Announced in the hello, so that the peer sends no
    #: faster and its backlog stays in its priority scheduler; at least MIN_RECV_RATE.
    recv_rate: float | None = None
    #: Largest hello body accepted, in bytes, checked before it is buffered (a hello is
    #: about 200 bytes; 4 KiB leaves room for extensions).
    max_hello_size: int = 4096
    #: Largest body of any other extension packet (close, ...), in bytes, checked before
    #: it is buffered.
    max_control_size: int = 1024
    #: Wire bytes the scheduler hands the transport per call (the transport's
    #: IPushProducer pause stops it earlier); 64 KiB is Twisted's TCP buffer size.
    write_batch_bytes: int = 65536
    #: Seconds of sending, at the link's measured drain rate, that the protocol writes
    #: into the transport before it waits for the transport to take them (a write that
    #: empties the queues does not wait): the bytes committed below the scheduler (the
    #: transport's buffer, then the kernel's past tcp_notsent_lowat) stay within about
    #: two such writes, at least one packet each, at most write_batch_bytes
    #: (specs/connection.md section 7). Plain TCP only: over TLS or WebSocket, and with None,
    #: write_batch_bytes per write and a pause only past the transport's own buffer
    #: size (64 KiB for Twisted's TCP).
    write_ahead_time: float | None = 0.001
    #: Seconds between two per-channel statistics telemetry events (0 disables them).
    stats_interval: float = 10.0
    #: TCP_NODELAY on every connection: small high-priority packets must not wait for
    #: Nagle and a delayed ACK (40 ms tails otherwise; Go, hence CometBFT, sets it too).
    tcp_nodelay: bool = True
    #: TCP_NOTSENT_LOWAT in bytes (None: leave the kernel default). Bytes handed to the
    #: kernel can no longer be reordered by priority; without this bound Linux queues
    #: megabytes of bulk data ahead of a high-priority message (bench/history/2026-11-22.md).
    tcp_notsent_lowat: int | None = 16384
    #: Seconds a broken session stays suspended, waiting to be resumed (0: no resume);
    #: 30 s outlasts a Wi-Fi roam or a restart of a peer under a supervisor.
    resume_grace: float = 30.0
    #: Bound on the bytes of a session's unacknowledged messages (the recovery buffer),
    #: in bytes.
    recovery_buffer_bytes: int = 32 << 20
    #: Bound on the unacknowledged bytes of all sessions together (beyond it a channel
    #: keeps only its reserve; specs/resume.md section 1.3).
    max_unacked_bytes: int = 256 << 20
    #: Path of the session store (sqlite3, WAL mode) that keeps every session's counts,
    #: recovery buffer and delivered counts on disk, so that a node killed and started
    #: again with the same key and store resumes its sessions (specs/resume.md section 9).
    #: None: sessions live in memory only. Bounded by ``max_unacked_bytes``.
    session_store: str | None = None
    #: Suspended sessions kept at most; past it the oldest is ended.
    max_suspended_sessions: int = 32
    #: Unacknowledged bytes kept in suspended sessions at most; past it the one holding
    #: the most is ended (its messages counted as not confirmed delivered).
    max_suspended_bytes: int = 128 << 20
    #: The receiver acknowledges after this many messages, this many bytes, or
    #: ack_interval seconds after an unacknowledged delivery, whichever comes first.
    ack_every_messages: int = 256
    #: Bytes of delivered messages after which the receiver acknowledges (see above).
    ack_every_bytes: int = 1 << 20
    #: Seconds after an unacknowledged delivery after which the receiver acknowledges
    #: (see above); short, so that the sender's recovery buffer drains.
    ack_interval: float = 0.1
    #: Largest wait, in seconds, between two dial attempts of a persistent or resuming peer.
    max_reconnect_delay: float = 4.0
    #: Failed dial attempts in a row before a dialer gives up (None: until resume_grace
    #: ends for a suspended session, forever for persistent peers and retrying first
    #: dials). Bounds persistent peers too: one that reaches it is no longer persistent
    #: and its waiting dial fails with DialGaveUp. A first dial makes one attempt even
    #: with 0. Reset on success.
    max_reconnects: int | None = None
    #: A first non-persistent ``Switch.dial`` keeps trying (with the reconnect backoff)
    #: instead of failing on the first error (NATS's retry_on_failed_connect). A
    #: persistent dial always keeps trying, whatever this says.
    retry_initial_dial: bool = False
    #: Do not add the listen addresses that peers announce to their address pools.
    ignore_discovered_addresses: bool = False
    #: Dial private-range addresses (RFC 1918, 100.64.0.0/10, IPv6 unique local...) that
    #: peers tell (PEX replies, hellos). Off: only public ones, and loopback ones told by
    #: a peer connected over loopback; never link-local, metadata or our own (specs/pex.md 3.5).
    allow_discovered_private: bool = False
    #: Dial a persistent peer's addresses in the given order instead of shuffling them.
    retain_address_order: bool = False
    #: Let two nodes hold sessions from (or be dialed at) one IP address. False: a
    #: second node's session from an IP address that has one, inbound or outbound, in any
    #: state, is refused (``duplicate_ip``) and such an address is not dialed (CometBFT's
    #: ``allow_duplicate_ip = false``). Exact addresses, unlike max_connections_per_ip,
    #: which also bounds one IPv6 /64's inbound sessions and applies either way.
    allow_duplicate_ip: bool = True
    #: Host (IP) that outgoing connections bind to (None: the kernel chooses).
    local_address: str | None = None
    #: A new connection from a node that already has a live one: seconds the old one has
    #: to answer a ping before the newcomer replaces it (specs/resume.md section 7).
    duplicate_probe_timeout: float = 2.0
    #: TCP_USER_TIMEOUT, seconds: the kernel drops a connection whose sent data stays
    #: unacknowledged this long (a half-open link under load). None: the kernel default.
    tcp_user_timeout: float | None = 30.0
    #: SO_KEEPALIVE with TCP_KEEPIDLE = ping_interval: a second, kernel-side probe of
    #: idle connections where the platform has these options.
    tcp_keepalive: bool = True
    #: The status page's Prometheus ``/metrics`` adds series labelled by each peer's node
    #: id (specs/status.md section 4). Off by default: then a node's series do not grow
    #: with its peers; on, 10,000 peers are 10,000 series per per-peer metric.
    metrics_per_peer: bool = False
    #: What an exception escaping a reactor's ``add_peer`` or ``receive`` (or the
    #: Deferred ``receive`` returned) does: "drop" ends the session with a ``ReactorError``
    #: naming the reactor and channel and counts it in ``Switch.reactor_errors``, as
    #: CometBFT's StopPeerForError does; "log" only logs it and keeps the peer
    #: (specs/reactor-api.md section 4). "drop" by default: a peer sending garbage goes.
    reactor_errors: str = "drop"
    #: Bytes of whole messages one peer may have waiting for a busy channel (one whose
    #: reactor's ``receive`` returned a Deferred that has not fired) before reading from
    #: that peer stops, down to TCP (specs/reactor-api.md section 4.1). Each message
    #: counts its payload plus the 64 bytes its Python objects cost
    #: (``mconn.core.session.MESSAGE_OVERHEAD``), so empty messages count too. 1 MiB: a
    #: few thousand typical consensus or mempool messages, small beside recovery_buffer_bytes.
    reactor_backlog_bytes: int = 1 << 20
    #: Messages one peer may have waiting for busy channels before reading from it stops
    #: (with reactor_backlog_bytes: reading stops at either bound and resumes once both
    #: are below). 4096: above the ~3,300 messages of 250 bytes (a mempool transaction,
    #: a vote) that reactor_backlog_bytes holds, so honest traffic meets the byte bound
    #: first; it caps the receive calls queued behind one busy reactor, and the memory of
    #: tiny messages, at a quarter of the 16,384 the byte bound alone would let through.
    reactor_backlog_messages: int = 4096
    #: Node ids whose sessions bypass max_inbound_peers and max_outbound_peers (CometBFT's
    #: unconditional_peer_ids), e.g. a validator's sentries. Empty by default: limits
    #: apply to everyone. ``Switch.dial(..., unconditional=True)`` adds one.
    unconditional_peers: frozenset = frozenset()
    #: Largest WebSocket message (and frame) accepted from a ws/wss peer, in bytes,
    #: checked from the frame header before its payload is read (specs/websocket.md 4).
    #: 1 MiB: mconn sends messages of at most 64 KiB (so it may not be below that), and
    #: proxies re-frame at will within it.
    ws_max_message_bytes: int = 1 << 20
    #: Seconds a ws/wss connection may take from TCP connected to the WebSocket upgrade
    #: done, and an HTTP proxy to answer CONNECT; the mconn handshake_timeout follows.
    #: 10 s, as handshake_timeout: a proxy on the way adds a round trip or two.
    ws_handshake_timeout: float = 10.0
    #: Origins a ws/wss listener accepts in an upgrade that names one (patterns such as
    #: "https://*.example.com", "*" for any). An upgrade without an Origin header (every
    #: node's) is always accepted; one with an Origin no pattern matches is refused with
    #: 403. Empty: every Origin is refused, since only a browser sends one, and a web page
    #: in the operator's browser could otherwise reach a loopback listener as a local
    #: peer (specs/websocket.md 4).
    ws_allowed_origins: frozenset = frozenset()
    #: IP addresses of reverse proxies in front of a ws/wss listener whose
    #: X-Forwarded-For is believed: a connection from one of them counts (limits, PEX
    #: source, status page) as coming from the last hop that header names, which must
    #: be an IP address (one header line, ASCII only; else 400). Until its upgrade is read
    #: it counts in no address and in one group of the trusted proxies (specs/websocket.md
    #: 6.1). Empty: the TCP peer is the peer, and the header is ignored (it is only text).
    ws_trusted_proxies: frozenset = frozenset()
    #: HTTP proxy for ws:// and wss:// dials, "http://host:port" (HTTP CONNECT). None:
    #: the environment's https_proxy (wss) or http_proxy (ws), except for no_proxy hosts
    #: and loopback ones, as curl and Go do; "": never a proxy. Plain tcp dials never use one.
    http_proxy: str | None = None
    #: PEM file of the CAs a wss:// dial trusts when the Switch has no TLS options (the
    #: listener is a TLS-terminating proxy, checked like a web server: its certificate
    #: must name the host dialed). None: the system's trusted roots.
    wss_ca_file: str | None = None

    def __post_init__(self) -> None:
        if self.reactor_errors not in ("drop", "log"):
            raise ValueError(f"Config.reactor_errors must be 'drop' or 'log', got {self.reactor_errors!r}")
        if isinstance(self.unconditional_peers, str) or not all(isinstance(n, str) for n in self.unconditional_peers):
            raise ValueError(f"Config.unconditional_peers must be node ids, got {self.unconditional_peers!r}")
        object.__setattr__(self, "unconditional_peers", frozenset(self.unconditional_peers))
        for name in (
            "ping_interval",
            "pong_timeout",
            "send_timeout",
            "handshake_timeout",
            "dial_timeout",
            "close_linger",
            "ack_interval",
            "max_reconnect_delay",
            "duplicate_probe_timeout",
        ):
            _check_positive(name, getattr(self, name))
        _check_int("max_packet_payload", self.max_packet_payload, MIN_PACKET_PAYLOAD, MAX_PACKET_PAYLOAD_LIMIT)
        _check_int("max_inbound_peers", self.max_inbound_peers, 0)
        _check_int("max_outbound_peers", self.max_outbound_peers, 0)
        for name in (
            "max_pending_handshakes",
            "max_pending_per_group",
            "max_connections_per_ip",
            "max_pings_per_interval",
            "max_control_backlog",
        ):
            _check_int(name, getattr(self, name), 1)
        _check_int("pending_group_prefix_v4", self.pending_group_prefix_v4, 0, 32)
        _check_int("pending_group_prefix_v6", self.pending_group_prefix_v6, 0, 128)
        _check_int("ip_limit_prefix_v4", self.ip_limit_prefix_v4, 0, 32)
        _check_int("ip_limit_prefix_v6", self.ip_limit_prefix_v6, 0, 128)
        _check_int("max_hello_size", self.max_hello_size, 64)
        _check_int("max_control_size", self.max_control_size, 64)
        _check_int("write_batch_bytes", self.write_batch_bytes, 1)
        _check_int("recovery_buffer_bytes", self.recovery_buffer_bytes, 1)
        _check_int("max_unacked_bytes", self.max_unacked_bytes, 1)
        _check_int("max_suspended_sessions", self.max_suspended_sessions, 0)
        _check_int("max_suspended_bytes", self.max_suspended_bytes, 0)
        _check_int("ack_every_messages", self.ack_every_messages, 1)
        _check_int("ack_every_bytes", self.ack_every_bytes, 1)
        _check_int("reactor_backlog_bytes", self.reactor_backlog_bytes, 1)
        _check_int("reactor_backlog_messages", self.reactor_backlog_messages, 1)
        if self.max_reconnects is not None:
            _check_int("max_reconnects", self.max_reconnects, 0)
        if (
            isinstance(self.resume_grace, bool)
            or not isinstance(self.resume_grace, (int, float))
            or not (0 <= self.resume_grace < math.inf)
        ):
            raise ValueError(f"Config.resume_grace must be a finite number >= 0, got {self.resume_grace!r}")
        for name in (
            "tcp_nodelay",
            "tcp_keepalive",
            "retry_initial_dial",
            "ignore_discovered_addresses",
            "retain_address_order",
            "allow_discovered_private",
            "allow_duplicate_ip",
            "metrics_per_peer",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Config.{name} must be True or False, got {getattr(self, name)!r}")
        if self.tcp_user_timeout is not None:
            _check_positive("tcp_user_timeout", self.tcp_user_timeout)
        if self.local_address is not None and (not isinstance(self.local_address, str) or not self.local_address):
            raise ValueError(f"Config.local_address must be a host (IP address) or None, got {self.local_address!r}")
        if self.tcp_notsent_lowat is not None:
            _check_int("tcp_notsent_lowat", self.tcp_notsent_lowat, 1)
        _check_int("ws_max_message_bytes", self.ws_max_message_bytes, 65536)
        _check_positive("ws_handshake_timeout", self.ws_handshake_timeout)
        for name in ("ws_allowed_origins", "ws_trusted_proxies"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"Config.{name} must be a set of strings, got {value!r}")
            object.__setattr__(self, name, frozenset(value))
        for name in ("http_proxy", "wss_ca_file", "session_store"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"Config.{name} must be a string or None, got {getattr(self, name)!r}")
        if self.write_ahead_time is not None:
            _check_positive("write_ahead_time", self.write_ahead_time)
        for name in ("send_rate", "recv_rate"):
            value = getattr(self, name)
            if value is not None:
                _check_positive(name, value)
        if self.recv_rate is not None and self.recv_rate < MIN_RECV_RATE:
            raise ValueError(
                f"Config.recv_rate must be at least MIN_RECV_RATE {MIN_RECV_RATE} bytes per second "
                f"(it is announced to peers, which refuse less), got {self.recv_rate!r}"
            )
        if not (type(self.stats_interval) in (int, float) and self.stats_interval == 0):
            _check_positive("stats_interval", self.stats_interval)

    def replace(self, **changes) -> Config:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def _check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"Config.{name} must be a positive finite number, got {value!r}")


def _check_int(name: str, value, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"Config.{name} must be an integer {bound}, got {value!r}")
