"""Fixtures of the operator tests."""

import pytest
import pytest_twisted
from twisted.internet import defer

from helpers import the_reactor
from mconn import Config, Switch
from mconn.ops.metrics import SwitchMetrics
from operators.twistd_nodes import Node

#: Bound on stopping the Switches a test started, in seconds.
STOP_TIMEOUT = 15.0


@pytest.fixture
def nodes(tmp_path):
    """Starts Node processes; kills any still running at the end, by PID."""
    started = []

    def node(name):
        started.append(Node(tmp_path, name))
        return started[-1]

    yield node
    for n in started:
        n.kill()


@pytest.fixture
def metered_switches():
    """Makes started Switches, each with one reactor made by ``reactor_factory`` and its
    own started SwitchMetrics; stops them all at the end (bounded by STOP_TIMEOUT).

    ``make(reactor_factory, config=None, **kwargs)`` returns ``(switch, metrics)``;
    ``config`` defaults to ``Config(stats_interval=0)``, ``kwargs`` go to the Switch.
    """
    made, metrics = [], []

    def make(reactor_factory, config=None, **kwargs):
        config = Config(stats_interval=0) if config is None else config
        switch = Switch([reactor_factory()], config=config, clock=the_reactor(), **kwargs)
        switch.startService()
        made.append(switch)
        m = SwitchMetrics(switch)
        m.start()
        metrics.append(m)
        return switch, m

    yield make
    for m in metrics:
        m.stop()
    stops = [defer.maybeDeferred(s.stopService) for s in made if s.running]
    pytest_twisted.blockon(defer.DeferredList(stops).addTimeout(STOP_TIMEOUT, the_reactor()))
