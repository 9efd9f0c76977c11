"""The pure core imports neither Twisted nor anything that does I/O (a sans-I/O core, as h11 and h2)."""

import pathlib
import subprocess
import sys

CORE_MODULES = [
    "mconn.wire",
    "mconn.frame_buffer",
    "mconn.channel",
    "mconn.connection",
    "mconn.handshake",
    "mconn.events",
    "mconn.errors",
    "mconn.config",
    "mconn.rate",
    "mconn.session",
    "mconn.session_table",
    "mconn.admission",
]

PROGRAM = """
import sys
for name in {modules!r}:
    __import__(name)
loaded = sorted(m for m in sys.modules if m == "twisted" or m.startswith("twisted."))
print(len(loaded), loaded[:5])
"""


def test_core_imports_without_twisted():
    """Importing every core module in a fresh interpreter loads no twisted module."""
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(modules=CORE_MODULES)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.startswith("0 "), f"the pure core imported Twisted: {result.stdout.strip()}"


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
