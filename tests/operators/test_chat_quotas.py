"""What a chat node agrees to store (specs/chat.md section 3.1): the per-peer quota, the
downloads quota, the free-space floor, and the REFUSE message the sender sees.

The transfers run on real Switches over 127.0.0.1 (pytest-twisted, the Net of
test_chat_reactor.py); the accounting is also checked on its own, with made-up times.
Every wait is bounded and every Switch started is stopped.
"""

import hashlib
import importlib.util
import os
import pathlib
import re
import shutil

import pytest
import pytest_twisted

from helpers import RecordingReactor, bounded, until
from mconn import PeerClosed
from operators.test_chat_reactor import Net, random_file
from reactors import chat, chat_files
from reactors.chat import FILE, ChatReactor, FileLimits, FileReceipt
from reactors.chat_quota import BLOCK, Quotas, footprint
from reactors.chat_wire import DISK_FLOOR, PEER_QUOTA

ROOT = pathlib.Path(__file__).resolve().parents[2]
KIB = 1024


def refusals(reactor):
    return [e[1] for e in reactor.events if e[0] == "refused"]


def stored(directory):
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


# -- the rules, on real Switches -------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_an_unsolicited_flood_from_one_peer_stops_at_its_quota_and_the_sender_sees_why(tmp_path):
    """A peer that keeps sending files is refused once its quota for the window is used: it gets a REFUSE
    (peer_quota, a reason, a retry_after within the window) as a FileReceipt and an on_refused call, nothing
    more is stored, it stays connected, and another peer can still send."""
    net = Net(tmp_path)
    try:
        a, c = await net.node("alice"), await net.node("carol")
        b = await net.node("bob", peer_quota_bytes=1024 * KIB)
        await net.link(a, b)
        await net.link(c, b)
        ra, rb, rc = (s.reactors[0] for s in (a, b, c))
        random_file(tmp_path / "f.bin", 400 * KIB)
        answers = [(await bounded(ra.send_file(tmp_path / "f.bin")))[b.node_id] for _ in range(4)]
        assert answers[:2] == [FileReceipt(True)] * 2
        for receipt in answers[2:]:
            assert receipt.refused == "peer_quota" and not receipt, receipt
            assert receipt.reason.startswith("refused: 819200 of peer_quota_bytes 1048576 used in the last 3600 s")
        [first, second] = refusals(ra)
        assert (first.by_us, first.code, first.name, first.size) == (False, "peer_quota", "f.bin", 400 * KIB)
        assert first.peer == b.node_id
        assert 3500 < first.retry_after <= 3600 and first.reason == answers[2].reason
        assert [(r.by_us, r.code, r.peer) for r in refusals(rb)] == [(True, "peer_quota", a.node_id)] * 2
        assert stored(tmp_path / "bob") == ["f (1).bin", "f.bin"] and rb.files_refused == 2
        assert list((await bounded(rc.send_file(tmp_path / "f.bin"))).values()) == [FileReceipt(True)]
        assert b.node_id in a.peers and a.node_id in b.peers
    finally:
        await net.stop()


@pytest_twisted.ensureDeferred
async def test_the_downloads_quota_counts_every_file_there_and_is_shared_by_all_peers(tmp_path):
    """Files already in the downloads folder and files from every peer count against downloads_quota_bytes;
    the offer that would pass it is refused with downloads_quota and not stored."""
    net = Net(tmp_path)
    try:
        (tmp_path / "bob").mkdir()
        (tmp_path / "bob" / "old.bin").write_bytes(b"x" * 600 * KIB)
        a, c = await net.node("alice"), await net.node("carol")
        b = await net.node("bob", downloads_quota_bytes=1024 * KIB)
        await net.link(a, b)
        await net.link(c, b)
        random_file(tmp_path / "f.bin", 300 * KIB)
        assert list((await bounded(a.reactors[0].send_file(tmp_path / "f.bin"))).values()) == [FileReceipt(True)]
        [receipt] = (await bounded(c.reactors[0].send_file(tmp_path / "f.bin"))).values()
        assert receipt.refused == "downloads_quota", receipt
        assert receipt.reason == (
            "refused: downloads holds 921600 bytes and 0 arriving; a file of 307200 bytes would pass "
            "downloads_quota_bytes 1048576"
        )
        assert stored(tmp_path / "bob") == ["f.bin", "old.bin"]
    finally:
        await net.stop()


