"""Which per-packet path the imported mconn runs, in ``mconn --version``'s words: the
compiled twin or pure Python (and why); a tree from before the twin is pure Python."""

from __future__ import annotations


def implementation() -> str:
    try:
        from mconn.core.speedups import describe
    except ImportError:
        return "pure Python (no compiled twin in this tree)"
    return describe()
