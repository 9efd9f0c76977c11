"""The settings of a node run by twistd: :class:`Options`, merging with the TOML file, the checks.

Every setting may come from the command line or from a TOML file (``--config FILE``):
its keys are the long options without the leading dashes (``listen``, ``peer``, ``reactor``,
``key``, ``create_key``, ``telemetry``, ``telemetry_rotate_bytes``, ``telemetry_rotate_seconds``, ``telemetry_keep_files``,
``telemetry_keep_bytes``, ``status``, ``tls``, ``tls_ca``, ``tls_cert``,
``tls_no_client_cert``, ``tls_upgrade``, ``tls_accept_upgrade``, ``network``, ``moniker``,
and for a PEX reactor ``addrbook_file``, ``seed_mode``, ``private_peer_ids``; the flags are
``true`` or ``false`` there) and the :class:`mconn.Config` fields (``ping_interval = 30``), which are
also options (``--ping-interval 30``; a boolean field is a pair of flags,
``--tcp-keepalive`` / ``--no-tcp-keepalive``). A key may be written with dashes, as on the
command line (``ping-interval = 30`` is ``ping_interval``); both spellings of one key in
one file are an error. An unknown key is an error that names the closest valid key. The
command line wins: a repeatable option given there replaces the file's list. Relative
paths in the file are relative to the file. The defaults are Config's; a ``--peer`` is a
persistent dial, so one that is down when the node starts is dialed until it is up.

``--network`` and ``--moniker`` make the node's ``NodeInfo`` (specs/reactor-api.md section
10). A reactor's options, ``--reactor-option CLASS.key=value`` or a ``[reactors.CLASS]``
table, are keyword arguments of its constructor (mconn/ops/node.py checks and converts
them; specs/reactor-api.md section 13); a command-line option replaces the file's value of
that key only. ``--help`` lists the node's own options first and the Config fields after
a heading (``NODE_HELP_ORDER``); a twistd option given after ``mconn`` is named as twistd's.

The help of a Config option is the ``#:`` comment above its field in mconn/config.py
(meaning, unit, why the default) and the default a twistd node uses (mconn/ops/node_help.py):
a field added to Config is an option with its help, without a change here.

``Options.postOptions`` merges the file and the command line into ``{name: Setting}``
(each value with where it was set: ``--listen``, ``node.toml: listen``); :func:`resolve`
checks them as far as that is possible without I/O (types, Config's own checks, peer
addresses, ``MODULE:CLASS`` specs, TLS flags that agree with each other) and returns a
:class:`NodeSettings`. A bad setting is a :class:`ConfigurationError` naming the option,
or the file and key, and what is wrong. mconn/ops/node.py builds the service from the result.
The names and kinds of the settings, :class:`Setting`, :class:`ConfigurationError` and the
reading of the TOML file and of command-line text are in mconn/ops/node_config_file.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from typing import Any, cast

from twisted.python import usage

from mconn.core.address import PeerAddress, parse_address
from mconn.core.node_info import NodeInfo
from mconn.config import Config
from mconn.ops.node_config_file import (
    CONFIG_TYPES,
    COUNTS,
    FALSE_WORDS,
    FLAGS,
    NODE_SETTINGS,
    PATHS,
    REACTOR_OPTIONS,
    REPEATABLE,
    TEXTS,
    TRUE_WORDS,
    WORD_SETS,
    ConfigurationError,
    Setting,
    from_text,
    parse_reactor_option,
    read_toml,
)
from mconn.ops.node_help import CONFIG_FIELDS, NODE_CONFIG_DEFAULTS, config_option_help, describe_default
from mconn.ops.status import local_endpoint
from mconn.ops.telemetry_file import (
    DEFAULT_KEEP_BYTES,
    DEFAULT_KEEP_FILES,
    DEFAULT_ROTATE_BYTES,
    DEFAULT_ROTATE_SECONDS,
)


#: The key file used when neither the command line nor the config file names one.
DEFAULT_KEY = "node.key"


@dataclasses.dataclass(frozen=True)
class TLSSettings:
    """How the node speaks TLS (specs/tls.md): ``identity`` (a certificate made from the
    node key) or ``ca`` (``cert``, signed by a CA in ``ca``, holding the node key).

    In either mode, ``upgrade`` dials with the plaintext pre-hello before TLS, and
    ``tls_required=False`` lets the listener accept that start besides TLS first
    (specs/tls.md section 7).
    """

    mode: str
    where: str
    ca: Setting | None = None
    cert: Setting | None = None
    require_client_cert: bool = True
    upgrade: bool = False
    tls_required: bool = True


@dataclasses.dataclass(frozen=True)
class PexSettings:
    """The options of a PEX reactor (specs/pex.md section 3.6-3.8), given to every reactor
    with a ``configure_pex`` method (``reactors.pex.PexReactor``)."""

    addrbook_file: Setting | None = None
    seed_mode: Setting | None = None
    private_peer_ids: Setting | None = None  # of frozenset[str]

    def given(self) -> list[Setting]:
        return [s for s in (self.addrbook_file, self.seed_mode, self.private_peer_ids) if s is not None]


@dataclasses.dataclass(frozen=True)
class NodeSettings:
    """Everything a node needs, checked as far as that is possible without I/O."""

    listen: tuple[Setting, ...]
    peers: tuple[Setting, ...]  # of PeerAddress
    reactors: tuple[Setting, ...]  # of "module:Class"
    key: Setting
    telemetry: Setting | None
    telemetry_rotate_bytes: int
    config: Config
    status: Setting | None = None  # the endpoint, with interface=127.0.0.1 if it named none
    tls: TLSSettings | None = None
    telemetry_keep_files: int = DEFAULT_KEEP_FILES
    telemetry_keep_bytes: int = DEFAULT_KEEP_BYTES
    telemetry_rotate_seconds: int = DEFAULT_ROTATE_SECONDS
    create_key: bool = False  # --create-key: a missing key file is created (twistd refuses it otherwise)
    pex: PexSettings = PexSettings()
    #: What the node announces (--network, --moniker), or None: nothing announced or required.
    node_info: NodeInfo | None = None
    #: The keyword arguments of each reactor, by the CLASS of its ``--reactor MODULE:CLASS``:
    #: {CLASS: {key: Setting}} (``--reactor-option CLASS.key=value``, ``[reactors.CLASS]``).
    reactor_options: dict[str, dict[str, Setting]] = dataclasses.field(default_factory=dict)


def text_of(setting: Setting) -> str:
    """The value of a setting that is text by construction: a path (``key``, ``telemetry``,
    ``tls_ca``, ``tls_cert``), the ``status`` endpoint, one ``listen``, ``peer`` or ``reactor``."""
    return cast(str, setting.value)


# -- options ---------------------------------------------------------------------------


def _option(name: str) -> str:
    return name.replace("_", "-")


def _is_bool_field(name: str) -> bool:
    return CONFIG_TYPES[name] is bool


def _config_parameters() -> list:
    return [[_option(name), None, None, config_option_help(name)] for name in CONFIG_FIELDS if not _is_bool_field(name)]


def _config_flags() -> list:
    """``--NAME`` and ``--no-NAME`` for each boolean Config field."""
    flags = []
    for name in CONFIG_FIELDS:
        if _is_bool_field(name):
            flags.append([_option(name), None, config_option_help(name)])
            flags.append([f"no-{_option(name)}", None, f"the opposite of --{_option(name)}"])
    return flags


class Options(usage.Options):
    """``twistd mconn`` options; after parsing, ``options.settings`` is a NodeSettings.

    Parsed by twistd, the options also choose twistd's pid file (and, for a daemon, its
    log file) when the command line names none: see :func:`twistd_files`.
    """

    synopsis = "[options]"
    longdesc = (
        "Run an mconn node: listen for peers, keep the --peer nodes connected, route their "
        "messages to the --reactor classes. Every option (without the leading dashes) and "
        "every Config field may also be set in a TOML file given with --config, and a "
        "reactor's options in a [reactors.CLASS] table; the command line wins. twistd's own "
        "options (-n, --pidfile, --logfile...) go before 'mconn'. Unless twistd's --pidfile is given, the pid file is the key file's path "
        "with .pid for .key (node.key: node.pid), so nodes with different keys can run from "
        "one directory; --pidfile '' writes none."
    )
    optParameters = [
        [
            "key",
            None,
            None,
            f"node key file (PEM, mode 0600); it must exist (mconn keygen FILE) unless --create-key "
            f"[default: {DEFAULT_KEY} in the current directory]",
        ],
        [
            "telemetry",
            None,
            None,
            "write every telemetry event of this node to this file as JSON lines [default: none]",
        ],
        [
            "telemetry-rotate-bytes",
            None,
            None,
            f"rotate the telemetry file when it reaches this many bytes, 0: never "
            f"[default: {describe_default(DEFAULT_ROTATE_BYTES)}]",
        ],
        [
            "telemetry-rotate-seconds",
            None,
            None,
            "also rotate the telemetry file once it has been open this many seconds, and at stop, "
            "so that a reader of closed files gets every record within that time, 0: never "
            f"[default: {DEFAULT_ROTATE_SECONDS}]",
        ],
        [
            "telemetry-keep-files",
            None,
            None,
            f"keep at most this many rotated telemetry files, deleting the oldest first, 0: none "
            f"[default: {DEFAULT_KEEP_FILES}]",
        ],
        [
            "telemetry-keep-bytes",
            None,
            None,
            f"keep at most this many bytes of rotated telemetry files, deleting the oldest first "
            f"[default: {describe_default(DEFAULT_KEEP_BYTES)}]",
        ],
        ["config", None, None, "TOML file with any of these settings [default: none]"],
        [
            "network",
            None,
            None,
            "the network (chain id) this node is on, announced in its hello; peers on another network, "
            "or announcing none, are refused (1..50 printable ASCII characters, no spaces) "
            "[default: none: nothing announced or required]",
        ],
        [
            "moniker",
            None,
            None,
            "a name for people (at most 64 bytes of printable text), announced with --network; "
            "logs and 'mconn status' name a peer 'MONIKER (first 8 hex digits of its id)' [default: none]",
        ],
        [
            "status",
            None,
            None,
            "serve the status page (HTML and /status.json) on this endpoint, e.g. tcp:8080; "
            "without interface= it listens on 127.0.0.1 only [default: none]",
        ],
        ["tls-ca", None, None, "CA mode: trust the CAs in this PEM file (peers need certificates they signed)"],
        ["tls-cert", None, None, "CA mode: this node's certificate (PEM), whose key is the --key file"],
        [
            "addrbook-file",
            None,
            None,
            "PEX: keep the address book in this JSON file (mode 0600), read at start, saved every "
            "2 minutes and at stop (CometBFT's addr_book_file) [default: none: not kept]",
        ],
        [
            "private-peer-ids",
            None,
            None,
            "PEX: node ids, comma-separated, never added to the address book nor shared "
            "(CometBFT's private_peer_ids) [default: none]",
        ],
    ] + _config_parameters()
    optFlags = [
        [
            "create-key",
            None,
            "create the --key file if it does not exist (a new node identity; logged as a warning) "
            "[default: off: a missing key file stops the node]",
        ],
        ["tls", None, "identity mode: TLS with a self-signed certificate made from the node key [default: off]"],
        ["tls-no-client-cert", None, "CA mode: accept dialers that present no certificate [default: off]"],
        ["tls-upgrade", None, "dial with a plaintext pre-hello, then TLS on the same connection [default: off]"],
        [
            "tls-accept-upgrade",
            None,
            "accept dialers that start with the pre-hello, besides TLS first [default: off]",
        ],
        [
            "seed-mode",
            None,
            "PEX: run as a seed: crawl the address book, answer whoever connects once and "
            "disconnect them (CometBFT's seed_mode) [default: off]",
        ],
    ] + _config_flags()

    def __init__(self) -> None:
        super().__init__()
        for name in REPEATABLE:
            self[name] = []
        self["reactor-option"] = []

    def opt_listen(self, endpoint: str) -> None:
        """accept peers on this server endpoint, e.g. tcp:26656:interface=127.0.0.1
        (repeatable) [default: none: the node only dials]"""
        self["listen"].append(endpoint)

    def opt_peer(self, address: str) -> None:
        """keep the node ID@HOST:PORT connected (repeatable) [default: none]"""
        self["peer"].append(address)

    def opt_reactor(self, spec: str) -> None:
        """MODULE:CLASS of a Reactor to run, built with its --reactor-option keyword arguments (repeatable) [default: none]"""
        self["reactor"].append(spec)

    def opt_reactor_option(self, text: str) -> None:
        """CLASS.key=value: the keyword argument key=value for --reactor MODULE:CLASS; the value is text, or an int, float or bool where the constructor's parameter says so (repeatable) [default: none]"""
        self["reactor-option"].append(text)

    def parseOptions(self, options=None) -> None:
        """Parse, then say what is wrong in one line (twistd would print its usage first)."""
        try:
            _check_flag_values(options)
            super().parseOptions(options)
        except usage.UsageError as e:
            raise SystemExit(f"mconn: {_twistd_option_hint(e)}") from None

    def getUsage(self, width: int | None = None) -> str:
        """The node's own options first, in the order a new node needs them (key, listen,
        peer, reactor...), then the Config fields under a heading of their own."""
        text = super().getUsage(width)
        head, _, rest = text.partition("Options:\n")
        blocks = _option_blocks(rest)
        node = [b for name, b in blocks if name not in _CONFIG_OPTIONS]
        order = {name: i for i, name in enumerate(NODE_HELP_ORDER)}
        node_names = [name for name, _ in blocks if name not in _CONFIG_OPTIONS]
        node = [b for _, b in sorted(zip(node_names, node, strict=True), key=lambda nb: order.get(nb[0], len(order)))]
        tuning = [b for name, b in blocks if name in _CONFIG_OPTIONS]
        tail = rest[sum(len(b) for _, b in blocks) :]  # the long description after the options
        return f"{head}Options:\n{''.join(node)}\n{TUNING_HEADING}\n{''.join(tuning)}{tail}" if tuning else text

    def parseArgs(self, *args: str) -> None:
        if args:
            raise ConfigurationError(f"unexpected argument {args[0]!r}: every setting is an option (--help)")

    def postOptions(self) -> None:
        given = read_toml(self["config"]) if self["config"] else {}
        for name in REPEATABLE:
            if self[name]:
                given[name] = Setting(list(self[name]), f"--{name}")
        if self["reactor-option"]:
            # Per reactor and key: the command line replaces the file's value of that key only.
            tables = cast(
                dict[str, dict[str, Setting]], given[REACTOR_OPTIONS].value if REACTOR_OPTIONS in given else {}
            )
            for text in self["reactor-option"]:
                reactor, key, value = parse_reactor_option(text, "--reactor-option")
                where = f"--reactor-option {reactor}.{key}"
                tables.setdefault(reactor, {})[key] = Setting(value, where)
            given[REACTOR_OPTIONS] = Setting(tables, "--reactor-option")
        for name in FLAGS:
            if self[_option(name)]:
                given[name] = Setting(True, f"--{_option(name)}")
        for name in CONFIG_FIELDS:
            if _is_bool_field(name):
                on, off = self[_option(name)], self[f"no-{_option(name)}"]
                if on and off:
                    raise ConfigurationError(f"--{_option(name)} and --no-{_option(name)} contradict each other")
                if on or off:
                    given[name] = Setting(bool(on), f"--{'' if on else 'no-'}{_option(name)}")
        for name in NODE_SETTINGS[len(REPEATABLE) :] + tuple(CONFIG_FIELDS):
            if name in FLAGS or (name in CONFIG_FIELDS and _is_bool_field(name)):
                continue
            text = self[_option(name)]
            if text is not None:
                value = os.path.abspath(text) if name in PATHS else from_text(name, text, f"--{_option(name)}")
                given[name] = Setting(value, f"--{_option(name)}")
        self.settings = resolve(given)
        twistd = getattr(self, "parent", None)
        if twistd is not None and "pidfile" in twistd:
            twistd_files(twistd, self.settings)


