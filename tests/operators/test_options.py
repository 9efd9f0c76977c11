"""``twistd mconn`` options, TOML files and the checks that stop a bad configuration.

In-process: the Options class twistd builds, and makeService, the way twistd calls them.
Each bad setting must give SystemExit with one line that names the setting and the
problem, before anything is written or bound.
"""

import os
import re
import stat
import textwrap

import pytest

from mconn import Config, NodeKey
from mconn.core.address import PeerAddress
from mconn.ops.node import NodeService, Options, build_service, makeService

ID = "ab" * 20
#: The Config of a twistd node when nothing is set: Config's defaults (a --peer is a
#: persistent dial, retried until it answers without retry_initial_dial).
NODE_CONFIG = Config()


def parse(*args, create_key=True) -> Options:
    """Options parsed from ``args``; with ``--create-key`` unless told not to (a missing
    key file stops makeService otherwise: tests/operators/test_first_day.py)."""
    options = Options()
    options.parseOptions((["--create-key"] if create_key else []) + list(args))
    return options


def error_of(*args) -> str:
    """The one line a bad command line stops with (parsing, then makeService)."""
    with pytest.raises(SystemExit) as info:
        service = makeService(parse(*args))
        service.telemetry and service.telemetry.log_file.close()
    message = info.value.code
    assert isinstance(message, str) and message.startswith("mconn: "), message
    assert "\n" not in message, message
    return message


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Relative paths (the default node.key) land in the test's directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path, text: str):
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_defaults_no_listen_no_peers_node_key_in_the_current_directory(tmp_path):
    """By default a node listens nowhere, dials no one, has no telemetry and keeps node.key in the current
    directory."""
    settings = parse().settings
    assert settings.listen == settings.peers == settings.reactors == ()
    assert settings.key.value == str(tmp_path / "node.key")
    assert settings.telemetry is None
    assert settings.config == NODE_CONFIG
    assert parse("--no-retry-initial-dial").settings.config == Config()


def test_repeatable_options_and_config_fields_on_the_command_line(tmp_path):
    """--listen, --peer and --reactor repeat, paths resolve from the current directory, and Config fields are
    options."""
    settings = parse(
        "--listen",
        "tcp:0:interface=127.0.0.1",
        "--listen",
        "tcp:0:interface=::1",
        "--peer",
        f"{ID}@127.0.0.1:26656",
        "--reactor",
        "operators.sample_reactors:Chat",
        "--key",
        "k.pem",
        "--telemetry",
        "t.json",
        "--telemetry-rotate-bytes",
        "4096",
        "--ping-interval",
        "5",
        "--no-tcp-nodelay",
        "--max-reconnects",
        "3",
        "--send-rate",
        "none",
    ).settings
    assert [s.value for s in settings.listen] == ["tcp:0:interface=127.0.0.1", "tcp:0:interface=::1"]
    assert [s.value for s in settings.peers] == [PeerAddress(ID, "127.0.0.1", 26656)]
    assert [s.value for s in settings.reactors] == ["operators.sample_reactors:Chat"]
    assert settings.key.value == str(tmp_path / "k.pem")
    assert settings.telemetry.value == str(tmp_path / "t.json")
    assert settings.telemetry_rotate_bytes == 4096
    assert settings.config == NODE_CONFIG.replace(
        ping_interval=5.0, tcp_nodelay=False, max_reconnects=3, send_rate=None
    )


def test_every_config_field_is_an_option():
    """Every Config field has a command-line option of the same name (dashes for underscores); a
    boolean one is a pair of flags, --NAME and --no-NAME."""
    names = {long for long, *_ in Options.optParameters + Options.optFlags}
    for field, hint in Config.__annotations__.items():
        option = field.replace("_", "-")
        assert option in names, field
        assert (hint in (bool, "bool")) == (f"no-{option}" in names), field


