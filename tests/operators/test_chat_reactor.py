"""The chat reactor on real Switches over 127.0.0.1 (pytest-twisted): gossip, dedup,
priorities, file transfer and what a hostile or careless peer gets (specs/chat.md).

Every wait is bounded (TIMEOUT) and every Switch started is stopped.
"""

import hashlib
import os

import pytest
import pytest_twisted
from twisted.internet import defer

from helpers import RecordingReactor, bounded, sleep, the_reactor, until
from mconn import Config, PeerClosed, Switch
from reactors import chat
from reactors.chat import CHAT, FILE, ChatReactor

pytestmark = pytest.mark.integration

TIMEOUT = 10.0
CONFIG = Config(stats_interval=0)


class Net:
    """Chat nodes on 127.0.0.1; ``stop()`` stops every Switch it started."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.switches = []

    async def node(self, name, reactor=None, **kwargs):
        if reactor is None:
            reactor = ChatReactor(name, downloads=str(self.tmp_path / name), **kwargs)
            reactor.events = []
            reactor.on_line = lambda line, r=reactor: r.events.append(("line", line))
            reactor.on_file = lambda f, r=reactor: r.events.append(("file", f))
            reactor.on_status = lambda node_id, status, detail, r=reactor: r.events.append(("status", status, detail))
            reactor.on_refused = lambda refused, r=reactor: r.events.append(("refused", refused))
        switch = Switch([reactor], config=CONFIG, clock=the_reactor())
        switch.startService()
        port = await switch.listen("tcp:0:interface=127.0.0.1")
        switch.address = f"{switch.node_id}@127.0.0.1:{port.getHost().port}"
        self.switches.append(switch)
        return switch

    async def link(self, a, b, **kwargs):
        """a dials b; waits until both hold the session and know each other's names."""
        await bounded(a.dial(b.address, **kwargs))
        ra, rb = a.reactors[0], b.reactors[0]
        await until(lambda: a.node_id in b.peers, "the inbound side's session")
        if isinstance(ra, ChatReactor) and isinstance(rb, ChatReactor):
            await until(lambda: b.node_id in ra.names and a.node_id in rb.names, "the names")

    async def stop(self):
        await bounded(defer.gatherResults([defer.maybeDeferred(s.stopService) for s in self.switches]))


def lines(reactor):
    return [e[1] for e in reactor.events if e[0] == "line"]