#: The node's own options in ``--help``, in this order; the Config fields follow them.
NODE_HELP_ORDER = (
    "key",
    "create-key",
    "listen",
    "peer",
    "reactor",
    "reactor-option",
    "network",
    "moniker",
    "config",
    "status",
    "tls",
    "tls-ca",
    "tls-cert",
    "tls-no-client-cert",
    "tls-upgrade",
    "tls-accept-upgrade",
    "telemetry",
    "telemetry-rotate-bytes",
    "telemetry-keep-files",
    "telemetry-keep-bytes",
    "addrbook-file",
    "seed-mode",
    "private-peer-ids",
    "help",
    "version",
)
TUNING_HEADING = (
    "Tuning: each field of mconn.Config (mconn/config.py) is an option, and a TOML key;\nthe defaults suit most nodes:"
)
_CONFIG_OPTIONS = frozenset(
    [_option(name) for name in CONFIG_FIELDS] + [f"no-{_option(name)}" for name in CONFIG_FIELDS]
)


def _option_blocks(text: str) -> list[tuple[str, str]]:
    """(long option, its lines) of the option list twisted.python.usage writes, in order;
    the text after the last option (the long description) is not in any block."""
    blocks: list[tuple[str, str]] = []
    for line in text.splitlines(keepends=True):
        start = re.match(r" {2}(?:-\w, | {4})--([\w-]+)", line)
        if start:
            blocks.append((start.group(1), line))
        elif blocks and line.startswith(" " * 8) and line.strip():
            blocks[-1] = (blocks[-1][0], blocks[-1][1] + line)
        else:
            break
    return blocks


