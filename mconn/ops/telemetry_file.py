"""TelemetryFile: one node's telemetry events as JSON Lines in a rotating file.

specs/telemetry.md section 2: each event is written as one lean record (version 2: ``v``,
``event``, ``node_id``, ``log_time``, ``level`` and the event's own fields; none of
Twisted's ``log_*`` keys), one JSON object a line, into a
``twisted.python.logfile.LogFile``. The file rotates once it has reached ``rotate_bytes``,
or (with ``rotate_seconds``) once it has been open that long: ``PATH`` is closed and renamed
to a **closed name** that never changes afterwards, ``PATH.<UTC time>-<seq>``
(``node.json.20261125T101502Z-000007``: when it was closed, then a sequence number one
more than the largest of the log's closed files), and a new ``PATH`` is opened. A reader
that takes only closed names (Spark's file source, which reads each new file once) sees
every record once; the live ``PATH`` is still being written. The size is checked
before each write, and a write is whole records (the records of one reactor turn, cut
where the file reaches its size), so a record is never split across two files and none
is lost in the rotation. With ``rotate_seconds`` a timer also closes a file that has
been open that long, so a record is in a closed file at most ``rotate_seconds`` after it
was written, and ``stopService`` closes the last one (a non-empty ``PATH`` left by a killed
process is closed when the file is opened again). An empty file is never closed. A file
whose last record was cut short
(a killed process) gets a newline before the next record, so the cut record cannot spoil
it. Read the files back, oldest first, with :func:`read_events`: it reads the version 2
records and the version 1 records of Twisted's ``jsonFileLogObserver`` (RS-separated)
that older nodes wrote, even mixed in one file. Rotated files of the layout before closed
names (``PATH.1`` newest, ``PATH.2``...) are still read, pruned and tightened, as older
than any closed file.

Retention (specs/telemetry.md section 2.1): after each rotation, and when the file is
opened, the rotated files are pruned to the newest ``keep_files`` whose sizes add up to at
most ``keep_bytes``; the oldest go first, so the files kept are always the newest K,
with no gap. With rotation on, a log never holds more than ``rotate_bytes`` plus
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
import re
import stat
import time
from typing import cast

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
    "DEFAULT_ROTATE_SECONDS",
    "CLOSED_NAME",
    "ENVELOPE",
    "FILE_MODE",
    "RECORD_SEPARATOR",
    "RECORD_VERSION",
    "JsonLinesObserver",
    "RetainingLogFile",
    "TelemetryFileService",
    "_strict",
    "closed_name",
    "closed_paths",
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
#: Default age at which a telemetry file rotates: 0, never (by size only).
DEFAULT_ROTATE_SECONDS = 0
#: Default retention of the rotated files: at most 10 files and 100 MiB.
DEFAULT_KEEP_FILES = 10
DEFAULT_KEEP_BYTES = 100 * 1024 * 1024

#: The permissions of a telemetry file and its rotated files: read and write for the
#: owner only (specs/telemetry.md section 2.2).
FILE_MODE = 0o600

#: ASCII record separator: Twisted's version 1 records each start with one (RFC 7464).
RECORD_SEPARATOR = "\x1e"

#: The suffix of a closed file's name, after ``PATH.``: when it was closed (UTC, to the
#: second), then its sequence number (groups: time, seq). It never changes once given.
CLOSED_NAME = re.compile(r"^(\d{8}T\d{6}Z)-(\d+)$")
#: Digits of a closed file's sequence number (more when it grows past them).
SEQ_DIGITS = 6


def closed_name(path: str | os.PathLike, when: float, seq: int) -> str:
    """The name ``path`` gets when it is closed at ``when`` (seconds since the epoch) as
    the log's file number ``seq``: ``PATH.20261125T101502Z-000007``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    return f"{os.fspath(path)}.{stamp}-{seq:0{SEQ_DIGITS}d}"


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

    def observer(self, node_id: str) -> ILogObserver:
        """A plain function observing events that passes this observer those of node
        ``node_id`` in the ``mconn`` namespace (or ``mconn.*``) with an ``event`` name,
        and nothing else; in one frame, without a filter's call or the instance's (a
        connection storm writes three records a handshake)."""
        clock = self.clock
        append = self._lines.append  # the batch's one list: flush empties it in place

        def observe(event: dict) -> None:
            namespace = event.get("log_namespace") or ""
            if (
                (namespace == "mconn" or namespace.startswith("mconn."))
                and "event" in event
                and event.get("node_id") == node_id
            ):
                if clock is None:
                    self(event)  # no turns: one write a record
                    return
                append(format_record(event))
                if self._call is None:
                    self._call = clock.callLater(0, self.flush)

        return cast(ILogObserver, observe)

    def flush(self) -> None:
        """Write the records waiting for the end of the turn (now: at a stop)."""
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()
        lines = self._lines[:]
        self._lines.clear()
        log_file = self.log_file
        if not lines or log_file.closed:
            return
        limit = log_file.rotateLength
        size = log_file.size
        if limit and size >= limit:
            size = 0  # the next write rotates first
        data = b"".join(lines)
        if not limit or size + len(data) < limit:  # no record fills the file: one write
            log_file.write(data)
            log_file.flush()
            return
        start = 0
        for end, line in enumerate(lines, 1):
            size += len(line)
            if limit and size >= limit and end < len(lines):
                log_file.write(b"".join(lines[start:end]))  # the file is full with this record
                start, size = end, 0
        log_file.write(b"".join(lines[start:]))
        log_file.flush()


