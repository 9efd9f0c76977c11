"""A reactor that records its lifecycle calls, for the tests of a start that fails.

``twistd mconn --reactor operators.lifecycle_reactor:Lifecycle`` builds it; with
``MCONN_TEST_LIFECYCLE`` set to a path in the environment, each call is also appended to
that file as a line (``start_reactor``, ``stop_reactor``), so a test can read what a
twistd process did after it exited.
"""

import os

from mconn import ChannelDescriptor, Reactor


class Lifecycle(Reactor):
    """Owns channel 0x60; ``calls`` lists ``start_reactor`` and ``stop_reactor`` in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def get_channels(self):
        return [ChannelDescriptor(0x60, priority=1)]

    def start_reactor(self) -> None:
        self._record("start_reactor")

    def stop_reactor(self) -> None:
        self._record("stop_reactor")

    def _record(self, call: str) -> None:
        self.calls.append(call)
        path = os.environ.get("MCONN_TEST_LIFECYCLE")
        if path:
            with open(path, "a") as f:
                f.write(call + "\n")