def _twistd_option_hint(error: usage.UsageError) -> str:
    """A twistd option given after ``mconn`` (``twistd -n mconn --pidfile x.pid``): say
    where it goes, instead of only that mconn does not know it."""
    unknown = re.fullmatch(r"option (-{1,2})([\w-]+) not recognized", str(error))
    if unknown is None:
        return str(error)
    from twisted.scripts.twistd import ServerOptions

    twistd = ServerOptions()
    dashes, name = unknown.groups()
    names = {o.rstrip("=") for o in twistd.longOpt} if dashes == "--" else set(twistd.shortOpt.replace(":", ""))
    if name not in names:
        return str(error)
    option = f"{dashes}{name}"
    return (
        f"{option} is an option of twistd, not of mconn: give it before 'mconn', as in 'twistd {option} ... mconn ...'"
    )


def _check_flag_values(arguments) -> None:
    """A boolean Config option given a value the old way (``--tcp-keepalive false``):
    say that it is a pair of flags now, instead of "Wrong number of arguments"."""
    arguments = list(arguments or ())
    for flag, value in itertools.pairwise(arguments):
        name = flag[2:].replace("-", "_")
        words = TRUE_WORDS + FALSE_WORDS
        if flag.startswith("--") and name in CONFIG_FIELDS and _is_bool_field(name) and value.lower() in words:
            raise ConfigurationError(
                f"{flag} {value}: {flag} is a flag and takes no value; give {flag} or --no-{flag[2:]}"
            )


