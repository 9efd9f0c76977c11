"""atheris harness for the handshake and session-answer paths of a real Switch (long runs).

The target (tests/fuzz/switch_target.py, ``fuzz_one``) builds a world from byte 0 (our
Switch listening or dialing, holding nothing, a connected or a suspended session), reads
a structure-aware hello or session answer from the bytes that follow (or takes them raw),
plays the stream on a memory network and checks, after every step and at the end, that
nothing escaped, that invariants, the reactor contract and the limits hold, and that the
connection ended for a specific reason named by one close packet.

    python tests/fuzz/make_corpus.py                             # seeds from specs/vectors
    python tests/fuzz/fuzz_switch.py tests/fuzz/corpus/switch    # fuzz (atheris / libFuzzer flags)
    python tests/fuzz/fuzz_switch.py crash-1234...               # replay one input

See tests/fuzz/README.md.
"""

from __future__ import annotations

import sys

import harness

fuzz_one = harness.load("tests.fuzz.switch_target", "fuzz_one", ["mconn"])

if __name__ == "__main__":
    sys.exit(harness.main(sys.argv, fuzz_one))
