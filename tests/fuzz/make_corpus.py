"""Write the seed corpora of the atheris harnesses, mostly from the golden vectors in specs/vectors/*.json.

One folder per target under the corpus directory, each seed in that harness's input
format:

* ``inbound`` (fuzz_inbound.py; tests/fuzz/target.py ``schedule_from_bytes``): every hex
  value of every vector, alone and after a valid peer hello, for our side as listener
  and as dialer;
* ``switch`` (fuzz_switch.py; tests/fuzz/switch_target.py ``scenario_from_bytes``): for
  every world, the default structure-aware hello or session answer, alone and followed
  by each packet of wire.json and resume.json; and raw: hello.json's bodies and hellos
  carrying resume.json's session requests to a listener, resume.json's session answers
  to a dialer;
* ``pex`` (fuzz_pex.py): pex.json's messages, raw, under no limit and the default one,
  and the structure-aware defaults;
* ``chat`` (fuzz_chat.py): there are no chat vectors; one message of every kind built
  from chat_wire's declarations, raw, and the structure-aware defaults.

    python tests/fuzz/make_corpus.py [corpus directory]   (default: tests/fuzz/corpus)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mconn.core import wire  # noqa: E402
from mconn.core.wire import HelloTag, PacketType  # noqa: E402
from reactors.chat_wire import FILE  # noqa: E402
from tests.fuzz.declared import Reader  # noqa: E402
from tests.fuzz.handshake_inputs import draw_answer, draw_hello  # noqa: E402
from tests.fuzz.message_target import chat_examples  # noqa: E402
from tests.fuzz.target import peer_hello  # noqa: E402
from tests.helpers_core import expand  # noqa: E402

VECTOR_KEYS = ("hex", "packet_hex", "bytes", "stream")


def vectors(name: str):
    return json.loads((ROOT / "specs" / "vectors" / f"{name}.json").read_text())


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


def inbound_seeds() -> list[bytes]:
    out = []
    hello = peer_hello()
    for path in sorted((ROOT / "specs" / "vectors").glob("*.json")):
        for data in vector_bytes(json.loads(path.read_text())):
            for side in (0, 1):  # listener, dialer
                out.append(bytes([side, 0]) + data)
                out.append(bytes([side, 0]) + hello + data)
    return out


def _choices(draw) -> bytes:
    """The zero bytes a structure-aware draw reads when every choice is its default."""
    reader = Reader(bytes(4096))
    draw(reader)
    return bytes(reader.at)


def _by_kind(kind: str) -> list[bytes]:
    entries = vectors("resume")["valid"] + vectors("resume")["invalid"]
    return [expand(e["hex"]) for e in entries if e["kind"] == kind]


def switch_seeds() -> list[bytes]:
    """See the module docstring; byte 0 is the world (tests/fuzz/switch_target.py)."""
    out = []
    after = vector_bytes(vectors("wire")) + _by_kind("ack")
    worlds = [(dialer, held, low) for dialer in (0, 1) for held in (0, 1, 2) for low in ((0, 1) if dialer else (0,))]
    for dialer, held, low in worlds:
        mode = dialer | held << 1 | low << 4
        choices = _choices(draw_answer if dialer else draw_hello)
        out.append(bytes([mode, 0]))
        out += [bytes([mode, 0]) + choices + data for data in after]
        raw = bytes([mode | 8, 0])
        if dialer:
            out += [raw + packet for packet in _by_kind("session_answer")]
        else:
            out += [raw + wire.encode_extension(PacketType.HELLO, expand(v["hex"])) for v in _all_hellos()]
            out += [raw + _hello_with(request) for request in _by_kind("session_request")]
    return out


def _all_hellos() -> list[dict]:
    hello = vectors("hello")
    return hello["valid"] + hello["invalid"] + hello["incompatible"]


def _hello_with(request: bytes) -> bytes:
    hello = wire.decode_hello(expand(vectors("hello")["valid"][0]["hex"]))
    hello = dataclasses.replace(hello, fields=((HelloTag.SESSION, request),))
    return wire.encode_extension(PacketType.HELLO, wire.encode_hello(hello))


def pex_seeds() -> list[bytes]:
    pex = vectors("pex")
    messages = [expand(v["hex"]) for v in pex["valid"] + pex["invalid"]]
    return [bytes([mode]) for mode in range(4)] + [bytes([4 | limit]) + m for m in messages for limit in (0, 1)]


def chat_seeds() -> list[bytes]:
    return [b"\x00", b"\x01"] + [bytes([2 | (channel_id == FILE)]) + message for channel_id, message in chat_examples()]


SEEDS = {"inbound": inbound_seeds, "switch": switch_seeds, "pex": pex_seeds, "chat": chat_seeds}


def main(argv: list[str]) -> int:
    corpus = pathlib.Path(argv[1]) if len(argv) > 1 else pathlib.Path(__file__).with_name("corpus")
    for target, seeds in SEEDS.items():
        folder = corpus / target
        folder.mkdir(parents=True, exist_ok=True)
        written = 0
        for seed in seeds():
            path = folder / hashlib.sha1(seed).hexdigest()
            if not path.exists():
                path.write_bytes(seed)
                written += 1
        print(f"{written} new seeds in {folder} ({len(list(folder.iterdir()))} in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