def twistd_files(twistd, settings: NodeSettings) -> None:
    """Name twistd's pid file after the key file unless ``--pidfile`` was given (and the
    log file of a daemon unless ``--logfile`` was), so that nodes with different keys run
    from one directory; refuse to start a second node on one pid file, in one line.

    twistd's own defaults (``twistd.pid``, ``twistd.log`` in the current directory) make
    a second node in the same directory exit, or remove the first one's pid file.
    """
    key = text_of(settings.key)
    stem = key[: -len(".key")] if key.endswith(".key") else key
    if twistd["pidfile"] == "twistd.pid":
        twistd["pidfile"] = stem + ".pid"
    if not twistd["nodaemon"] and twistd.get("logfile") is None and not twistd.get("syslog"):
        twistd["logfile"] = stem + ".log"
    pid = running_pid(twistd["pidfile"])
    if pid is not None:
        raise ConfigurationError(
            f"pid file {twistd['pidfile']}: process {pid} is running; is a node with the key "
            f"{settings.key.value} running already? Stop it, or give twistd another --pidfile"
        )


def running_pid(pidfile: str) -> int | None:
    """The PID in ``pidfile`` if that process is running, else None (no file, a stale one)."""
    if not pidfile:
        return None
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid if pid != os.getpid() else None