def test_toml_file_sets_everything_and_the_command_line_wins(tmp_path):
    """A TOML file sets every setting, its paths relative to the file; a command-line option replaces the
    file's value."""
    (tmp_path / "conf").mkdir()
    config = write(
        tmp_path / "conf" / "node.toml",
        f"""\
        listen = ["tcp:0:interface=127.0.0.1", "tcp:0:interface=::1"]
        peer = "{ID}@127.0.0.1:26656"
        reactor = ["operators.sample_reactors:Chat"]
        key = "keys/node.key"
        telemetry = "telemetry.json"
        telemetry_rotate_bytes = 1000
        ping_interval = 20
        pong-timeout = 7.5
        tcp_notsent_lowat = "none"
        local_address = "127.0.0.1"
        session_store = "state/sessions.db"
        wss_ca_file = "ca.pem"
    """,
    )
    settings = parse("--config", config, "--listen", "tcp:0", "--ping-interval", "9").settings
    assert [s.value for s in settings.listen] == ["tcp:0"]  # replaced, not merged
    assert [s.value for s in settings.peers] == [PeerAddress(ID, "127.0.0.1", 26656)]
    assert settings.key.value == str(tmp_path / "conf" / "keys" / "node.key")  # relative to the file
    assert settings.telemetry.value == str(tmp_path / "conf" / "telemetry.json")
    assert settings.telemetry_rotate_bytes == 1000
    assert settings.config == NODE_CONFIG.replace(
        session_store=str(tmp_path / "conf" / "state" / "sessions.db"),  # Config's paths too
        wss_ca_file=str(tmp_path / "conf" / "ca.pem"),
        ping_interval=9.0,
        pong_timeout=7.5,
        tcp_notsent_lowat=None,
        local_address="127.0.0.1",
    )


def test_toml_integers_become_floats_for_float_fields(tmp_path):
    """A float field keeps its type in telemetry events (grace, delay...) whatever the file says."""
    config = parse("--config", write(tmp_path / "n.toml", "resume_grace = 30\n")).settings.config
    assert type(config.resume_grace) is float


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--bogus"], "mconn: option --bogus not recognized"),
        (["--listen"], "mconn: option --listen requires argument"),
        (["--peer", "127.0.0.1"], "mconn: --peer: peer address '127.0.0.1': missing ':<port>'"),
        (
            ["--peer", "127.0.0.1:26656"],
            "mconn: --peer: peer address '127.0.0.1:26656' needs the node id: ID@HOST:PORT",
        ),
        (["--peer", "xyz@h:1"], "mconn: --peer: peer address 'xyz@h:1': node id 'xyz' must be 40 hex characters"),
        (["--reactor", "reactors.demo"], "mconn: --reactor: 'reactors.demo' is not MODULE:CLASS"),
        (["--ping-interval", "soon"], "mconn: --ping-interval: 'soon' is not a number"),
        (
            ["--ping-interval", "-1"],
            "mconn: --ping-interval: Config.ping_interval must be a positive finite number, got -1.0",
        ),
        (["--max-inbound-peers", "2.5"], "mconn: --max-inbound-peers: '2.5' is not an integer"),
        (["--tcp-nodelay=false"], "mconn: option --tcp-nodelay must not have an argument"),
        (
            ["--tcp-nodelay", "false"],
            "mconn: --tcp-nodelay false: --tcp-nodelay is a flag and takes no value; give --tcp-nodelay or --no-tcp-nodelay",
        ),
        (["--listen", "tcp:0", "stray"], "mconn: unexpected argument 'stray': every setting is an option (--help)"),
        (["--tcp-nodelay", "--no-tcp-nodelay"], "mconn: --tcp-nodelay and --no-tcp-nodelay contradict each other"),
        (["--telemetry-rotate-bytes", "-5"], "mconn: --telemetry-rotate-bytes: -5 must be a number of bytes >= 0"),
        (["--config", "missing.toml"], "mconn: --config missing.toml: cannot read it: No such file or directory"),
    ],
)
def test_bad_command_lines_stop_with_one_line(args, expected):
    """Each bad command line stops with one line naming the option and what is wrong with its value."""
    assert error_of(*args).startswith(expected)


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "colour = 'blue'\n",
            "n.toml: colour: unknown setting; the valid keys are the long options of 'twistd mconn --help'",
        ),
        ("ping_intervall = 5\n", "n.toml: ping_intervall: unknown setting; did you mean ping_interval?"),
        (
            "ping-interval = 5\nping_interval = 6\n",
            "n.toml: ping_interval: set twice, as ping-interval and ping_interval",
        ),
        (
            "ping_interval = 'soon'\n",
            "n.toml: ping_interval: Config.ping_interval must be a positive finite number, got 'soon'",
        ),
        (
            "max_packet_payload = 0\n",
            "n.toml: max_packet_payload: Config.max_packet_payload must be an integer in 1024..1048576",
        ),
        ("listen = 5\n", "n.toml: listen: 5 must be a string or a list of strings"),
        ("key = 5\n", "n.toml: key: 5 must be a path"),
        ("peer = ['nowhere']\n", "n.toml: peer: peer address 'nowhere': missing ':<port>'"),
        ("ping_interval = \n", "--config n.toml: not valid TOML: Invalid value (at line 1, column 17)"),
    ],
)
def test_bad_toml_files_stop_with_one_line_naming_file_and_key(tmp_path, text, expected):
    """Each bad TOML file stops with one line naming the file, the key and what is wrong."""
    write(tmp_path / "n.toml", text)
    assert error_of("--config", "n.toml").startswith(f"mconn: {expected}")


