"""atheris harness for the mempool reactor, reactors/mempool.py, fed whole sessions (long runs, not in CI).

The target (tests/fuzz/reactor_target.py, ``fuzz_mempool``) checks that receive raises nothing (an invalid transaction is only counted), and that the mempool, each peer's share, each seen set and the order stay within the reactor's bounds.

    python tests/fuzz/fuzz_mempool.py tests/fuzz/corpus/mempool    # fuzz (atheris / libFuzzer flags)

See tests/fuzz/README.md.
"""

from __future__ import annotations

import sys

import harness

fuzz_mempool = harness.load("tests.fuzz.reactor_target", "fuzz_mempool", ["reactors", "mconn", "construct"])

if __name__ == "__main__":
    sys.exit(harness.main(sys.argv, fuzz_mempool))