def resolve(given: dict) -> NodeSettings:
    """Check the merged settings and turn them into a NodeSettings.

    :raises ConfigurationError: naming the setting and what is wrong with it.
    """
    config_values: dict[str, Any] = dict(NODE_CONFIG_DEFAULTS)
    for name in CONFIG_FIELDS:
        if name in given:
            setting = given[name]
            try:
                Config(**{name: setting.value})
            except (TypeError, ValueError) as e:
                raise ConfigurationError(f"{setting.where}: {e}") from None
            config_values[name] = setting.value
    try:
        config = Config(**config_values)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"configuration: {e}") from None
    counts = {name: _count(given, name, default) for name, default in COUNTS.items()}
    status = given.get("status")
    if status is not None:
        if not isinstance(status.value, str) or not status.value.strip():
            raise ConfigurationError(f"{status.where}: {status.value!r} must be an endpoint, like tcp:8080")
        status = Setting(local_endpoint(status.value.strip()), status.where)
    listen = _each(given, "listen")
    reactors = tuple(Setting(_reactor_spec(text_of(s), s.where), s.where) for s in _each(given, "reactor"))
    return NodeSettings(
        listen=listen,
        peers=tuple(Setting(_peer(text_of(s), s.where), s.where) for s in _each(given, "peer")),
        reactors=reactors,
        key=given.get("key", Setting(os.path.abspath(DEFAULT_KEY), "--key (default)")),
        telemetry=given.get("telemetry"),
        **counts,
        config=config,
        status=status,
        tls=_tls_settings(given, listening=bool(listen)),
        create_key=_flag(given, "create_key"),
        pex=_pex_settings(given),
        node_info=_node_info(given),
        reactor_options=_reactor_options(given, reactors),
    )


