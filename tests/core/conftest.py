"""Setup shared by the core tests (no Twisted here).

The helpers live in tests/helpers_core.py; the repository root is put on sys.path so that
``from tests.helpers_core import ...`` works however pytest was started.
"""

import pathlib
import sys

_ROOT = str(pathlib.Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