def test_key_is_created_on_first_start_with_mode_0600_and_kept(tmp_path):
    """The node key is created with mode 0600 on the first start and reused, same node id, on the next."""
    service = makeService(parse("--key", "node.key"))
    assert isinstance(service, NodeService) and not service.running
    mode = stat.S_IMODE(os.stat(tmp_path / "node.key").st_mode)
    assert mode == 0o600
    again = makeService(parse("--key", "node.key"))
    assert again.switch.node_id == service.switch.node_id == NodeKey.load(tmp_path / "node.key").node_id


def bad_key(tmp_path, kind):
    path = tmp_path / "node.key"
    if kind == "loose":
        NodeKey.generate().save(path)
        path.chmod(0o644)
    elif kind == "garbage":
        path.write_text("not a key")
        path.chmod(0o600)
    else:
        path.mkdir()
    return str(path)


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("loose", "has mode 0644, which lets group or other read it; run: chmod 600"),
        ("garbage", "is not a PEM private key"),
        ("directory", "Is a directory"),
    ],
)
def test_a_bad_key_file_stops_startup(tmp_path, kind, expected):
    """A key file that others can read, that is not a PEM key, or that is a directory stops startup with one
    line naming it."""
    path = bad_key(tmp_path, kind)
    message = error_of("--key", path)
    assert message.startswith("mconn: --key: ") and repr(path) in message and expected in message


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--listen", "tcp:notaport"],
            "mconn: --listen: endpoint 'tcp:notaport' is not valid: invalid literal for int()",
        ),
        (
            ["--listen", "carrier-pigeon:1"],
            "mconn: --listen: endpoint 'carrier-pigeon:1' is not valid: Unknown endpoint type",
        ),
        (
            ["--reactor", "no_such_module:Chat"],
            "mconn: --reactor: cannot import no_such_module: No module named 'no_such_module'",
        ),
        (
            ["--reactor", "operators.sample_reactors:Nope"],
            "mconn: --reactor: module operators.sample_reactors has no Nope",
        ),
        (
            ["--reactor", "operators.sample_reactors:NotAReactor"],
            "mconn: --reactor: operators.sample_reactors:NotAReactor() is a NotAReactor, not an mconn Reactor",
        ),
        (
            ["--reactor", "operators.sample_reactors:Broken"],
            "mconn: --reactor: operators.sample_reactors:Broken() failed: RuntimeError: cannot start without a database",
        ),
        (
            ["--reactor", "operators.sample_reactors:Chat", "--reactor", "operators.sample_reactors:Chat"],
            "mconn: --reactor: channel 0x10 is claimed by both Chat and Chat",
        ),
        (["--telemetry", "no/such/dir/t.json"], "mconn: --telemetry: cannot write"),
    ],
)
def test_bad_endpoints_reactors_and_files_stop_startup_and_write_no_key(tmp_path, args, expected):
    """makeService checks them; the missing key is not written when anything else fails."""
    assert error_of("--key", "node.key", *args).startswith(expected)
    assert not (tmp_path / "node.key").exists()


