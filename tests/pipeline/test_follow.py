"""``mconn-pipeline --follow``: a real small fleet on 127.0.0.1 with the follower beside it
(specs/pipeline.md section 9).

Three Switches (A listens; B dials A; C dials A through a fault proxy) write their
telemetry with rotation by age on (``TelemetryFileService(rotate_seconds=1)``: closed
files under names that never change), exchange messages both ways, and the proxy resets
C's link once (a resume). The follower runs as a subprocess on its own Spark; the test
fetches its page while the fleet runs (a link and the resume shown), stops the fleet,
waits until the follower has read every closed file, stops it by its PID, and checks that
its live links, reconnects and delivery_audit tables equal the batch run's on the same
files (``exceptAll`` both ways). Every wait is bounded.
"""

import json
import os
import pathlib
import re
import signal
import sys

import pytest
import pytest_twisted
import urllib.request

from twisted.internet import defer, protocol, threads

from faultproxy import FaultProxy
from helpers import bounded, sleep, the_reactor, until
from integration.test_loopback import Collector, stop
from mconn import ChannelDescriptor, Config, Switch
from mconn.ops.telemetry_file import TelemetryFileService, closed_paths

pytestmark = pytest.mark.integration

PIPELINE = pathlib.Path(sys.executable).with_name("mconn-pipeline")
CHANNELS = [ChannelDescriptor(0x20, priority=1, send_queue_capacity=16)]
PER_ROUND = 40  # messages per link, direction and round
#: The follower's JVM starts in 10 to 20 s on two shared cores.
START_TIMEOUT = 60.0
TABLES = ("links", "reconnects", "delivery_audit")


class Follower(protocol.ProcessProtocol):
    """The follower subprocess: its stdout and stderr kept, its end awaited."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.err = bytearray()
        self.ended = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        self.out += data

    def errReceived(self, data: bytes) -> None:
        self.err += data

    def processEnded(self, reason) -> None:
        self.ended.callback(getattr(reason.value, "exitCode", None))

    def url(self) -> str | None:
        match = re.search(rb"the page is (http://127\.0\.0\.1:\d+/)", bytes(self.out))
        return match.group(1).decode() if match else None


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200, (url, response.status)
        return response.read()


async def fetch(url: str) -> bytes:
    return await bounded(threads.deferToThread(_get, url), 15)


async def state(url: str) -> dict:
    return json.loads(await fetch(url + "state.json"))


async def send_round(pairs, start):
    sends = []
    for peer in pairs:
        for i in range(start, start + PER_ROUND):
            sends.append(defer.ensureDeferred(peer.send(0x20, b"%d:" % i + b"x" * (i % 200))))
    assert all(await bounded(defer.gatherResults(sends), 30))


@pytest_twisted.ensureDeferred
async def test_the_follower_shows_the_live_fleet_and_ends_with_the_batch_runs_tables(tmp_path, spark):
    """While the fleet runs, the page shows its links, the resume the proxy caused and a clean audit; once the
    fleet stopped and every closed file was read, the live tables equal the batch run's on the same files."""
    from mconn.pipeline import job
    from mconn.pipeline.spark import Progress

    logs, state_dir = tmp_path / "logs", tmp_path / "follow"
    logs.mkdir()
    follower = Follower()
    args = [str(PIPELINE), "--follow", str(logs), "--port", "0", "--trigger", "2", "--out", str(state_dir)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    transport = the_reactor().spawnProcess(follower, args[0], args, env=env)
    pid = transport.pid
    config = Config(stats_interval=1.0, resume_grace=10.0, max_reconnect_delay=0.2)
    collectors = {name: Collector(CHANNELS) for name in "ABC"}
    nodes = {name: Switch([collectors[name]], clock=the_reactor(), config=config) for name in "ABC"}
    files = [
        TelemetryFileService(logs / f"{name}.json", s.node_id, rotate_seconds=1, keep_files=10_000, clock=the_reactor())
        for name, s in nodes.items()
    ]
    proxy = None
    try:
        for service in files:
            service.startService()
        for s in nodes.values():
            s.startService()
        port_a = (await nodes["A"].listen("tcp:0:interface=127.0.0.1")).getHost().port
        proxy = FaultProxy("127.0.0.1", port_a)
        proxy_port = await proxy.start()
        ids = {name: s.node_id for name, s in nodes.items()}
        b_to_a = await bounded(nodes["B"].dial(f"{ids['A']}@127.0.0.1:{port_a}"))
        c_to_a = await bounded(nodes["C"].dial(f"{ids['A']}@127.0.0.1:{proxy_port}"))
        await until(lambda: len(nodes["A"].peers) == 2)
        pairs = [b_to_a, c_to_a, nodes["A"].peers[ids["B"]], nodes["A"].peers[ids["C"]]]
        await send_round(pairs, 0)
        proxy.reset_all()  # C's link breaks without a close: the session resumes
        await send_round(pairs, PER_ROUND)
        await until(lambda: c_to_a.resumes == 1 and c_to_a.state == "connected", "C's session to resume")
        await send_round(pairs, 2 * PER_ROUND)

        await until(lambda: follower.url() is not None or follower.ended.called, "the page's URL", START_TIMEOUT)
        assert follower.url() is not None, bytes(follower.err).decode(errors="replace")[-2000:]
        url = follower.url()
        for _ in range(int(START_TIMEOUT)):  # the live view catches up with the fleet
            live = await state(url)
            if live["link_count"] == 4 and any(r["resumes"] == 1 for r in live["links"]):
                break
            await sleep(1)
        else:
            raise AssertionError(f"the page never showed 4 link ends and the resume: {live}")
        page = (await fetch(url)).decode()
        assert '<meta http-equiv="refresh"' in page and "mconn fleet, live" in page
        assert 'class="verdict ok"' in page, page
        assert ids["C"][:12] in page and ids["A"][:12] in page
        assert live["audit"]["lost"] == 0 and live["audit"]["duplicated"] == 0
    finally:
        if proxy is not None:
            await proxy.stop()
        await stop(*nodes.values())
        for service in files:
            service.stopService()  # the last files are closed
    try:
        closed = sum(len(closed_paths(logs / f"{name}.json")) for name in "ABC")
        for _ in range(int(START_TIMEOUT)):  # every closed file read and the tables rebuilt
            live = await state(url)
            if live["files"] == closed:
                break
            await sleep(1)
        else:
            raise AssertionError(f"the follower read {live['files']} of {closed} closed files")
        assert live["error"] is None, live["error"]
    finally:
        if not follower.ended.called:
            os.kill(pid, signal.SIGTERM)
        code = await bounded(follower.ended, 60)
    assert code == 0, bytes(follower.err).decode(errors="replace")[-2000:]

    out = str(tmp_path / "batch")
    job.run(spark, [str(logs)], out, progress=Progress(len(job.STAGES), enabled=False))
    for name in TABLES:
        batch = spark.read.parquet(f"{out}/{name}")
        follow = spark.read.parquet(str(state_dir / "tables" / name))
        assert batch.count() > 0, name
        assert follow.exceptAll(batch).count() == 0 and batch.exceptAll(follow).count() == 0, name
    audit = spark.read.parquet(f"{out}/delivery_audit").collect()
    assert {r["verdict"] for r in audit} == {"ok"} and sum(r["delivered"] for r in audit) == 4 * 3 * PER_ROUND
