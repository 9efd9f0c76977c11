"""How the fleet report names nodes and channels, and tells link failures from errors.

A Switch logs its moniker and network in ``node_started``; the pipeline maps each node id
to the moniker of its latest ``node_started`` (``names.node_names``) and each channel id to
the name ``channel_stats`` gave it, and shows a node as ``moniker (abcd1234)``, falling back
to its id when it logged no moniker (older logs). Older logs' ``connection_lost`` has no
``reason_kind``: the pipeline classifies its ``reason_type`` with a copy of mconn.errors'
table (the pipeline imports nothing of mconn), checked here against ``error_kind``.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from twisted.internet.testing import MemoryReactorClock

import mconn
from helpers import RecordingReactor, Telemetry
from mconn import ChannelDescriptor, Config, NodeInfo, errors
from mconn.testing import MemoryNetwork
from mconn.pipeline import names, reasons

from .fleetlog import FleetLog, Link, node_id

CHANNELS = [ChannelDescriptor(0x20, priority=1)]
A, B, C = (node_id(n) for n in "ABC")


def started_event(node_info):
    capture = Telemetry().start()
    try:
        network = MemoryNetwork(MemoryReactorClock())
        switch = network.switch([RecordingReactor(CHANNELS)], config=Config(stats_interval=0), node_info=node_info)
        switch.startService()
        switch.stopService()
        network.flush()
    finally:
        capture.stop()
    [event] = [e for e in capture.named("node_started") if e["node_id"] == switch.node_id]
    return event


def test_node_started_carries_the_switch_s_moniker_and_network():
    """A Switch with a NodeInfo logs its moniker and network in node_started; one without logs both null, and
    an empty moniker is null too."""
    event = started_event(NodeInfo(network="mconn-test", moniker="alpha"))
    assert (event["moniker"], event["network"]) == ("alpha", "mconn-test")
    event = started_event(None)
    assert (event["moniker"], event["network"]) == (None, None)
    event = started_event(NodeInfo(network="mconn-test"))
    assert (event["moniker"], event["network"]) == (None, "mconn-test")


def error_classes() -> set[type]:
    """Every MConnError class of mconn, every module imported first (a subclass may live anywhere in mconn).

    Subclasses that node software defines (reactors/chat's errors, say, once a test imported them) are left
    out: the pipeline cannot know their names, and reads them by their ``reason_kind``, which mconn logs."""
    for module in pkgutil.walk_packages(mconn.__path__, "mconn."):
        if not module.name.startswith("mconn.pipeline"):
            importlib.import_module(module.name)
    found, todo = set(), [errors.MConnError]
    while todo:
        cls = todo.pop()
        if cls.__module__ == "mconn" or cls.__module__.startswith("mconn."):
            found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_the_pipeline_classifies_reasons_as_mconn_errors_does():
    """The pipeline's copy of the class-name table gives every MConnError class the kind error_kind gives it,
    and a name mconn does not have is other, as error_kind says of an exception that is not an MConnError."""
    classes = error_classes()
    assert len(classes) > 20
    for cls in classes:
        assert reasons.kind_of_type(cls.__name__) == errors.error_kind(cls.__new__(cls)), cls.__name__
    assert reasons.kind_of_type("ConnectionDone") == errors.error_kind(ValueError()) == reasons.OTHER
    listed = set(reasons.LINK_TYPES) | set(reasons.MISBEHAVIOUR_TYPES)
    assert listed <= {cls.__name__ for cls in classes}, "a class name the table lists is not in mconn.errors"


def test_a_node_is_shown_by_moniker_or_by_its_id():
    """``moniker (abcd1234)``; without a moniker the 8-hex prefix (the report) or the whole id (the console); a
    chart cuts a long moniker; a channel with its name, ``0x20 votes``, or its id alone."""
    known = {A: "validator-1", B: "x" * 64}
    assert names.node(A, known) == f"validator-1 ({A[:8]})"
    assert names.node(C, known) == C[:8]
    assert names.node(C, known, whole=True) == C
    assert names.node(None, known) == "-"
    assert names.node(B, known, most=20) == "x" * 19 + f"\u2026 ({B[:8]})"
    assert names.channel(0x20, {0x20: "votes"}) == "0x20 votes"
    assert names.channel(0x21, {0x20: "votes"}) == "0x21"


@pytest.fixture(scope="module")
def events(spark, tmp_path_factory):
    """A: a current node that restarted under a new moniker; B: a current node without node info; C: an older
    node (no node_started). A - B's channel_stats name one channel; A - C's break is logged by C without
    reason_kind, and by A with it."""
    from mconn.pipeline import ingest

    fleet = FleetLog()
    a = fleet.node("A", current=True, moniker="alpha-old")
    b = fleet.node("B", current=True)
    c = fleet.node("C")
    for node in (a, b):
        node.start(0)
    a.moniker = "alpha"
    a.start(5)
    ab = Link(a, b, "s-ab", 10, channel_names={0x20: "votes"})
    ab.stats(a, 11)
    ab.end(20)
    ac = Link(a, c, "s-ac", 10)
    ac.suspend(15)  # ConnectionLost at both ends
    ac.end(30, "PongTimeout")
    root = tmp_path_factory.mktemp("names")
    fleet.write(root / "logs")
    return ingest.parse(ingest.read_records(spark, [str(root / "logs")])).cache()


def test_the_latest_node_started_names_a_node(events):
    """A node is named by its latest node_started's moniker; a node that logged none, or no node_started at
    all (an older node), has no name; a channel by the latest name channel_stats gave it."""
    known = {r["node_id"]: r["moniker"] for r in names.node_names(events).collect()}
    assert known == {A: "alpha"}
    channels = {r["channel_id"]: r["channel_name"] for r in names.channel_names(events).collect()}
    assert channels == {0x20: "votes"}
    row = events.sparkSession.range(1)
    for part in names.parts(events):
        row = row.crossJoin(part)
    assert names.collected(row.first().asDict()) == ({A: "alpha"}, {0x20: "votes"})


def test_a_reason_without_its_kind_is_classified_by_its_type(events):
    """connection_lost's reason_kind as logged, or from its reason_type for an older node: the break and the
    PongTimeout count as link failures at both ends, ConnectionClosed does not."""
    from pyspark.sql import functions as F

    lost = events.where(F.col("event") == "connection_lost")
    got = sorted(
        (r["node_id"] == C, r["reason_type"], r["reason_kind"], r["kind"])
        for r in lost.select("node_id", "reason_type", "reason_kind", reasons.reason_kind().alias("kind")).collect()
    )
    assert got == [
        (False, "ConnectionClosed", "other", "other"),
        (False, "ConnectionClosed", "other", "other"),
        (False, "ConnectionLost", "link", "link"),
        (False, "PongTimeout", "link", "link"),
        (True, "ConnectionLost", None, "link"),
        (True, "PongTimeout", None, "link"),
    ]