def test_build_service_raises_usage_errors_for_callers_other_than_twistd():
    """build_service raises ConfigurationError for a bad endpoint, for callers other than twistd."""
    from mconn.ops.node import ConfigurationError

    with pytest.raises(ConfigurationError, match="^--listen: endpoint 'tcp:x' is not valid"):
        build_service(parse("--listen", "tcp:x").settings)


def test_the_service_holds_telemetry_then_switch(tmp_path):
    """The node service holds the telemetry file first, then the Switch with the configured reactor's
    channels."""
    service = makeService(parse("--telemetry", "t.json", "--reactor", "operators.sample_reactors:Chat"))
    try:
        assert list(service) == [service.telemetry, service.switch]
        assert service.telemetry.node_id == service.switch.node_id
        assert [d.id for d in service.switch.channels] == [0x10]
    finally:
        service.telemetry.log_file.close()


# -- --status and TLS ----------------------------------------------------------------------


def test_status_endpoint_listens_on_loopback_unless_an_interface_is_named(tmp_path):
    """The status endpoint listens on 127.0.0.1 unless an interface is named, on the command line or in a
    file."""
    assert parse().settings.status is None
    assert parse("--status", "tcp:8080").settings.status.value == "tcp:8080:interface=127.0.0.1"
    assert parse("--status", "tcp:8080:interface=0.0.0.0").settings.status.value == "tcp:8080:interface=0.0.0.0"
    write(tmp_path / "n.toml", "status = 'tcp:9090'\n")
    assert parse("--config", "n.toml").settings.status.value == "tcp:9090:interface=127.0.0.1"


def test_the_service_holds_telemetry_switch_then_status_page(tmp_path):
    """With --status the node service holds telemetry, Switch, then the status page on the loopback."""
    service = makeService(parse("--telemetry", "t.json", "--status", "tcp:0"))
    try:
        assert list(service) == [service.telemetry, service.switch, service.status]
        assert service.status.endpoint == "tcp:0:interface=127.0.0.1" and service.status.switch is service.switch
    finally:
        service.telemetry.log_file.close()


def test_tls_identity_mode_is_wired_into_the_switch(tmp_path):
    """--tls (or tls = true in a file) gives the Switch identity-mode TLS with the node's key; without it, no
    TLS."""
    assert makeService(parse()).switch.tls is None
    service = makeService(parse("--tls"))
    assert service.switch.tls.mode == "identity"
    assert service.switch.tls.node_key.node_id == service.switch.node_id
    write(tmp_path / "n.toml", "tls = true\n")
    assert makeService(parse("--config", "n.toml")).switch.tls.mode == "identity"


def test_tls_upgrade_flags_are_wired_into_the_switch(tmp_path):
    """--tls-upgrade and --tls-accept-upgrade set the Switch's upgrade and tls_required, from the command line
    or a file."""
    default = makeService(parse("--tls")).switch.tls
    assert (default.upgrade, default.tls_required) == (False, True)
    both = makeService(parse("--tls", "--tls-upgrade", "--tls-accept-upgrade")).switch.tls
    assert (both.upgrade, both.tls_required) == (True, False)
    write(tmp_path / "n.toml", "tls = true\ntls_upgrade = true\n")
    from_file = makeService(parse("--config", "n.toml")).switch.tls
    assert (from_file.upgrade, from_file.tls_required) == (True, True)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--tls-upgrade"], "mconn: --tls-upgrade: --tls-upgrade is for TLS: give --tls or --tls-ca FILE too"),
        (
            ["--tls-accept-upgrade"],
            "mconn: --tls-accept-upgrade: --tls-accept-upgrade is for TLS: give --tls or --tls-ca FILE too",
        ),
    ],
)
def test_upgrade_flags_without_tls_stop_with_one_line(args, expected):
    """The upgrade flags without --tls or --tls-ca stop with one line saying TLS is needed."""
    assert error_of(*args) == expected


