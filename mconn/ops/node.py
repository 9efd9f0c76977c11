"""A node run by twistd: ``twistd -n mconn --listen tcp:26656 --key node.key ...``.

twisted/plugins/mconn_plugin.py names this module; twistd builds :class:`Options` from
the command line and calls :func:`makeService` with it. The options, the TOML file
(``--config FILE``) and the checks that need no I/O are in mconn/ops/node_settings.py, which
turns them into a :class:`NodeSettings`; this module builds the service from that (the
reactors, the key, the TLS options, the telemetry file) and runs it. A reactor is built as
``CLASS(**options)`` from its ``--reactor-option CLASS.key=value`` and ``[reactors.CLASS]``
options, checked against the constructor (specs/reactor-api.md section 13); ``--network``
and ``--moniker`` are the Switch's NodeInfo.

Bad configuration stops startup before anything has started (no port, no pid file, no
key written), with one line on stderr that says what is wrong and where (the option, or
the file and key). twistd itself prints the whole usage before a UsageError and a
traceback for an error in makeService, so both entry points turn a
:class:`ConfigurationError` into ``SystemExit("mconn: ...")``; :func:`build_service`
raises it for callers that are not twistd.

The key file is the node's identity: makeService refuses one that does not exist unless
``--create-key`` is given, and then logs the new node id as a warning. twistd's pid file
is named after the key (``alice.key``: ``alice.pid``) unless ``--pidfile`` is given
(mconn/ops/node_settings.py, ``twistd_files``). A port already in use stops ``twistd -n``
with one line, ``mconn: StartupError: --listen ...: Address already in use``, exit
status 1, its pid file removed; a daemon reports it through twistd's status pipe.

TLS (specs/tls.md): ``--tls`` is identity mode, a self-signed certificate made from the
node key at each start. ``--tls-ca FILE --tls-cert FILE`` is CA mode: the certificate,
signed by a CA in the bundle, must hold the ``--key`` key and be valid now (an expired one
stops startup); ``--tls-no-client-cert`` lets a CA-mode listener accept dialers without a
certificate. ``--status ENDPOINT`` serves the status page (specs/status.md); an endpoint
without ``interface=`` listens on 127.0.0.1 only, and the URL is logged once bound:
``mconn status page of node ID on http://127.0.0.1:PORT/``.

SIGHUP: the TLS certificate and key files are read again (``TLSOptions.reload``); new
connections use them, connected peers stay. A reload that fails (a bad file, a
certificate for another key, an expired one) is logged and the old certificate stays in
use. Only a node started by twistd (:func:`makeService`) installs the handler.

twistd's log: makeService opens the file twistd would log to (``--logfile``, the daemon's
log file, stdout for ``twistd -n``) with mconn/ops/text_log.py's observer, Twisted's lines
at a fraction of their cost, and :meth:`NodeService.setServiceParent` makes it twistd's
application's ``ILogObserver``; ``--logger`` and ``--syslog`` still choose their own.

SIGTERM: twistd stops the service, the Switch closes every peer with a close packet, the
telemetry file gets the last events, and twistd exits (by re-raising the signal, so the
exit status is "terminated by SIGTERM", the way twistd reports an orderly stop).
"""

from __future__ import annotations

import datetime
import importlib
import inspect
import os
import signal
import sys
import typing
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from cryptography import x509
from OpenSSL import SSL
from twisted.application.service import MultiService, Service
from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort
from twisted.logger import ILogObserver, Logger
from twisted.python.components import Componentized

from mconn.ops.node_config_file import FALSE_WORDS, TRUE_WORDS, ConfigurationError, Setting
from mconn.core.node_info import display_name
from mconn.core.node_key import NodeKey
from mconn.ops.node_settings import NodeSettings, Options, text_of
from mconn.switch.reactor import Reactor
from mconn.ops.status import StatusService
from mconn.switch.switch import Switch
from mconn.ops.telemetry_file import TelemetryFileService
from mconn.ops.text_log import twistd_log_observer
from mconn.net.tls import TLSOptions

