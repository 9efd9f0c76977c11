"""twistd's text log of a node, the same lines at half the cost.

A node run by twistd writes every log event as a line of text (twistd's
``textFileLogObserver``: ``formatEventAsClassicLogText`` with ``timeFormatRFC3339``).
Twisted formats each line from scratch: the time stamp through a ``FixedOffsetTimeZone``
and ``strftime``, and the event by parsing its format string with ``string.Formatter``.
:class:`ClassicLogText` writes the same text, byte for byte, with two caches:

- the time stamp's text is kept for the second it names: ``timeFormatRFC3339`` has
  nothing finer than a second, and Twisted's time zone (``FixedOffsetTimeZone.
  fromLocalTimeStamp``: the local offset at that instant) only changes on a whole
  second, so every time in ``[s, s + 0.999999)`` has the text of ``s``. A time whose
  microseconds could round up into the next second, or that is not a float, is
  formatted by Twisted's ``formatTime`` itself.
- each format string is parsed once (a bounded LRU cache). A format whose fields are
  plain names (``{peer}``, ``{peer!r}``, ``{n:5d}``) is compiled to literal text and
  ``(name, conversion, spec)`` fields, formatted as ``string.Formatter`` would:
  ``format(event[name], spec)`` after the conversion. Anything else (attribute or item
  access, ``{f()}`` calls, positional or nested fields, a malformed format, a bytes
  format) is formatted by Twisted's ``formatEvent`` every time, so its output, and its
  error text, are Twisted's own; so is an event already flattened (``log_flattened``,
  by a JSON observer earlier in the chain; twistd's observer comes first).

:func:`twistd_log_observer` opens the file twistd would (``--logfile``, ``twistd.log``
for a daemon, stdout for ``twistd -n``) and :func:`mconn.ops.node.makeService` gives it to
twistd as the application's ``ILogObserver``; ``--logger`` and ``--syslog`` still take
precedence, as twistd documents.
"""

from __future__ import annotations

import math
import signal
import string
import sys
import time
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import IO, Any

from twisted.logger import (
    FileLogObserver,
    LogEvent,
    formatEvent,
    formatTime,
    timeFormatRFC3339,
)
from twisted.python.logfile import LogFile

__all__ = ["ClassicLogText", "text_file_log_observer", "twistd_log_observer"]

#: Format strings kept parsed; a node logs a few dozen distinct ones.
MAX_FORMATS = 512

#: A time's fraction of a second below which its microseconds cannot round up into the
#: next second (``datetime.fromtimestamp`` rounds to the microsecond, half to even).
_LAST_SAFE_FRACTION = 0.999999

_CONVERSIONS: dict[str | None, Callable[[Any], Any] | None] = {None: None, "s": str, "r": repr, "a": ascii}

#: A compiled format: literal text and ``(name, conversion, spec)`` fields in order, or
#: None for a format that Twisted's formatEvent formats each time.
_Compiled = tuple[str | tuple[str, Callable[[Any], Any] | None, str], ...] | None

_FORMATTER = string.Formatter()


class ClassicLogText:
    """``formatEventAsClassicLogText(event, formatTime=timeFormatRFC3339)``, cached.

    Call it with an event: the line (ending in ``\\n``, inner newlines followed by a tab)
    or None for an event with nothing to say, as Twisted's. At most ``max_formats``
    parsed format strings are kept, the least recently used dropped first.
    """

    def __init__(self, max_formats: int = MAX_FORMATS) -> None:
        if type(max_formats) is not int or max_formats < 1:
            raise ValueError(f"max_formats must be a positive int, not {max_formats!r}")
        self._second: int | None = None
        self._zone: object = None
        self._stamp = ""
        self._compile = lru_cache(maxsize=max_formats)(_compile)

    def cache_info(self) -> Any:
        """The format cache's hits, misses, maxsize and currsize (functools' CacheInfo)."""
        return self._compile.cache_info()

    def __call__(self, event: LogEvent) -> str | None:
        # The order of eventAsText: the event's text, its traceback, the time, the system.
        text = self._event_text(event)
        if "log_failure" in event:
            text = "\n".join((text, _traceback(event["log_failure"])))
        if not text:
            return None
        line = "".join((self._time(event.get("log_time", None)), " [", _system(event), "] ", text))
        return line.replace("\n", "\n\t") + "\n"

    def _time(self, when: Any) -> str:
        """``formatTime(when, timeFormatRFC3339)``, its text reused within a second.

        ``time.tzname`` is a new tuple after every ``time.tzset()``: a time zone changed
        mid-second is seen at once, as Twisted sees it.
        """
        if type(when) is float and math.isfinite(when):
            second = math.floor(when)
            if when - second < _LAST_SAFE_FRACTION:
                if second != self._second or time.tzname is not self._zone:
                    self._stamp = formatTime(when, timeFormatRFC3339)
                    self._second = second
                    self._zone = time.tzname
                return self._stamp
        return formatTime(when, timeFormatRFC3339)

    def _event_text(self, event: LogEvent) -> str:
        """Twisted's ``formatEvent(event)``, each format string parsed once."""
        form = event.get("log_format", None)
        if type(form) is not str or "log_flattened" in event:
            return formatEvent(event)  # no format, bytes, not text, or flattened: Twisted's
        parts = self._compile(form)
        if parts is None:
            return formatEvent(event)
        try:
            return "".join([part if type(part) is str else _field(event, *part) for part in parts])
        except BaseException:  # as Twisted's _formatEvent, which formatEvent runs
            # A missing field, a bad spec, a failing __format__: Twisted's formatEvent
            # formats it again and describes the failure in its own words.
            return formatEvent(event)