def random_file(path, size):
    data = os.urandom(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


# -- gossip ---------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_line_crosses_a_line_of_three_nodes_through_the_middle_exactly_once(tmp_path):
    """In a line of three nodes a chat line reaches the far end through the middle once, with its origin, via
    and hop count, and never comes back."""
    net = Net(tmp_path)
    try:
        a, b, c = [await net.node(n) for n in ("alice", "bob", "carol")]
        await net.link(a, b)
        await net.link(c, b)
        ra, rb, rc = (s.reactors[0] for s in (a, b, c))
        line_id = ra.say("hello from alice")
        await until(lambda: lines(rc), "carol to get the line")
        await sleep(0.2)  # room for a second copy to show up
        [at_b], [at_c] = lines(rb), lines(rc)
        assert (at_c.id, at_c.text, at_c.name, at_c.origin) == (line_id, "hello from alice", "alice", a.node_id)
        assert at_c.via == b.node_id and at_c.hops == 1 and at_b.hops == 0
        assert lines(ra) == [] and [r.lines_seen for r in (ra, rb, rc)] == [0, 1, 1]
        assert [r.duplicates_dropped for r in (ra, rb, rc)] == [0, 0, 0], "a line went back where it came from"
    finally:
        await net.stop()


@pytest_twisted.ensureDeferred
async def test_in_a_triangle_each_node_shows_a_line_once_and_drops_the_copies(tmp_path):
    """In a triangle each node shows every line once and drops the copies that arrive by the other way round."""
    net = Net(tmp_path)
    try:
        a, b, c = [await net.node(n) for n in ("alice", "bob", "carol")]
        await net.link(a, b)
        await net.link(b, c)
        await net.link(c, a)
        ra, rb, rc = (s.reactors[0] for s in (a, b, c))
        rb.say("one")
        rc.say("two")
        await until(lambda: len(lines(ra)) == 2 and len(lines(rb)) == 1 and len(lines(rc)) == 1, "the lines")
        await until(lambda: ra.duplicates_dropped + rb.duplicates_dropped + rc.duplicates_dropped >= 2, "the copies")
        await sleep(0.2)
        assert sorted(line.text for line in lines(ra)) == ["one", "two"]
        assert [line.text for line in lines(rb)] == ["two"] and [line.text for line in lines(rc)] == ["one"]
    finally:
        await net.stop()


@pytest_twisted.ensureDeferred
async def test_the_same_line_id_twice_from_a_peer_is_shown_once(tmp_path):
    """A line id sent twice by a peer is shown once; the second copy is counted as a duplicate."""
    net = Net(tmp_path)
    try:
        raw = RecordingReactor(ChatReactor().get_channels())
        a, b = await net.node("raw", reactor=raw), await net.node("bob")
        await net.link(a, b)
        origin = bytes.fromhex(a.node_id)
        line = chat.encode(CHAT, chat.LINE, id=b"\x07" * 16, origin=origin, hops=0, name="raw", text="hi")
        peer = a.peers[b.node_id]
        assert await peer.send(CHAT, line) and await peer.send(CHAT, line)
        rb = b.reactors[0]
        await until(lambda: rb.duplicates_dropped == 1, "the copy to be dropped")
        assert [x.text for x in lines(rb)] == ["hi"] and rb.lines_seen == 1
    finally:
        await net.stop()


# -- files ----------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_chat_line_overtakes_a_large_file_and_the_file_arrives_intact(tmp_path):
    """A chat line said during a 16 MiB file transfer arrives before the file, and the file arrives intact at
    both peers with no .part left."""
    net = Net(tmp_path)
    try:
        a, b, c = [await net.node(n) for n in ("alice", "bob", "carol")]
        await net.link(a, b)
        await net.link(a, c)
        ra, rb, rc = (s.reactors[0] for s in (a, b, c))
        digest = random_file(tmp_path / "big.bin", 16 << 20)
        progress = []
        said = []

        def on_progress(sent, total):
            progress.append((sent, total))
            if len(progress) == 8:  # well under way: 8 of 512 chunks accepted
                said.append(ra.say("chat while the file moves"))

        receipts = await bounded(ra.send_file(tmp_path / "big.bin", on_progress), 60)
        assert receipts == {b.node_id: chat.FileReceipt(True), c.node_id: chat.FileReceipt(True)}
        assert progress[-1] == (16 << 20, 16 << 20) and said  # the file's bytes, once for both peers
        for r, name in ((rb, "bob"), (rc, "carol")):
            kinds = [e[0] for e in r.events if e[0] in ("line", "file")]
            assert kinds == ["line", "file"], f"{name} got the chat line after the file: {kinds}"
            [(_, received)] = [e for e in r.events if e[0] == "file"]
            assert received.path == str(tmp_path / name / "big.bin") and received.sender == a.node_id
            assert hashlib.sha256(open(received.path, "rb").read()).hexdigest() == digest == received.sha256
            assert os.listdir(tmp_path / name) == ["big.bin"], "a .part file was left behind"
            assert r.files_received == 1
    finally:
        await net.stop()


@pytest_twisted.ensureDeferred
async def test_an_oversized_file_is_refused_and_the_next_one_still_arrives(tmp_path):
    """A file over the receiver's max_file_size is refused with a reason and nothing stored; a smaller one
    still arrives intact."""
    net = Net(tmp_path)
    try:
        a, b = await net.node("alice"), await net.node("bob", max_file_size=100_000)
        await net.link(a, b)
        ra, rb = a.reactors[0], b.reactors[0]
        random_file(tmp_path / "huge.bin", 4 << 20)
        receipts = await bounded(ra.send_file(tmp_path / "huge.bin"))
        [receipt] = receipts.values()
        assert not receipt and "4194304 bytes is larger than max_file_size 100000" in receipt.reason
        assert not os.path.exists(tmp_path / "bob") or os.listdir(tmp_path / "bob") == []
        digest = random_file(tmp_path / "small.bin", 50_000)
        assert list((await bounded(ra.send_file(tmp_path / "small.bin"))).values()) == [chat.FileReceipt(True)]
        assert hashlib.sha256((tmp_path / "bob" / "small.bin").read_bytes()).hexdigest() == digest
        assert rb.files_received == 1 and b.node_id in a.peers
    finally:
        await net.stop()


@pytest_twisted.ensureDeferred
async def test_a_file_that_cannot_be_stored_is_refused_and_the_sender_stays(tmp_path):
    """A file the receiver cannot store is refused with a reason, and the sender stays connected."""
    net = Net(tmp_path)
    try:
        a, b = await net.node("alice"), await net.node("bob")
        (tmp_path / "bob").write_text("a file where the downloads directory should be")
        await net.link(a, b)
        random_file(tmp_path / "f.bin", 300_000)
        [receipt] = (await bounded(a.reactors[0].send_file(tmp_path / "f.bin"))).values()
        assert not receipt and receipt.reason.startswith(f"refused: cannot store f.bin in {tmp_path / 'bob'}")
        assert list(a.peers) == [b.node_id]
    finally:
        await net.stop()


@pytest_twisted.ensureDeferred
async def test_odd_names_are_sanitised_and_never_overwrite(tmp_path):
    """Odd file names are sanitised, a second file of the same name gets a new name instead of overwriting,
    and an empty file arrives."""
    net = Net(tmp_path)
    try:
        a, b = await net.node("alice"), await net.node("bob")
        await net.link(a, b)
        ra = a.reactors[0]
        odd = tmp_path / ".hid\x07den"
        random_file(odd, 1000)
        for _ in range(2):
            assert all((await bounded(ra.send_file(odd))).values())
        assert sorted(os.listdir(tmp_path / "bob")) == ["_hid_den", "_hid_den (1)"]
        empty = tmp_path / "empty.txt"
        empty.write_bytes(b"")
        assert all((await bounded(ra.send_file(empty))).values())
        assert (tmp_path / "bob" / "empty.txt").read_bytes() == b""
    finally:
        await net.stop()


# -- bad input ------------------------------------------------------------------------

TRANSFER = b"\x01" * 16
BAD = {
    "unknown kind": (CHAT, b"\x09hello", "MalformedChatMessage: unknown message kind 0x09 on channel 0x20"),
    "truncated line": (CHAT, b"\x02" + b"\x00" * 20, "MalformedChatMessage: kind 0x02 on channel 0x20"),
    "text over the limit": (
        CHAT,
        chat.encode(CHAT, chat.LINE, id=b"\x02" * 16, origin=b"\x03" * 20, hops=0, name="x", text="y" * 4001),
        "MalformedChatMessage: text of 4001 bytes; the largest is 4000",
    ),
    "not utf-8": (CHAT, b"\x01\x02\xff\xfe", "MalformedChatMessage: kind 0x01 on channel 0x20"),
    "path traversal": (
        FILE,
        chat.encode(FILE, chat.OFFER, transfer=TRANSFER, size=5, sha256=b"\x00" * 32, name="../../evil"),
        "UnsafeFileName: offered file name '../../evil' is a path",
    ),
    "chunk of no transfer": (
        FILE,
        chat.encode(FILE, chat.CHUNK, transfer=TRANSFER, data=b"data"),
        "UnexpectedFileMessage: a chunk for transfer 0101",
    ),
    "receipt of no transfer": (
        FILE,
        chat.encode(FILE, chat.RECEIPT, transfer=TRANSFER, ok=True, reason=""),
        "UnexpectedFileMessage: a receipt for transfer 0101",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest_twisted.ensureDeferred
async def test_a_bad_message_drops_its_sender_with_a_specific_reason_and_others_carry_on(tmp_path, case):
    """A malformed chat message drops its sender with a close naming the problem; other peers keep chatting
    and nothing is written."""
    channel_id, message, expected = BAD[case]
    net = Net(tmp_path)
    try:
        raw = RecordingReactor(ChatReactor().get_channels())
        bad, b, c = await net.node("raw", reactor=raw), await net.node("bob"), await net.node("carol")
        await net.link(bad, b)
        await net.link(c, b)
        assert await bad.peers[b.node_id].send(channel_id, message)
        await until(lambda: any(call[0] == "remove_peer" for call in raw.calls), "the bad peer to be dropped")
        [(_, _, reason)] = [call for call in raw.calls if call[0] == "remove_peer"]
        assert isinstance(reason, PeerClosed) and reason.code == "closed" and reason.text.startswith(expected), reason
        rb, rc = b.reactors[0], c.reactors[0]
        assert ("status", "dropped", reason.text) in rb.events and rb.peers_dropped == 1
        rc.say("still here")
        await until(lambda: lines(rb), "bob to hear carol")
        assert list(b.peers) == [c.node_id]
        assert os.listdir(tmp_path) == [], "something was written"  # no downloads dir at all
    finally:
        await net.stop()


def test_a_message_longer_than_its_channel_allows_is_refused_before_parsing():
    """A file-channel message one byte over its limit is refused as ChatMessageTooLarge before parsing; one
    byte under is decoded."""
    with pytest.raises(chat.ChatMessageTooLarge, match=f"of {chat.MAX_FILE_MESSAGE + 1} bytes on channel 0x21"):
        chat.decode(FILE, b"\x02" + b"\x00" * chat.MAX_FILE_MESSAGE)
    assert chat.decode(FILE, b"\x02" + b"\x00" * (chat.MAX_FILE_MESSAGE - 1))[0] == chat.CHUNK


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "..\\x", "nul\x00"])
def test_path_names_are_refused(name):
    """Empty, dot, parent, path-separated and NUL-bearing file names are refused as UnsafeFileName."""
    with pytest.raises(chat.UnsafeFileName):
        chat.safe_file_name(name)


# -- breaks ---------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_transfer_survives_a_transport_break_and_the_status_says_so(tmp_path):
    """A file transfer survives a transport reset mid-file through resume and arrives intact; both sides show
    joined, suspended, resumed."""
    net = Net(tmp_path)
    try:
        a, b = await net.node("alice"), await net.node("bob")
        await net.link(a, b, persistent=True)
        ra, rb = a.reactors[0], b.reactors[0]
        digest = random_file(tmp_path / "f.bin", 8 << 20)
        broke = []

        def on_progress(sent, total):
            if sent >= total // 4 and not broke:
                broke.append(sent)
                a.peers[b.node_id]._protocol.transport.abortConnection()  # a reset, mid-file

        receipts = await bounded(ra.send_file(tmp_path / "f.bin", on_progress), 30)
        assert list(receipts.values()) == [chat.FileReceipt(True)] and broke
        assert hashlib.sha256((tmp_path / "bob" / "f.bin").read_bytes()).hexdigest() == digest
        for r in (ra, rb):
            statuses = [e[1] for e in r.events if e[0] == "status"]
            assert statuses == ["joined", "suspended", "resumed"], statuses
    finally:
        await net.stop()