#: twistd needs Options and makeService here; the rest is what callers import from it.
__all__ = [
    "ConfigurationError",
    "NodeService",
    "NodeSettings",
    "Options",
    "StartupError",
    "build_service",
    "makeService",
]

log = Logger(namespace="mconn.node")


# -- building the service --------------------------------------------------------------


def makeService(options: Options) -> NodeService:
    """twistd's entry point: :func:`build_service`, with errors as one line on stderr.

    Unlike build_service, it refuses a key file that does not exist unless
    ``--create-key`` was given: a typo in ``--key``, or a start from another directory,
    would otherwise give the node a new identity without a word.
    """
    settings = options.settings
    if not settings.create_key and not os.path.lexists(text_of(settings.key)):
        raise SystemExit(
            f"mconn: {settings.key.where}: {settings.key.value} does not exist; create a key with "
            f"'mconn keygen {settings.key.value}' or start once with --create-key (a new node identity)"
        )
    try:
        service = build_service(settings)
    except ConfigurationError as e:
        raise SystemExit(f"mconn: {e}") from None
    service.reload_on_sighup = True
    twistd = getattr(options, "parent", None)
    if twistd is not None and twistd.get("nodaemon"):
        service.foreground_pidfile = twistd.get("pidfile") or ""
    if twistd is not None:
        try:
            service.text_log = twistd_log_observer(twistd)
        except OSError as e:
            raise SystemExit(
                f"mconn: --logfile: cannot write {e.filename or twistd.get('logfile')}: {e.strerror or e}"
            ) from None
    return service


def build_service(settings: NodeSettings, clock=None) -> NodeService:
    """The node's service, once every setting has been checked; nothing is started.

    A missing key file is written last, when nothing else can fail.

    :param clock: the Twisted reactor (``twisted.internet.reactor`` if None).
    :raises ConfigurationError: naming the setting and what is wrong with it.
    """
    if clock is None:
        from twisted.internet import reactor as clock
    for setting in settings.listen + ((settings.status,) if settings.status is not None else ()):
        _check_endpoint(clock, setting)
    reactors = [_build_reactor(setting, settings.reactor_options) for setting in settings.reactors]
    _configure_pex(reactors, settings)
    key, created = _load_key(settings.key)
    tls = _build_tls(settings, key, created)
    try:
        switch = Switch(
            reactors, node_key=key, config=settings.config, clock=clock, tls=tls, node_info=settings.node_info
        )
    except ValueError as e:  # two reactors claim one channel
        where = settings.reactors[0].where if settings.reactors else "--reactor"
        raise ConfigurationError(f"{where}: {e}") from None
    telemetry = None
    if settings.telemetry is not None:
        try:
            telemetry = TelemetryFileService(
                settings.telemetry.value,
                key.node_id,
                rotate_bytes=settings.telemetry_rotate_bytes,
                rotate_seconds=settings.telemetry_rotate_seconds,
                keep_files=settings.telemetry_keep_files,
                keep_bytes=settings.telemetry_keep_bytes,
            )
        except OSError as e:
            path = e.filename or settings.telemetry.value
            raise ConfigurationError(f"{settings.telemetry.where}: cannot write {path}: {e.strerror or e}") from None
    if created:
        try:
            key.save(text_of(settings.key))
        except OSError as e:
            if telemetry is not None:
                telemetry.log_file.close()
            path = settings.key.value
            raise ConfigurationError(f"{settings.key.where}: cannot create {path}: {e.strerror or e}") from None
        log.warn(
            "created a new node key {path}: this is a new node identity, node id {node_id}",
            path=settings.key.value,
            node_id=key.node_id,
        )
    return NodeService(
        switch,
        listen=[s.value for s in settings.listen],
        peers=[str(s.value) for s in settings.peers],
        telemetry=telemetry,
        status=text_of(settings.status) if settings.status is not None else None,
    )


