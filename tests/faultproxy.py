"""The fault proxy moved to the package (mconn/ops/faultproxy.py); tests import it from here."""

from mconn.ops.faultproxy import *  # noqa: F401,F403
from mconn.ops.faultproxy import MAX_BUFFERED, FaultProxy, Link  # noqa: F401  (named for readers and linters)
