"""Which implementation of the per-packet path runs: the compiled twin or pure Python.

``mconn.core._speedups`` (Cython, mconn/core/_speedups.pyx) is an optional extension
built by the install (``make``; setup.py): where it is importable it replaces the pure
functions it mirrors (receiving: ``frame_buffer.decode_packets``,
``connection.process_msgs``; sending: ``channel.schedule``, the scheduler's pick and the
packets' framing; the session's ``Session.admit`` and ``Session.record_delivered``),
unless the environment sets ``MCONN_PURE=1`` when mconn is first imported. The pure
functions stay the reference and the fallback; tests/core/test_speedups_twin.py,
test_speedups_process.py, test_speedups_send.py and test_speedups_session.py prove the
two byte- and event-identical. ``mconn --version`` says which is in use.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

#: The interface version of the extension this source expects: a stale build (an
#: older _speedups.pyx compiled) is not used, mconn runs on the pure functions instead.
INTERFACE = 7


def load_extension(name: str, interface: int) -> tuple[ModuleType | None, str]:
    """The compiled module ``name`` if it is built, of ``interface`` and wanted (not
    ``MCONN_PURE=1``), else None; and why not, when it is not. The WebSocket frames'
    twin (mconn.net.websocket_frames) is chosen by the same rule."""
    if os.environ.get("MCONN_PURE") == "1":
        return None, "MCONN_PURE=1"
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None, "the extension is not built"
    if getattr(module, "INTERFACE", None) != interface:
        return None, f"the extension is stale (interface {getattr(module, 'INTERFACE', None)}, expected {interface})"
    return module, ""


def _load() -> tuple[ModuleType | None, str]:
    return load_extension("mconn.core._speedups", INTERFACE)


#: The compiled module when it is in use, else None; and why not, when it is not.
SPEEDUPS, WHY_PURE = _load()
#: "accelerated" or "pure Python".
IMPLEMENTATION = "accelerated" if SPEEDUPS is not None else "pure Python"


def describe() -> str:
    """One line for people: which implementation runs, and why when it is pure Python."""
    return IMPLEMENTATION if SPEEDUPS is not None else f"{IMPLEMENTATION} ({WHY_PURE})"