@pytest_twisted.ensureDeferred
async def test_an_offer_that_would_break_the_free_space_floor_is_refused_before_a_byte_is_written(tmp_path):
    """An offer that would leave less than min_free_bytes free on the downloads file system is refused with
    disk_floor, and no file, not even a .part, is written."""
    floor = shutil.disk_usage(tmp_path).free + (1 << 30)
    net = Net(tmp_path)
    try:
        a, b = await net.node("alice"), await net.node("bob", min_free_bytes=floor)
        await net.link(a, b)
        random_file(tmp_path / "f.bin", 100 * KIB)
        [receipt] = (await bounded(a.reactors[0].send_file(tmp_path / "f.bin"))).values()
        assert receipt.refused == "disk_floor" and f"would leave less than min_free_bytes {floor}" in receipt.reason
        assert stored(tmp_path / "bob") == []
    finally:
        await net.stop()


@pytest_twisted.ensureDeferred
async def test_a_transfer_that_reaches_the_floor_half_way_is_refused_and_its_part_deleted(tmp_path, monkeypatch):
    """When the free space falls to the floor during a transfer, the receiver stops writing, deletes the .part
    file and sends REFUSE (disk_floor); the sender stops, and a later file arrives once space is back."""
    free = {"bytes": 1 << 40}
    monkeypatch.setattr(chat_files, "free_bytes", lambda path: free["bytes"])
    net = Net(tmp_path)
    try:
        a, b = await net.node("alice"), await net.node("bob", min_free_bytes=1 << 30)
        await net.link(a, b)
        ra, rb = a.reactors[0], b.reactors[0]
        random_file(tmp_path / "big.bin", 8 << 20)

        def on_progress(sent, total):
            if sent >= 1 << 20:
                free["bytes"] = (1 << 30) + 1000  # another program fills the disk

        [receipt] = (await bounded(ra.send_file(tmp_path / "big.bin", on_progress), 30)).values()
        assert receipt.refused == "disk_floor" and receipt.reason.startswith("refused: 1073742824 bytes free")
        assert rb.files_refused == 1 and stored(tmp_path / "bob") == [], "the .part file was left behind"
        free["bytes"] = 1 << 40
        digest = random_file(tmp_path / "small.bin", 200 * KIB)
        assert list((await bounded(ra.send_file(tmp_path / "small.bin"))).values()) == [FileReceipt(True)]
        assert hashlib.sha256((tmp_path / "bob" / "small.bin").read_bytes()).hexdigest() == digest
    finally:
        await net.stop()


@pytest_twisted.ensureDeferred
async def test_a_refusal_of_a_transfer_we_are_not_sending_drops_its_sender(tmp_path):
    """A REFUSE naming a transfer the node is not sending is bad input: the peer is closed with
    UnexpectedFileMessage."""
    net = Net(tmp_path)
    try:
        raw = RecordingReactor(ChatReactor().get_channels())
        bad, b = await net.node("raw", reactor=raw), await net.node("bob")
        await net.link(bad, b)
        refuse = chat.encode(FILE, chat.REFUSE, transfer=b"\x01" * 16, code=2, retry_after=5, reason="refused: no")
        assert await bad.peers[b.node_id].send(FILE, refuse)
        await until(lambda: any(call[0] == "remove_peer" for call in raw.calls), "the bad peer to be dropped")
        [(_, _, reason)] = [call for call in raw.calls if call[0] == "remove_peer"]
        assert isinstance(reason, PeerClosed) and reason.text.startswith(
            "UnexpectedFileMessage: a refusal for transfer 0101"
        ), reason
    finally:
        await net.stop()


# -- the message ----------------------------------------------------------------------


def test_refuse_has_the_layout_of_the_spec():
    """REFUSE is kind 0x05: transfer id, a u8 code, a u32 retry_after, a u8-length reason, nothing after; an
    unknown code is malformed."""
    message = chat.encode(FILE, chat.REFUSE, transfer=bytes(range(16)), code=2, retry_after=3600, reason="no")
    assert message == bytes([5]) + bytes(range(16)) + b"\x02" + b"\x00\x00\x0e\x10" + b"\x02no"
    kind, fields = chat.decode(FILE, message)
    assert (kind, fields.code, fields.retry_after, fields.reason) == (chat.REFUSE, 2, 3600, "no")
    with pytest.raises(chat.MalformedChatMessage, match="kind 0x05 on channel 0x21"):
        chat.decode(FILE, message[:17] + b"\x09" + message[18:])
    with pytest.raises(chat.MalformedChatMessage):
        chat.decode(FILE, message + b"\x00")


# -- the accounting, with made-up times ------------------------------------------------


