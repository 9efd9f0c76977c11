"""twistd's text log of a node through mconn.ops.text_log: Twisted's lines, byte for byte.

The property: for arbitrary events (format strings with fields of every kind, malformed
ones, bytes formats, no format, failures, non-ASCII text, times around second boundaries
and daylight-saving changes in several time zones), ClassicLogText writes what Twisted's
``textFileLogObserver`` writes, or raises what it raises. One formatter serves every
example, so its caches carry over from one event, and one time zone, to the next. Then
makeService's choice of file (as twistd's UnixAppLogger), and a real ``twistd -n
--logfile`` node whose whole .log is written by ClassicLogText.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.application.service import Application
from twisted.logger import FileLogObserver, ILogObserver, LogLevel, textFileLogObserver
from twisted.python.failure import Failure

from mconn.ops.node import makeService
from mconn.ops.node_settings import Options
from mconn.ops.text_log import ClassicLogText, text_file_log_observer, twistd_log_observer
from operators.twistd_nodes import ENV, LOOPBACK, TIMEOUT, alive, wait_until

#: Zones with a whole-hour, a half-hour and a half-hour daylight-saving offset.
ZONES = ["UTC", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
#: Daylight-saving changes: New York 2026-03-08 07:00Z and 2026-11-01 06:00Z, Lord Howe
#: 2026-04-04 15:00Z (its half hour back).
CHANGES = [1772953200, 1793512800, 1775314800]
FRACTIONS = [0.0, 0.25, 0.5, 0.999998, 0.9999989, 0.999999, 0.9999994, 0.9999995, 0.9999996, 0.99999999]
NAMES = ["peer", "n", "address", "f", "obj", "width", "log_text", "ü名", "1a"]


class Odd:
    """A value whose attributes, items and text are fields of their own."""

    name = "ödd"

    def __getitem__(self, key):
        return f"item {key}"

    def __str__(self):
        return "Odd ∞"

    def __repr__(self):
        return "<Odd ∞>"


class Unprintable:
    """A value that cannot be made text (its repr works: hypothesis prints examples)."""

    def __str__(self):
        raise RuntimeError("no str for you")

    def __repr__(self):
        return "Unprintable()"

    def __format__(self, spec):
        raise RuntimeError(f"no format {spec!r}")


def failure(message: str) -> Failure:
    try:
        raise ValueError(message)
    except ValueError:
        return Failure()


def broken_failure() -> object:
    class Broken:
        def getTraceback(self):
            raise RuntimeError("no traceback ☹")

    return Broken()


values = st.one_of(
    st.text(max_size=12),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.none(),
    st.tuples(st.text(max_size=5), st.integers(0, 65535)),
    st.sampled_from([Odd(), Unprintable(), lambda: "called ✓", LogLevel.warn]),
)
field_names = st.sampled_from(NAMES)
fields = st.one_of(
    field_names.map(lambda n: "{" + n + "}"),
    st.tuples(field_names, st.sampled_from("sra")).map(lambda t: "{" + "!".join(t) + "}"),
    st.tuples(field_names, st.sampled_from([">8", "<3", "d", ".2f", "x", "^5s", "!", "=+9"])).map(
        lambda t: "{" + ":".join(t) + "}"
    ),
    st.sampled_from(["{obj.name}", "{obj[3]}", "{f()}", "{0}", "{}", "{n:{width}}", "{n!x}", "{{", "}}", "{", "}"]),
)
formats = st.lists(st.one_of(st.text(max_size=6), fields), max_size=6).map("".join)
times = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(CHANGES), st.integers(-2, 2), st.sampled_from(FRACTIONS)).map(
        lambda t: float(t[0] + t[1]) + t[2]
    ),
    st.floats(min_value=-1e9, max_value=4e9),
    st.integers(0, 4 * 10**9),
    st.sampled_from([float("nan"), float("inf"), "yesterday"]),
)


@st.composite
def events(draw) -> dict:
    event = {name: draw(values) for name in draw(st.sets(field_names, max_size=6))}
    form = draw(st.one_of(formats, st.none(), formats.map(lambda f: f.encode("utf-8", "surrogatepass")), st.just(7)))
    if form is not None:
        event["log_format"] = form
    optional = {
        "log_time": times,
        "log_level": st.one_of(st.sampled_from(list(LogLevel.iterconstants())), st.just("loud")),
        "log_namespace": st.one_of(st.text(max_size=8), st.just(Odd())),
        "log_system": st.one_of(st.text(max_size=8), st.just(Unprintable()), st.just(3)),
        "log_failure": st.one_of(st.text(max_size=8).map(failure), st.builds(broken_failure)),
        "log_text": st.text(max_size=8),
    }
    for key in draw(st.sets(st.sampled_from(sorted(optional)))):
        event[key] = draw(optional[key])
    return event


@st.composite
def plain_events(draw) -> dict:
    """Events whose format has only plain-name fields, every one present: the compiled path."""
    names = draw(st.lists(field_names, min_size=1, max_size=4))
    specs = st.sampled_from(["", "!s", "!r", "!a", ":>8", ":^7", "!r:>12", ":"])
    literal = st.text(max_size=5).map(lambda t: t.replace("{", "{{").replace("}", "}}"))
    form = "".join(draw(literal) + "{" + name + draw(specs) + "}" for name in names) + draw(literal)
    event = {name: draw(st.one_of(st.text(max_size=8), st.just(Odd()), st.integers())) for name in names}
    event.update(log_format=form, log_time=draw(times.filter(lambda t: isinstance(t, float))), log_namespace="n")
    return event


def outcome(format_line, event):
    """What a formatter makes of ``event``: its text, or the exception it raises."""
    try:
        return ("text", format_line(event))
    except Exception as e:
        return ("raised", type(e), str(e))


def twisted_line(event):
    """The line Twisted's textFileLogObserver writes (twistd's observer)."""
    return textFileLogObserver(io.StringIO()).formatEvent(event)


#: One formatter for every example: its caches see every event and zone in turn.
CACHED = ClassicLogText(max_formats=8)


def set_zone(zone: str) -> None:
    os.environ["TZ"] = zone
    time.tzset()


@pytest.fixture
def restore_zone():
    before = os.environ.get("TZ")
    yield
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(event=events(), zone=st.sampled_from(ZONES))
def test_the_lines_are_twisteds_for_any_event(restore_zone, event, zone):
    """ClassicLogText formats (or fails to) exactly as Twisted's textFileLogObserver, in any zone."""
    set_zone(zone)
    assert outcome(CACHED, event) == outcome(twisted_line, event)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(event=plain_events(), zone=st.sampled_from(ZONES))
