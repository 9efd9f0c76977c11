"""The values of a twistd node's settings: their names and kinds, the TOML file, the errors.

Which settings a node has besides the :class:`mconn.Config` fields (``REPEATABLE``,
``PATHS``, ``FLAGS``, ``COUNTS``, ``TEXTS``: ``NODE_SETTINGS``; reactor options are the
``[reactors.CLASS]`` tables, ``REACTOR_TABLE``), how a value given as text on the
command line becomes its setting's type (:func:`from_text`), and how the ``--config FILE``
TOML file is read into ``{name: Setting}`` (:func:`read_toml`): keys with ``_`` or ``-``,
both spellings of one key an error, an unknown key an error that names the closest valid
one, relative paths relative to the file (README, "Operate a node"). Every value is a
:class:`Setting` that says where it was set; a bad one is a :class:`ConfigurationError`
naming the option, or the file and key. mconn/ops/node_settings.py merges the file with the
command line and checks the result.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import types
import typing

from twisted.python import usage

from mconn.config import Config
from mconn.ops.node_help import CONFIG_FIELDS
from mconn.ops.telemetry_file import (
    DEFAULT_KEEP_BYTES,
    DEFAULT_KEEP_FILES,
    DEFAULT_ROTATE_BYTES,
    DEFAULT_ROTATE_SECONDS,
)

#: Settings that may be repeated; the rest take one value.
REPEATABLE = ("listen", "peer", "reactor")
PATHS = ("key", "telemetry", "tls_ca", "tls_cert", "addrbook_file")
#: :class:`mconn.Config` fields that name a file: in a TOML file, relative to it as well.
CONFIG_PATHS = ("session_store", "wss_ca_file")
#: Settings that are on when given (``--tls``), true or false in TOML.
FLAGS = ("create_key", "tls", "tls_no_client_cert", "tls_upgrade", "tls_accept_upgrade", "seed_mode")
#: Settings that are a set of words: comma-separated on the command line, a list or a
#: comma-separated string in TOML (CometBFT's ``private_peer_ids``).
WORD_SETS = ("private_peer_ids",)
#: Settings that are a number of bytes or files, 0 or more, and their defaults.
COUNTS = {
    "telemetry_rotate_bytes": DEFAULT_ROTATE_BYTES,
    "telemetry_rotate_seconds": DEFAULT_ROTATE_SECONDS,
    "telemetry_keep_files": DEFAULT_KEEP_FILES,
    "telemetry_keep_bytes": DEFAULT_KEEP_BYTES,
}
#: Settings that are one line of text: what the node announces in its node info
#: (mconn.core.node_info): its network (chain id) and its moniker, a name for people.
TEXTS = ("network", "moniker")
NODE_SETTINGS = REPEATABLE + PATHS + tuple(COUNTS) + ("status",) + TEXTS + FLAGS + WORD_SETS
#: The TOML table of reactor options (``[reactors.NAME]``) and the setting it becomes,
#: with the command line's ``--reactor-option NAME.key=value``: {NAME: {key: Setting}}.
REACTOR_TABLE = "reactors"
REACTOR_OPTIONS = "reactor_options"
CONFIG_TYPES = typing.get_type_hints(Config)
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


class ConfigurationError(usage.UsageError):
    """A setting is wrong; the message says which (option, or file and key) and why."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """A configured value and where it was set (``--listen``, ``node.toml: listen``)."""

    value: object
    where: str


def from_text(name: str, text: str, where: str):
    """A command-line value, converted to the type of its setting."""
    base, optional = _setting_type(name)
    if optional and text.lower() == "none":
        return None
    if base is bool:
        if text.lower() in TRUE_WORDS + FALSE_WORDS:
            return text.lower() in TRUE_WORDS
        raise ConfigurationError(f"{where}: {text!r} is not true or false")
    if base in (frozenset, tuple, list):
        return frozenset(item.strip() for item in text.split(",") if item.strip())
    if base in (int, float):
        try:
            return base(text)
        except ValueError:
            kind = "an integer" if base is int else "a number"
            raise ConfigurationError(f"{where}: {text!r} is not {kind}") from None
    return text


def _setting_type(name: str) -> tuple[type, bool]:
    """(base type, whether None is allowed) of a Config field or node setting."""
    if name in COUNTS:
        return int, False
    if name in FLAGS:
        return bool, False
    if name in WORD_SETS:
        return frozenset, False
    if name == "status" or name in TEXTS:
        return str, False
    hint = CONFIG_TYPES[name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], True
    return hint, False


def read_toml(path: str) -> dict[str, Setting]:
    """{setting: Setting} from a TOML file; unknown keys are errors."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigurationError(f"--config {path}: cannot read it: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigurationError(f"--config {path}: not valid TOML: {e}") from None
    base = os.path.dirname(os.path.abspath(path))
    given: dict[str, Setting] = {}
    for key, value in data.items():
        name = key.replace("-", "_")  # dashes as on the command line are accepted
        where = f"{path}: {key}"
        if name == REACTOR_TABLE:
            given[REACTOR_OPTIONS] = Setting(_reactor_tables(value, where), where)
            continue
        if name == "reactor_option":
            raise ConfigurationError(f"{where}: in a file, reactor options are a table: [reactors.NAME] key = value")
        if name not in NODE_SETTINGS and name not in CONFIG_FIELDS:
            raise ConfigurationError(f"{where}: unknown setting; {_closest(name)}")
        if name in given:
            raise ConfigurationError(f"{where}: set twice, as {given[name].where.split(': ', 1)[1]} and {key}")
        given[name] = Setting(_from_toml(name, value, where, base), where)
    return given


