"""The twistd plugin of mconn: ``twistd mconn --help``.

A drop-in (twisted/plugins has no __init__.py): twistd finds it on its plugin path and
imports mconn.ops.node only when the ``mconn`` subcommand is used.
"""

from twisted.application.service import ServiceMaker

mconn = ServiceMaker("mconn", "mconn.ops.node", "Run an mconn peer-to-peer node", "mconn")
