"""TelemetryFile: one node's telemetry events as JSON Lines in a rotating file.

specs/telemetry.md section 2: each event is written as one lean record (version 2: ``v``,
``event``, ``node_id``, ``log_time``, ``level`` and the event's own fields; none of
Twisted's ``log_*`` keys), one JSON object a line, into a
``twisted.python.logfile.LogFile``. The file rotates once it has reached ``rotate_bytes``:
``PATH`` becomes ``PATH.1``, ``PATH.1`` becomes ``PATH.2``, and so on. The size is checked
before each write, and a write is whole records (the records of one reactor turn, cut
where the file reaches its size), so a record is never split across two files and none
is lost in the rotation. A file whose last record was cut short
(a killed process) gets a newline before the next record, so the cut record cannot spoil
it. Read the files back, oldest first, with :func:`read_events`: it reads the version 2
records and the version 1 records of Twisted's ``jsonFileLogObserver`` (RS-separated)
that older nodes wrote, even mixed in one file.

Retention (specs/telemetry.md section 2.1): after each rotation, and when the file is
opened, the rotated files are pruned to the newest ``keep_files`` whose sizes add up to at
most ``keep_bytes``; the oldest go first, so the files kept are always ``PATH.1`` to
``PATH.K`` with no gap. With rotation on, a log never holds more than ``rotate_bytes`` plus
one record in ``PATH`` and ``keep_bytes`` in the rotated files, however many peers connect.

Privacy (specs/telemetry.md section 2.2): PATH and its rotated files are the owner's
only (``FILE_MODE``, 0600). PATH is created with that mode by ``os.open`` whatever the
umask; a file found with group or other permission bits (PATH, or a rotated file left
by an earlier run) is tightened to it when the file is opened, and one that cannot be
tightened (another user's) is refused with an ``OSError`` naming it and its mode. The
records name sessions by their references, never by their ids (``mconn.core.session_ref``).

A record is written when its ``log_namespace`` is ``mconn`` (or ``mconn.*``), it has an
``event`` name (specs/telemetry.md section 1), and its ``node_id`` is this node's: several
nodes in one process each get their own file.
"""

from __future__ import annotations

import json
import os
import stat

from twisted.application.service import Service
from twisted.logger import ILogObserver, eventFromJSON, globalLogPublisher
from twisted.python.logfile import LogFile

from mconn.ops.telemetry_record import (
    ENVELOPE,
    RECORD_VERSION,
    _strict,
    encode_record,
    format_record,
    lean_record,
    lean_text,
)

#: Re-exported: a record's text is made in mconn.ops.telemetry_record now.
__all__ = [
    "DEFAULT_KEEP_BYTES",
    "DEFAULT_KEEP_FILES",
    "DEFAULT_ROTATE_BYTES",
    "ENVELOPE",
    "FILE_MODE",
    "RECORD_SEPARATOR",
    "RECORD_VERSION",
    "JsonLinesObserver",
    "RetainingLogFile",
    "TelemetryFileService",
    "_strict",
    "encode_record",
    "format_record",
    "lean_record",
    "lean_text",
    "open_log_file",
    "open_private",
    "parse_lines",
    "prune_rotated",
    "read_events",
    "rotated_paths",
    "tighten",
]

#: Default size at which a telemetry file rotates (10 MiB).
DEFAULT_ROTATE_BYTES = 10 * 1024 * 1024
#: Default retention of the rotated files: at most 10 files and 100 MiB.
DEFAULT_KEEP_FILES = 10
DEFAULT_KEEP_BYTES = 100 * 1024 * 1024

#: The permissions of a telemetry file and its rotated files: read and write for the
#: owner only (specs/telemetry.md section 2.2).
FILE_MODE = 0o600

#: ASCII record separator: Twisted's version 1 records each start with one (RFC 7464).
RECORD_SEPARATOR = "\x1e"


class JsonLinesObserver:
    """A log observer writing each event it gets as one ``format_record`` line.

    Without a clock each record is one ``write``. With ``clock`` the records of one
    reactor turn are formatted as they come and written together when the turn ends
    (``clock.callLater(0)``), in as few writes as rotation allows: a batch is cut after
    the record that brings the file to ``rotateLength``, so the next write rotates
    first, as it would after that record alone, and no file holds more than
    ``rotate_bytes`` plus one record (specs/telemetry.md section 2). A connection storm
    logs three records per connection; one write each was a third of their cost.
    """

    def __init__(self, log_file, clock=None) -> None:
        self.log_file = log_file
        self.clock = clock
        self._lines: list[bytes] = []
        self._call = None

    def __call__(self, event: dict) -> None:
        if self.clock is None:
            self.log_file.write(format_record(event))
            self.log_file.flush()
            return
        self._lines.append(format_record(event))
        if self._call is None:
            self._call = self.clock.callLater(0, self.flush)

    def flush(self) -> None:
        """Write the records waiting for the end of the turn (now: at a stop)."""
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()
        lines, self._lines = self._lines, []
        log_file = self.log_file
        if not lines or log_file.closed:
            return
        limit = log_file.rotateLength
        size = log_file.size
        if limit and size >= limit:
            size = 0  # the next write rotates first
        start = 0
        for end, line in enumerate(lines, 1):
            size += len(line)
            if limit and size >= limit and end < len(lines):
                log_file.write(b"".join(lines[start:end]))  # the file is full with this record
                start, size = end, 0
        log_file.write(b"".join(lines[start:]))
        log_file.flush()