def _reactor_tables(value, where: str) -> dict[str, dict[str, Setting]]:
    """``[reactors.NAME]`` tables: {NAME: {key: Setting}}; the values keep their TOML types."""
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigurationError(f"{where}: must hold one table per reactor: [reactors.NAME] key = value")
    return {
        name: {key: Setting(v, f"{where}.{name}.{key}") for key, v in table.items()} for name, table in value.items()
    }


def parse_reactor_option(text: str, where: str) -> tuple[str, str, str]:
    """``NAME.key=value`` of ``--reactor-option``: (NAME, key, value text)."""
    target, equals, value = text.partition("=")
    name, dot, key = target.strip().partition(".")
    if not equals or not dot or not name.isidentifier() or not key.isidentifier():
        raise ConfigurationError(
            f"{where} {text!r}: must be NAME.key=value, NAME the CLASS of a --reactor MODULE:CLASS "
            "(like ChatReactor.name=alice)"
        )
    return name, key, value


def _closest(name: str) -> str:
    """What to say about an unknown key: the closest valid one, or where the list is."""
    valid = list(NODE_SETTINGS) + list(CONFIG_FIELDS) + [REACTOR_TABLE]
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]}?"
    return "the valid keys are the long options of 'twistd mconn --help' without the leading '--'"


def _from_toml(name: str, value, where: str, base: str):
    """A TOML value as its setting's type: paths made absolute, ints accepted as floats."""
    if name in REPEATABLE:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ConfigurationError(f"{where}: {value!r} must be a string or a list of strings")
        return items
    if name in WORD_SETS:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ConfigurationError(f"{where}: {value!r} must be a list of strings or a comma-separated string")
        return frozenset(i.strip() for i in items if i.strip())
    if name in PATHS or name in CONFIG_PATHS:
        if not isinstance(value, str):
            raise ConfigurationError(f"{where}: {value!r} must be a path (a string)")
        return os.path.join(base, os.path.expanduser(value))
    kind, optional = _setting_type(name)
    if optional and value == "none":
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # telemetry fields keep their documented type (specs/telemetry.md)
    return value
