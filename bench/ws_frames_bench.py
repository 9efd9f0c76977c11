"""The WebSocket frame paths alone, in one process: CPU per MiB of framing and masking a
bulk write, and of reading it back, against copying the same bytes once (specs/websocket.md).

    .venv/bin/python bench/ws_frames_bench.py [--before REF] [--repeat N]

What it measures, per MiB of payload, each the median of ``--repeat`` interleaved rounds:

* ``write``: ``binary_frames`` of one bulk write of the protocol above (65,920 bytes:
  64 KiB of packet data and its packet headers, hence a 64 KiB frame and a short one),
  masked as a dialer sends it and unmasked as a listener does;
* ``read``: a ``FrameReader`` given that stream in 64 KiB reads (Twisted's read size),
  the payloads of each read joined as the carrier hands them on;
* ``copy``: ``bytearray(data)`` of the same 65,920 bytes (one copy), the baseline: the
  figures are also shown as multiples of it, steadier than microseconds on a shared machine.

Each is measured on the compiled twin (mconn/net/_wsframe.pyx, what runs when it is built:
``compiled``) and on the pure reference of websocket_frames.py (``pure``), whatever
``MCONN_PURE`` says.

``--before REF`` runs the same against ``mconn/net/websocket_frames.py`` of git revision REF
too (exported with ``git show``), in the same rounds. A revision from before
``binary_frames`` existed writes the way mconn/net/websocket.py then did: one ``masked_frame``
(or header + payload) per 64 KiB and one transport write each, which Twisted's
``doWrite`` joins into one buffer before its send.

It measures no sockets, no Twisted and no mconn protocol: bench/ws_bench.py has the
end-to-end figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT]

import mconn.net.websocket_frames as current  # noqa: E402

LIMIT = 65536  # mconn.net.websocket.SEND_MESSAGE_BYTES
WRITE = 65920  # one bulk write of the protocol above
READ = 65536  # Twisted's read size


def load_revision(ref: str):
    """mconn/net/websocket_frames.py of git revision ``ref``, as a module of its own."""
    text = subprocess.run(
        ["git", "-C", ROOT, "show", f"{ref}:mconn/net/websocket_frames.py"], check=True, capture_output=True
    ).stdout
    directory = tempfile.mkdtemp(prefix="ws_frames_before_")
    path = os.path.join(directory, "websocket_frames_before.py")
    with open(path, "wb") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("websocket_frames_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def writer(module):
    """A function (data, masked) -> the bytes the transport beneath sends for one write."""
    if hasattr(module, "binary_frames"):
        return lambda data, masked: module.binary_frames(data, limit=LIMIT, keys=os.urandom if masked else None)

    def one_frame_per_write(data, masked):
        writes = []  # what Twisted's write appends to its buffer, one frame each
        view = memoryview(data)
        for start in range(0, len(data), LIMIT):
            payload = view[start : start + LIMIT]
            n, bit = len(payload), 0x80 if masked else 0
            if n < 126:
                header = struct.pack("!BB", 0x82, bit | n)
            elif n < 65536:
                header = struct.pack("!BBH", 0x82, bit | 126, n)
            else:
                header = struct.pack("!BBQ", 0x82, bit | 127, n)
            writes.append(module.masked_frame(header, os.urandom(4), payload) if masked else header + payload)
        return b"".join(writes)  # Twisted's doWrite

    return one_frame_per_write


def reader(module, masked: bool, reads: list):
    def run():
        frames = module.FrameReader(masked=masked, max_message=1 << 20)
        for data in reads:
            payloads, stop, rest = frames.read(data)
            if stop is not None:
                raise RuntimeError(f"the reader stopped: {stop}")
            if len(payloads) > 1:
                b"".join(payloads)  # the carrier's _deliver

    return run


def per_mib(function, number: int, mib: float) -> float:
    """Microseconds of CPU per MiB: the best of three timings of ``number`` calls."""
    return min(timeit.repeat(function, number=number, repeat=3, timer=time.process_time)) / number / mib * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", metavar="REF")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    versions = [("pure", current)] + ([(args.before, load_revision(args.before))] if args.before else [])
    if current.WSFRAME is not None:
        versions.insert(0, ("compiled", current.WSFRAME))
    else:
        print(f"the compiled twin is not in use ({current.WSFRAME_WHY}): the pure functions only")
    data = os.urandom(WRITE)
    write_mib = WRITE / 2**20
    streams = {masked: b"".join(writer(current)(data, masked) for _ in range(40)) for masked in (True, False)}
    reads = {masked: [s[i : i + READ] for i in range(0, len(s), READ)] for masked, s in streams.items()}
    results: dict = {}
    for _ in range(args.repeat):
        results.setdefault("copy", []).append(per_mib(lambda: bytearray(data), 500, write_mib))
        for name, module in versions:
            write = writer(module)
            for masked in (True, False):
                side = "masked" if masked else "unmasked"
                results.setdefault((name, "write", side), []).append(
                    per_mib(lambda write=write, masked=masked: write(data, masked), 500, write_mib)
                )
                read_mib = sum(len(r) for r in reads[masked]) / 2**20
                results.setdefault((name, "read", side), []).append(
                    per_mib(reader(module, masked, reads[masked]), 10, read_mib)
                )
    copy = statistics.median(results.pop("copy"))
    load = os.getloadavg()
    print(f"ws_frames_bench: {args.repeat} rounds (medians); load average {load[0]:.1f} {load[1]:.1f}")
    print(f"copy (the baseline): {copy:.0f} us/MiB")
    print(f"{'version':<10} {'path':<6} {'frames':<9} {'us/MiB':>8} {'x copy':>8}")
    for (name, path, side), values in sorted(results.items(), key=lambda item: (item[0][1], item[0][2], item[0][0])):
        value = statistics.median(values)
        print(f"{name:<10} {path:<6} {side:<9} {value:>8.0f} {value / copy:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
