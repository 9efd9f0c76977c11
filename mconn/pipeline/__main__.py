"""``python -m mconn.pipeline``: the same as the ``mconn-pipeline`` command."""

import sys

from mconn.pipeline.cli import main

sys.exit(main())
