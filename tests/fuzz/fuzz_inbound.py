"""atheris harness for the whole inbound path of a Connection (long runs, not in CI).

The target (tests/fuzz/target.py, ``fuzz_one``) cuts the input into chunks with waits,
feeds them to a sans-I/O Connection and checks, after every step, that nothing escaped,
that a failure is a specific RemoteProtocolError answered by one close packet, and that
buffers stay within the configured limits. A failed check is an AssertionError, which
atheris reports as a crash with the input that caused it.

    python tests/fuzz/make_corpus.py                               # seeds from specs/vectors
    python tests/fuzz/fuzz_inbound.py tests/fuzz/corpus/inbound    # fuzz (atheris / libFuzzer flags)
    python tests/fuzz/fuzz_inbound.py crash-1234...                # replay one input

Without atheris installed, the arguments that are files or directories are replayed once
each (a regression run of a corpus). See tests/fuzz/README.md.
"""

from __future__ import annotations

import sys

import harness

fuzz_one = harness.load("tests.fuzz.target", "fuzz_one", ["mconn"])

if __name__ == "__main__":
    sys.exit(harness.main(sys.argv, fuzz_one))
