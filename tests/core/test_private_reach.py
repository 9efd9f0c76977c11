"""No module reaches an underscore member that another module owns, unless it is listed here.

One object calls another's underscore members only inside its own module (Python's
convention for a private member, which Twisted and magic-wormhole keep too); across
modules, and always across packages, a call goes through a public method or a declared
zope interface (``mconn.net.owner``). This test reads mconn/ and reactors/ with ``ast`` and
collects every ``x._name`` (and ``getattr``/``setattr``/``hasattr``/``delattr`` of
``x`` with a constant ``"_name"``) where ``x`` is not ``self``, ``cls`` or ``super()``
and ``_name`` is not a dunder.

Who owns ``_name`` is approximated by the name alone: an access is a reach when the
accessing module does not define ``_name`` itself (as a function or method, a class, a
module-level name, an attribute assigned on any object, a class attribute, or a
``__slots__`` entry). A module that reads the ``_protocol`` of a Peer while its own class
also has a ``_protocol`` is therefore not counted: the approximation errs towards
silence, never towards a false alarm.

Findings are grouped by (accessing module, attribute). Every group must be in ALLOWED with
a one-line reason: what it reaches and why that is not yet a public method. An entry
that no longer matches anything fails too, so the list only shrinks. Reaches whose
owner lives in another package of mconn (net -> switch, ops -> switch, ...) are named
apart in the failure message: they cross a layer, the worst kind.
"""

from __future__ import annotations

import ast
import collections
import pathlib

from tests.core.test_import_graph import module_files

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("mconn", "reactors")

#: The builtins that take an attribute's name as a string.
_NAMED_ACCESS = {"getattr", "setattr", "hasattr", "delattr"}

#: (accessing module, attribute) -> why it is still reached from outside its owner.
ALLOWED: dict[tuple[str, str], str] = {
    # -- within a package ----------------------------------------------------------------------
    ("mconn.net.timers", "_on_timer"): (
        "the shared timer wheel fires a connection's timer: one device with the protocol, hidden from its users"
    ),
    ("mconn.net.timers", "_timer"): "the timer wheel clears the protocol's handle on the entry it fires",
    ("mconn.net.write_through", "_tempDataLen"): (
        "Twisted's TCP transport's count of bytes not yet in dataBuffer (is it empty?); Twisted has no public one"
    ),
    ("mconn.switch.session_manager", "_attach"): (
        "the session manager, sole owner of a Peer's lifecycle, gives it a resumed connection; not for reactors"
    ),
    ("mconn.switch.session_manager", "_detach"): (
        "the session manager takes a broken connection from a suspending Peer (a table effect); not for reactors"
    ),
    ("mconn.switch.session_manager", "_end"): (
        "the session manager ends a Peer's session (a table effect); not for reactors"
    ),
    # -- the test doubles: one package, a MemoryLink's parts -----------------------------------
    ("mconn.testing.fabric", "_path"): "the network path a MemoryLink runs on, to find the links a fault touches",
    ("mconn.testing.fabric", "_schedule"): "a healed black hole makes each MemoryLink on it move what it held",
    ("mconn.testing.network", "_vanish"): "a killed node's MemoryLinks lose its side, silently or with a reset",
    ("mconn.testing.network", "_wrappedProtocol"): (
        "Twisted's endpoint wrapper holds the protocol whose owner names the dialing node; no public accessor"
    ),
    ("mconn.testing.transport", "_wrappedProtocol"): (
        "Twisted's endpoint wrapper holds the protocol a MemoryLink joins; no public accessor"
    ),
    # -- pyspark, which offers no public way to these --------------------------------------------
    ("mconn.pipeline.cli", "_active_spark_context"): (
        "pyspark's running SparkContext, if any: a caller's session is left running"
    ),
    ("mconn.pipeline.ingest", "_jvm"): "pyspark's JVM gateway, for Hadoop's FileSystem, which pyspark does not wrap",
    ("mconn.pipeline.ingest", "_jsc"): "pyspark's Java SparkContext, for the Hadoop configuration of that FileSystem",
    ("mconn.pipeline.spark", "_jvm"): "pyspark's JVM gateway, for Hadoop's local FileSystem (no .crc files written)",
    ("mconn.pipeline.spark", "_jsc"): "pyspark's Java SparkContext, for the Hadoop configuration of that FileSystem",
    ("mconn.pipeline.spark", "_ensure_initialized"): (
        "under spark-submit, pyspark's gateway to the JVM that holds --master and --conf, before SparkConf reads them"
    ),
}


