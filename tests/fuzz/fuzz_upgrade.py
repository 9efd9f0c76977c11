"""atheris harness for a ws listener's WebSocket upgrade (long runs, not in CI).

The target (tests/fuzz/upgrade_target.py, ``fuzz_one``) feeds the input, cut into chunks
with waits, to a WebSocket listener connection of a real Switch on a Clock, and checks
after every step that nothing escaped, that whatever the listener wrote is an HTTP
answer (101 or 4xx/5xx) and that the admission counts agree; at the end, that the
listener closed the connection and that nothing stays counted. A failed check is an
AssertionError, which atheris reports as a crash with the input that caused it.

    python tests/fuzz/fuzz_upgrade.py --seeds tests/fuzz/corpus/upgrade   # write the seeds
    python tests/fuzz/fuzz_upgrade.py tests/fuzz/corpus/upgrade           # fuzz (atheris / libFuzzer flags)
    python tests/fuzz/fuzz_upgrade.py crash-1234...                       # replay one input

Without atheris installed, the arguments that are files or directories are replayed once
each (a regression run of a corpus). See tests/fuzz/README.md.
"""

from __future__ import annotations

import hashlib
import pathlib
import sys

from twisted.logger import globalLogBeginner

import harness

# Twisted keeps the log events of a process that never began logging (up to 65,536 of
# them, each holding what it names: a protocol, a Failure): over a fuzz run, gigabytes.
# The target watches for failures itself.
globalLogBeginner.beginLoggingTo([], discardBuffer=True, redirectStandardIO=False)

fuzz_one = harness.load("tests.fuzz.upgrade_target", "fuzz_one", ["mconn", "autobahn"])


def write_seeds(folder: str) -> int:
    from tests.fuzz.upgrade_target import seeds

    path = pathlib.Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    for seed in seeds():
        (path / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    print(f"wrote {len(seeds())} seeds to {path}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--seeds"]:
        sys.exit(write_seeds(sys.argv[2] if len(sys.argv) > 2 else "tests/fuzz/corpus/upgrade"))
    sys.exit(harness.main(sys.argv, fuzz_one))