class RetainingLogFile(LogFile):
    """A LogFile that prunes its rotated files to ``keep_files`` and ``keep_bytes``, and
    whose files are ``FILE_MODE`` (the owner's only), rotated ones included."""

    def __init__(self, name, directory, rotateLength, *, keep_files: int, keep_bytes: int) -> None:
        self.keep_files = keep_files
        self.keep_bytes = keep_bytes
        super().__init__(name, directory, rotateLength, defaultMode=FILE_MODE)
        self.prune()
        for rotated in rotated_paths(self.path):  # left by an earlier run, maybe before 0600
            if rotated != self.path:
                tighten_path(rotated)

    def _openFile(self) -> None:
        """Open PATH with ``open_private``, in place of LogFile's ``open`` (which creates
        it by the umask, or by changing the process's umask for a moment)."""
        self.closed = False
        self._file = open_private(self.path)
        self.size = self._file.tell()
        if self.size:  # a record cut short by a killed process must not spoil the next one
            self._file.seek(-1, os.SEEK_END)
            last = self._file.read(1)
            self._file.seek(0, os.SEEK_END)
            if last != b"\n":
                self._file.write(b"\n")
                self.size += 1

    def rotate(self) -> None:
        super().rotate()
        self.prune()

    def prune(self) -> list[str]:
        """Delete the rotated files beyond the retention bound; their paths, oldest first."""
        return prune_rotated(self.path, self.keep_files, self.keep_bytes)


def open_log_file(
    path: str | os.PathLike,
    rotate_bytes: int = DEFAULT_ROTATE_BYTES,
    *,
    keep_files: int = DEFAULT_KEEP_FILES,
    keep_bytes: int = DEFAULT_KEEP_BYTES,
) -> RetainingLogFile:
    """A LogFile at ``path`` that rotates at ``rotate_bytes`` (0: never) and keeps at most
    ``keep_files`` rotated files holding at most ``keep_bytes`` in all.

    :raises OSError: if the file cannot be opened for appending.
    """
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    return RetainingLogFile(name, directory, rotate_bytes or None, keep_files=keep_files, keep_bytes=keep_bytes)


def open_private(path: str | os.PathLike):
    """``path`` opened for appending and reading (unbuffered, at its end); created with
    ``FILE_MODE`` whatever the umask, and tightened to it when found wider (``tighten``).

    :raises OSError: if it cannot be opened, or is wider and cannot be tightened.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        tighten(fd, path)
        file = os.fdopen(fd, "rb+", 0)
    except BaseException:
        os.close(fd)
        raise
    file.seek(0, os.SEEK_END)
    return file


def tighten(fd: int, path) -> None:
    """Make the regular file open on ``fd`` ``FILE_MODE`` if its group or others have any
    permission; leave anything else (``/dev/null``) alone: it is not ours to change.

    :raises OSError: naming ``path`` and its mode, if it cannot be tightened.
    """
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode) or not mode & 0o077:
        return
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError as error:
        raise OSError(
            error.errno,
            f"its mode {stat.S_IMODE(mode):04o} lets others read it and cannot be made {FILE_MODE:04o} "
            f"({error.strerror})",
            os.fspath(path),
        ) from None


def tighten_path(path: str | os.PathLike) -> None:
    """``tighten`` for a file that is not open (a rotated file); a file gone meanwhile
    (pruned by another process) is nothing to tighten."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return
    try:
        tighten(fd, path)
    finally:
        os.close(fd)


def prune_rotated(path: str | os.PathLike, keep_files: int, keep_bytes: int) -> list[str]:
    """Keep the newest rotated files of ``path`` (``PATH.1`` first) while there are at most
    ``keep_files`` of them holding at most ``keep_bytes``; delete the rest.

    :returns: the deleted paths, oldest first.
    """
    rotated = rotated_paths(path)
    if rotated and rotated[-1] == os.fspath(path):
        rotated.pop()  # the live file is bounded by rotate_bytes, not pruned
    kept = total = 0
    deleted: list[str] = []
    for name in reversed(rotated):  # newest first
        size = os.path.getsize(name)
        if deleted or kept == keep_files or total + size > keep_bytes:
            deleted.append(name)
        else:
            kept += 1
            total += size
    for name in reversed(deleted):
        os.remove(name)
    return deleted[::-1]


