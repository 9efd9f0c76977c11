"""The help of ``twistd mconn``'s Config options, built from mconn/config.py's comments.

Each Config field is an option (mconn/ops/node_settings.py); its help is the ``#:`` comment
above the field (what it means, its unit, why its default) followed by the default a
twistd node really uses. So a field added to Config gets its help with no change here,
and tests/operators/test_first_day.py compares the help with Config for every field.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

from mconn.config import Config

CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
#: Config defaults that differ for a node run by twistd, each with its reason in
#: ``_NODE_DEFAULT_REASONS``: none now (a ``--peer`` is a persistent dial, which is retried
#: until it answers whatever ``retry_initial_dial`` says).
NODE_CONFIG_DEFAULTS: dict[str, object] = {}


def config_field_docs() -> dict[str, str]:
    """{field: the ``#:`` comment above it in mconn/config.py, as one line}.

    The comment says what the field means, its unit and why its default; a field
    without one has no entry (tests/operators/test_first_day.py requires one for each).
    """
    docs: dict[str, str] = {}
    comment: list[str] = []
    try:
        source = inspect.getsource(Config)
    except (OSError, TypeError):  # installed without its .py files: help without comments
        return docs
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("#:"):
            comment.append(text[2:].strip())
            continue
        field = re.match(r"(\w+)\s*:", text)
        if field and field.group(1) in CONFIG_FIELDS and comment:
            docs[field.group(1)] = " ".join(comment)
        comment = []
    return docs


def describe_default(value) -> str:
    """A default as the help shows it: ``on``/``off``, ``none``, sizes also in KiB/MiB."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (frozenset, set, tuple, list)):
        return ", ".join(sorted(str(v) for v in value)) or "none"
    if isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        unit, amount = ("MiB", value >> 20) if value % (1 << 20) == 0 else ("KiB", value >> 10)
        return f"{value} ({amount} {unit})"
    return str(value)


#: Why a twistd node's default differs from Config's (NODE_CONFIG_DEFAULTS).
_NODE_DEFAULT_REASONS: dict[str, str] = {}


def config_option_help(name: str) -> str:
    """The help of the option of Config field ``name``: its comment, then the default a
    twistd node uses (and Config's, where they differ)."""
    field = CONFIG_FIELDS[name]
    doc = config_field_docs().get(name) or f"Config.{name} (undocumented)"
    if name in NODE_CONFIG_DEFAULTS:
        node, own = describe_default(NODE_CONFIG_DEFAULTS[name]), describe_default(field.default)
        default = f"[default: {node} for a twistd node ({_NODE_DEFAULT_REASONS[name]}); Config's is {own}]"
    else:
        default = f"[default: {describe_default(field.default)}]"
    if isinstance(field.default, (frozenset, tuple, list)):
        doc += " (on the command line: comma-separated)"
    return f"{doc} {default}"
