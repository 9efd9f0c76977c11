"""``mconn.core.node_info.display_name``: how every surface (logs, ``mconn status``) names a node."""

import pytest

from mconn.core.node_info import NodeInfo, display_name

NODE_ID = "abcd1234" + "ef" * 16


@pytest.mark.parametrize(
    "info, expected",
    [
        (NodeInfo(network="chain-a", moniker="alice"), "alice (abcd1234)"),
        ("bob the validator", "bob the validator (abcd1234)"),  # a moniker as /status.json carries it
        (NodeInfo(network="chain-a"), NODE_ID),  # no moniker: the whole id, as before
        ("", NODE_ID),
        (None, NODE_ID),
    ],
)
def test_a_node_is_its_moniker_and_the_first_8_hex_digits_of_its_id(info, expected):
    """A moniker is followed by the first 8 hex digits of the id (monikers are not unique);
    without one the name is the whole node id."""
    assert display_name(NODE_ID, info) == expected