def test_the_lines_of_plain_fields_are_twisteds(restore_zone, event, zone):
    """Formats of plain-name fields with every conversion and spec, non-ASCII values: Twisted's lines."""
    set_zone(zone)
    assert outcome(CACHED, event) == outcome(twisted_line, event)


def test_times_within_a_second_and_across_its_edges(restore_zone):
    """A run of times through second boundaries and a daylight-saving change: each stamp is Twisted's."""
    set_zone("America/New_York")
    text = ClassicLogText()
    for second in range(CHANGES[0] - 3, CHANGES[0] + 3):
        for fraction in FRACTIONS:
            event = {"log_format": "tick", "log_time": second + fraction}
            assert text(event) == twisted_line(event), (second, fraction)


def test_a_zone_changed_within_a_second_shows_at_once(restore_zone):
    """time.tzset() between two events of one second: the second event has the new offset, as Twisted's."""
    text = ClassicLogText()
    event = {"log_format": "x", "log_time": 1780000000.25}
    set_zone("UTC")
    assert text(event).startswith("2026-05-28T20:26:40+0000 ")
    set_zone("Asia/Kolkata")
    assert text(event) == twisted_line(event)
    assert text(event).startswith("2026-05-29T01:56:40+0530 ")


def test_the_observer_writes_the_same_bytes_to_a_binary_file():
    """text_file_log_observer into a bytes file: UTF-8, as textFileLogObserver's."""
    event = {"log_format": "π {peer!r} ✓", "peer": "ñ", "log_time": 1780000000.5, "log_namespace": "n"}
    ours, twisteds = io.BytesIO(), io.BytesIO()
    text_file_log_observer(ours)(event)
    textFileLogObserver(twisteds)(event)
    assert ours.getvalue() == twisteds.getvalue() and ours.getvalue().endswith("✓\n".encode())