def rotated_paths(path: str | os.PathLike) -> list[str]:
    """The files of a telemetry log, oldest first: ``PATH.N``, ..., ``PATH.1``, ``PATH``."""
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    prefix = name + "."
    suffixes = [f[len(prefix) :] for f in os.listdir(directory) if f.startswith(prefix)]
    found = [f"{path}.{n}" for n in sorted((int(s) for s in suffixes if s.isdigit()), reverse=True)]
    return found + [path] if os.path.exists(path) else found


def read_events(path: str | os.PathLike) -> list[dict]:
    """Every event of a telemetry log and its rotated files, oldest first.

    Version 2 records come back as written (their ``log_time`` and ``level`` included);
    version 1 records as Twisted's ``eventsFromJSONLogFile`` restores them. A record that
    is not a JSON object (one cut short by a killed process) is skipped, as Twisted's
    reader skips it.
    """
    events = []
    for name in rotated_paths(path):
        with open(name, encoding="utf-8", errors="replace") as f:
            events.extend(parse_lines(f))
    return events


def parse_lines(lines) -> list[dict]:
    """The records of a telemetry file's lines: version 2 JSON Lines, version 1
    RS-separated records, or both mixed (a node upgraded in place appends to its file)."""
    events = []
    for line in lines:
        for text in line.split(RECORD_SEPARATOR) if RECORD_SEPARATOR in line else (line,):
            text = text.strip()
            if not text:
                continue
            try:
                record = json.loads(text)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            events.append(record if "v" in record else eventFromJSON(text))
    return events


class TelemetryFileService(Service):
    """Writes one node's telemetry events to a rotating JSON Lines file while running.

    The file is opened here, so that a path that cannot be written fails at
    configuration time; the observer is added in ``privilegedStartService`` (before the
    node listens, so its ``listening`` events are kept) and removed in ``stopService``,
    which closes the file.

    :param path: the file; rotated files are ``PATH.1``, ``PATH.2``...
    :param node_id: whose events to write.
    :param rotate_bytes: rotate once the file has this many bytes (0: never).
    :param keep_files: rotated files kept at most (0: none); the oldest are deleted first.
    :param keep_bytes: bytes the rotated files hold at most, in all.
    :param publisher: the log publisher to observe (``globalLogPublisher`` if None).
    :param clock: the ``IReactorTime`` that ends a reactor turn: the records of one turn
        are written together at its end (``JsonLinesObserver``; Twisted's global reactor
        if None), and at ``stopService``.
    :raises OSError: if the file cannot be opened.
    """

    def __init__(
        self,
        path,
        node_id: str,
        *,
        rotate_bytes: int = DEFAULT_ROTATE_BYTES,
        keep_files: int = DEFAULT_KEEP_FILES,
        keep_bytes: int = DEFAULT_KEEP_BYTES,
        publisher=None,
        clock=None,
    ) -> None:
        self.path = os.fspath(path)
        self.clock = clock
        self.node_id = node_id
        self.rotate_bytes = rotate_bytes
        self.keep_files = keep_files
        self.keep_bytes = keep_bytes
        self.publisher = publisher if publisher is not None else globalLogPublisher
        self.log_file = self._open()
        self._observer: ILogObserver | None = None
        #: The JsonLinesObserver writing the file while the service runs.
        self._writer: JsonLinesObserver | None = None

    def _open(self) -> RetainingLogFile:
        return open_log_file(self.path, self.rotate_bytes, keep_files=self.keep_files, keep_bytes=self.keep_bytes)

    def _write_ours(self, write):
        """An observer passing ``write`` this node's mconn events (namespace ``mconn`` or
        ``mconn.*``, an ``event`` name, our ``node_id``) and nothing else; one function,
        not a ``FilteringLogObserver`` and its predicate loop, per event."""

        def observe(event: dict) -> None:
            namespace = event.get("log_namespace") or ""
            if (
                (namespace == "mconn" or namespace.startswith("mconn."))
                and "event" in event
                and event.get("node_id") == self.node_id
            ):
                write(event)

        return observe

    def privilegedStartService(self) -> None:
        super().privilegedStartService()
        self._observe()

    def startService(self) -> None:
        super().startService()
        self._observe()

    def stopService(self) -> None:
        super().stopService()
        if self._observer is not None:
            self.publisher.removeObserver(self._observer)
            self._observer = None
            assert self._writer is not None  # set with the observer
            self._writer.flush()
            self.log_file.close()

    def _observe(self) -> None:
        if self._observer is not None:
            return
        if self.log_file.closed:  # started again after a stop
            self.log_file = self._open()
        clock = self.clock
        if clock is None:
            from twisted.internet import reactor as clock
        self._writer = JsonLinesObserver(self.log_file, clock)
        self._observer = self._write_ours(self._writer)
        self.publisher.addObserver(self._observer)
