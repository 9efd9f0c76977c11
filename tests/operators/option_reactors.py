"""A reactor with options, for ``twistd mconn --reactor operators.option_reactors:Greeter
--reactor-option Greeter.KEY=VALUE`` and ``[reactors.Greeter]`` (specs/reactor-api.md,
"Reactors under twistd")."""

from __future__ import annotations

from twisted.logger import Logger

from mconn import ChannelDescriptor, Reactor

log = Logger(namespace="greeter")


class Greeter(Reactor):
    """Owns channel 0x30; logs its options, with their types, when it starts, and shows
    them in its status section."""

    def __init__(
        self, greeting: str = "hello", repeat: int = 1, *, loud: bool = False, ratio: float | None = None, tags=()
    ) -> None:
        self.options = {"greeting": greeting, "repeat": repeat, "loud": loud, "ratio": ratio, "tags": tags}

    def get_channels(self):
        return [ChannelDescriptor(0x30, priority=1)]

    def start_reactor(self) -> None:
        log.info("greeter options: {shown}", shown=self.shown())

    def shown(self) -> str:
        """``greeting='hi' (str), repeat=3 (int), ...``"""
        return ", ".join(f"{k}={v!r} ({type(v).__name__})" for k, v in self.options.items())

    def status(self):
        return {"options": self.shown()}
