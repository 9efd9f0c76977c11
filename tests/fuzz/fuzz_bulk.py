"""atheris harness for the bulk stream check, reactors/bulk.py (long runs, not in CI).

The target (tests/fuzz/reactor_target.py, ``fuzz_bulk``) checks that a message is the expected one or fails with BulkStreamError, in bounded time and memory.

    python tests/fuzz/fuzz_bulk.py tests/fuzz/corpus/bulk    # fuzz (atheris / libFuzzer flags)

See tests/fuzz/README.md.
"""

from __future__ import annotations

import sys

import harness

fuzz_bulk = harness.load("tests.fuzz.reactor_target", "fuzz_bulk", ["reactors", "mconn", "construct"])

if __name__ == "__main__":
    sys.exit(harness.main(sys.argv, fuzz_bulk))
