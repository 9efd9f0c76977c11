"""atheris harness for the chat decoder, reactors/chat_wire.py (long runs, not in CI).

The target (tests/fuzz/message_target.py, ``fuzz_chat``) takes a message of either chat
channel raw or builds it from chat_wire.DECLARATIONS, decodes it, and checks that a
failure is the module's MalformedChatMessage or ChatMessageTooLarge, that a success
encodes back to the same bytes, and that time and work are bounded.

    python tests/fuzz/make_corpus.py                         # seeds
    python tests/fuzz/fuzz_chat.py tests/fuzz/corpus/chat    # fuzz (atheris / libFuzzer flags)

See tests/fuzz/README.md.
"""

from __future__ import annotations

import sys

import harness

fuzz_chat = harness.load("tests.fuzz.message_target", "fuzz_chat", ["reactors", "mconn", "construct"])

if __name__ == "__main__":
    sys.exit(harness.main(sys.argv, fuzz_chat))
