"""A real three-node network on 127.0.0.1, its telemetry, then the pipeline on real Spark.

Three Switches (A listens; B dials A; C dials A, and dials B through a fault proxy)
exchange messages on two channels both ways, with a telemetry file per node written by
jsonFileLogObserver (specs/telemetry.md section 2). The test breaks links while messages
flow: B's link to A twice with ``force_reconnect``, C's link to B once with a proxy
reset. After a clean stop, the pipeline must audit every message with nothing lost or
duplicated, and count exactly the resumes the test caused, on the links it caused them.
Pings are frequent, so every node logs ping round trips: the latency table uses them.
"""

import pytest
import pytest_twisted
from twisted.internet import defer
from twisted.logger import FilteringLogObserver, PredicateResult, globalLogPublisher, jsonFileLogObserver

from faultproxy import FaultProxy
from integration.test_loopback import Collector, bounded, stop
from helpers import sleep, the_reactor, until
from mconn import ChannelDescriptor, Config, NodeInfo, Switch

pytestmark = pytest.mark.integration

CHANNELS = [
    ChannelDescriptor(0x20, priority=1, send_queue_capacity=16),
    ChannelDescriptor(0x21, priority=5, send_queue_capacity=16),
]
PER_CHANNEL = 60  # messages per channel, direction and link


class NodeLog:
    """The node's mconn events, to one file, as jsonFileLogObserver writes them."""

    def __init__(self, path, switch):
        self.file = open(path, "a", encoding="utf-8")
        node_id = switch.node_id

        def mine(event):
            ok = event.get("log_namespace") == "mconn" and event.get("node_id") == node_id
            return PredicateResult.yes if ok else PredicateResult.no

        self.observer = FilteringLogObserver(jsonFileLogObserver(self.file), [mine])
        globalLogPublisher.addObserver(self.observer)

    def close(self):
        globalLogPublisher.removeObserver(self.observer)
        self.file.close()


async def send_batch(peer, start, count):
    for i in range(start, start + count):
        for channel in (0x20, 0x21):
            assert await peer.send(channel, b"%d:%d:" % (channel, i) + b"x" * (i % 300))