def test_a_peers_quota_frees_up_as_its_charges_age_out_of_the_window():
    """Charges older than peer_quota_window no longer count; retry_after is the wait until enough have aged
    out, and 0 for a file larger than the quota itself."""
    quotas = Quotas(FileLimits(peer_quota_bytes=100 * BLOCK, peer_quota_window=60.0))
    quotas.charge("p", 60 * BLOCK, now=0.0)
    quotas.charge("p", 30 * BLOCK, now=20.0)
    refusal = quotas.refuse_sender("p", 20 * BLOCK, now=30.0)
    assert refusal.code == PEER_QUOTA and refusal.retry_after == 30  # the first charge ages out at 60
    assert quotas.refuse_sender("q", 20 * BLOCK, now=30.0) is None  # another peer's quota is its own
    assert quotas.refuse_sender("p", 20 * BLOCK, now=60.5) is None
    assert quotas.refuse_sender("p", 101 * BLOCK, now=60.5).retry_after == 0


def test_a_transfer_that_ends_early_is_charged_what_arrived():
    """A transfer settled after 10 blocks of 50 counts 10 blocks; every file counts at least one block."""
    quotas = Quotas(FileLimits(peer_quota_bytes=100 * BLOCK))
    charge = quotas.charge("p", 50 * BLOCK, now=0.0)
    quotas.settle(charge, 10 * BLOCK - 1)
    assert quotas.used("p", now=1.0) == 10 * BLOCK
    quotas.charge("p", 0, now=1.0)
    assert quotas.used("p", now=1.0) == 11 * BLOCK and footprint(0) == footprint(1) == BLOCK


def test_the_free_space_floor_counts_the_bytes_still_arriving():
    """The floor holds after every transfer being received has arrived, not just after this one."""
    quotas = Quotas(FileLimits(min_free_bytes=1000))
    assert quotas.refuse_disk(500, stored=0, in_flight=0, free=1500, remaining=0) is None
    assert quotas.refuse_disk(500, stored=0, in_flight=0, free=1500, remaining=1).code == DISK_FLOOR


@pytest.mark.parametrize(
    "field, value",
    [("peer_quota_bytes", -1), ("min_free_bytes", 1.5), ("peer_quota_window", 0), ("max_file_size", True)],
)
def test_bad_limits_are_refused_naming_the_limit(field, value):
    """A negative or non-integer byte limit, or a window that is not a positive number, is a ValueError
    naming it."""
    with pytest.raises(ValueError, match=field):
        ChatReactor(**{field: value})


# -- the spec and the example -----------------------------------------------------------


def spec_section(number: str) -> str:
    text = (ROOT / "specs" / "chat.md").read_text()
    return text.split(f"\n### {number} ", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]


def test_the_spec_lists_every_refusal_code_and_every_limit_with_its_default():
    """specs/chat.md section 3.1 has a row for each REFUSE code with its number, and for each FileLimits field
    with the default the code uses and the example's option."""
    section = spec_section("3.1")
    codes = dict(re.findall(r"^\| `(\d+)` \| `(\w+)` \|", section, re.MULTILINE))
    assert {int(n): name for n, name in codes.items()} == chat.REFUSALS
    rows = re.findall(r"^\| `(\w+)` \| `--([\w-]+)` \| (\d+(?:\.\d+)?) ", section, re.MULTILINE)
    assert {name: float(default) for name, _, default in rows} == {
        f: float(getattr(FileLimits(), f)) for f in FileLimits.__dataclass_fields__
    }
    assert all(option == name.replace("_", "-") for name, option, _ in rows)


def load_example():
    spec = importlib.util.spec_from_file_location("chat_example", ROOT / "examples" / "chat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_takes_every_limit_as_an_option():
    """examples/chat.py has an option per file limit, with FileLimits' default, and passes them to the
    ChatReactor; a bad value stops it with a usage error."""
    example = load_example()
    options = example.Options()
    options.parseOptions(["--peer-quota-bytes", "5000", "--peer-quota-window", "60", "--min-free-bytes", "0"])
    reactor = ChatReactor("x", **example.limits_of(options))
    assert reactor.limits == FileLimits(peer_quota_bytes=5000, peer_quota_window=60.0, min_free_bytes=0)
    defaults = example.Options()
    defaults.parseOptions([])
    assert example.limits_of(defaults) == dataclass_dict(FileLimits())
    with pytest.raises(example.usage.UsageError, match="peer_quota_bytes must be a number of bytes >= 0"):
        example.Options().parseOptions(["--peer-quota-bytes", "-1"])


def dataclass_dict(limits):
    return {f: getattr(limits, f) for f in FileLimits.__dataclass_fields__}