class RetainingLogFile(LogFile):
    """A LogFile that closes its files under names that never change (``closed_name``),
    by size and by age (``rotate_seconds``), prunes them to ``keep_files`` and
    ``keep_bytes``, and whose files are ``FILE_MODE`` (the owner's only), closed ones
    included.

    ``clock`` (an ``IReactorTime``; the system's time if None) gives a file's age and
    the time in a closed name. With ``rotate_seconds``, a non-empty PATH found when the
    file is opened (left by a process that was killed) is closed first.
    """

    def __init__(
        self,
        name,
        directory,
        rotateLength,
        *,
        keep_files: int,
        keep_bytes: int,
        rotate_seconds: float = DEFAULT_ROTATE_SECONDS,
        clock=None,
    ) -> None:
        self.keep_files = keep_files
        self.keep_bytes = keep_bytes
        self.rotate_seconds = rotate_seconds
        self.now = clock.seconds if clock is not None else time.time
        super().__init__(name, directory, rotateLength, defaultMode=FILE_MODE)
        self.next_seq = 1 + max((seq for _, seq in _closed(self.path)), default=0)
        self.prune()
        for rotated in rotated_paths(self.path):  # left by an earlier run, maybe before 0600
            if rotated != self.path:
                tighten_path(rotated)
        if rotate_seconds:
            self.hand_over()

    def _openFile(self) -> None:
        """Open PATH with ``open_private``, in place of LogFile's ``open`` (which creates
        it by the umask, or by changing the process's umask for a moment)."""
        self.closed = False
        self._file = open_private(self.path)
        self.size = self._file.tell()
        #: When this file was opened: its age counts from here (``rotate_seconds``).
        self.opened_at = self.now()
        if self.size:  # a record cut short by a killed process must not spoil the next one
            self._file.seek(-1, os.SEEK_END)
            last = self._file.read(1)
            self._file.seek(0, os.SEEK_END)
            if last != b"\n":
                self._file.write(b"\n")
                self.size += 1

    def age(self) -> float:
        """Seconds since PATH was opened (or its age last restarted, empty)."""
        return self.now() - self.opened_at

    def shouldRotate(self) -> bool:
        """A non-empty file rotates at ``rotateLength`` bytes, or ``rotate_seconds`` old."""
        if not self.size:
            return False
        if self.rotateLength and self.size >= self.rotateLength:
            return True
        return bool(self.rotate_seconds) and self.age() >= self.rotate_seconds

    def rotate(self) -> None:
        """Close PATH under its closed name and open a new PATH; then prune. An empty
        PATH is not closed: its age starts again. As LogFile's, does nothing when the
        directory or PATH cannot be written (logging goes on to PATH)."""
        if not self.size:
            self.opened_at = self.now()
            return
        if not (os.access(self.directory, os.W_OK) and os.access(self.path, os.W_OK)):
            return
        self._file.close()
        when = self.now()
        target = closed_name(self.path, when, self.next_seq)
        while os.path.lexists(target):  # a file put there by someone else: never replaced
            self.next_seq += 1
            target = closed_name(self.path, when, self.next_seq)
        os.rename(self.path, target)
        self.next_seq += 1
        self._openFile()
        self.prune()

    def hand_over(self) -> None:
        """Close PATH now if it holds anything (a stop, a start after a kill)."""
        if self.size:
            self.flush()
            self.rotate()

    def prune(self) -> list[str]:
        """Delete the rotated files beyond the retention bound; their paths, oldest first."""
        return prune_rotated(self.path, self.keep_files, self.keep_bytes)