async def run_network(directory):
    """Returns {(dialer, listener): resumes injected}, node ids by name, messages sent."""
    config = Config(stats_interval=1.0, resume_grace=10.0, max_reconnect_delay=0.2, ping_interval=0.25)
    collectors = {name: Collector(CHANNELS) for name in "ABC"}
    # A and B have monikers; C has none (the report shows it by its id).
    infos = {
        name: NodeInfo(network="live", moniker=moniker)
        for name, moniker in zip("ABC", ("alpha", "bravo", ""), strict=True)
    }
    nodes = {
        name: Switch([collectors[name]], clock=the_reactor(), config=config, node_info=infos[name]) for name in "ABC"
    }
    logs = [NodeLog(directory / f"{name}.json", s) for name, s in nodes.items()]
    proxy = None
    try:
        for s in nodes.values():
            s.startService()
        port_a = (await nodes["A"].listen("tcp:0:interface=127.0.0.1")).getHost().port
        port_b = (await nodes["B"].listen("tcp:0:interface=127.0.0.1")).getHost().port
        proxy = FaultProxy("127.0.0.1", port_b)
        proxy_port = await proxy.start()
        ids = {name: s.node_id for name, s in nodes.items()}
        b_to_a = await bounded(nodes["B"].dial(f"{ids['A']}@127.0.0.1:{port_a}"))
        c_to_a = await bounded(nodes["C"].dial(f"{ids['A']}@127.0.0.1:{port_a}"))
        c_to_b = await bounded(nodes["C"].dial(f"{ids['B']}@127.0.0.1:{proxy_port}"))
        await until(lambda: len(nodes["A"].peers) == 2 and len(nodes["B"].peers) == 2)
        dialed = {("B", "A"): b_to_a, ("C", "A"): c_to_a, ("C", "B"): c_to_b}
        back = {pair: nodes[pair[1]].peers[ids[pair[0]]] for pair in dialed}
        breaks = {("B", "A"): 2, ("C", "B"): 1, ("C", "A"): 0}
        rounds = 3
        for r in range(rounds):
            sends = [
                send_batch(p, r * (PER_CHANNEL // rounds), PER_CHANNEL // rounds)
                for p in list(dialed.values()) + list(back.values())
            ]
            sends = [defer.ensureDeferred(s) for s in sends]
            if r < 2:
                dialed[("B", "A")].force_reconnect()  # the first two rounds break B -> A
            if r == 1:
                proxy.reset_all()  # the second breaks C -> B in the proxy
            await bounded(defer.gatherResults(sends), 30)
            done = {("B", "A"): min(r + 1, 2), ("C", "B"): 1 if r >= 1 else 0, ("C", "A"): 0}
            await until(
                lambda done=done: all(p.resumes == done[pair] and p.state == "connected" for pair, p in dialed.items())
            )
        for collector in collectors.values():
            await collector.until(2 * 2 * PER_CHANNEL)  # two peers, two channels
        await sleep(0.3)  # the last acks arrive
        peers = [p for s in nodes.values() for p in s.peers.values()]
        await until(lambda: all(p.round_trip is not None for p in peers))  # an idle link pings
        await sleep(config.stats_interval + 0.2)  # a channel_stats tick logs the round trips
        return breaks, ids
    finally:
        if proxy is not None:
            await proxy.stop()
        await stop(*nodes.values())
        for log in logs:
            log.close()


@pytest_twisted.ensureDeferred
async def test_a_real_network_audits_clean_and_counts_the_injected_resumes(tmp_path, spark, tables):
    """The pipeline on a real three-node network's logs finds no loss or duplicate and counts exactly the
    resumes the proxies injected, at both ends."""
    from mconn.pipeline import job
    from mconn.pipeline.spark import Progress

    (tmp_path / "logs").mkdir()
    breaks, ids = await run_network(tmp_path / "logs")
    out = str(tmp_path / "tables")
    result = job.run(spark, [str(tmp_path / "logs")], out, progress=Progress(len(job.STAGES), enabled=False))

    s = result.summary
    sent = 3 * 2 * 2 * PER_CHANNEL  # links, directions, channels
    assert (s["lost"], s["duplicated"], s["unsettled"], s["one_sided_rows"]) == (0, 0, 0, 0)
    assert s["messages_audited"] == sent
    assert (s["malformed_records"], s["unknown_events"], s["nodes"], s["sessions"]) == (0, 0, 3, 3)
    assert s["resumes"] == sum(breaks.values())
    assert (s["restarts"], s["restarted_sessions"], s["rtt_source"]) == (0, 0, "ping")
    audit = tables(out, "delivery_audit")
    assert all(r["verdict"] == "ok" and r["sender_final"] and r["receiver_final"] for r in audit)
    assert sum(r["delivered"] for r in audit) == sent
    names = {v: k for k, v in ids.items()}
    resumes = {}
    for row in tables(out, "links"):
        resumes.setdefault(frozenset((names[row["node_id"]], names[row["peer_id"]])), set()).add(row["resumes"])
    assert resumes == {frozenset(pair): {n} for pair, n in breaks.items()}  # both ends agree
    connections = {(names[r["node_id"]], names[r["peer_id"]]): r["connections"] for r in tables(out, "links")}
    assert connections == {(a, b): breaks.get((a, b), breaks.get((b, a))) + 1 for a, b in connections}
    latency = [r for r in tables(out, "latency") if r["scope"] == "link"]
    assert len(latency) == 6 and all(r["source"] == "ping" and r["samples"] >= 1 for r in latency)
    dials = [r for r in tables(out, "reconnects") if r["result"] == "connected"]
    assert sorted((names[r["node_id"]], names[r["peer_id"]], r["resolution"]) for r in dials) == [
        ("B", "A", "resumed"),
        ("B", "A", "resumed"),
        ("C", "B", "resumed"),
    ]
    # The Switches logged their monikers in node_started: the pipeline names A and B by them, not C.
    from mconn.pipeline import names as naming

    events = spark.read.parquet(f"{out}/events")
    known = {r["node_id"]: r["moniker"] for r in naming.node_names(events).collect()}
    assert known == {ids["A"]: "alpha", ids["B"]: "bravo"}
