"""bench/prebuilt.py, the prebuilt-frames baseline of bench/run.py: what its sender writes,
a block of frames or one frame a write, only while the transport lets it, and that its
receiver (links.RawLink's parser) gets every message back, fed whole or a byte at a time.
"""

from __future__ import annotations

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))

import prebuilt  # noqa: E402
from links import Handler  # noqa: E402
from scenarios import BULK, END, SMALL, padded  # noqa: E402

SMALL_MSG = padded(SMALL, 0, 100)
BULK_MSG = padded(BULK, 0, 1 << 20)


class PausingTransport:
    """Records each write and pauses its producer after ``writes`` of them, as a
    transport whose buffer went over its size does."""

    def __init__(self, link, writes: int) -> None:
        self.link = link
        self.writes: list[bytes] = []
        self.pause_after = writes

    def write(self, data: bytes) -> None:
        if not self.link.writable:  # a filler that ignored the pause would write forever
            raise AssertionError(f"write {len(self.writes) + 1} while the producer is paused")
        self.writes.append(data)
        if len(self.writes) % self.pause_after == 0:
            self.link.pauseProducing()


class Collect(Handler):
    def __init__(self) -> None:
        self.messages: list[bytes] = []

    def message(self, channel: int, msg: bytes) -> None:
        self.messages.append(msg)


def fill(msg: bytes, batched, pause_after: int, turns: int) -> tuple[prebuilt.PrebuiltFiller, PausingTransport]:
    """A filler run for ``turns`` resumptions of its link, then past its end."""
    link = prebuilt.PrebuiltLink(lambda link: None)
    link.transport = transport = PausingTransport(link, pause_after)
    done = []
    filler = prebuilt.PrebuiltFiller(link, 0x20, msg, time.monotonic() + 3600, lambda: done.append(True), batched)
    filler.run()
    for _ in range(turns - 1):
        assert not done and not link.writable  # waiting for the transport, writing nothing
        link.resumeProducing()
    filler.until = 0.0  # the measurement's time is up: the next turn writes the end
    link.resumeProducing()
    assert done == [True]
    return filler, transport


def received(stream: bytes, chunk: int) -> list[bytes]:
    """The messages a PrebuiltLink's receiving side hands on, fed ``chunk`` bytes at a time."""
    link = prebuilt.PrebuiltLink(lambda link: None)
    link.handler = collect = Collect()
    for at in range(0, len(stream), chunk):
        link.dataReceived(stream[at : at + chunk])
    return collect.messages


def test_small_messages_go_a_thousand_prebuilt_frames_a_write_and_all_arrive():
    filler, transport = fill(SMALL_MSG, None, pause_after=1, turns=3)
    frame = prebuilt.frame(SMALL_MSG)
    assert transport.writes[:3] == [frame * 1000] * 3  # one block a turn: the transport paused after each
    assert transport.writes[3:] == [prebuilt.END_FRAME]
    assert filler.sent == 3000
    stream = b"".join(transport.writes)
    for chunk in (len(stream), 1, 4099):
        messages = received(stream, chunk)
        assert messages[:-1] == [SMALL_MSG] * 3000 and messages[-1] == bytes([END])


def test_one_by_one_writes_each_frame_on_its_own():
    filler, transport = fill(SMALL_MSG, False, pause_after=1000, turns=2)
    assert transport.writes[:2000] == [prebuilt.frame(SMALL_MSG)] * 2000
    assert transport.writes[2000:] == [prebuilt.END_FRAME]
    assert filler.sent == 2000
    assert received(b"".join(transport.writes), 997)[:-1] == [SMALL_MSG] * 2000


def test_a_bulk_message_is_one_frame_a_write():
    filler, transport = fill(BULK_MSG, None, pause_after=1, turns=2)
    assert transport.writes[:2] == [prebuilt.frame(BULK_MSG)] * 2
    assert filler.sent == 2
    assert received(b"".join(transport.writes), 65536)[:-1] == [BULK_MSG] * 2


def test_send_now_writes_one_frame():
    link = prebuilt.PrebuiltLink(lambda link: None)
    link.transport = transport = PausingTransport(link, 1000)
    assert link.send_now(0x40, b"R" + bytes(99))
    assert transport.writes == [(100).to_bytes(4, "big") + b"R" + bytes(99)]
