"""The README's programs run as written: examples/two_nodes.py and the 20-line reactor
(`make run`, the fleet demo, is tests/integration/test_fleet_demo.py)."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(args, timeout=120):
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_two_nodes_example_shows_messages_crossing_on_three_channels():
    """examples/two_nodes.py exits 0 with messages on chat, status and bulk; a chat line beats the 32 MiB bulk
    message (priorities)."""
    result = run([sys.executable, "examples/two_nodes.py"])
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "done: all messages crossed" in out
    for name in ("chat", "status", "bulk"):
        assert re.search(rf"bob   <- {name}", out), out
    # Chat lines arrive before the 32 MiB bulk message completes: priorities at work.
    assert out.index("bob   <- chat   'hello bob'") < out.index("bob   <- bulk")


def test_readme_reactor_snippet_runs():
    """The README's Python snippet runs as written: both nodes print the other's greeting, short id matching
    full id."""
    readme = (ROOT / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    result = run([sys.executable, "-c", snippet], timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    greetings = re.findall(r"^([0-9a-f]{8}) says: hello from ([0-9a-f]{40})$", result.stdout, re.M)
    assert len(greetings) == 2
    assert {short for short, _ in greetings} == {full[:8] for _, full in greetings}


def test_makefile_targets_match_the_readme():
    """Every make target the README names exists in the Makefile, and CI runs `make test`."""
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run", "test"):
        assert f"make {target}" in readme
        assert re.search(rf"^{target}:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()
