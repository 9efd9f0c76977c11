"""What the atheris harnesses here share: the instrumented import of a target, fuzzing, replay.

Each harness (fuzz_inbound.py, fuzz_switch.py, fuzz_pex.py, fuzz_chat.py) names its
target function and the packages atheris instruments for coverage, and calls ``main``.
With atheris installed, ``main`` hands the command line to libFuzzer; without it, the
files and folders named are replayed once each (a regression run of a corpus). See
tests/fuzz/README.md.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "tests"):  # tests.fuzz.*, and the test helpers (as pytest sees them)
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

try:
    import atheris
except ImportError:  # replay only
    atheris = None


def load(module: str, function: str, instrument: list[str]):
    """``module.function``, imported with atheris instrumenting the packages ``instrument``."""
    if atheris is None:
        return getattr(importlib.import_module(module), function)
    with atheris.instrument_imports(include=instrument):
        return getattr(importlib.import_module(module), function)


def replay(target, paths: list[str]) -> int:
    files = []
    for name in paths:
        path = pathlib.Path(name)
        files += sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    for path in files:
        target(path.read_bytes())
    print(f"replayed {len(files)} inputs without a failure (atheris is not installed: no fuzzing)")
    return 0


def main(argv: list[str], target) -> int:
    if atheris is None:
        return replay(target, [a for a in argv[1:] if not a.startswith("-")])
    atheris.Setup(argv, target)
    atheris.Fuzz()
    return 0