# -- the scan ----------------------------------------------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _slot_names(value: ast.expr) -> set[str]:
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return {value.value}
    if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def defined_names(tree: ast.AST) -> set[str]:
    """Every underscore name a module (or a class) defines for itself: functions and
    methods, classes, names bound at module or class level (class attributes, imports),
    attributes assigned on ``self`` or ``cls``, and ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not tree:
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) and _is_own(node.value):
            names.add(node.attr)
        if isinstance(node, (ast.Module, ast.ClassDef)):
            names |= _bound_at_top(node.body)
    return {name for name in names if _private(name)}


def _bound_at_top(body: list[ast.stmt]) -> set[str]:
    """The names a module or class body binds, under ``if``/``try``/``with`` too (not in
    functions), with the strings of its ``__slots__``."""
    names: set[str] = set()
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets):
                names |= _slot_names(statement.value)
    return names


def _is_own(target: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object reaches its own members."""
    if isinstance(target, ast.Name):
        return target.id in ("self", "cls")
    return isinstance(target, ast.Call) and isinstance(target.func, ast.Name) and target.func.id == "super"


def _class_named_after(target: ast.expr) -> str | None:
    """The class a receiver's name suggests: ``Peer`` for ``peer``, ``self.peer`` or
    ``self._peer``; ``SessionManager`` for ``session_manager``."""
    name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else None
    if not name or not name.strip("_"):
        return None
    return "".join(part.capitalize() for part in name.strip("_").split("_"))


def reaches(tree: ast.Module) -> list[tuple[str, int, str | None]]:
    """(attribute, line, the class the receiver is named after) of every underscore
    member reached on an object other than ``self``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _is_own(node.value):
            found.append((node.attr, node.lineno, _class_named_after(node.value)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _NAMED_ACCESS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and not _is_own(node.args[0])
        ):
            found.append((node.args[1].value, node.lineno, _class_named_after(node.args[0])))
    return found


def package_of(module: str) -> str:
    """``mconn.switch`` for ``mconn.switch.peer``; ``mconn`` for errors and config;
    ``reactors`` for every reactor."""
    parts = module.split(".")
    if parts[0] == "mconn" and len(parts) > 2:
        return ".".join(parts[:2])
    return parts[0]


def private_reaches(root: pathlib.Path, packages) -> tuple[dict, dict]:
    """((module, attribute) -> ["file:line", ...]; (module, attribute) -> the modules
    that may own it).

    An access is a reach when the accessing module does not define the attribute itself,
    or when the receiver is named after a class of another module that defines it
    (``self.peer._on_ack`` from a module with an ``_on_ack`` of its own)."""
    paths = module_files(root, packages)
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in paths.items()}
    defining: dict[str, set[str]] = collections.defaultdict(set)  # attribute -> modules
    classes: dict[str, list[tuple[str, set[str]]]] = collections.defaultdict(list)  # class -> [(module, members)]
    defined = {}
    for name, tree in trees.items():
        defined[name] = defined_names(tree)
        for attribute in defined[name]:
            defining[attribute].add(name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name].append((name, defined_names(node)))
    found: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
    owners: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for name, tree in trees.items():
        for attribute, line, class_name in reaches(tree):
            typed = {
                module
                for module, members in classes.get(class_name, ())
                if module != name and attribute in members and name not in {m for m, _ in classes[class_name]}
            }
            if typed:
                owners[(name, attribute)] |= typed
            elif attribute not in defined[name]:
                owners[(name, attribute)] |= defining.get(attribute, set())
            else:
                continue
            found[(name, attribute)].add(line)
    sites = {
        key: [f"{paths[key[0]].relative_to(root)}:{line}" for line in sorted(lines)] for key, lines in found.items()
    }
    return sites, dict(owners)


def crosses_packages(module: str, owners: set[str]) -> bool:
    """Is every module of mconn that may own the attribute in another package than
    ``module``'s? (An attribute nobody here defines belongs to a library: not counted.)"""
    packages = {package_of(owner) for owner in owners if owner.startswith("mconn")}
    return bool(packages) and package_of(module) not in packages