def _node_info(given: dict) -> NodeInfo | None:
    """The NodeInfo of ``--network`` and ``--moniker``; a moniker needs a network (the node
    info that carries it makes peers without one unwelcome, so it is not implied)."""
    network, moniker = (given.get(name) for name in TEXTS)
    for setting in (network, moniker):
        if setting is not None and not isinstance(setting.value, str):
            raise ConfigurationError(f"{setting.where}: {setting.value!r} must be text")
    if network is None:
        if moniker is not None and moniker.value:
            raise ConfigurationError(
                f"{moniker.where}: a moniker is announced in the node info, which needs --network NAME too "
                "(the network this node is on; peers on another one are refused)"
            )
        return None
    try:
        return NodeInfo(network=network.value, moniker=moniker.value if moniker is not None else "")
    except ValueError as e:  # it names the field and the value
        where = moniker.where if moniker is not None and "moniker" in str(e) else network.where
        raise ConfigurationError(f"{where}: {e}") from None


def _reactor_options(given: dict, reactors: tuple[Setting, ...]) -> dict[str, dict[str, Setting]]:
    """The reactor options, each for a ``--reactor`` of that CLASS (checked against the
    constructor when the reactor is built: mconn/ops/node.py)."""
    setting = given.get(REACTOR_OPTIONS)
    if setting is None:
        return {}
    tables = cast(dict[str, dict[str, Setting]], setting.value)
    classes = [text_of(r).partition(":")[2] for r in reactors]
    for name, options in tables.items():
        if name not in classes:
            where = next(iter(options.values())).where if options else setting.where
            known = ", ".join(classes) or "none"
            raise ConfigurationError(f"{where}: no --reactor is a {name} (the reactors: {known})")
    return tables