@pytest.fixture
def pki(tmp_path):
    """A CA, and node.key with a certificate for it: {name: path}."""
    from integration.test_tls import CA
    from cryptography.hazmat.primitives import serialization

    ca = CA()
    key = NodeKey.generate()
    key.save(tmp_path / "node.key")
    pem = serialization.Encoding.PEM

    def cert(name, node_key=key, **kwargs):
        path = tmp_path / name
        path.write_bytes(ca.issue(node_key, **kwargs).public_bytes(pem))
        return str(path)

    import datetime

    now, day = datetime.datetime.now(datetime.UTC), datetime.timedelta(days=1)
    return {
        "ca": str(ca.write(tmp_path / "ca.pem")),
        "cert": cert("node.pem"),
        "other": cert("other.pem", NodeKey.generate()),
        "expired": cert("expired.pem", not_before=now - 30 * day, not_after=now - day),
        "future": cert("future.pem", not_before=now + day, not_after=now + 30 * day),
        "key": str(tmp_path / "node.key"),
        "node_id": key.node_id,
    }


def test_tls_ca_mode_is_wired_into_the_switch(pki):
    """--tls-ca with --tls-cert gives the Switch CA-mode TLS; --tls-no-client-cert admits dialers without one;
    without a cert it only dials."""
    service = makeService(
        parse("--key", pki["key"], "--tls-ca", pki["ca"], "--tls-cert", pki["cert"], "--listen", "tcp:0")
    )
    tls = service.switch.tls
    assert tls.mode == "ca" and not tls.anonymous_clients and tls.node_key.node_id == pki["node_id"]
    relaxed = makeService(
        parse("--key", pki["key"], "--tls-ca", pki["ca"], "--tls-cert", pki["cert"], "--tls-no-client-cert")
    ).switch.tls
    assert relaxed.anonymous_clients
    dial_only = makeService(parse("--key", pki["key"], "--tls-ca", pki["ca"])).switch.tls
    assert dial_only.mode == "ca" and dial_only.certificate is None


def test_tls_settings_from_toml_relative_to_the_file(pki, tmp_path):
    """TLS settings in a TOML file resolve their paths relative to the file and reach the Switch."""
    write(
        tmp_path / "n.toml", "key = 'node.key'\ntls_ca = 'ca.pem'\ntls_cert = 'node.pem'\ntls_no_client_cert = true\n"
    )
    settings = parse("--config", "n.toml").settings
    assert settings.tls.ca.value == pki["ca"] and settings.tls.cert.value == pki["cert"]
    assert not settings.tls.require_client_cert
    assert makeService(parse("--config", "n.toml")).switch.tls.anonymous_clients


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--tls", "--tls-ca", "ca.pem"],
            "mconn: --tls: identity mode (--tls) and CA mode (--tls-ca) exclude each other; choose one",
        ),
        (["--tls-cert", "node.pem"], "mconn: --tls-cert: a node certificate is for CA mode: give --tls-ca FILE too"),
        (
            ["--tls", "--tls-no-client-cert"],
            "mconn: --tls-no-client-cert: accepting dialers without a certificate is for CA mode: give --tls-ca FILE too",
        ),
        (
            ["--tls-ca", "ca.pem", "--listen", "tcp:0"],
            "mconn: --tls-ca: a node that listens needs a certificate to present: give --tls-cert FILE",
        ),
        (["--status", " "], "mconn: --status: ' ' must be an endpoint, like tcp:8080"),
        (
            ["--status", "tcp:web"],
            "mconn: --status: endpoint 'tcp:web:interface=127.0.0.1' is not valid: invalid literal for int()",
        ),
    ],
)
def test_bad_tls_and_status_options_stop_with_one_line(args, expected):
    """Conflicting or incomplete TLS options and a bad status endpoint stop with one line saying which and
    why."""
    assert error_of(*args).startswith(expected)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("tls = 'yes please'\n", "n.toml: tls: 'yes please' must be true or false"),
        ("status = 8080\n", "n.toml: status: 8080 must be an endpoint, like tcp:8080"),
        (
            "tls = true\ntls_ca = 'ca.pem'\n",
            "n.toml: tls: identity mode (--tls) and CA mode (--tls-ca) exclude each other",
        ),
    ],
)
def test_bad_tls_and_status_settings_in_toml(tmp_path, text, expected):
    """Bad TLS and status settings in a TOML file stop with one line naming the file, the key and why."""
    write(tmp_path / "n.toml", text)
    assert error_of("--config", "n.toml").startswith(f"mconn: {expected}")


