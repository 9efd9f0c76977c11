"""Strangers cannot take a node's file descriptors.

A node in its own process (descriptor_node.py) may open at most NOFILE (160)
descriptors. Silent sockets from 40 loopback addresses, 10 each (400 in all, more than
twice what it may open), connect and say nothing; they are held open for the whole test.
Every one of them is a pending handshake from the TCP accept on, so at most
``max_pending_handshakes`` (64) are kept and each newcomer of a new address group pushes
out the oldest of the largest group: the node's open descriptors stay near that bound,
never reach NOFILE, and an honest peer from another address gets a session while the
attack is still going on. Over tcp and ws (a WebSocket connection is counted from the
accept too, before its upgrade).

The node process is stopped by its PID; every socket is closed.
"""

from __future__ import annotations

import json
import os
import pathlib
import select
import socket
import subprocess
import sys

import pytest
import pytest_twisted

from helpers import bounded, stop_switches, the_reactor, until
from mconn import ChannelDescriptor, Config, Reactor, Switch

pytestmark = pytest.mark.integration

NODE = pathlib.Path(__file__).with_name("descriptor_node.py")
ROOT = pathlib.Path(__file__).resolve().parents[2]
NOFILE = 160
ADDRESSES = [f"127.0.1.{i}" for i in range(1, 41)]
PER_ADDRESS = 10
#: Descriptors a node holds beside its pending handshakes: stdio, the listening port, the
#: epoll and waker descriptors, Python's own; measured at 12-14 when idle.
BASE_DESCRIPTORS = 24


class Quiet(Reactor):
    def get_channels(self):
        return [ChannelDescriptor(0x20)]

    def receive(self, channel_id, peer, message):
        pass


def read_event(process, seconds: float = 20.0) -> dict:
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    assert ready, f"no line from the node within {seconds} s"
    line = process.stdout.readline()
    assert line, f"the node ended: {process.stderr.read()}"
    return json.loads(line)


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.parametrize("scheme", ["tcp", "ws"])
@pytest_twisted.ensureDeferred
async def test_silent_sockets_cannot_exhaust_a_nodes_descriptors(scheme):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen(
        [sys.executable, str(NODE), str(NOFILE), scheme],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    held: list[socket.socket] = []
    honest = None
    try:
        started = read_event(process)
        assert started["event"] == "listening", started
        port = started["port"]
        for _ in range(PER_ADDRESS):
            for address in ADDRESSES:
                try:
                    held.append(socket.create_connection(("127.0.0.1", port), timeout=2, source_address=(address, 0)))
                except OSError:
                    pass  # the listen backlog was full for a moment: that socket never got in
        assert len(held) >= 300, f"only {len(held)} of {PER_ADDRESS * len(ADDRESSES)} sockets connected"
        honest = Switch([Quiet()], clock=the_reactor(), config=Config(stats_interval=0, local_address="127.0.2.1"))
        honest.startService()
        target = f"{started['node_id']}@127.0.0.1:{port}"
        if scheme == "ws":
            target = f"{started['node_id']}@ws://127.0.0.1:{port}/mconn"
        peer = await bounded(honest.dial(target), 20)
        assert peer.node_id == started["node_id"]
        assert read_event(process)["event"] == "add_peer"
        # Refused and evicted sockets are closed once their close packet is written.
        bound = Config().max_pending_handshakes + BASE_DESCRIPTORS
        await until(
            lambda: process.poll() is not None or open_descriptors(process.pid) <= bound,
            f"the node to hold at most {bound} descriptors",
        )
        assert process.poll() is None, f"the node died: {process.stderr.read()}"
    finally:
        for sock in held:
            sock.close()
        if honest is not None:
            await stop_switches(honest)
        process.kill()
        process.wait(timeout=10)
        process.stdout.close()
        process.stderr.close()