def open_log_file(
    path: str | os.PathLike,
    rotate_bytes: int = DEFAULT_ROTATE_BYTES,
    *,
    keep_files: int = DEFAULT_KEEP_FILES,
    keep_bytes: int = DEFAULT_KEEP_BYTES,
    rotate_seconds: float = DEFAULT_ROTATE_SECONDS,
    clock=None,
) -> RetainingLogFile:
    """A LogFile at ``path`` that rotates at ``rotate_bytes`` (0: never) or once it is
    ``rotate_seconds`` old (0: never; checked before each write, and by the caller's
    timer: ``TelemetryFileService``), and keeps at most ``keep_files`` rotated files
    holding at most ``keep_bytes`` in all.

    :raises OSError: if the file cannot be opened for appending.
    """
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    return RetainingLogFile(
        name,
        directory,
        rotate_bytes or None,
        keep_files=keep_files,
        keep_bytes=keep_bytes,
        rotate_seconds=rotate_seconds,
        clock=clock,
    )


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
    """Keep the newest rotated files of ``path`` (the last closed first) while there are at most
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
    """The files of a telemetry log, oldest first: the old layout's ``PATH.N``, ...,
    ``PATH.1``, then the closed files by sequence number, then ``PATH`` if it exists."""
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    prefix = name + "."
    suffixes = [f[len(prefix) :] for f in os.listdir(directory) if f.startswith(prefix)]
    found = [f"{path}.{n}" for n in sorted((int(s) for s in suffixes if s.isdigit()), reverse=True)]
    found += closed_paths(path)
    return found + [path] if os.path.exists(path) else found


def closed_paths(path: str | os.PathLike) -> list[str]:
    """The closed files of the log at ``path`` (``PATH.<UTC time>-<seq>``), by sequence number."""
    return [name for name, _ in _closed(path)]


def _closed(path: str | os.PathLike) -> list[tuple[str, int]]:
    """(closed file, its sequence number) of the log at ``path``, by sequence number."""
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    prefix = name + "."
    found = []
    for entry in os.listdir(directory):
        match = CLOSED_NAME.match(entry[len(prefix) :]) if entry.startswith(prefix) else None
        if match:
            found.append((int(match.group(2)), match.group(1), f"{path}.{entry[len(prefix) :]}"))
    return [(file, seq) for seq, _, file in sorted(found)]


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

    :param path: the file; closed files are ``PATH.<UTC time>-<seq>`` (``closed_name``).
    :param node_id: whose events to write.
    :param rotate_bytes: rotate once the file has this many bytes (0: never).
    :param rotate_seconds: rotate a non-empty file once it has been open this many
        seconds (0: never), checked before each write and by a timer on ``clock``; the
        last file is closed at ``stopService``, so a reader of closed files gets every
        record at most this long after it was written.
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
        rotate_seconds: float = DEFAULT_ROTATE_SECONDS,
    ) -> None:
        if rotate_seconds < 0:
            raise ValueError(f"rotate_seconds must be 0 (never) or more, got {rotate_seconds!r}")
        self.path = os.fspath(path)
        self.clock = clock
        self.node_id = node_id
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.keep_files = keep_files
        self.keep_bytes = keep_bytes
        self.publisher = publisher if publisher is not None else globalLogPublisher
        self.log_file = self._open()
        self._observer: ILogObserver | None = None
        #: The JsonLinesObserver writing the file while the service runs.
        self._writer: JsonLinesObserver | None = None
        #: The timer that closes a file ``rotate_seconds`` old (IDelayedCall), while running.
        self._rotation = None

    def _open(self) -> RetainingLogFile:
        return open_log_file(
            self.path,
            self.rotate_bytes,
            keep_files=self.keep_files,
            keep_bytes=self.keep_bytes,
            rotate_seconds=self.rotate_seconds,
            clock=self.clock,
        )

    def privilegedStartService(self) -> None:
        super().privilegedStartService()
        self._observe()

    def startService(self) -> None:
        super().startService()
        self._observe()

    def stopService(self) -> None:
        super().stopService()
        if self._rotation is not None:
            if self._rotation.active():
                self._rotation.cancel()
            self._rotation = None
        if self._observer is not None:
            self.publisher.removeObserver(self._observer)
            self._observer = None
            assert self._writer is not None  # set with the observer
            self._writer.flush()
            if self.rotate_seconds:
                self.log_file.hand_over()
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
        # This node's mconn events (namespace mconn or mconn.*, an event name, our
        # node_id) and nothing else: one function, not a FilteringLogObserver.
        self._observer = self._writer.observer(self.node_id)
        self.publisher.addObserver(self._observer)
        if self.rotate_seconds:
            self._arm(clock)

    def _arm(self, clock) -> None:
        """Call ``_rotate_by_age`` when the file turns ``rotate_seconds`` old."""
        delay = max(0.0, self.rotate_seconds - self.log_file.age())
        self._rotation = clock.callLater(delay, self._rotate_by_age, clock)

    def _rotate_by_age(self, clock) -> None:
        """Close the file if it is old enough and holds anything (an empty one starts its
        age again), after writing the records waiting for the end of the turn."""
        self._rotation = None
        if self._writer is None or self.log_file.closed:
            return
        self._writer.flush()
        if self.log_file.age() >= self.rotate_seconds:
            self.log_file.rotate()
        self._arm(clock)
