"""specs/security.md is kept true by its table: every limit in it, every default it states
and every test it names are checked against the code.

* every ``Config`` field is either a row's bound (section 1) or listed as a setting that
  bounds nothing a stranger reaches (section 3), and a field named like a limit
  (``max_*``, ``*_bytes``, ``*_timeout``, ``*_rate``, ``*_prefix_*``...) must be a bound;
* every bound written as ``Config.name = value``, ``module.Class(param=value)`` or
  ``module.NAME = value`` states the code's default;
* every row names at least one test, and each ``tests/...py::name`` exists.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pathlib
import re

import pytest

from mconn.config import Config

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "security.md"
COLUMNS = ("resource", "bound", "unit", "counted per", "when full", "proven by")
LIMIT_NAME = re.compile(r"^max_|^recovery_|_backlog|_prefix_|_per_|_limit|_capacity|_grace$|_rate$|_timeout$|_linger$")
CONFIG_DEFAULT = re.compile(r"`Config\.(\w+) = ([^`]+)`")
PARAM_DEFAULT = re.compile(r"`([\w.]+)\.(\w+)\((\w+)=([^`]+)\)`")
CONSTANT = re.compile(r"`((?:mconn|reactors)\.[\w.]+\.[A-Z][A-Z0-9_]+) = ([^`]+)`")
TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def section(text: str, number: int) -> str:
    start = text.index(f"\n## {number}. ")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def rows() -> list[dict[str, str]]:
    lines = [line for line in section(SPEC.read_text(), 1).splitlines() if line.startswith("|")]
    header = [cell.strip().lower() for cell in lines[0].strip("|").split("|")]
    assert tuple(header) == COLUMNS, header
    assert set(lines[1].replace("|", "").strip()) <= set("-: "), lines[1]
    out = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == len(COLUMNS), f"{len(cells)} cells in {line!r}"
        out.append(dict(zip(COLUMNS, cells, strict=True)))
    return out


ROWS = rows()


def literal(text: str):
    """A default as the spec writes it: a Python literal, or ``frozenset()``."""
    return frozenset() if text == "frozenset()" else ast.literal_eval(text)


def resolve(path: str):
    """The object a dotted path names: the longest importable module, then attributes
    (``reactors.mempool.MempoolReactor.SEEN_CAPACITY``)."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise AssertionError(f"{path} names nothing importable")


def config_defaults() -> dict[str, object]:
    return {f.name: f.default for f in dataclasses.fields(Config)}


def test_the_table_has_a_row_for_every_resource_of_the_model():
    resources = " ".join(row["resource"].lower() for row in ROWS)
    for resource in (
        "connection slots",
        "pending handshakes",
        "pending websocket upgrades",
        "suspended sessions",
        "unacknowledged bytes",
        "reactor backlog",
        "seen sets",
        "pending requests",
        "cpu per byte received",
        "cpu per byte sent",
        "timers",
        "address-book entries",
        "dials",
        "disk (chat)",
        "disk (telemetry)",
        "file descriptors",
    ):
        assert resource in resources, f"no row for {resource!r}"


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row["resource"][:40])
def test_every_row_is_whole_and_names_a_test_that_exists(row):
    for column in COLUMNS:
        assert row[column] and row[column] != "-", f"{row['resource']!r} has no {column!r}"
    refs = TEST_REF.findall(row["proven by"])
    assert refs, f"{row['resource']!r} names no test"
    for path, name in refs:
        source = ROOT / path
        assert source.is_file(), f"{row['resource']!r} names {path}, which does not exist"
        assert re.search(rf"^(async )?def {name}\(", source.read_text(), re.M), f"{path} has no test {name}"


def test_every_config_field_is_a_bound_or_a_setting_that_bounds_nothing():
    table = " ".join(row["bound"] + " " + row["counted per"] for row in ROWS)
    in_table = set(re.findall(r"Config\.(\w+)", table))
    settings = set(re.findall(r"^- `Config\.(\w+)`", section(SPEC.read_text(), 3), re.M))
    fields = set(config_defaults())
    assert not (in_table & settings), f"both a bound and a setting: {sorted(in_table & settings)}"
    assert fields <= in_table | settings, f"Config fields the model forgets: {sorted(fields - in_table - settings)}"
    assert (in_table | settings) <= fields, f"not Config fields: {sorted((in_table | settings) - fields)}"
    limits = {name for name in fields if LIMIT_NAME.search(name)}
    assert not (limits & settings), f"limits listed as settings: {sorted(limits & settings)}"


def test_every_default_the_table_states_is_the_codes():
    defaults = config_defaults()
    stated = 0
    for row in ROWS:
        for name, value in CONFIG_DEFAULT.findall(row["bound"]):
            assert literal(value) == defaults[name], f"Config.{name}: spec {value}, code {defaults[name]!r}"
            stated += 1
        for module, owner, param, value in PARAM_DEFAULT.findall(row["bound"]):
            default = inspect.signature(resolve(f"{module}.{owner}")).parameters[param].default
            assert literal(value) == default, f"{module}.{owner}({param}): spec {value}, code {default!r}"
            stated += 1
        for path, value in CONSTANT.findall(row["bound"]):
            actual = resolve(path)
            assert literal(value) == actual, f"{path}: spec {value}, code {actual!r}"
            stated += 1
    assert stated >= len(ROWS), f"only {stated} defaults stated for {len(ROWS)} rows"
