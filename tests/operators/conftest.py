"""Fixtures of the operator tests."""

import pytest

from operators.twistd_nodes import Node


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
