"""No import cycles in mconn/ and reactors/: every module can be imported first.

The graph is read from the source with ``ast``, not by importing: every ``import`` and
``from ... import`` counts, at module level, inside functions and under
``if TYPE_CHECKING:`` alike (a lazy import that closes a circle still ties the two
modules into one). Relative imports are resolved, and ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module, else to ``pkg``. An import by a string
(``importlib.import_module``, mconn/__init__.py's lazy names) is not an edge.

The strongly connected components of the graph (Tarjan) hold the cycles; for each import
inside a component the failure names the shortest cycle through it.
"""

from __future__ import annotations

import ast
import collections
import itertools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("mconn", "reactors")


# -- the graph ---------------------------------------------------------------------------


def module_files(root: pathlib.Path, packages) -> dict[str, pathlib.Path]:
    """Every module under ``packages`` (directories of ``root``): dotted name -> file."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: pathlib.Path, modules) -> dict[str, int]:
    """The modules of ``modules`` that module ``name`` imports, each with its first line."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [_known(alias.name, modules) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            targets = [_known(f"{base}.{alias.name}", modules) for alias in node.names]
        else:
            continue
        for target in targets:
            if target is not None and target != name:
                found[target] = min(found.get(target, node.lineno), node.lineno)
    return found


def _absolute(module: str | None, level: int, package: str) -> str:
    if level == 0:
        return module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - (level - 1)])
    return f"{base}.{module}" if module else base


