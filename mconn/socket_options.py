"""Socket options of a connection (specs/connection.md section 7, specs/resume.md 7.4).

TCP_NODELAY, TCP_NOTSENT_LOWAT (a small kernel send queue, so that priorities decide
what goes out), TCP_USER_TIMEOUT and keepalive (half-open links are found even where
the mconn keepalive is slower), set where the transport is a TCP socket and the
platform has them; and the kernel's count of acknowledged bytes (TCP_INFO), from which
the protocol measures the link's rate to size its writes (specs/connection.md section 7).
"""

from __future__ import annotations

import socket
import struct
import sys

from twisted.logger import Logger

log = Logger(namespace="mconn")

_LINUX = sys.platform.startswith("linux")
#: Linux's struct tcp_info: tcpi_bytes_acked (since 4.1) is the u64 at offset 120.
_TCP_INFO = getattr(socket, "TCP_INFO", 11) if _LINUX else None
_BYTES_ACKED = struct.Struct("=Q")
_BYTES_ACKED_OFFSET = 120


def _socket_options(config) -> list[tuple[str, int, int, int]]:
    """(name, level, option, value) of every option ``config`` asks for on this platform."""
    tcp = socket.IPPROTO_TCP
    options = []
    lowat = getattr(socket, "TCP_NOTSENT_LOWAT", 25 if _LINUX else None)
    if config.tcp_notsent_lowat and lowat is not None:
        options.append(("TCP_NOTSENT_LOWAT", tcp, lowat, config.tcp_notsent_lowat))
    user_timeout = getattr(socket, "TCP_USER_TIMEOUT", 18 if _LINUX else None)
    if config.tcp_user_timeout is not None and user_timeout is not None:
        options.append(("TCP_USER_TIMEOUT", tcp, user_timeout, max(1, round(config.tcp_user_timeout * 1000))))
    if config.tcp_keepalive:
        options.append(("SO_KEEPALIVE", socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
        for name, value in (
            ("TCP_KEEPIDLE", config.ping_interval),
            ("TCP_KEEPINTVL", config.pong_timeout / 3),
            ("TCP_KEEPCNT", 3),
        ):
            option = getattr(socket, name, None)
            if option is not None:
                options.append((name, tcp, option, max(1, min(32767, round(value)))))
    return options


def set_socket_options(transport, config) -> None:
    """TCP_NODELAY, TCP_NOTSENT_LOWAT, TCP_USER_TIMEOUT and keepalive, where the
    transport is a TCP socket and the platform has them (specs/connection.md section 7)."""
    if config.tcp_nodelay and hasattr(transport, "setTcpNoDelay"):
        transport.setTcpNoDelay(True)
    handle = socket_of(transport)
    if handle is None:
        return
    for name, level, option, value in _socket_options(config):
        try:
            handle.setsockopt(level, option, value)
        except OSError as e:
            log.debug("{option} not set: {error}", option=name, error=e)



def socket_of(transport) -> socket.socket | None:
    """The TCP socket beneath ``transport`` (one level down under TLS), or None."""
    handle = getattr(transport, "getHandle", lambda: None)()
    if not isinstance(handle, socket.socket):  # a TLS transport: the socket is one level down
        handle = getattr(getattr(transport, "transport", None), "getHandle", lambda: None)()
    return handle if isinstance(handle, socket.socket) else None


def bytes_acked(handle: socket.socket) -> int | None:
    """The bytes the peer has acknowledged on this TCP connection (TCP_INFO's
    tcpi_bytes_acked), or None where the platform does not say."""
    if _TCP_INFO is None:
        return None
    end = _BYTES_ACKED_OFFSET + _BYTES_ACKED.size
    try:
        info = handle.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, end)
    except OSError:
        return None
    if len(info) < end:
        return None  # a kernel older than 4.1
    return _BYTES_ACKED.unpack_from(info, _BYTES_ACKED_OFFSET)[0]