def _field(event: Mapping[str, Any], name: str, convert: Callable[[Any], Any] | None, spec: str) -> str:
    """A plain-name field as ``string.Formatter`` formats it through Twisted's CallMapping
    (whose wrapper's ``__str__``, ``__repr__`` and ``__format__`` are the value's)."""
    value = event[name]
    if convert is not None:
        value = convert(value)
    return format(value, spec)


def _compile(form: str) -> _Compiled:
    """The literal text and fields of ``form``; None if any field is not a plain name."""
    try:
        fields = list(_FORMATTER.parse(form))
    except ValueError:
        return None  # malformed: Twisted's formatEvent says how
    parts: list[str | tuple[str, Callable[[Any], Any] | None, str]] = []
    for literal, name, spec, conversion in fields:
        if literal:
            parts.append(literal)
        if name is None:
            continue
        spec = spec or ""  # a str whenever there is a field
        if not _plain(name) or "{" in spec or "}" in spec or conversion not in _CONVERSIONS:
            return None
        parts.append((name, _CONVERSIONS[conversion], spec))
    return tuple(parts)


def _plain(name: str) -> bool:
    """A field string.Formatter looks up as ``mapping[name]`` and nothing more: not
    positional, no attribute or item access, no Twisted ``()`` call."""
    return bool(name) and not name.isdigit() and "." not in name and "[" not in name and not name.endswith("()")


def _traceback(failure: Any) -> str:
    """The traceback text eventAsText appends for ``log_failure``."""
    try:
        return str(failure.getTraceback())
    except BaseException as e:
        return "(UNABLE TO OBTAIN TRACEBACK FROM EVENT):" + str(e)


def _system(event: LogEvent) -> str:
    """``log_system``, else ``namespace#level``, as eventAsText writes it."""
    system = event.get("log_system", None)
    if system is None:
        level = event.get("log_level", None)
        level_name = "-" if level is None else level.name
        return f"{event.get('log_namespace', '-')}#{level_name}"
    try:
        return str(system)
    except Exception:
        return "UNFORMATTABLE"


def text_file_log_observer(out_file: IO[Any], max_formats: int = MAX_FORMATS) -> FileLogObserver:
    """``twisted.logger.textFileLogObserver(out_file)``, writing the same lines faster."""
    return FileLogObserver(out_file, ClassicLogText(max_formats))


def twistd_log_observer(twistd: Mapping[str, Any]) -> FileLogObserver | None:
    """The observer of the file twistd would log to, or None to leave it to twistd.

    ``twistd`` is twistd's options. As ``UnixAppLogger``: ``--logfile FILE`` (rotated on
    SIGUSR1 unless something else handles that signal), stdout for ``twistd -n`` without
    ``--logfile`` or with ``--logfile -``, else ``twistd.log``. None when ``--logger`` or
    ``--syslog`` choose the observer, or for a daemon told to log to stdout (twistd refuses).
    """
    if twistd.get("logger") or twistd.get("syslog"):
        return None
    name = twistd.get("logfile") or ""
    nodaemon = bool(twistd.get("nodaemon"))
    if name == "-" and not nodaemon:
        return None
    if name == "-" or (nodaemon and not name):
        return text_file_log_observer(sys.stdout)
    log_file = LogFile.fromFullPath(name or "twistd.log")
    if not signal.getsignal(signal.SIGUSR1):

        def rotate(signum: int, frame: object) -> None:
            from twisted.internet import reactor

            reactor.callFromThread(log_file.rotate)  # type: ignore[attr-defined]

        signal.signal(signal.SIGUSR1, rotate)
    return text_file_log_observer(log_file)
