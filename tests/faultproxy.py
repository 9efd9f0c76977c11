"""The fault proxy moved to the package (mconn/faultproxy.py); tests import it from here."""
from mconn.faultproxy import *  # noqa: F401,F403
from mconn.faultproxy import MAX_BUFFERED, FaultProxy, Link  # noqa: F401  (named for readers and linters)
