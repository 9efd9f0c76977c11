"""Each layer package explains itself: its ``__init__.py`` is an index of its modules.

mconn/core, net, switch and ops each open with a docstring that says the package's job,
its rule, and its modules in reading order. The docstring is all the file holds (no
imports, no code: the public names are exported by mconn/__init__.py), it names every
module of the folder as ````name```` in double backticks, and it names no module the
folder does not have. A module added, renamed or removed without a line here fails.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYER_PACKAGES = ("core", "net", "switch", "ops")

#: A module's entry in the index: ``name`` at the start of a bullet (``* ``name``: ...``).
_ENTRY = re.compile(r"^\s*[*-]\s+``([A-Za-z_][A-Za-z0-9_]*)``", re.M)


def index_of(package: pathlib.Path) -> tuple[ast.Module, str | None]:
    tree = ast.parse((package / "__init__.py").read_text())
    return tree, ast.get_docstring(tree, clean=False)


def modules_of(package: pathlib.Path) -> set[str]:
    """The modules of the folder: its .py files but __init__, and its sub-packages."""
    files = {path.stem for path in package.glob("*.py") if path.stem != "__init__"}
    packages = {path.name for path in package.iterdir() if (path / "__init__.py").is_file()}
    return files | packages


@pytest.mark.parametrize("name", LAYER_PACKAGES)
def test_the_package_init_is_only_a_docstring(name):
    """``mconn/<package>/__init__.py`` holds one statement: its docstring."""
    tree, docstring = index_of(ROOT / "mconn" / name)
    assert docstring, f"mconn/{name}/__init__.py has no docstring"
    extra = [f"line {node.lineno}: {ast.unparse(node)[:60]}" for node in tree.body[1:]]
    assert not extra, f"mconn/{name}/__init__.py holds more than its docstring:\n" + "\n".join(extra)


@pytest.mark.parametrize("name", LAYER_PACKAGES)
def test_the_package_docstring_names_every_module_and_only_those(name):
    """Every module of the folder is an entry of the index (````name````), and every
    ````name```` entry is a module of the folder."""
    package = ROOT / "mconn" / name
    _, docstring = index_of(package)
    listed = _ENTRY.findall(docstring or "")
    modules = modules_of(package)
    assert len(modules) > 3, f"found no modules in mconn/{name}"
    missing = sorted(modules - set(listed))
    unknown = sorted(set(listed) - modules)
    twice = sorted({entry for entry in listed if listed.count(entry) > 1})
    assert not missing, f"mconn/{name}/__init__.py does not list: {', '.join(missing)}"
    assert not unknown, f"mconn/{name}/__init__.py lists modules that do not exist: {', '.join(unknown)}"
    assert not twice, f"mconn/{name}/__init__.py lists twice: {', '.join(twice)}"


def test_the_index_reader_sees_entries_and_not_names_in_prose(tmp_path):
    """An entry is ````name```` at the start of a bullet; ````Name```` in the text of an
    entry (a class it holds) is not one."""
    (tmp_path / "__init__.py").write_text('"""Job.\n\n* ``alpha``: holds ``Beta``;\n- ``gamma``: ``delta`` too.\n"""\n')
    (tmp_path / "alpha.py").write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    _, docstring = index_of(tmp_path)
    assert _ENTRY.findall(docstring) == ["alpha", "gamma"]
    assert modules_of(tmp_path) == {"alpha", "sub"}
