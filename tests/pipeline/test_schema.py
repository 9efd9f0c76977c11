"""The pipeline's schema against specs/telemetry.md, and the packaging boundary.

``mconn.pipeline.schema`` declares every event's fields for Spark; the spec's field
tables are parsed here (with the parser tests/adapter/test_telemetry.py checks the code
against) so that the pipeline reads exactly what mconn writes. The core library must
never import Spark: the pipeline is an extra (``mconn[pipeline]``).
"""

import subprocess
import sys

from adapter.test_telemetry import SPEC_EVENTS
from mconn.pipeline import schema


def test_every_event_of_the_spec_with_its_fields_and_types():
    """The pipeline schema has every event of specs/telemetry.md, with its fields and their types."""
    assert schema.EVENTS == {name: spec["fields"] for name, spec in SPEC_EVENTS.items()}


def test_the_events_above_info_level():
    """The schema's warnings are exactly the spec's events above info level, with their levels."""
    assert schema.WARNINGS == {name: spec["level"] for name, spec in SPEC_EVENTS.items() if spec["level"] != "info"}


def test_every_list_of_objects_with_its_item_fields():
    """Every list-of-objects field in the spec has its item fields in the schema."""
    items = {(name, field): children for name, spec in SPEC_EVENTS.items() for field, children in spec["items"].items()}
    assert schema.ITEMS == items


def test_every_list_field_has_a_column_in_the_events_table():
    """Every list field has its own column in the events table, clashing with no other column or scalar field."""
    lists = {(e, f) for e, fields in schema.EVENTS.items() for f, t in fields.items() if t.startswith("list of")}
    assert set(schema.LIST_COLUMNS) == lists
    assert len(set(schema.LIST_COLUMNS.values())) == len(lists)
    assert not set(schema.LIST_COLUMNS.values()) & set(schema.scalar_fields())


def test_a_field_name_has_one_type_across_events():
    """A field name has one type in every event that has it."""
    schema.scalar_fields()  # raises if two events disagree


def test_the_core_library_never_imports_spark():
    """Every module of mconn but mconn.pipeline imports without pyspark, py4j or matplotlib."""
    program = (
        "import importlib, pkgutil, sys, mconn\n"
        "for m in pkgutil.walk_packages(mconn.__path__, 'mconn.'):\n"
        "    if not m.name.startswith('mconn.pipeline'):\n"
        "        importlib.import_module(m.name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j', 'matplotlib')))"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
