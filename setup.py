"""Builds mconn's optional compiled twins, mconn/core/_speedups.pyx and mconn/net/_wsframe.pyx
(the metadata is setup.cfg).

The extension is optional: when Cython is missing, MCONN_NO_EXTENSION=1 is set, or the
compiler or the Python headers fail, the install goes on without it and mconn runs on
the pure-Python functions (``mconn --version`` says which is in use).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _warn(text: str) -> None:
    print(f"mconn: {text}; mconn will run on pure Python", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that reports a failed compile instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler at all (distutils' CCompilerError, ...)
            _warn(f"building the compiled twin failed ({e})")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # a compile or link error
            _warn(f"building {ext.name} failed ({e})")


def extensions() -> list[Extension]:
    if os.environ.get("MCONN_NO_EXTENSION") == "1":
        _warn("MCONN_NO_EXTENSION=1: the compiled twin is not built")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed: the compiled twin is not built")
        return []
    try:
        return cythonize(
            [
                Extension("mconn.core._speedups", ["mconn/core/_speedups.pyx"]),
                Extension("mconn.net._wsframe", ["mconn/net/_wsframe.pyx"]),
            ],
            compiler_directives={"language_level": "3"},
            quiet=True,
        )
    except Exception as e:
        _warn(f"Cython could not translate the compiled twins ({e})")
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