def test_format_strings_are_parsed_once_and_the_cache_is_bounded():
    """A format seen again is a cache hit; more formats than max_formats keep at most max_formats."""
    text = ClassicLogText(max_formats=3)
    for _ in range(5):
        text({"log_format": "peer {peer}", "peer": "a"})
    info = text.cache_info()
    assert (info.hits, info.misses) == (4, 1)
    for i in range(10):
        text({"log_format": f"format {i} {{peer}}", "peer": "a"})
    assert text.cache_info().currsize == 3


@pytest.mark.parametrize("bad", [0, -1, 2.5, "8"])
def test_a_bad_cache_size_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=f"max_formats must be a positive int, not {re.escape(repr(bad))}"):
        ClassicLogText(max_formats=bad)


# -- where twistd's log goes ---------------------------------------------------------------------


@pytest.fixture
def keep_sigusr1():
    before = signal.getsignal(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGUSR1, before)


def test_the_file_is_the_one_twistd_would_log_to(tmp_path, monkeypatch, keep_sigusr1):
    """--logfile FILE, twistd.log for a daemon, stdout for -n; nothing when --logger, --syslog or a
    daemon's '-' leave it to twistd."""
    monkeypatch.chdir(tmp_path)
    named = twistd_log_observer({"logfile": str(tmp_path / "n.log"), "nodaemon": True})
    assert isinstance(named, FileLogObserver) and isinstance(named.formatEvent, ClassicLogText)
    assert (tmp_path / "n.log").exists()
    assert signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None)  # rotation, as twistd's
    twistd_log_observer({"logfile": None, "nodaemon": False})
    assert (tmp_path / "twistd.log").exists()
    for foreground in ({"logfile": None, "nodaemon": True}, {"logfile": "-", "nodaemon": True}):
        observer = twistd_log_observer(foreground)
        assert observer is not None
        out = io.StringIO()
        monkeypatch.setattr(sys, "stdout", out)
        twistd_log_observer(foreground)({"log_format": "hi", "log_namespace": "n"})
        monkeypatch.undo()
        monkeypatch.chdir(tmp_path)
        assert out.getvalue() == "- [n#-] hi\n"
    for left_to_twistd in ({"logger": object}, {"syslog": True}, {"logfile": "-", "nodaemon": False}):
        assert twistd_log_observer(left_to_twistd) is None


def test_makeservice_gives_twistds_application_the_observer(tmp_path, keep_sigusr1):
    """The service, added to twistd's Application, makes the observer its ILogObserver component
    (which twistd's AppLogger uses when no --logger is given); one the application has stays."""

    def service(*twistd_args):
        options = Options()
        options.parseOptions(["--key", str(tmp_path / "a.key"), "--create-key", "--listen", LOOPBACK])
        options.parent = {"logfile": str(tmp_path / "a.log"), "nodaemon": True, "pidfile": "", **dict(twistd_args)}
        return makeService(options)

    node = service()
    application = Application("mconn")
    node.setServiceParent(application)
    assert application.getComponent(ILogObserver) is node.text_log
    assert isinstance(node.text_log.formatEvent, ClassicLogText)

    own = textFileLogObserver(io.StringIO())
    application = Application("mconn")
    application.setComponent(ILogObserver, own)
    service().setServiceParent(application)
    assert application.getComponent(ILogObserver) is own
    assert service(("logger", object)).text_log is None


