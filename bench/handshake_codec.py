"""CPU of the handshake's codecs: the hand-written ones against the construct declarations.

    .venv/bin/python bench/handshake_codec.py

A listener decodes the dialer's hello and its session request and encodes its session
answer once per handshake (a share of a connect storm's cost). This times each of them both ways in the
same run, on a hello like a node's (6 channels, a session request, a node info): the
declaration (``wire.hello_parts_declared``, ``SessionRequestBody``, ``SessionAnswerBody``)
is the baseline, the hand-written code (``wire.decode_hello``'s reader,
``decode_session_request``, ``encode_session_answer``) is what mconn runs. Prints one
JSON line of microseconds per call (the smallest of 5 repeats) and declared/hand ratios.
"""

from __future__ import annotations

import json
import os
import sys
import timeit

from mconn import ChannelDescriptor
from mconn.core import wire
from mconn.core.handshake import make_hello
from mconn.core.node_info import NodeInfo


def _cost(call, number: int = 300) -> float:
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6


def main() -> int:
    request = wire.SessionRequest(session_id=os.urandom(16), resume=False)
    hello = make_hello(
        node_id=os.urandom(20).hex(),
        channels=[ChannelDescriptor(i, priority=1 + i % 3) for i in range(0x20, 0x26)],
        max_packet_payload=1024,
        listen_address="127.0.0.1:26656",
        fields=((wire.HelloTag.SESSION, wire.encode_session_request(request)),),
        node_info=NodeInfo(network="bench"),
    )
    body = wire.encode_hello(hello)
    value = hello.fields[0][1]
    answer = wire.SessionAnswer(session_id=request.session_id, resumed=False)
    pairs = {
        "hello": (lambda: wire.hello_parts_declared(body), lambda: wire._hello_parts(body)),
        "session_request": (
            lambda: wire._parse(wire.SessionRequestBody, value, "session request"),
            lambda: wire.decode_session_request(value),
        ),
        "session_answer": (
            lambda: wire.SessionAnswerBody.build(
                dict(session_id=answer.session_id, resumed=False, reason="", delivered=[])
            ),
            lambda: wire.encode_session_answer(answer),
        ),
    }
    out = {"hello_bytes": len(body)}
    for name, (declared, hand) in pairs.items():
        d, h = _cost(declared), _cost(hand)
        out[name] = {"declared_us": round(d, 2), "hand_us": round(h, 2), "declared_over_hand": round(d / h, 1)}
    out["decode_hello_us"] = round(_cost(lambda: wire.decode_hello(body)), 2)
    out["load_average"] = os.getloadavg()[0]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
