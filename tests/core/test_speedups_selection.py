"""mconn.core.speedups picks the compiled twin only when it is built, current and wanted."""

from __future__ import annotations

import types

import pytest

from mconn.core import speedups


@pytest.fixture
def extension(monkeypatch):
    """Make ``mconn.core._speedups`` import as the module this returns sets (None: absent)."""
    found: dict[str, object] = {}

    def import_module(name):
        assert name == "mconn.core._speedups"
        if found.get("module") is None:
            raise ImportError(f"No module named {name!r}")
        return found["module"]

    monkeypatch.setattr(speedups.importlib, "import_module", import_module)
    monkeypatch.delenv("MCONN_PURE", raising=False)
    return found


def test_a_current_extension_is_used(extension):
    extension["module"] = module = types.SimpleNamespace(INTERFACE=speedups.INTERFACE)
    assert speedups._load() == (module, "")


def test_mconn_pure_chooses_pure_python(extension, monkeypatch):
    extension["module"] = types.SimpleNamespace(INTERFACE=speedups.INTERFACE)
    monkeypatch.setenv("MCONN_PURE", "1")
    assert speedups._load() == (None, "MCONN_PURE=1")


def test_an_extension_not_built_leaves_pure_python(extension):
    assert speedups._load() == (None, "the extension is not built")


def test_a_stale_extension_is_not_used(extension):
    extension["module"] = types.SimpleNamespace(INTERFACE=speedups.INTERFACE - 1)
    module, why = speedups._load()
    assert module is None
    assert why == f"the extension is stale (interface {speedups.INTERFACE - 1}, expected {speedups.INTERFACE})"


def test_describe_names_the_implementation_and_why():
    if speedups.SPEEDUPS is None:
        assert speedups.describe() == f"pure Python ({speedups.WHY_PURE})"
    else:
        assert speedups.describe() == "accelerated"