def test_a_log_file_that_cannot_be_opened_stops_makeservice_in_one_line(tmp_path, keep_sigusr1):
    options = Options()
    options.parseOptions(["--key", str(tmp_path / "a.key"), "--create-key", "--listen", LOOPBACK])
    options.parent = {"logfile": str(tmp_path / "missing" / "a.log"), "nodaemon": True, "pidfile": ""}
    with pytest.raises(SystemExit, match=r"mconn: --logfile: cannot write .*missing/a\.log: No such file"):
        makeService(options)


# -- a real twistd node ---------------------------------------------------------------------------

#: twistd as its script runs it, with ClassicLogText recording every line it formats into
#: the file named by the first argument.
RECORDING_TWISTD = """
import sys
from mconn.ops import text_log
record = open(sys.argv.pop(1), "a", encoding="utf-8")
formatted = text_log.ClassicLogText.__call__
def recording(self, event):
    line = formatted(self, event)
    if line:
        record.write(line)
        record.flush()
    return line
text_log.ClassicLogText.__call__ = recording
sys.argv[0] = "twistd"
from twisted.scripts.twistd import run
run()
"""
#: A line of twisted.logger's classic text: an RFC 3339 time stamp and ``[system]``.
CLASSIC_LINE = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}|-) \[[^\]\n]*\] ")


class RecordingNode:
    """A twistd mconn node in ``directory`` run by RECORDING_TWISTD; stopped by its PID."""

    def __init__(self, directory, *twistd_args: str) -> None:
        self.directory = directory
        self.record = directory / "recorded.log"
        node = ["mconn", "--key", str(directory / "a.key"), "--create-key", "--listen", LOOPBACK]
        with open(directory / "out", "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", RECORDING_TWISTD, str(self.record), *twistd_args, *node],
                cwd=directory,
                env=ENV,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_log(self, log, text: str) -> None:
        def logged():
            if self.process.poll() not in (None, 0):  # a daemon's twistd exits 0 once it runs
                raise AssertionError(f"twistd exited with {self.process.returncode}: {self.output()}")
            return log.exists() and text in log.read_text()

        wait_until(logged, f"{text!r} in {log.name}")

    def output(self) -> str:
        return (self.directory / "out").read_text(errors="replace")


@pytest.mark.integration
@pytest.mark.parametrize("foreground", [True, False], ids=["nodaemon-logfile", "daemon"])
def test_a_twistd_node_writes_its_log_file_through_classic_log_text(tmp_path, foreground):
    """``twistd -n --logfile node.log mconn`` and a daemon (its log file a.log, named after the key):
    every line of the file was formatted by ClassicLogText, each line is twisted.logger's classic
    text, and SIGUSR1 still rotates the file as twistd's own observer's."""
    log = tmp_path / ("node.log" if foreground else "a.log")
    pidfile = tmp_path / "a.pid"
    twistd = ["-n", "--logfile", str(log)] if foreground else []
    node = RecordingNode(tmp_path, *twistd, "--pidfile", str(pidfile))
    pid = node.process.pid
    try:
        node.wait_log(log, " started: listening on ")
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGUSR1)
        wait_until(lambda: log.with_name(log.name + ".1").exists(), f"{log.name} rotated to {log.name}.1")
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not alive(pid), f"twistd {pid} to exit")
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
        if node.process.poll() is None:
            node.process.kill()
        node.process.wait(timeout=TIMEOUT)
    written = log.with_name(log.name + ".1").read_text() + log.read_text()
    assert "Server Shut Down." in written and " started: listening on " in written
    assert written == node.record.read_text()
    for line in written.splitlines():
        assert line.startswith("\t") or CLASSIC_LINE.match(line), line
