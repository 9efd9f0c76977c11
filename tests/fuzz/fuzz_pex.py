"""atheris harness for the PEX decoder, reactors/pex_wire.py (long runs, not in CI).

The target (tests/fuzz/message_target.py, ``fuzz_pex``) takes the message raw or builds
it from pex_wire's declarations, decodes it, and checks that a failure is PexMisbehaved
with a decoding reason, that a success round-trips, and that time and work are bounded.

    python tests/fuzz/make_corpus.py                       # seeds from specs/vectors/pex.json
    python tests/fuzz/fuzz_pex.py tests/fuzz/corpus/pex    # fuzz (atheris / libFuzzer flags)

See tests/fuzz/README.md.
"""

from __future__ import annotations

import sys

import harness

fuzz_pex = harness.load("tests.fuzz.message_target", "fuzz_pex", ["reactors", "mconn", "construct"])

if __name__ == "__main__":
    sys.exit(harness.main(sys.argv, fuzz_pex))