def test_bad_tls_files_stop_startup_with_one_line(pki, tmp_path):
    """Missing, mismatched, expired, not-yet-valid and non-PEM TLS files each stop startup with one line
    naming the file."""
    ca_args = ("--key", pki["key"], "--tls-ca", pki["ca"], "--tls-cert")
    assert error_of("--key", pki["key"], "--tls-ca", "missing.pem") == (
        f"mconn: --tls-ca: cannot read {tmp_path / 'missing.pem'}: No such file or directory"
    )
    assert error_of(*ca_args, "missing.pem") == (
        f"mconn: --tls-cert: cannot read {tmp_path / 'missing.pem'}: No such file or directory"
    )
    message = error_of(*ca_args, pki["other"])
    assert message.startswith(f"mconn: --tls-cert: certificate {pki['other']!r} holds the key of node ")
    assert message.endswith(f"but key file {pki['key']!r} is node {pki['node_id']}")
    assert error_of(*ca_args, pki["expired"]).startswith(
        f"mconn: --tls-cert: certificate {pki['expired']} expired on "
    ) and error_of(*ca_args, pki["expired"]).endswith(" UTC; renew it")
    assert error_of(*ca_args, pki["future"]).startswith(
        f"mconn: --tls-cert: certificate {pki['future']} is not valid before "
    )
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    assert error_of(*ca_args, str(garbage)).startswith(f"mconn: --tls-cert: certificate {str(garbage)!r} is not PEM")
    assert error_of("--key", pki["key"], "--tls-ca", str(garbage), "--tls-cert", pki["cert"]).startswith(
        f"mconn: --tls-ca: CA bundle {str(garbage)!r} is not PEM"
    )


def test_ca_mode_with_a_missing_key_file_stops_and_writes_no_key(pki, tmp_path):
    """In CA mode a missing key file stops startup, saying it must be the certificate's key, and no new key is
    written."""
    message = error_of("--key", "new.key", "--tls-ca", pki["ca"], "--tls-cert", pki["cert"])
    assert message == (
        f"mconn: --key: {tmp_path / 'new.key'} does not exist; in CA mode it must be the key that "
        f"--tls-cert {pki['cert']} holds"
    )
    assert not (tmp_path / "new.key").exists()


def test_pex_settings_from_the_command_line_and_toml_reach_the_pex_reactor(tmp_path):
    """--addrbook-file, --seed-mode and --private-peer-ids (and their TOML keys, the file's
    path relative to the file) are given to the PEX reactor; without one they are refused."""
    other = "cd" * 20
    service = makeService(
        parse(
            "--reactor",
            "reactors.pex:PexReactor",
            "--addrbook-file",
            "book.json",
            "--seed-mode",
            "--private-peer-ids",
            f"{ID}, {other}",
        )
    )
    pex = service.switch.reactor("PexReactor")
    assert pex.addrbook_file == str(tmp_path / "book.json")
    assert pex.seed_mode is True and pex.private_peer_ids == {ID, other}
    (tmp_path / "conf").mkdir()
    config = write(
        tmp_path / "conf" / "node.toml",
        f"""\
        reactor = "reactors.pex:PexReactor"
        addrbook_file = "data/addrbook.json"
        seed-mode = true
        private_peer_ids = ["{other}"]
    """,
    )
    pex = makeService(parse("--config", config)).switch.reactor("PexReactor")
    assert pex.addrbook_file == str(tmp_path / "conf" / "data" / "addrbook.json")
    assert pex.seed_mode is True and pex.private_peer_ids == {other}
    assert makeService(parse("--reactor", "reactors.pex:PexReactor")).switch.reactor("PexReactor").seed_mode is False


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--seed-mode"], "mconn: --seed-mode: is for a PEX reactor, and no --reactor takes it"),
        (["--addrbook-file", "b.json"], "mconn: --addrbook-file: is for a PEX reactor"),
        (
            ["--reactor", "reactors.pex:PexReactor", "--private-peer-ids", "validator"],
            "mconn: --private-peer-ids: 'validator' is not a node id (40 lowercase hex digits)",
        ),
    ],
)
def test_bad_pex_settings_stop_with_one_line(args, expected):
    """A PEX option without a PEX reactor, or a private peer id that is not a node id, stops the node."""
    assert error_of(*args).startswith(expected)