def _check_endpoint(clock, setting: Setting) -> None:
    try:
        serverFromString(clock, setting.value)
    except Exception as e:  # ValueError, TypeError, KeyError...: each parser has its own
        raise ConfigurationError(f"{setting.where}: endpoint {setting.value!r} is not valid: {e}") from None


def _build_reactor(setting: Setting, options: dict[str, dict[str, Setting]]) -> Reactor:
    module_name, _, name = text_of(setting).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigurationError(f"{setting.where}: cannot import {module_name}: {e}") from None
    factory = getattr(module, name, None)
    if factory is None:
        raise ConfigurationError(f"{setting.where}: module {module_name} has no {name}")
    kwargs = _reactor_kwargs(factory, name, options.get(name, {}))
    try:
        reactor = factory(**kwargs)
    except Exception as e:
        raise ConfigurationError(f"{setting.where}: {setting.value}() failed: {type(e).__name__}: {e}") from None
    if not isinstance(reactor, Reactor):
        kind = type(reactor).__name__
        raise ConfigurationError(f"{setting.where}: {setting.value}() is a {kind}, not an mconn Reactor")
    return reactor


#: Parameter types a ``--reactor-option`` value (text) is converted to; others get the text.
_OPTION_TYPES = (bool, int, float)


def _reactor_kwargs(factory, name: str, options: dict[str, Setting]) -> dict[str, object]:
    """The keyword arguments of ``factory`` (a reactor class) from its reactor options: a key
    the constructor does not take is an error naming the reactor, the key and the ones it
    takes; a text value becomes an int, float or bool where the parameter's annotation (or
    else its default) is one (``none`` is None where it may be None)."""
    if not options:
        return {}
    try:
        parameters: typing.Mapping[str, inspect.Parameter] = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        parameters = {}
    try:
        hints = typing.get_type_hints(factory.__init__ if inspect.isclass(factory) else factory)
    except Exception:  # an annotation that does not resolve: no conversions from it
        hints = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    keywords = [n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    kwargs: dict[str, object] = {}
    for key, setting in options.items():
        if key not in keywords and not takes_any:
            raise ConfigurationError(
                f"{setting.where}: {name} takes no option {key!r} (its options: {', '.join(keywords) or 'none'})"
            )
        value = setting.value
        if isinstance(value, str) and key in parameters:
            value = _option_value(value, hints.get(key), parameters[key].default, setting.where, name, key)
        kwargs[key] = value
    return kwargs


def _option_value(text: str, hint, default, where: str, reactor: str, key: str):
    """``text`` as the type the parameter declares: its annotation, or its default's type."""
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_args(hint) else [hint]
    optional = type(None) in typing.get_args(hint) or (hint is None and default is None)
    kind = kinds[0] if len(kinds) == 1 and kinds[0] in _OPTION_TYPES else None
    if kind is None and hint is None and type(default) in _OPTION_TYPES:
        kind = type(default)
    if optional and text.lower() == "none":
        return None
    if kind is None:
        return text
    try:
        return _from_text_as(kind, text)
    except ValueError:
        raise ConfigurationError(f"{where}: {reactor}'s {key} is {kind.__name__}: {text!r} is not one") from None


def _from_text_as(kind: type, text: str):
    """``text`` as a bool (true/false, yes/no, on/off, 1/0), an int or a float."""
    if kind is bool:
        word = text.strip().lower()
        if word not in TRUE_WORDS + FALSE_WORDS:
            raise ValueError(text)
        return word in TRUE_WORDS
    return kind(text)


def _configure_pex(reactors: list[Reactor], settings: NodeSettings) -> None:
    """Give ``--addrbook-file``, ``--seed-mode`` and ``--private-peer-ids`` to every
    reactor that takes them (a ``configure_pex`` method: ``reactors.pex.PexReactor``)."""
    pex = settings.pex
    given = pex.given()
    if not given:
        return
    takers = [hook for r in reactors if callable(hook := getattr(r, "configure_pex", None))]
    if not takers:
        raise ConfigurationError(
            f"{given[0].where}: is for a PEX reactor, and no --reactor takes it (give --reactor reactors.pex:PexReactor)"
        )
    for configure_pex in takers:
        try:
            configure_pex(
                addrbook_file=pex.addrbook_file.value if pex.addrbook_file is not None else None,
                seed_mode=pex.seed_mode.value if pex.seed_mode is not None else None,
                private_peer_ids=pex.private_peer_ids.value if pex.private_peer_ids is not None else None,
            )
        except (TypeError, ValueError) as e:
            raise ConfigurationError(f"{given[0].where}: {e}") from None


def _build_tls(settings: NodeSettings, key: NodeKey, created: bool) -> TLSOptions | None:
    """The Switch's TLSOptions, once the files are readable, the certificate holds the
    node key and is valid now."""
    tls = settings.tls
    if tls is None:
        return None
    if tls.mode == "identity":
        return TLSOptions.identity(key, upgrade=tls.upgrade, tls_required=tls.tls_required)
    for setting in (tls.ca, tls.cert):
        if setting is not None:
            _check_readable(setting)
    if tls.cert is not None:
        if created:
            raise ConfigurationError(
                f"{settings.key.where}: {settings.key.value} does not exist; in CA mode it must be the key "
                f"that {tls.cert.where} {tls.cert.value} holds"
            )
        _check_validity(tls.cert)
    assert tls.ca is not None  # CA mode: _tls_settings gives it the --tls-ca file
    try:
        return TLSOptions.from_files(
            ca_file=text_of(tls.ca),
            cert_file=text_of(tls.cert) if tls.cert is not None else None,
            key_file=text_of(settings.key) if tls.cert is not None else None,
            require_client_cert=tls.require_client_cert,
            upgrade=tls.upgrade,
            tls_required=tls.tls_required,
        )
    except (ValueError, SSL.Error) as e:
        where = tls.ca.where if "CA bundle" in str(e) or tls.cert is None else tls.cert.where
        raise ConfigurationError(f"{where}: {e}") from None


def _check_readable(setting: Setting) -> None:
    try:
        with open(text_of(setting), "rb"):
            pass
    except OSError as e:
        raise ConfigurationError(f"{setting.where}: cannot read {setting.value}: {e.strerror or e}") from None


def _check_validity(setting: Setting, now: datetime.datetime | None = None) -> None:
    """Refuse to start with an own certificate that has expired or is not valid yet.

    An unparsable file is left to ``TLSOptions.from_files``, which says so.
    """
    with open(text_of(setting), "rb") as f:
        data = f.read()
    try:
        leaf = x509.load_pem_x509_certificates(data)[0]
    except ValueError:
        return
    now = now or datetime.datetime.now(datetime.UTC)
    if now > leaf.not_valid_after_utc:
        raise ConfigurationError(
            f"{setting.where}: certificate {setting.value} expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; "
            "renew it"
        )
    if now < leaf.not_valid_before_utc:
        raise ConfigurationError(
            f"{setting.where}: certificate {setting.value} is not valid before "
            f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC (is the clock right?)"
        )


def _load_key(setting: Setting) -> tuple[NodeKey, bool]:
    """(the key, whether it is new and still to be saved)."""
    if not os.path.lexists(text_of(setting)):
        return NodeKey.generate(), True
    try:
        return NodeKey.load(text_of(setting)), False
    except ValueError as e:
        raise ConfigurationError(f"{setting.where}: {e}") from None


# -- the service -----------------------------------------------------------------------


class NodeService(MultiService):
    """The telemetry file, then the Switch, then the status page; ports and persistent
    peers on start.

    Ports (the Switch's, then the status page's) are bound in ``privilegedStartService``
    (before twistd drops privileges), after the telemetry file is observed, so the
    ``listening`` events are in it. ``stopService`` stops the children one after the
    other, last started first: the Switch's closing events still reach the telemetry file.
    """

    def __init__(
        self, switch, *, listen, peers, telemetry: TelemetryFileService | None = None, status: str | None = None
    ) -> None:
        super().__init__()
        self.switch = switch
        self.listen = list(listen)
        self.peers = list(peers)
        self.telemetry = telemetry
        #: The IListeningPorts, once bound.
        self.ports: list[IListeningPort] | None = None
        #: twistd's text log (mconn/ops/text_log.py), set by makeService: given to twistd
        #: as the application's ILogObserver when the service joins it.
        self.text_log: ILogObserver | None = None
        self._binding = False
        #: Install a SIGHUP handler that reloads the TLS files (set by makeService).
        self.reload_on_sighup = False
        #: Set by makeService for ``twistd -n``: twistd's pid file ("" for none). A start
        #: that fails (a port in use) then removes it and exits with one line on stderr.
        self.foreground_pidfile: str | None = None
        self._previous_sighup: Callable[[int, FrameType | None], Any] | int | None = None
        if telemetry is not None:
            telemetry.setServiceParent(self)
        switch.setServiceParent(self)
        #: The status page (``--status``), or None.
        self.status: StatusService | None = None
        if status is not None:
            self.status = StatusService(switch, status, listen_addresses=self._addresses)
            self.status.setServiceParent(self)

    def setServiceParent(self, parent) -> None:
        """Join ``parent``; twistd's application also gets :attr:`text_log` as its log
        observer, which twistd uses unless ``--logger`` names another (twistd's AppLogger
        reads the component after makeService, before it starts logging)."""
        super().setServiceParent(parent)
        if self.text_log is not None and isinstance(parent, Componentized):
            if parent.getComponent(ILogObserver, None) is None:
                parent.setComponent(ILogObserver, self.text_log)

    def privilegedStartService(self) -> None:
        super().privilegedStartService()
        try:
            self._bind()
        except StartupError as e:
            if self.foreground_pidfile is None:
                raise  # a daemon's twistd reports it through its status pipe
            self._exit_in_one_line(e)

    def _exit_in_one_line(self, error: StartupError) -> None:
        """Exit 1 with ``mconn: StartupError: ...`` on the terminal's stderr, not a traceback.

        twistd -n routes sys.stderr into its log and prints an exception escaping the
        start as a traceback; it removes its pid file only for an Exception, so this does.
        """
        pidfile = self.foreground_pidfile
        if pidfile:
            try:
                with open(pidfile) as f:
                    ours = f.read().strip() == str(os.getpid())
                if ours:
                    os.unlink(pidfile)
            except OSError:
                pass
        print(f"mconn: StartupError: {error}", file=sys.__stderr__, flush=True)
        raise SystemExit(1)

    def startService(self) -> None:
        if self.ports is None:  # not started by twistd: nothing bound yet
            self.privilegedStartService()
        super().startService()
        # Logged once the reactor runs (twistd has installed its signal handlers by then):
        # from that line on, SIGTERM gets an orderly shutdown.
        own = [a for a in self.peers if a.partition("@")[0] == self.switch.node_id]
        for address in own:
            log.warn("--peer {address} is this node itself (its own key); it is not dialed", address=address)
        peers = [a for a in self.peers if a not in own]
        info = self.switch.node_info
        self.switch.clock.callWhenRunning(
            log.info,
            "mconn node {node} started: listening on {addresses}, keeping {peers} connected",
            node=display_name(self.switch.node_id, info) + (f" on network {info.network}" if info else ""),
            node_id=self.switch.node_id,
            addresses=", ".join(self._addresses()) or "nothing",
            peers=_count(len(peers), "peer"),
        )
        if not self.listen and not peers:
            self.switch.clock.callWhenRunning(
                log.warn,
                "this node has no --listen and no --peer: nobody can reach it and it dials "
                "nobody (a reactor such as peer exchange may still dial)",
            )
        for address in peers:
            d = self.switch.dial(address, persistent=True)
            d.addErrback(self._dial_failed, address)
        if self.reload_on_sighup and self.switch.tls is not None:
            clock = self.switch.clock
            self._previous_sighup = signal.signal(
                signal.SIGHUP, lambda signum, frame: clock.callFromThread(self.reload_tls)
            )

    def reload_tls(self) -> bool:
        """Read the TLS files again (SIGHUP); whether the new ones are in use.

        New connections use them; connected peers keep theirs. A failure is logged and
        leaves the old certificate in use.
        """
        try:
            self.switch.tls.reload()
        except (ValueError, SSL.Error) as e:
            log.error("TLS reload failed, the old certificate stays in use: {error}", error=str(e))
            return False
        log.info(
            "TLS files reloaded: new connections use them; {peers} stay connected",
            peers=_count(len(self.switch.peers), "peer"),
        )
        return True

    @defer.inlineCallbacks
    def stopService(self):
        Service.stopService(self)  # not MultiService's, which stops every child at once
        if self._previous_sighup is not None:
            signal.signal(signal.SIGHUP, self._previous_sighup)
            self._previous_sighup = None
        for service in reversed(list(self)):
            try:
                yield defer.maybeDeferred(service.stopService)
            except Exception:
                log.failure("stopping {service} failed", service=service)

    def _bind(self) -> None:
        """Listen on every endpoint (the status page's, then the Switch's); on a failure,
        close the ports opened and raise.

        Twisted's stream server endpoints bind at once; a failure that comes later (from
        some other kind of endpoint) is logged.
        """
        self.ports = []
        failures = []

        def failed(failure, description):
            if self._binding:
                failures.append((description, failure))
            else:
                log.failure("cannot listen: {description}", failure, description=description)

        self._binding = True
        # The status page first: the Switch logs node_started once its first port is
        # bound, and a node whose status port is taken never started.
        if self.status is not None:
            self.status.listen().addErrback(failed, f"--status {self.status.endpoint}")
        for description in self.listen if not failures else ():
            self.switch.listen(description).addCallbacks(
                self.ports.append, failed, errbackArgs=(f"--listen {description}",)
            )
        self._binding = False
        if failures:
            # The Switch closes the ports it opened and, with no connection yet, runs
            # stop_reactor now: twistd -n exits before its reactor runs.
            self.switch.stopService()
            if self.status is not None and self.status.port is not None:
                self.status.port, port = None, self.status.port
                port.stopListening()
            if self.telemetry is not None:
                self.telemetry.stopService()
            description, failure = failures[0]
            error = getattr(failure.value, "socketError", None)  # CannotListenError
            reason = getattr(error, "strerror", None) or failure.getErrorMessage()
            raise StartupError(f"{description}: {reason}")

    def _addresses(self) -> list[str]:
        # An IAddress with a port (IPv4Address, IPv6Address) has a host too: the addresses are Any.
        hosts: Iterator[tuple[Any, str | None]] = (
            (p.getHost(), getattr(p, "peer_address", None)) for p in self.ports or ()
        )
        # A WebSocket port names its URL (ws://host:port/path, specs/websocket.md).
        return [url or (f"{h.host}:{h.port}" if hasattr(h, "port") else str(h)) for h, url in hosts]

    def _dial_failed(self, failure, address: str) -> None:
        if self.running:  # while stopping, the Switch fails the dials it drops
            log.warn("dialing {address} failed: {error}", address=address, error=failure.getErrorMessage())


def _count(n: int, noun: str) -> str:
    """``1 peer``, ``2 peers``, ``0 peers``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class StartupError(Exception):
    """The node could not start (a port already in use): what failed and where."""
