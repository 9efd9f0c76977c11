"""atheris harness for the whole inbound path of a Connection (long runs, not in CI).

The target (tests/fuzz/target.py, ``fuzz_one``) cuts the input into chunks with waits,
feeds them to a sans-I/O Connection and checks, after every step, that nothing escaped,
that a failure is a specific RemoteProtocolError answered by one close packet, and that
buffers stay within the configured limits. A failed check is an AssertionError, which
atheris reports as a crash with the input that caused it.

    python tests/fuzz/make_corpus.py                      # seeds from specs/vectors
    python tests/fuzz/fuzz_inbound.py tests/fuzz/corpus   # fuzz (atheris / libFuzzer flags)
    python tests/fuzz/fuzz_inbound.py crash-1234...       # replay one input

Without atheris installed, the arguments that are files or directories are replayed once
each (a regression run of a corpus). See tests/fuzz/README.md.
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

try:
    import atheris
except ImportError:  # replay only
    atheris = None

if atheris is not None:
    with atheris.instrument_imports(include=["mconn"]):
        from tests.fuzz.target import fuzz_one
else:
    from tests.fuzz.target import fuzz_one


def replay(paths: list[str]) -> int:
    files = []
    for name in paths:
        path = pathlib.Path(name)
        files += sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    for path in files:
        fuzz_one(path.read_bytes())
    print(f"replayed {len(files)} inputs without a failure (atheris is not installed: no fuzzing)")
    return 0


def main(argv: list[str]) -> int:
    if atheris is None:
        return replay([a for a in argv[1:] if not a.startswith("-")])
    atheris.Setup(argv, fuzz_one)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