# -- node info: --network and --moniker ------------------------------------------------------


def test_network_and_moniker_from_the_command_line_and_toml_reach_the_switch(tmp_path):
    """--network and --moniker (or network and moniker in a file) become the Switch's NodeInfo; without
    --network the node announces none and requires none."""
    assert makeService(parse()).switch.node_info is None
    info = makeService(parse("--network", "chain-a", "--moniker", "alice west")).switch.node_info
    assert (info.network, info.moniker) == ("chain-a", "alice west")
    assert makeService(parse("--network", "chain-a")).switch.node_info.moniker == ""
    write(tmp_path / "n.toml", "network = 'chain-b'\nmoniker = 'bob'\n")
    info = makeService(parse("--config", "n.toml", "--moniker", "carol")).switch.node_info
    assert (info.network, info.moniker) == ("chain-b", "carol")  # the command line wins


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--moniker", "alice"],
            "mconn: --moniker: a moniker is announced in the node info, which needs --network NAME too",
        ),
        (["--network", "a b"], "mconn: --network: NodeInfo.network must be printable ASCII without spaces, got 'a b'"),
        (["--network", "n" * 51], "mconn: --network: NodeInfo.network is 51 bytes; at most 50"),
        (["--network", "a", "--moniker", "x" * 65], "mconn: --moniker: NodeInfo.moniker is 65 bytes; at most 64"),
        (
            ["--network", "a", "--moniker", "bell\x07"],
            "mconn: --moniker: NodeInfo.moniker must be printable text, got 'bell\\x07'",
        ),
    ],
)
def test_a_bad_network_or_moniker_stops_with_one_line_naming_it(args, expected):
    """A moniker without a network, or a network or moniker over its limit or with characters NodeInfo does
    not allow, stops the node with one line naming the option and the value."""
    assert error_of(*args).startswith(expected)


def test_a_bad_moniker_in_toml_names_the_file_and_key(tmp_path):
    write(tmp_path / "n.toml", "network = 'a'\nmoniker = 5\n")
    assert error_of("--config", "n.toml") == "mconn: n.toml: moniker: 5 must be text"


# -- reactor options -----------------------------------------------------------------------

GREETER = "operators.option_reactors:Greeter"


def greeter_options(*args) -> dict:
    return makeService(parse("--reactor", GREETER, *args)).switch.reactor("Greeter").options


def test_reactor_options_are_keyword_arguments_typed_by_the_constructor(tmp_path):
    """--reactor-option CLASS.key=value is a keyword argument of that reactor; text becomes an int, float or
    bool where the parameter is annotated so (none: None where it may be None), else stays text."""
    assert greeter_options() == {"greeting": "hello", "repeat": 1, "loud": False, "ratio": None, "tags": ()}
    options = greeter_options(
        "--reactor-option",
        "Greeter.greeting=hi=there",
        "--reactor-option",
        "Greeter.repeat=3",
        "--reactor-option",
        "Greeter.loud=yes",
        "--reactor-option",
        "Greeter.ratio=0.25",
        "--reactor-option",
        "Greeter.tags=a,b",
    )
    assert options == {"greeting": "hi=there", "repeat": 3, "loud": True, "ratio": 0.25, "tags": "a,b"}
    assert greeter_options("--reactor-option", "Greeter.ratio=none")["ratio"] is None