def _known(dotted: str, modules) -> str | None:
    """The longest prefix of ``dotted`` that is one of ``modules`` (None: not ours):
    ``pkg.sub`` for ``from pkg import sub`` if it is a module, else ``pkg``."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph(root: pathlib.Path, packages) -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    """(module -> the modules it imports; (module, target) -> "file:line" of the import)."""
    modules = module_files(root, packages)
    graph, where = {}, {}
    for name, path in modules.items():
        found = imports_of(name, path, modules)
        graph[name] = set(found)
        for target, line in found.items():
            where[(name, target)] = f"{path.relative_to(root)}:{line}"
    return graph, where


# -- cycles ------------------------------------------------------------------------------


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is not None:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                elif successor in on_stack:
                    low[node] = min(low[node], index[successor])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """For every edge inside a strongly connected component, the shortest cycle through it,
    each cycle once, as ``[a, b, ..., a]`` starting from its smallest module."""
    found = set()
    for component in strongly_connected(graph):
        members = set(component)
        for node in component:
            for successor in sorted(graph.get(node, ())):
                if successor in members:
                    path = _shortest_path(graph, successor, node, members)
                    found.add(_rotated([node, *path]))
    return [[*cycle, cycle[0]] for cycle in sorted(found)]


def _shortest_path(graph, start: str, goal: str, members: set[str]) -> list[str]:
    """The shortest path from ``start`` to ``goal`` within ``members`` (both ends included)."""
    previous = {start: None}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for successor in sorted(graph.get(node, ())):
            if successor in members and successor not in previous:
                previous[successor] = node
                queue.append(successor)
    path = [goal]
    while previous[path[-1]] is not None:
        path.append(previous[path[-1]])
    return path[::-1]


def _rotated(path: list[str]) -> tuple[str, ...]:
    """A cycle (``path`` ends where it starts, or is one node) from its smallest node."""
    ring = path[:-1] if len(path) > 1 else path
    first = ring.index(min(ring))
    return tuple(ring[first:] + ring[:first])


def describe(cycle: list[str], where: dict[tuple[str, str], str]) -> str:
    lines = " -> ".join(cycle)
    sites = ", ".join(where.get(edge, "?") for edge in itertools.pairwise(cycle))
    return f"{lines}  ({sites})"


# -- the tests ---------------------------------------------------------------------------


def test_no_import_cycles():
    """No module of mconn/ or reactors/ imports, however lazily, a module that imports it back."""
    graph, where = import_graph(ROOT, PACKAGES)
    assert "mconn.switch.switch" in graph and "reactors.pex" in graph  # the walk found the tree
    found = cycles(graph)
    assert not found, f"{len(found)} import cycle(s):\n" + "\n".join(describe(c, where) for c in found)


def test_the_cycle_finder_names_every_cycle_of_a_made_up_graph():
    """Two circles sharing a node, a self-import, and a bystander that only reaches them."""
    graph = {
        "a": {"b"},
        "b": {"c", "d"},
        "c": {"a"},
        "d": {"b"},
        "e": {"a"},  # reaches a circle, is in none
        "f": {"f"},
        "g": set(),
    }
    assert sorted(strongly_connected(graph)) == [["a", "b", "c", "d"], ["e"], ["f"], ["g"]]
    assert cycles(graph) == [["a", "b", "c", "a"], ["b", "d", "b"], ["f", "f"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []


def test_the_graph_sees_lazy_relative_and_type_checking_imports(tmp_path):
    """A circle closed by a function-level ``from pkg.sub import c``, a relative
    ``from . import b`` and a ``..a`` import under TYPE_CHECKING is found; a string is not."""
    files = {
        "pkg/__init__.py": "import importlib\nLAZY = importlib.import_module('pkg.a')\n",
        "pkg/a.py": "from . import b\nfrom os import path\n",
        "pkg/b.py": "def later():\n    from pkg.sub import c\n    return c\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import b as _\n",
        "pkg/d.py": "import pkg.sub.c\nfrom pkg import nothing_here\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph, where = import_graph(tmp_path, ["pkg"])
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.a"},
        "pkg.d": {"pkg", "pkg.sub.c"},
    }
    [cycle] = cycles(graph)
    assert describe(cycle, where) == "pkg.a -> pkg.b -> pkg.sub.c -> pkg.a  (pkg/a.py:1, pkg/b.py:2, pkg/sub/c.py:3)"


# -- the layers ------------------------------------------------------------------------

#: The layers of mconn, bottom up: a module imports its own layer or one below it. errors
#: and config sit below every layer; testing (fakes for reactor authors) may use every
#: layer but ops; the package itself (mconn/__init__.py, the public API) and its lazy
#: names stand above them all.
LAYERS = {
    "mconn.errors": 0,
    "mconn.config": 0,
    "mconn.core": 1,
    "mconn.net": 2,
    "mconn.switch": 3,
    "mconn.testing": 3.5,
    "mconn.ops": 4,
    "mconn": 5,
}

#: What reactors/ may import of mconn: the public API, the test doubles, and the core
#: modules reactor authors use (addresses and their scopes, the go-wire primitives, the
#: node id's size, the token bucket, address groups, a private file written atomically).
REACTOR_IMPORTS = {
    "mconn",
    "mconn.errors",
    "mconn.config",
    "mconn.testing",
    "mconn.core.address",
    "mconn.core.wire_primitives",
    "mconn.core.node_key",
    "mconn.core.rate",
    "mconn.core.admission",
    "mconn.core.private_file",
}


def layer_of(module: str):
    """The layer of an mconn module: its longest prefix in LAYERS (None for the pipeline)."""
    if module.startswith("mconn.pipeline"):
        return None
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise AssertionError(f"{module} is in no layer")


def test_every_import_goes_down_the_layers():
    """errors/config < core < net < switch < ops: no module of mconn imports one of a
    layer above its own, however lazily; the pipeline imports nothing of mconn outside
    itself."""
    graph, where = import_graph(ROOT, ("mconn",))
    assert {"mconn.core.wire", "mconn.net.protocol", "mconn.switch.switch", "mconn.ops.node"} <= set(graph)
    upward = []
    for module, targets in graph.items():
        for target in targets:
            if module.startswith("mconn.pipeline") or target.startswith("mconn.pipeline"):
                if module.startswith("mconn.pipeline") != target.startswith("mconn.pipeline"):
                    upward.append(f"{module} -> {target} ({where[(module, target)]}): the pipeline stands alone")
                continue
            if layer_of(target) > layer_of(module):
                upward.append(f"{module} -> {target} ({where[(module, target)]})")
    assert not upward, f"{len(upward)} import(s) up the layers:\n" + "\n".join(sorted(upward))


def test_reactors_use_only_the_public_api_and_the_declared_core_modules():
    """reactors/ are what node authors copy: they import mconn's public names, its test
    doubles and a short list of core modules, never its internals."""
    graph, where = import_graph(ROOT, ("mconn", "reactors"))
    internal = [
        f"{module} -> {target} ({where[(module, target)]})"
        for module, targets in graph.items()
        if module.startswith("reactors")
        for target in targets
        if target.startswith("mconn") and target not in REACTOR_IMPORTS
    ]
    assert not internal, "reactors/ reach into mconn's internals:\n" + "\n".join(sorted(internal))