def _pex_settings(given: dict) -> PexSettings:
    """The PEX options, checked: the seed flag a bool, each private peer id a node id."""
    seed = given.get("seed_mode")
    if seed is not None:
        _flag(given, "seed_mode")
    private = given.get("private_peer_ids")
    for name in WORD_SETS:
        setting = given.get(name)
        if setting is None:
            continue
        for word in sorted(setting.value):
            if not (len(word) == 40 and all(c in "0123456789abcdef" for c in word)):
                raise ConfigurationError(f"{setting.where}: {word!r} is not a node id (40 lowercase hex digits)")
    return PexSettings(addrbook_file=given.get("addrbook_file"), seed_mode=seed, private_peer_ids=private)


def _flag(given: dict, name: str) -> bool:
    setting = given.get(name)
    if setting is None:
        return False
    if not isinstance(setting.value, bool):
        raise ConfigurationError(f"{setting.where}: {setting.value!r} must be true or false")
    return setting.value


def _tls_settings(given: dict, *, listening: bool) -> TLSSettings | None:
    """The TLS mode the flags and files ask for, once they agree with each other."""
    for name in FLAGS:
        setting = given.get(name)
        if setting is not None and not isinstance(setting.value, bool):
            raise ConfigurationError(f"{setting.where}: {setting.value!r} must be true or false")
    identity, ca, cert, anonymous = (given.get(n) for n in ("tls", "tls_ca", "tls_cert", "tls_no_client_cert"))
    identity = identity if identity is not None and identity.value else None
    anonymous = anonymous if anonymous is not None and anonymous.value else None
    upgrade, accept = (given.get(n) for n in ("tls_upgrade", "tls_accept_upgrade"))
    dial_upgrade = upgrade is not None and upgrade.value
    tls_required = not (accept is not None and accept.value)
    if identity is None and ca is None:
        for setting, what in ((upgrade, "--tls-upgrade"), (accept, "--tls-accept-upgrade")):
            if setting is not None and setting.value:
                raise ConfigurationError(f"{setting.where}: {what} is for TLS: give --tls or --tls-ca FILE too")
    if identity is not None and ca is not None:
        raise ConfigurationError(
            f"{identity.where}: identity mode (--tls) and CA mode (--tls-ca) exclude each other; choose one"
        )
    if ca is None:
        for setting, what in ((cert, "a node certificate"), (anonymous, "accepting dialers without a certificate")):
            if setting is not None:
                raise ConfigurationError(f"{setting.where}: {what} is for CA mode: give --tls-ca FILE too")
        if identity is None:
            return None
        return TLSSettings("identity", identity.where, upgrade=dial_upgrade, tls_required=tls_required)
    if cert is None and listening:
        raise ConfigurationError(
            f"{ca.where}: a node that listens needs a certificate to present: give --tls-cert FILE "
            "(a certificate for the --key file, signed by the CA)"
        )
    return TLSSettings(
        "ca",
        ca.where,
        ca=ca,
        cert=cert,
        require_client_cert=anonymous is None,
        upgrade=dial_upgrade,
        tls_required=tls_required,
    )


def _count(given: dict, name: str, default: int) -> int:
    """A number of bytes or files, 0 or more."""
    setting = given.get(name, Setting(default, "default"))
    if isinstance(setting.value, bool) or not isinstance(setting.value, int) or setting.value < 0:
        what = "files" if name.endswith("_files") else "seconds" if name.endswith("_seconds") else "bytes"
        raise ConfigurationError(f"{setting.where}: {setting.value!r} must be a number of {what} >= 0")
    return setting.value


def _each(given: dict, name: str) -> tuple[Setting, ...]:
    setting = given.get(name)
    return tuple(Setting(v, setting.where) for v in setting.value) if setting is not None else ()


def _peer(text: str, where: str) -> PeerAddress:
    try:
        address = parse_address(text)
    except ValueError as e:
        raise ConfigurationError(f"{where}: {e}") from None
    if address.node_id is None:
        raise ConfigurationError(f"{where}: peer address {text!r} needs the node id: ID@HOST:PORT")
    return address


def _reactor_spec(text: str, where: str) -> str:
    module, colon, name = text.partition(":")
    if not colon or not all(p.isidentifier() for p in module.split(".")) or not name.isidentifier():
        raise ConfigurationError(f"{where}: {text!r} is not MODULE:CLASS, like reactors.pex:PexReactor")
    return text
