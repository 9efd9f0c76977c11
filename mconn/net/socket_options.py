"""Socket options of a connection (specs/connection.md section 7, specs/resume.md 7.4).

TCP_NODELAY, TCP_NOTSENT_LOWAT (a small kernel send queue, so that priorities decide
what goes out), TCP_USER_TIMEOUT and keepalive (half-open links are found even where
the mconn keepalive is slower), set where the transport is a TCP socket and the
platform has them; and the kernel's count of acknowledged bytes (TCP_INFO), from which
the protocol measures the link's rate to size its writes (specs/connection.md section 7).

A listening port is prepared once (``prepare_listening``): the options are set on its
socket, and those an accepted socket is found to inherit on this kernel (probed once
per process on a loopback pair, with getsockopt) are not set again on each inbound
connection: seven ``setsockopt`` calls were about 5% of a connect storm's CPU.
"""

from __future__ import annotations

import functools
import socket
import struct
import sys
import weakref

from twisted.logger import Logger

log = Logger(namespace="mconn")

_LINUX = sys.platform.startswith("linux")
#: Linux's struct tcp_info: tcpi_bytes_acked (since 4.1) is the u64 at offset 120.
_TCP_INFO = getattr(socket, "TCP_INFO", 11) if _LINUX else None
_BYTES_ACKED = struct.Struct("=Q")
_BYTES_ACKED_OFFSET = 120


#: The last (config, its options): one Config serves every connection of a Switch.
_LAST_OPTIONS: list = [None, ()]
#: Listening port -> (the options set on its socket, the names its accepted sockets
#: inherit, {name: (level, option, the value it had before)}).
_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NOTHING: frozenset[str] = frozenset()


def _options_of(config) -> tuple:
    """``_socket_options(config)`` with TCP_NODELAY first when ``tcp_nodelay``, as a
    tuple, computed once per Config."""
    if _LAST_OPTIONS[0] is not config:
        options = tuple(_socket_options(config))
        if config.tcp_nodelay:
            options = (("TCP_NODELAY", socket.IPPROTO_TCP, socket.TCP_NODELAY, 1), *options)
        _LAST_OPTIONS[:] = [config, options]
    return _LAST_OPTIONS[1]


def _socket_options(config) -> list[tuple[str, int, int, int]]:
    """(name, level, option, value) of every option ``config`` asks for on this platform
    but TCP_NODELAY (``_options_of`` adds it; a connection's transport sets it)."""
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
    transport is a TCP socket and the platform has them (specs/connection.md section 7);
    on a connection accepted by a port ``prepare_listening`` prepared with the same
    options, only those its socket does not inherit."""
    options = _options_of(config)
    prepared = _prepared(transport)
    inherited = _NOTHING
    if prepared is not None:
        if prepared[0] == options:
            inherited = prepared[1]
            if len(inherited) == len(options):
                return  # every one inherited (or none asked for)
        else:  # the Config changed since the port was prepared
            _undo_inherited(transport, prepared, options)
    if config.tcp_nodelay and "TCP_NODELAY" not in inherited and hasattr(transport, "setTcpNoDelay"):
        transport.setTcpNoDelay(True)
    handle = socket_of(transport)
    if handle is None:
        return
    for name, level, option, value in options:
        if name in inherited or name == "TCP_NODELAY":
            continue
        _set(handle, name, level, option, value)


def _set(handle: socket.socket, name: str, level: int, option: int, value: int) -> None:
    try:
        handle.setsockopt(level, option, value)
    except OSError as e:
        log.debug("{option} not set: {error}", option=name, error=e)


def _prepared(transport) -> tuple | None:
    """What ``prepare_listening`` did to the port ``transport`` was accepted on, or None
    (Twisted's TCP server transport names its port ``server``; a TLS transport forwards
    the name to the TCP one beneath)."""
    port = getattr(transport, "server", None)
    if port is None:
        return None
    try:
        return _PREPARED.get(port)
    except TypeError:  # not a port that can be weakly referenced
        return None


def _undo_inherited(transport, prepared: tuple, options: tuple) -> None:
    """Put back the platform's value of each option inherited from the port that
    ``options`` no longer asks for (the rest are set again from ``options``)."""
    handle = socket_of(transport)
    if handle is None:
        return
    asked = {name for name, *_ in options}
    for name, (level, option, value) in prepared[2].items():
        if name in prepared[1] and name not in asked:
            _set(handle, name, level, option, value)


def prepare_listening(port, config) -> frozenset:
    """Set ``config``'s options (TCP_NODELAY included) on the socket of the listening
    ``port`` (Twisted's TCP port: its ``socket``) and remember which ones the sockets it
    accepts inherit, so that ``set_socket_options`` leaves those alone (Linux's accepted
    sockets inherit all of them; ``inherited_options`` probes it). Returns their names;
    none for a port without a TCP socket."""
    handle = getattr(port, "socket", None)
    if not isinstance(handle, socket.socket) or handle.type != socket.SOCK_STREAM:
        return _NOTHING
    options = _options_of(config)
    before = {}  # the platform's values, put back on a connection whose Config no longer asks
    for name, level, option, value in options:
        try:
            before[name] = (level, option, handle.getsockopt(level, option))
            handle.setsockopt(level, option, value)
        except OSError as e:
            before.pop(name, None)
            log.debug("{option} not set on the listening socket: {error}", option=name, error=e)
    inherited = inherited_options(handle.family, options) & frozenset(before)
    _PREPARED[port] = (options, inherited, before)
    return inherited


@functools.lru_cache(maxsize=8)
def inherited_options(family: int, options: tuple) -> frozenset:
    """The names of ``options`` ((name, level, option, value)) that a socket accepted on
    a listening socket carrying them inherits, on this kernel: set on a loopback listener
    of ``family``, read back with getsockopt on a socket it accepts. Probed once per
    process and option set; none where the probe cannot run."""
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    try:
        with socket.socket(family, socket.SOCK_STREAM) as listener, socket.socket(family, socket.SOCK_STREAM) as client:
            listener.bind((host, 0))
            listener.listen(1)
            for _name, level, option, value in options:
                try:
                    listener.setsockopt(level, option, value)
                except OSError:
                    pass
            client.settimeout(2.0)
            listener.settimeout(2.0)
            client.connect(listener.getsockname()[:2])
            accepted, _ = listener.accept()
            with accepted:
                return frozenset(
                    name for name, level, option, value in options if _read(accepted, level, option) == value
                )
    except OSError as e:
        log.debug("socket option inheritance not probed: {error}", error=e)
        return _NOTHING


def _read(handle: socket.socket, level: int, option: int) -> int | None:
    try:
        return handle.getsockopt(level, option)
    except OSError:
        return None


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
