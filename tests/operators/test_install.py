"""A plain (not editable) install ships the twistd plugin and the ``mconn`` command.

The project is copied and installed with pip into a fresh virtualenv. The virtualenv
gets the test virtualenv's site-packages as a plain path entry for the dependencies
(Twisted...): a plain entry, so the editable install of mconn there (a .pth finder) is
not loaded, and mconn and the plugin can only come from the new install.

When the test virtualenv can build a wheel itself (the ``wheel`` package, or setuptools
70.1 or later), the build uses it, offline (about 3 s); otherwise pip builds in its usual
isolated environment, fetching setuptools and wheel from the index (about 15 s).
"""

import importlib.metadata
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: What the build does not need (and what is large).
NOT_COPIED = (
    ".venv",
    ".git",
    ".hypothesis",
    ".pytest_cache",
    ".ruff_cache",
    "*.egg-info",
    "__pycache__",
    "build",
    "dist",
    "dropin.cache",
    "bench",
    "tests",
)
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def run(args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, env=ENV, **kwargs)


def install(project: pathlib.Path, directory: pathlib.Path) -> pathlib.Path:
    """pip-install a copy of ``project`` into a new virtualenv; its python."""
    source = directory / "source"
    shutil.copytree(project, source, ignore=shutil.ignore_patterns(*NOT_COPIED))
    venv = directory / "venv"
    result = run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert result.returncode == 0, result.stderr
    python = venv / "bin" / "python"
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    pathlib.Path(purelib, "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    offline = ["--no-build-isolation", "--no-index"] if can_build_wheels() else []
    result = run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", *offline, source])
    assert result.returncode == 0, result.stdout + result.stderr
    return python


def can_build_wheels() -> bool:
    """Whether setuptools can build a wheel here without an isolated build environment."""
    try:
        version = tuple(int(p) for p in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
    return version >= (64, 0) and (version >= (70, 1) or importlib.util.find_spec("wheel") is not None)


def test_twistd_lists_mconn_after_a_plain_install(tmp_path):
    """After a plain install, twistd lists the mconn plugin from the installed copy and the mconn command
    runs."""
    python = install(ROOT, tmp_path)
    where = run(
        [python, "-c", "import twisted.plugins.mconn_plugin as p, mconn; print(p.__file__); print(mconn.__file__)"],
        cwd=tmp_path,
    )
    assert where.returncode == 0, (
        "the plain install lacks twisted/plugins/mconn_plugin.py: setup.cfg must list twisted.plugins "
        f"among the packages\n{where.stderr}"
    )
    for path in where.stdout.split():
        assert path.startswith(str(tmp_path / "venv")), where.stdout  # the installed copy, not the source tree
    twistd = run(
        [python, "-c", "import sys; sys.argv = ['twistd', '--help']; from twisted.scripts.twistd import run; run()"],
        cwd=tmp_path,
    )
    assert twistd.returncode == 0, twistd.stderr
    assert re.search(r"^\s+mconn\s+Run an mconn", twistd.stdout, re.M), twistd.stdout
    command = run([tmp_path / "venv" / "bin" / "mconn", "--help"], cwd=tmp_path)
    assert command.returncode == 0 and "keygen" in command.stdout, command.stdout + command.stderr