def describe(key, sites, owners) -> str:
    module, attribute = key
    defining = ", ".join(sorted(owners)) or "a library"
    return f"  {module}: .{attribute} (owned by {defining}) at {', '.join(sites)}"


# -- the tests ---------------------------------------------------------------------------


def test_no_underscore_member_is_reached_from_another_module_unless_allowed():
    """Every reach of another module's underscore member is in ALLOWED with its reason,
    and every entry of ALLOWED still matches a reach."""
    found, owners = private_reaches(ROOT, PACKAGES)
    new = {key: sites for key, sites in found.items() if key not in ALLOWED}
    stale = sorted(key for key in ALLOWED if key not in found)
    message = []
    if new:
        crossing = {key: sites for key, sites in new.items() if crosses_packages(key[0], owners[key])}
        within = {key: sites for key, sites in new.items() if key not in crossing}
        if crossing:
            message.append(f"{len(crossing)} reach(es) across packages:")
            message += [describe(key, crossing[key], owners[key]) for key in sorted(crossing)]
        if within:
            message.append(f"{len(within)} reach(es) into another module of the same package or a library:")
            message += [describe(key, within[key], owners[key]) for key in sorted(within)]
        message.append("Add a public method or property to the owner, or an entry with its reason to ALLOWED.")
    if stale:
        message.append(f"{len(stale)} entry(ies) of ALLOWED no longer reached; remove them:")
        message += [f"  {module}: .{attribute}" for module, attribute in stale]
    assert not message, "\n".join(message)


def test_every_allowed_reach_gives_its_reason():
    """An entry of ALLOWED says in one line what it reaches and why."""
    bad = [key for key, reason in ALLOWED.items() if not reason.strip() or "\n" in reason]
    assert not bad, bad


def test_the_scan_sees_attributes_and_named_access_and_ignores_own_members(tmp_path):
    """A made-up package: ``peer._protocol`` and ``getattr(peer, "_deliver")`` reached from
    another module are found; ``self._x``, ``super()._y``, dunders, and a name the module
    defines itself are not; a reach into another package is told apart."""
    files = {
        "pkg/__init__.py": "",
        "pkg/a/__init__.py": "",
        "pkg/a/peer.py": (
            "class Peer:\n    __slots__ = ('_protocol',)\n    def _deliver(self):\n        return self._protocol\n"
        ),
        "pkg/a/stats.py": "def read(peer):\n    return peer._protocol\n",
        "pkg/b/__init__.py": "",
        "pkg/b/status.py": (
            "class Status(Base):\n"
            "    def __init__(self, peer):\n"
            "        self._own = peer.__dict__\n"
            "        super()._setup()\n"
            "        self._own._own\n"
            "        getattr(peer, '_deliver')()\n"
            "        peer._protocol.transport\n"
        ),
        "pkg/b/protocol.py": (
            "class Protocol:\n    def _deliver(self):\n        self.peer._deliver()\n        self.other._deliver()\n"
        ),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found, owners = private_reaches(tmp_path, ["pkg"])
    assert found == {
        ("pkg.a.stats", "_protocol"): ["pkg/a/stats.py:2"],
        ("pkg.b.status", "_deliver"): ["pkg/b/status.py:6"],
        ("pkg.b.status", "_protocol"): ["pkg/b/status.py:7"],
        ("pkg.b.protocol", "_deliver"): ["pkg/b/protocol.py:3"],  # self.peer is a Peer; self.other may be its own
    }
    assert owners[("pkg.a.stats", "_protocol")] == {"pkg.a.peer"}
    assert owners[("pkg.b.protocol", "_deliver")] == {"pkg.a.peer"}
    assert owners[("pkg.b.status", "_deliver")] == {"pkg.a.peer"}  # named after Peer, not pkg.b.protocol
    # package_of takes the first two parts of mconn names only: made-up names cross by hand.
    assert package_of("mconn.switch.peer") == "mconn.switch" and package_of("mconn.errors") == "mconn"
    assert crosses_packages("mconn.ops.status", {"mconn.switch.peer"})
    assert not crosses_packages("mconn.switch.telemetry", {"mconn.switch.peer"})
    assert not crosses_packages("mconn.net.write_through", set())  # Twisted's own
