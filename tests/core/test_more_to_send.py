"""Connection.more_to_send: False only when another data_to_send now would return nothing.

The adapter's pump stops writing on it (one scheduler pass per small message instead of
two), so a False while data could still go out would leave that data unsent until the
next pump: these tests pin that it never does.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from mconn.core.channel import ChannelDescriptor
from mconn.config import Config
from tests.helpers_core import CH, open_connection

CHANNELS = [ChannelDescriptor(CH, send_queue_capacity=64), ChannelDescriptor(0x21, priority=5, send_queue_capacity=64)]


def test_false_once_the_queues_are_empty():
    """more_to_send is False once everything queued has been sent."""
    conn = open_connection(channels=CHANNELS)
    conn.queue_message(CH, b"small")
    assert conn.data_to_send(0.0)
    assert conn.more_to_send is False
    assert conn.data_to_send(0.0) == b""


def test_true_while_a_budget_cut_the_data_short():
    """more_to_send stays True while a budget leaves data behind, and turns False with the last packet."""
    conn = open_connection(channels=CHANNELS)
    conn.queue_message(CH, b"x" * 5000)
    chunks = []
    for _ in range(20):
        chunks.append(conn.data_to_send(0.0, budget=1000))
        if not conn.more_to_send:
            break
    assert len(chunks) == 5 and all(chunks)  # five 1 KiB packets, the last one short
    assert conn.data_to_send(0.0) == b""


def test_false_when_send_rate_has_no_budget_left():
    """With send_rate's burst spent, more_to_send is False: another call now would send nothing."""
    conn = open_connection(channels=CHANNELS, config=Config(send_rate=1000.0))
    conn.queue_message(CH, b"q" * 5000)
    assert conn.data_to_send(0.0)
    assert conn.data_to_send(0.0) == b""  # the burst is spent
    assert conn.more_to_send is False


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.sampled_from([CH, 0x21]), st.integers(0, 4000)), min_size=1, max_size=12),
    budgets=st.lists(st.integers(1, 6000), min_size=1, max_size=30),
)
def test_never_false_while_data_is_left(sizes, budgets):
    """For any messages and budgets, a False more_to_send means nothing is left to send now."""
    conn = open_connection(channels=CHANNELS)
    for channel_id, size in sizes:
        assert conn.queue_message(channel_id, bytes(size))
    for budget in budgets:
        conn.data_to_send(0.0, budget=budget)
        if not conn.more_to_send:
            assert conn.data_to_send(0.0) == b""
            assert not conn.wants_to_send()
            return
    for _ in range(100):  # 48 KiB at most: a handful of write batches
        if not conn.more_to_send:
            break
        conn.data_to_send(0.0)
    assert conn.data_to_send(0.0) == b"" and not conn.wants_to_send()
