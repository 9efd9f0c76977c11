"""The pure core imports neither Twisted nor anything that does I/O (a sans-I/O core, as h11 and h2)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: Every module found under mconn/core/ (a glob, not a list: a new core module is checked
#: the day it is added), and the two shared modules below every layer.
CORE_MODULES = [
    "mconn.core." + path.stem for path in sorted((ROOT / "mconn" / "core").glob("*.py")) if path.stem != "__init__"
] + ["mconn.core", "mconn.errors", "mconn.config"]

#: What the sans-I/O core must not load: the event loop, its interfaces, the WebSocket library.
FORBIDDEN = ("twisted", "zope", "autobahn", "txaio")

PROGRAM = """
import sys
for name in {modules!r}:
    __import__(name)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})
print(len(loaded), loaded[:5])
"""


def test_core_imports_without_twisted():
    """Importing every module of mconn/core/ in a fresh interpreter loads no module of
    Twisted, zope, autobahn or txaio."""
    assert len(CORE_MODULES) > 15, CORE_MODULES
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(modules=CORE_MODULES, forbidden=FORBIDDEN)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.startswith("0 "), f"the pure core imported I/O modules: {result.stdout.strip()}"


def test_core_tests_do_not_import_twisted():
    """tests/core is the no-Twisted layer: its files and helpers never import it."""
    here = pathlib.Path(__file__).resolve().parent
    files = [*here.glob("*.py"), here.parent / "helpers_core.py"]
    offenders = [
        f.name
        for f in files
        if any(line.lstrip().startswith(("import twisted", "from twisted")) for line in f.read_text().splitlines())
    ]
    assert offenders == []
