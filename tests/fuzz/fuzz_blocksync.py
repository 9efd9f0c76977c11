"""atheris harness for the blocksync reactor, reactors/blocksync.py: its decoder, and the reactor fed whole sessions (long runs, not in CI).

The target (tests/fuzz/reactor_target.py, ``fuzz_blocksync``) checks that the decoder fails only with MalformedBlocksyncMessage and round-trips, that receive raises only BlocksyncError, and that requests in flight stay within the reactor's bounds and window.

    python tests/fuzz/fuzz_blocksync.py tests/fuzz/corpus/blocksync    # fuzz (atheris / libFuzzer flags)

See tests/fuzz/README.md.
"""

from __future__ import annotations

import sys

import harness

fuzz_blocksync = harness.load("tests.fuzz.reactor_target", "fuzz_blocksync", ["reactors", "mconn", "construct"])

if __name__ == "__main__":
    sys.exit(harness.main(sys.argv, fuzz_blocksync))
