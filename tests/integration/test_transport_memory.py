"""A TCP transport's first send from Twisted's buffer builds no dict of its own
(mconn/net/write_through.py, ``share_buffer_keys``; bench/RESULTS.md, "Memory per peer").

Twisted's ``doWrite`` sets ``dataBuffer`` and ``offset`` on a transport the first time
it sends from its buffer. CPython stops adding names to the attribute keys a class's
instances share after its first few dozen instances, and an instance that sets a name
not among them gets a dict of its own: 832 bytes a TCP transport. With write-through
a listener's first connections never send from Twisted's buffer, so without mconn
putting both names in the keys first, every later peer that is sent anything from a
timer (the stats tick's probe, a reactor's send) paid that dict: 0.8 KiB a peer at
10,000 idle peers. The node runs in a process of its own (transport_memory_node.py):
what the class's keys hold depends on what its first instances in the process set.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

NODE = pathlib.Path(__file__).with_name("transport_memory_node.py")
TESTS = pathlib.Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
#: More than the ~30 instances after which a class's keys take no new name.
PEERS = 60


def test_a_transport_sending_from_twisteds_buffer_keeps_its_attributes_without_a_dict():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]))
    done = subprocess.run([sys.executable, str(NODE), str(PEERS)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["peers"] == PEERS, report
    # Every message went through Twisted's buffer (a send outside a read), so every
    # transport ran doWrite: the case the dict came from.
    assert report["buffered"] == PEERS, report
    # A dict is 832 bytes a transport; without one, doWrite's new list replaces the old.
    assert report["abstract_bytes"] < 200, report
