"""Write the seed corpus of fuzz_inbound.py from the golden vectors in specs/vectors/*.json.

Every hex value of every vector (valid and invalid packets, hello bodies, resume
packets) becomes seeds in the harness's input format (tests/fuzz/target.py,
``schedule_from_bytes``): the bytes alone, and after a valid peer hello (so that
post-handshake packets are reached), for our side as listener and as dialer.

    python tests/fuzz/make_corpus.py [corpus directory]   (default: tests/fuzz/corpus)
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.fuzz.target import peer_hello  # noqa: E402
from tests.helpers_core import expand  # noqa: E402

VECTOR_KEYS = ("hex", "packet_hex", "bytes", "stream")


def vector_bytes(node) -> list[bytes]:
    """Every hex value in a vector file, wherever it is nested."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in VECTOR_KEYS and isinstance(value, (str, list, dict)):
                try:
                    found.append(expand(value))
                except (ValueError, TypeError, KeyError):
                    pass  # a description, not bytes
            else:
                found += vector_bytes(value)
    elif isinstance(node, list):
        for item in node:
            found += vector_bytes(item)
    return found


def seeds() -> list[bytes]:
    out = []
    hello = peer_hello()
    for path in sorted((ROOT / "specs" / "vectors").glob("*.json")):
        for data in vector_bytes(json.loads(path.read_text())):
            for side in (0, 1):  # listener, dialer
                out.append(bytes([side, 0]) + data)
                out.append(bytes([side, 0]) + hello + data)
    return out


def main(argv: list[str]) -> int:
    corpus = pathlib.Path(argv[1]) if len(argv) > 1 else pathlib.Path(__file__).with_name("corpus")
    corpus.mkdir(parents=True, exist_ok=True)
    written = 0
    for seed in seeds():
        path = corpus / hashlib.sha1(seed).hexdigest()
        if not path.exists():
            path.write_bytes(seed)
            written += 1
    print(f"{written} new seeds in {corpus} ({len(list(corpus.iterdir()))} in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
