"""Peer-controlled text reaches the terminal only as printable text (specs/chat.md section 5).

``printable`` on its own, then examples/chat.py's output and bottom toolbar rendered by
prompt_toolkit into a string, for a peer whose name is a terminal command. The same in a
real terminal is in test_chat_terminal.py.
"""

import contextlib
import io
import unicodedata

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.data_structures import Size
from prompt_toolkit.formatted_text import to_formatted_text
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output.vt100 import Vt100_Output

from operators.test_chat_quotas import load_example
from reactors.chat import ChatLine, ChatReactor, FileRefused, ReceivedFile, printable

HOSTILE = "\x01\x1b]0;pwned\x07\x1b[2J\x02mallory"
SHOWN = "\\x01\\x1b]0;pwned\\x07\\x1b[2J\\x02mallory"


@pytest.mark.parametrize(
    "text, shown",
    [
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
        ("\x1b[2J", "\\x1b[2J"),
        ("fake\r[alice] hi\nnext", "fake\\r[alice] hi\\nnext"),
        ("c1 \x9b2J del \x7f tab\t", "c1 \\x9b2J del \\x7f tab\\t"),
        ("bidi \u202eexe.txt", "bidi \\u202eexe.txt"),
        ("line sep \u2028 para \u2029", "line sep \\u2028 para \\u2029"),
        (HOSTILE, SHOWN),
    ],
)
def test_control_and_format_characters_become_visible_escapes(text, shown):
    """C0, DEL, C1, bidi overrides and line separators are replaced by their Python escapes."""
    assert printable(text) == shown


def test_ordinary_text_is_left_as_it_is():
    """Letters of any script, punctuation, emoji (joined with ZWJ) and box drawing are unchanged."""
    text = "héllo wörld — 你好 שלום 👩\u200d👩\u200d👧 ━━╺ … \\x1b"
    assert printable(text) == text


class FakePeer:
    def __init__(self, node_id):
        self.node_id = node_id
        self.state = "connected"


class FakeSwitch:
    def __init__(self, *node_ids):
        self.node_id = "0" * 40
        self.peers = {n: FakePeer(n) for n in node_ids}


@contextlib.contextmanager
def hostile_terminal():
    """examples/chat.py's ChatTerminal with a peer named HOSTILE, on a VT100 output written to a string."""
    example = load_example()
    screen = io.StringIO()
    output = Vt100_Output(screen, lambda: Size(rows=24, columns=200), term="xterm")
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=output):
        chat = ChatReactor("alice")
        mallory = "ab" * 20
        chat.names[mallory] = HOSTILE
        terminal = example.ChatTerminal(FakeSwitch(mallory), chat, clock=None)
        terminal.screen = screen
        terminal.mallory = mallory
        yield terminal


def test_the_toolbar_shows_a_hostile_name_as_text_and_passes_nothing_raw():
    """The bottom toolbar's fragments hold the peer's name escaped, no control character and no zero-width
    escape (text prompt_toolkit would write to the terminal as is), with or without the progress bar."""
    with hostile_terminal() as terminal:
        for sending in (None, ("photo.bin", 5, 10)):
            terminal.sending = sending
            fragments = to_formatted_text(terminal.toolbar())
            text = "".join(t for _, t, *_ in fragments)
            assert SHOWN in text and ("━" in text) == (sending is not None)
            assert not [s for s, *_ in fragments if "ZeroWidthEscape" in s], fragments
            assert not [c for c in text if unicodedata.category(c) == "Cc"], text


def test_lines_files_and_refusals_from_a_hostile_peer_print_as_text():
    """What a peer chose (its name, a line, a file name, a refusal's reason) is written to the terminal with
    its control characters escaped: no BEL, no title or clear-screen sequence reaches it."""
    with hostile_terminal() as terminal:
        m = terminal.mallory
        terminal.show_line(ChatLine(id="1", origin=m, name=HOSTILE, text="hi\x07\rthere", hops=0, via=m))
        terminal.show_file(ReceivedFile(path="/d/x", name="x\x1b[2J", size=1, sha256="00" * 32, sender=m))
        refused = FileRefused(
            transfer="01", name="f", size=1, peer=m, by_us=False, code="peer_quota", reason="no\x1b]0;x\x07",
            retry_after=5,
        )  # fmt: skip
        terminal.show_refused(refused)
    written = terminal.screen.getvalue()
    assert f"[{SHOWN}] hi\\x07\\rthere" in written and "x\\x1b[2J" in written and "no\\x1b]0;x\\x07" in written
    assert "\x07" not in written and "\x1b]" not in written and "\x1b[2J" not in written and "\rthere" not in written
