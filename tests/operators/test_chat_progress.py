"""The progress of a file sent to several chat peers counts the file's bytes once
(reactors/chat_files.py), on real Switches over 127.0.0.1. Every wait is bounded."""

import pytest
import pytest_twisted

from helpers import bounded
from operators.test_chat_reactor import Net, random_file
from reactors import chat

pytestmark = pytest.mark.integration


@pytest_twisted.ensureDeferred
async def test_a_file_sent_to_two_peers_counts_its_bytes_once_and_ends_full_though_one_refused(tmp_path):
    """alice sends a 4 MiB file to bob, who refuses files over 1 MiB, and to carol, who takes it: every
    report says the file's size as the total, the count never goes back nor past it, and the last one is
    the whole file (carol got it; bob's refusal no longer holds the bar back)."""
    net = Net(tmp_path)
    try:
        a = await net.node("alice")
        b = await net.node("bob", max_file_size=1 << 20)
        c = await net.node("carol")
        await net.link(a, b)
        await net.link(a, c)
        size = 4 << 20
        random_file(tmp_path / "f.bin", size)
        reports = []
        receipts = await bounded(
            a.reactors[0].send_file(tmp_path / "f.bin", lambda sent, total: reports.append((sent, total))), 30
        )
        assert receipts[b.node_id].refused == "too_large" and receipts[c.node_id] == chat.FileReceipt(True)
        assert reports and {total for _, total in reports} == {size}
        counts = [sent for sent, _ in reports]
        assert counts == sorted(counts) and counts[-1] == size, counts[-8:]
    finally:
        await net.stop()
