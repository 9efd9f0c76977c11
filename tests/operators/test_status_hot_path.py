"""The status page and ``/status.json`` say which per-packet path the node runs
(mconn.core.speedups, specs/status.md section 2: ``hot_path``, ``hot_path_why``), and
which code builds and reads WebSocket frames (mconn.net.websocket_frames: ``ws_frames``,
``ws_frames_why``).

In this process the page of a live Switch, rendered by a real headless Chromium, names
the path this process imported, as ``mconn --version`` does. Then real ``twistd mconn``
nodes on 127.0.0.1, stopped by their PIDs: one with ``MCONN_PURE=1`` in its environment,
one whose Python cannot import the compiled extensions (a ``sitecustomize`` on its path
blocks ``mconn.core._speedups`` and ``mconn.net._wsframe``, as a failed build leaves them
missing); each one's document, page and ``mconn --version`` say pure Python and why.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import urllib.request

import pytest
import pytest_twisted
from twisted.internet import defer, threads

from helpers import the_reactor
from mconn import Switch
from mconn.core import speedups
from mconn.net import websocket_frames
from mconn.ops.status import serve_status
from browser import run_browser
from operators.test_status import CONFIG, Sink
from operators.twistd_nodes import ENV, LOOPBACK, TIMEOUT, TWISTD, Node

pytestmark = pytest.mark.integration

MCONN = pathlib.Path(sys.executable).with_name("mconn")
CHAT = ("--reactor", "operators.sample_reactors:Chat")
#: A sitecustomize that makes the compiled extensions unimportable, as when they were never built.
NOT_BUILT = (
    "import sys\n"
    'sys.modules["mconn.core._speedups"] = None  # import raises ImportError\n'
    'sys.modules["mconn.net._wsframe"] = None\n'
)
#: The page's lines, as the browser rendered them.
HOT_PATH_SPAN = re.compile(r'<span class="hot-path">hot path: ([^<]*)</span>')
WS_FRAMES_SPAN = re.compile(r'<span class="ws-frames">ws frames: ([^<]*)</span>')


def status_of(url: str) -> dict:
    with urllib.request.urlopen(url + "status.json", timeout=TIMEOUT) as response:
        return json.loads(response.read())


def rendered_hot_path(url: str) -> str:
    """What the page's hot-path and ws-frames lines say once a headless browser has
    rendered it, joined as ``mconn --version`` joins them."""
    dom = run_browser("--virtual-time-budget=3000", "--dump-dom", url)
    match, ws = HOT_PATH_SPAN.search(dom), WS_FRAMES_SPAN.search(dom)
    assert match and ws, f"no hot-path or ws-frames line on the rendered page:\n{dom[:3000]}"
    return f"{match.group(1)}; ws frames {ws.group(1)}"


def version_line(env: dict) -> str:
    shown = subprocess.run([str(MCONN), "--version"], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.strip()


class EnvNode(Node):
    """A twistd node whose environment is ``env`` (twistd_nodes.Node's is ENV)."""

    def __init__(self, directory: pathlib.Path, name: str, env: dict) -> None:
        super().__init__(directory, name)
        self.env = env

    def start(self, *args: str) -> EnvNode:
        command = [str(TWISTD), "-n", "--pidfile", "", "mconn", "--key", str(self.key), "--create-key"]
        command += ["--telemetry", str(self.telemetry), *args]
        with open(self.output, "wb") as out:
            self.process = subprocess.Popen(
                command, cwd=self.directory, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        return self


@pytest.fixture
def env_nodes(tmp_path):
    """Starts EnvNode processes; kills any still running at the end, by PID."""
    started = []

    def node(name: str, env: dict) -> EnvNode:
        started.append(EnvNode(tmp_path, name, env))
        return started[-1]

    yield node
    for n in started:
        n.kill()


@pytest_twisted.ensureDeferred
async def test_the_page_of_this_process_names_the_path_it_imported():
    """status.json and the rendered page name the path this process runs, as mconn --version does."""
    switch = Switch([Sink()], config=CONFIG, clock=the_reactor())
    switch.startService()
    service = await serve_status(switch, interval=0.1)
    try:
        document = await threads.deferToThread(status_of, service.url)
        assert document["hot_path"] == speedups.IMPLEMENTATION
        assert document["hot_path_why"] == (speedups.WHY_PURE or None)
        assert document["ws_frames"] == websocket_frames.IMPLEMENTATION
        assert document["ws_frames_why"] == (websocket_frames.WSFRAME_WHY or None)
        shown = await threads.deferToThread(rendered_hot_path, service.url)
        both = f"{speedups.describe()}; ws frames {websocket_frames.describe()}"
        assert shown == both
        assert version_line(ENV).endswith(f"({both})")
    finally:
        await defer.DeferredList([defer.maybeDeferred(s.stopService) for s in (service, switch)])


def test_a_node_run_with_mconn_pure_says_pure_python_and_why(env_nodes):
    """A twistd node with MCONN_PURE=1 says pure Python (MCONN_PURE=1) on its status page and document."""
    env = dict(ENV, MCONN_PURE="1")
    node = env_nodes("pure", env).start("--listen", LOOPBACK, *CHAT, "--status", LOOPBACK)
    document = status_of(node.status_url)
    assert (document["hot_path"], document["hot_path_why"]) == ("pure Python", "MCONN_PURE=1")
    assert (document["ws_frames"], document["ws_frames_why"]) == ("pure Python", "MCONN_PURE=1")
    both = "pure Python (MCONN_PURE=1); ws frames pure Python (MCONN_PURE=1)"
    assert rendered_hot_path(node.status_url) == both
    assert version_line(env).endswith(f"({both})")
    node.terminate()


def test_a_node_without_the_extension_says_pure_python_and_why(env_nodes, tmp_path):
    """A twistd node that cannot import the compiled extension says so on its status page and document."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NOT_BUILT)
    env = dict(ENV, PYTHONPATH=f"{site}:{ENV['PYTHONPATH']}")
    env.pop("MCONN_PURE", None)
    node = env_nodes("unbuilt", env).start("--listen", LOOPBACK, *CHAT, "--status", LOOPBACK)
    document = status_of(node.status_url)
    assert (document["hot_path"], document["hot_path_why"]) == ("pure Python", "the extension is not built")
    assert (document["ws_frames"], document["ws_frames_why"]) == ("pure Python", "the extension is not built")
    both = "pure Python (the extension is not built); ws frames pure Python (the extension is not built)"
    assert rendered_hot_path(node.status_url) == both
    assert version_line(env).endswith(f"({both})")
    node.terminate()