def test_reactor_tables_in_toml_keep_their_types_and_the_command_line_replaces_one_key(tmp_path):
    """A [reactors.CLASS] table gives that reactor its keys with their TOML types; a --reactor-option of
    the same key replaces the file's value, the file's other keys stay."""
    write(
        tmp_path / "n.toml",
        f"""\
        reactor = "{GREETER}"
        [reactors.Greeter]
        greeting = "from the file"
        repeat = 2
        tags = ["x", "y"]
    """,
    )
    options = makeService(parse("--config", "n.toml", "--reactor-option", "Greeter.repeat=7")).switch.reactor("Greeter")
    assert options.options == {
        "greeting": "from the file",
        "repeat": 7,
        "loud": False,
        "ratio": None,
        "tags": ["x", "y"],
    }


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--reactor-option", "Greeter.colour=blue"],
            "mconn: --reactor-option Greeter.colour: Greeter takes no option 'colour' "
            "(its options: greeting, repeat, loud, ratio, tags)",
        ),
        (
            ["--reactor-option", "Greeter.repeat=many"],
            "mconn: --reactor-option Greeter.repeat: Greeter's repeat is int: 'many' is not one",
        ),
        (
            ["--reactor-option", "Greeter.loud=maybe"],
            "mconn: --reactor-option Greeter.loud: Greeter's loud is bool: 'maybe' is not one",
        ),
        (["--reactor-option", "Greeter"], "mconn: --reactor-option 'Greeter': must be NAME.key=value"),
        (["--reactor-option", "Greeter.repeat"], "mconn: --reactor-option 'Greeter.repeat': must be NAME.key=value"),
        (
            ["--reactor-option", "Chat.x=1"],
            "mconn: --reactor-option Chat.x: no --reactor is a Chat (the reactors: Greeter)",
        ),
    ],
)
def test_a_bad_reactor_option_stops_with_one_line_naming_reactor_and_key(args, expected):
    """An option the constructor does not take, a value that is not the parameter's type, a malformed
    option or one for a reactor that is not run stops the node, naming the reactor and the key."""
    assert error_of("--reactor", GREETER, *args).startswith(expected)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[reactors.Greeter]\ncolour = 'blue'\n", "n.toml: reactors.Greeter.colour: Greeter takes no option 'colour'"),
        ("reactors = 5\n", "n.toml: reactors: must hold one table per reactor: [reactors.NAME] key = value"),
        ("reactor_option = ['Greeter.repeat=2']\n", "n.toml: reactor_option: in a file, reactor options are a table"),
        ("[reactors.Nobody]\nx = 1\n", "n.toml: reactors.Nobody.x: no --reactor is a Nobody (the reactors: Greeter)"),
    ],
)
def test_bad_reactor_tables_in_toml_name_the_file_and_key(tmp_path, text, expected):
    write(tmp_path / "n.toml", text)
    assert error_of("--reactor", GREETER, "--config", "n.toml").startswith(f"mconn: {expected}")


# -- the first hour: help and twistd's own options ---------------------------------------------


def test_help_lists_the_node_options_first_then_the_config_fields_under_a_heading():
    """The node's own options come first, key and listen leading; the Config fields follow under the
    tuning heading, none of them before it and none of the node's after it."""
    text = Options().getUsage(width=100)
    head, heading, tuning = text.partition("Tuning: each field of mconn.Config")
    assert heading, text
    node = re.findall(r"^ {2}(?:-\w, | {4})--([\w-]+)", head, re.M)
    config = re.findall(r"^ {2}(?:-\w, | {4})--([\w-]+)", tuning, re.M)
    assert node[:8] == ["key", "create-key", "listen", "peer", "reactor", "reactor-option", "network", "moniker"]
    assert {"config", "status", "tls", "telemetry", "help"} <= set(node)
    fields = {name.replace("_", "-") for name in Config.__annotations__}
    assert not fields & set(node)
    assert {n.removeprefix("no-") for n in config} == fields


@pytest.mark.parametrize("option", ["--pidfile", "--logfile", "-n", "--nodaemon"])
def test_a_twistd_option_after_mconn_says_it_goes_before_mconn(option):
    """twistd's options given after ``mconn`` stop with one line saying whose option it is and where
    it goes."""
    args = [option, "x"] if option in ("--pidfile", "--logfile") else [option]
    assert error_of(*args) == (
        f"mconn: {option} is an option of twistd, not of mconn: give it before 'mconn', "
        f"as in 'twistd {option} ... mconn ...'"
    )
